"""A capture daemon's directory (sniffer/daemon.py) at the decoders' edge: capture.json, the packet files
in capture order, and the probe files turned into tables the decode pipeline can join.

    found = load_capture_dir(Path("out/worker0"))
    found.captures      # packet files, set by set, in rotation order: one continuous capture per set
    found.flows         # TCP connection -> owning process (pid, comm, cgroup)
    found.zmq_events    # one row per frame handed to / taken from libzmq

Probe event times are converted from the kernel's monotonic clock to epoch ns (`ts_ns` columns) with
the clock pairs the daemon wrote into each probe file, so they compare with packet timestamps.
What cannot be read (a probe file cut by a crash, a record that does not decode, a file capture.json
lists but the disk lacks) is decoded around and reported in `warnings`.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path


from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.formats import probe_events as ev
from dlcsniff.decoders.inputs.flow_owners import attribute_flows
from dlcsniff.decoders.arrow_without_pandas import pandas
from dlcsniff.decoders.formats.capture_dir import CAPTURE_JSON, read_capture_json, set_files

pd = pandas()
READ_CHUNK_BYTES = 1 << 20

FLOW_COLUMNS = ["set", "family", "local_ip", "local_port", "remote_ip", "remote_port", "pid", "tid", "comm",
                "cgroup_id", "cgroup", "source", "active", "state", "first_ts_ns", "established_ts_ns",
                "closed_ts_ns"]
ZMQ_COLUMNS = ["set", "ts_ns", "return_ts_ns", "pid", "tid", "comm", "direction", "function", "socket", "msg",
               "size_bytes", "flags", "more"]
NCCL_COLUMNS = ["set", "ts_ns", "pid", "tid", "comm", "function", "count", "datatype", "dtype", "size_bytes", "op",
                "peer", "comm_handle", "stream", "sendbuff", "recvbuff", "rank", "nranks"]
PROCESS_COLUMNS = ["set", "pid", "comm", "cmdline", "cgroup", "netns", "first_ts_ns"]
LIBRARY_COLUMNS = ["set", "ts_ns", "path", "library", "functions", "pid"]
ZMQ_MESSAGE_COLUMNS = ["set", "pid", "tid", "socket", "direction", "api_ts_ns", "return_ts_ns", "frame_sizes",
                       "size_bytes", "complete"]
_NULLABLE_INT = ["pid", "tid", "cgroup_id", "established_ts_ns", "closed_ts_ns", "rank", "nranks", "netns"]


@dataclass(frozen=True)
class CaptureDir:
    path: Path
    info: dict                          # capture.json as the daemon last wrote it
    sets: dict[int, list[Path]]         # packet files of each daemon run, in rotation order
    flows: pd.DataFrame                 # FLOW_COLUMNS
    zmq_events: pd.DataFrame            # ZMQ_COLUMNS
    nccl_events: pd.DataFrame           # NCCL_COLUMNS
    processes: pd.DataFrame             # PROCESS_COLUMNS
    libraries: pd.DataFrame             # LIBRARY_COLUMNS
    warnings: list[str]

    @property
    def captures(self) -> list[Path]:
        return [path for run in sorted(self.sets) for path in self.sets[run]]


def _frame(rows: list[dict], columns: list[str]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=columns)
    for column in columns:
        if column in _NULLABLE_INT:
            frame[column] = frame[column].astype("Int64")
    return frame


def _read_probe_file(path: Path, warnings: list[str]) -> list:
    decoder = ev.ProbeFileDecoder()
    found = []
    try:
        with open(path, "rb") as stream:
            while True:
                chunk = stream.read(READ_CHUNK_BYTES)
                if chunk:
                    decoder.receive_data(chunk)
                else:
                    decoder.receive_end()
                while (item := decoder.next_event()) is not ev.NEED_DATA:
                    if isinstance(item, ev.BadRecord):
                        warnings.append(f"{path.name}: record at offset {item.offset} skipped: {item.reason}")
                    else:
                        found.append(item)
                if not chunk:
                    break
    except DecodeError as exc:
        warnings.append(f"{path.name}: read up to a corrupt part: {exc}")
    if decoder.truncated_bytes:
        warnings.append(f"{path.name}: last record cut after {decoder.truncated_bytes} bytes (daemon killed?)")
    return found


def _set_tables(run: int, items: list, rows: dict[str, list]) -> None:
    clock = ev.EpochClock(event for event in items if isinstance(event, ev.ClockSync))
    epoch = clock.epoch_ns
    processes = {}
    for item in items:
        if isinstance(item, ev.ProcessInfo):
            processes.setdefault(item.tgid, item)
            rows["processes"].append({"set": run, "pid": item.tgid, "comm": item.comm, "cmdline": list(item.cmdline),
                                      "cgroup": item.cgroup, "netns": item.netns, "first_ts_ns": epoch(item.mono_ns)})
        elif isinstance(item, ev.ZmqCall):
            rows["zmq"].append({
                "set": run, "ts_ns": epoch(item.mono_ns), "return_ts_ns": epoch(item.return_mono_ns), "pid": item.tgid,
                "tid": item.tid, "comm": item.comm, "direction": "send" if item.kind == ev.Kind.ZMQ_SEND else "recv",
                "function": item.function, "socket": item.socket, "msg": item.msg, "size_bytes": item.size_bytes,
                "flags": item.flags, "more": item.more})
        elif isinstance(item, ev.LibraryAttached):
            rows["libraries"].append({"set": run, "ts_ns": epoch(item.mono_ns), "path": item.path,
                                      "library": item.library, "functions": list(item.functions), "pid": item.tgid})
    communicators = {item.comm_handle: item for item in items if isinstance(item, ev.NcclCommInit)}
    for item in items:
        if isinstance(item, ev.NcclCall):
            communicator = communicators.get(item.comm_handle)
            rows["calls"].append({
                "set": run, "ts_ns": epoch(item.mono_ns), "pid": item.tgid, "tid": item.tid, "comm": item.comm,
                "function": item.function, "count": item.count, "datatype": item.datatype, "dtype": item.dtype,
                "size_bytes": item.size_bytes, "op": item.op_name, "peer": item.peer, "comm_handle": item.comm_handle,
                "stream": item.stream, "sendbuff": item.sendbuff, "recvbuff": item.recvbuff,
                "rank": communicator.rank if communicator else None,
                "nranks": communicator.nranks if communicator else None})

    def cgroup(pid: int | None) -> str | None:
        return processes[pid].cgroup if pid in processes else None

    snapshot = [item for item in items if isinstance(item, ev.SocketSnapshot)]
    for flow in attribute_flows((item for item in items if isinstance(item, ev.SockEvent)), snapshot):
        rows["flows"].append({
            "set": run, "family": flow.family, "local_ip": flow.local_ip, "local_port": flow.local_port,
            "remote_ip": flow.remote_ip, "remote_port": flow.remote_port, "pid": flow.tgid, "tid": flow.tid,
            "comm": flow.comm, "cgroup_id": flow.cgroup_id, "cgroup": cgroup(flow.tgid), "source": flow.source,
            "active": flow.active, "state": ev.TCP_STATES.get(flow.state), "first_ts_ns": epoch(flow.first_mono_ns),
            "established_ts_ns": None if flow.established_mono_ns is None else epoch(flow.established_mono_ns),
            "closed_ts_ns": None if flow.closed_mono_ns is None else epoch(flow.closed_mono_ns)})
    # Connections already open at start: the /proc row. /proc is listed just after the tracepoint attached, so a
    # connection the probes saw alive then, or made since, is in both: one connection, one row. Made after the
    # attach (the probes saw it established), the probes' row holds it all; made before, the /proc row, completed
    # by what the probes saw of its end (its state, its close). A read of /proc/net/tcp is not atomic: a
    # connection that changed state meanwhile (into TIME_WAIT) may be listed twice, and is still one.
    def address(row: dict) -> tuple:
        return row["local_ip"], row["local_port"], row["remote_ip"], row["remote_port"]

    def take_owner(row: dict, other: dict) -> None:
        if row["pid"] is None and other["pid"] is not None:
            row.update({key: other[key] for key in ("pid", "tid", "comm", "cgroup_id", "cgroup", "source")})

    seen_by_probes = defaultdict(list)
    for row in rows["flows"]:
        if row["set"] == run:
            seen_by_probes[address(row)].append(row)
    listed: dict[tuple, dict] = {}          # connection (listeners may share an address) -> its row
    for item in snapshot:
        row = {"set": run, "family": item.family, "local_ip": item.local_ip, "local_port": item.local_port,
               "remote_ip": item.remote_ip, "remote_port": item.remote_port, "pid": item.tgid, "tid": None,
               "comm": item.comm, "cgroup_id": None, "cgroup": cgroup(item.tgid), "source": "proc",
               "active": None, "state": ev.TCP_STATES.get(item.state), "first_ts_ns": epoch(item.mono_ns),
               "established_ts_ns": None, "closed_ts_ns": None}
        if row["remote_port"] and address(row) in listed:
            take_owner(listed[address(row)], row)
            continue
        candidates = seen_by_probes[address(row)]
        same = next((later for later in candidates
                     if later["closed_ts_ns"] is None or later["closed_ts_ns"] >= row["first_ts_ns"]), None)
        if same is not None:
            candidates.remove(same)
        if same is not None and same["established_ts_ns"] is not None:
            take_owner(same, row)
            row = same
        else:
            if same is not None:
                rows["flows"].remove(same)
                row.update(state=same["state"], closed_ts_ns=same["closed_ts_ns"])
                take_owner(row, same)
            rows["flows"].append(row)
        listed[address(row)] = row


def load_capture_dir(path: Path) -> CaptureDir:
    """Read a daemon's directory, its probe files included. Raises CaptureError when it is not one."""
    path = Path(path)
    info = read_capture_json(path)
    warnings: list[str] = []
    on_disk = {entry.name for entry in path.iterdir() if entry.is_file()}
    listed = {item.get("name") for item in info.get("files", [])}
    warnings += [f"{name}: listed in {CAPTURE_JSON} but missing" for name in sorted(listed - on_disk)]
    for run in info.get("runs", []):
        if (run.get("stop_reason") or "").startswith("killed"):
            warnings.append(f"set {run['set']}: {run['stop_reason']}; its counts in {CAPTURE_JSON} may be short")
    sets, probe_files = set_files(path)
    rows: dict[str, list] = defaultdict(list)
    for run, probe_path in sorted(probe_files.items()):
        items = _read_probe_file(probe_path, warnings)
        try:
            _set_tables(run, items, rows)
        except DecodeError as exc:
            warnings.append(f"{probe_path.name}: events not usable: {exc}")
    return CaptureDir(
        path=path, info=info, sets=sets,
        flows=_frame(rows["flows"], FLOW_COLUMNS), zmq_events=_frame(rows["zmq"], ZMQ_COLUMNS),
        nccl_events=_frame(rows["calls"], NCCL_COLUMNS), processes=_frame(rows["processes"], PROCESS_COLUMNS),
        libraries=_frame(rows["libraries"], LIBRARY_COLUMNS), warnings=warnings)


def zmq_messages(zmq_events: pd.DataFrame) -> pd.DataFrame:
    """libzmq frames grouped into messages: per process, thread and socket, a message runs up to the frame
    without `more`. `api_ts_ns` is when the program handed over (send) or asked for (recv) the first
    frame; joined with the wire, it gives how long a message waited in the sender. A message whose last
    frame was not seen (the capture stopped) has complete = False. Frames of zmq_recv (more unknown)
    each make one message."""
    rows, open_messages = [], {}
    ordered = zmq_events.sort_values(["ts_ns", "return_ts_ns"], kind="stable")
    ordered = ordered.assign(last=~ordered["more"].eq(True))     # more False, or not known
    for frame in ordered.itertuples(index=False):
        key = (frame.set, frame.pid, frame.tid, frame.socket, frame.direction)
        message = open_messages.setdefault(key, {
            "set": frame.set, "pid": frame.pid, "tid": frame.tid, "socket": frame.socket,
            "direction": frame.direction, "api_ts_ns": frame.ts_ns, "frame_sizes": []})
        message["frame_sizes"].append(int(frame.size_bytes))
        message["return_ts_ns"] = frame.return_ts_ns
        if frame.last:
            del open_messages[key]
            rows.append({**message, "size_bytes": sum(message["frame_sizes"]), "complete": True})
    rows += [{**message, "size_bytes": sum(message["frame_sizes"]), "complete": False}
             for message in open_messages.values()]
    return _frame(rows, ZMQ_MESSAGE_COLUMNS).sort_values("api_ts_ns", kind="stable", ignore_index=True)
