"""Capture files → packets → TCP streams → ZMTP → ps-lite, collected into the decode tables.

The one place that wires the sans-IO layers together. Each capture is decoded on its own
(`decode_capture`, picklable results so captures can be decoded in parallel); `build_dataset`
then resolves what only the whole job reveals — ps-lite node ids, roles and tensor keys — and
returns the contract tables (see `decoders.dataset`).
"""
from __future__ import annotations

import collections
import dataclasses
import os
import pickle
import selectors
import signal
import struct
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from dlcsniff.decoders.tensors import byteps
from dlcsniff.decoders.tensors import mxnet
from dlcsniff.decoders.protocols import pslite
from dlcsniff.decoders.inputs.capture_file import CaptureError, Packet, open_capture
from dlcsniff.decoders.protocols.gloo import GlooCaptureDecoder
from dlcsniff.decoders.protocols.nccl_socket import NcclSocketCaptureDecoder
from dlcsniff.decoders.protocols.roce import RoceCaptureDecoder
from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.tcp_driver import BatchDecoder
from dlcsniff.decoders.packet import ParseStats, UnsupportedLinktype, check_linktype, ip_to_str
from dlcsniff.decoders.tcp import StreamData, StreamEnded, StreamGap, StreamStarted, TcpReassembler
from dlcsniff.decoders.protocols.zmtp import (NEED_DATA, UNLIMITED_SKIP_BYTES, Command, DecodeFailed, Greeting, Message, Resync,
                           ZmtpDecoder)

if TYPE_CHECKING:
    import pyarrow as pa

CAPTURE_SUFFIXES = (".pcap", ".pcapng", ".cap", ".pcap.gz", ".pcapng.gz", ".cap.gz")
FLOW_ID_CAPTURE_SHIFT = 32   # flow_id = (capture index << 32) + stream number: unique without coordination
ProgressFn = Callable[[int], None]   # called with the number of raw input bytes consumed since last call


def capture_name(path: Path) -> str:
    """The input file name without its extensions (`worker0.pcap.gz` → `worker0`)."""
    name = path.name
    while True:
        stem, dot, ext = name.rpartition(".")
        if not dot or ext.lower() not in {"pcap", "pcapng", "cap", "gz", "dmp"}:
            return name
        name = stem


@dataclass(frozen=True)
class CaptureInput:
    """One capture: its files, read in order as one continuous capture (a capture daemon rotates its
    files), and the daemon's directory when it came from one (its probe files then join the tables)."""
    name: str
    files: tuple[Path, ...]
    directory: Path | None = None

    @property
    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files)

    @property
    def path(self) -> Path:
        """What the user named: the file, or the daemon's directory."""
        return self.files[0] if self.directory is None else self.directory

    def with_files(self, files: Iterable[Path]) -> CaptureInput:
        return dataclasses.replace(self, files=tuple(files))


def expand_inputs(inputs: Iterable[Path]) -> list[CaptureInput]:
    """Files as given; a capture daemon's directory (capture.json) stands for its captures, one per daemon
    run, named after the directory; any other directory for the capture files directly inside it."""
    from dlcsniff.decoders.inputs.daemon_dir import is_capture_dir, load_capture_dir

    captures: list[CaptureInput] = []
    for item in inputs:
        item = Path(item)
        if item.is_dir() and is_capture_dir(item):
            sets = load_capture_dir(item).sets
            if not any(sets.values()):
                raise CaptureError(f"{item}: the capture daemon's directory holds no packet files")
            for run, files in sorted(sets.items()):
                name = item.resolve().name if len(sets) == 1 else f"{item.resolve().name}-{run}"
                captures.append(CaptureInput(name, tuple(files), item))
        elif item.is_dir():
            found = sorted(p for p in item.iterdir() if p.is_file() and p.name.lower().endswith(CAPTURE_SUFFIXES))
            if not found:
                raise CaptureError(f"{item}: directory holds no capture files (*.pcap, *.pcapng, optionally .gz)")
            captures.extend(CaptureInput(capture_name(p), (p,)) for p in found)
        elif not item.exists():
            raise CaptureError(f"{item}: no such file")
        else:
            captures.append(CaptureInput(capture_name(item), (item,)))
    dupes = [n for n, c in collections.Counter(c.name for c in captures).items() if c > 1]
    if dupes:
        raise CaptureError(f"two inputs share the capture name {dupes[0]!r}; rename one of them")
    return captures


@dataclass(slots=True)
class _Stream:
    """What the pipeline keeps per TCP direction while decoding."""
    flow_id: int
    key: tuple
    stream_id: int
    syn_seen: bool
    zmtp: ZmtpDecoder | None = None
    ps: pslite.PsliteDecoder | None = None
    is_pslite: bool | None = None       # None: undecided, until the first message
    app: object | None = None           # the collective-library decoder that claimed it (APP_DECODERS)
    held: list = field(default_factory=list)   # (bytes, ts_ns) seen before the protocol was decided
    held_bytes: int = 0
    declined: set = field(default_factory=set)  # application decoders that said "not mine"
    decided: bool = False
    decode_error: str | None = None
    announced_nodes: list = field(default_factory=list)   # (hostname, port) of ADD_NODE requests it sent


@dataclass
class CaptureResult:
    """One capture decoded on its own: column lists, still without job-wide node resolution."""
    capture: str
    path: str
    streams: dict[str, list]
    zmtp: dict[str, list]
    messages: dict[str, list]
    stream_announced: dict[int, list]          # flow_id → [(hostname, port)] from ADD_NODE requests
    nodes: list[tuple]                         # (node_id, role, hostname, port) from ADD_NODE replies
    collectives: dict[str, list] = field(default_factory=dict)
    packets: int = 0
    bytes_read: int = 0
    non_tcp_packets: int = 0
    parse_stats: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    undecoded_messages: int = 0
    bulk_packets: int = 0                      # TCP packets the batch decoder applied in bulk


_ZMTP_GREETING_SIGNATURE_END = 0x7F
# Bytes of a TCP direction the decoders may look at before they must say whether it is theirs.
PREFIX_BYTES = 64
# The collective-library decoders, offered every TCP direction that is not ZMTP 2.0/3.x, in this order.
APP_DECODERS = (GlooCaptureDecoder, NcclSocketCaptureDecoder, RoceCaptureDecoder)


def _zmtp_signature(prefix: bytes) -> bool | None:
    """ZMTP 2.0/3.x greeting signature (0xFF, 8 padding bytes, 0x7F): True/False, None while unknown."""
    if not prefix:
        return None
    if prefix[0] != 0xFF:
        return False
    return None if len(prefix) < 10 else prefix[9] == _ZMTP_GREETING_SIGNATURE_END


def _looks_like_zmtp10(prefix: bytes) -> bool:
    """ZMTP 1.0 (or its long form): a short identity frame `len flags` with flags 0, or 0xFF + 8-byte
    length. Weak on its own: asked only once no other decoder claimed the stream."""
    if len(prefix) >= 10 and prefix[0] == 0xFF:
        return (prefix[9] & 0x01) == 0
    return len(prefix) >= 2 and prefix[1] == 0 and len(prefix) >= prefix[0] + 1 and prefix[0] >= 1


# Columns in which the collective-library decoders name a TCP direction by the reassembler's stream number.
_STREAM_ID_COLUMNS = {"nccl_control_stream_id": "nccl_control_flow_id",
                      "nccl_setup_stream_id": "nccl_setup_flow_id"}


def _column_length(columns: dict[str, list]) -> int:
    return len(next(iter(columns.values()))) if columns else 0


def _append_row(columns: dict[str, list], row: dict) -> None:
    """Append one row to aligned column lists; a column new to them is null in the rows before."""
    n = _column_length(columns)
    for name in row.keys() - columns.keys():
        columns[name] = [None] * n
    for name, values in columns.items():
        values.append(row.get(name))


def _set_cell(columns: dict[str, list], name: str, i: int, value) -> None:
    if name not in columns:
        columns[name] = [None] * _column_length(columns)
    columns[name][i] = value


class _CaptureDecoder:
    def __init__(self, capture: str, flow_id_base: int):
        self.capture = capture
        self.flow_id_base = flow_id_base
        self.tcp = TcpReassembler()
        self.streams: dict[int, _Stream] = {}
        self.zmtp_rows: dict[str, list] = collections.defaultdict(list)
        self.msg_rows: dict[str, list] = {}      # aligned columns: filled through _append_row
        self.nodes: list[tuple] = []
        self.undecoded_messages = 0
        self.apps = [cls() for cls in APP_DECODERS]
        self.app_rows: list[tuple] = []      # (decoder, CaptureRows) once finished

    # -- TCP events -----------------------------------------------------------------------
    def on_tcp_event(self, ev) -> None:
        if isinstance(ev, StreamData):
            st = self.streams[ev.stream_id]
            if st.zmtp is not None:
                st.zmtp.receive_data(ev.data, ev.ts_ns)
                self._drain(st)
            elif st.app is not None:
                st.app.on_data(st.stream_id, ev.data, ev.ts_ns)
            elif not st.decided:
                st.held.append((bytes(ev.data), ev.ts_ns))
                st.held_bytes += len(ev.data)
                self._decide(st, final=False)
        elif isinstance(ev, StreamGap):
            st = self.streams[ev.stream_id]
            if not st.decided:
                self._decide(st, final=True)
            if st.zmtp is not None:
                st.zmtp.receive_gap(ev.size, ev.ts_ns, lost=ev.lost)
                self._drain(st)
            elif st.app is not None:
                st.app.on_gap(st.stream_id, ev.size, ev.ts_ns)
        elif isinstance(ev, StreamStarted):
            self.streams[ev.stream_id] = _Stream(flow_id=self.flow_id_base + ev.stream_id, key=ev.key,
                                                 stream_id=ev.stream_id, syn_seen=ev.syn_seen)
        elif isinstance(ev, StreamEnded):
            st = self.streams[ev.stream_id]
            if not st.decided:
                self._decide(st, final=True)
            if st.zmtp is not None:
                st.zmtp.receive_data(b"", ev.ts_ns)
                self._drain(st)
            elif st.app is not None:
                st.app.on_end(st.stream_id, ev.ts_ns)

    def on_other_packet(self, linktype: int, data, ts_ns: int) -> None:
        """A packet that is no TCP segment (UDP, RoCEv1...): offered to the decoders that read packets."""
        packet = Packet(ts_ns, linktype, data, len(data), 0)
        for app in self.apps:
            on_packet = getattr(app, "on_packet", None)
            if on_packet is not None and on_packet(packet):
                return

    def skippable_bytes(self, stream_id: int) -> int:
        """How many of the stream's next bytes need not be seen (decoders.fastpath.StreamConsumer)."""
        st = self.streams[stream_id]
        if st.zmtp is not None:
            return st.zmtp.skippable_bytes()
        return UNLIMITED_SKIP_BYTES if st.decided and st.app is None else 0

    def skip_bytes(self, stream_id: int, size: int, ts_ns: int) -> None:
        zmtp = self.streams[stream_id].zmtp
        if zmtp is not None:
            zmtp.skip(size, ts_ns)

    def _decide(self, st: _Stream, *, final: bool) -> None:
        """Whose is this TCP direction? ZMTP 2.0/3.x by its signature; else the first collective-library
        decoder that claims it; else ZMTP 1.0 or, caught mid-connection, ZMTP by resynchronisation on
        ps-lite metas; else plain TCP. Held bytes go to the winner."""
        prefix = b"".join(chunk for chunk, _ in st.held)[:PREFIX_BYTES]
        signature = _zmtp_signature(prefix)
        if signature is None and not final:
            return
        winner = None
        if not (signature and st.syn_seen):
            waiting = False
            for app in self.apps:
                if app in st.declined:
                    continue
                verdict = app.claim(st.stream_id, st.key, st.syn_seen, prefix)
                if verdict:
                    winner = app
                    break
                if verdict is None:
                    waiting = True
                else:
                    st.declined.add(app)
            if winner is None and waiting and not final and len(prefix) < PREFIX_BYTES:
                return
        st.decided = True
        held, st.held, st.held_bytes = st.held, [], 0
        if winner is not None:
            st.app = winner
            for chunk, ts_ns in held:
                winner.on_data(st.stream_id, memoryview(chunk), ts_ns)
            return
        if signature and st.syn_seen:
            self._start_zmtp(st, midstream=False)
        elif not st.syn_seen or not held:
            self._start_zmtp(st, midstream=True)     # its start is not in the capture
        elif _looks_like_zmtp10(prefix):
            self._start_zmtp(st, midstream=False)
        else:
            return                                   # plain TCP
        for chunk, ts_ns in held:
            st.zmtp.receive_data(chunk, ts_ns)
        self._drain(st)

    def _start_zmtp(self, st: _Stream, *, midstream: bool) -> None:
        st.decided = True
        st.ps = pslite.PsliteDecoder()
        st.zmtp = ZmtpDecoder(keep_body=st.ps.keep_body, midstream=midstream,
                              frame_validator=pslite.looks_like_meta)

    # -- ZMTP events ----------------------------------------------------------------------
    def _drain(self, st: _Stream) -> None:
        dec = st.zmtp
        while (ev := dec.next_event()) is not NEED_DATA:
            if isinstance(ev, Message):
                self._zmtp_row(st, ev, None)
                self._on_message(st, ev)
            elif isinstance(ev, Command):
                self._zmtp_row(st, ev, ev.name)
            elif isinstance(ev, DecodeFailed):
                st.decode_error = f"offset {ev.offset}: {ev.reason}"
            elif isinstance(ev, (Greeting, Resync)):
                pass   # visible through the decoder's state (version, lost_bytes, resyncs)

    def _zmtp_row(self, st: _Stream, ev, command: str | None) -> None:
        rows = self.zmtp_rows
        rows["flow_id"].append(st.flow_id)
        rows["ts_first_ns"].append(ev.ts_first_ns)
        rows["ts_last_ns"].append(ev.ts_last_ns)
        rows["command"].append(command)
        rows["frame_sizes"].append(list(ev.frame_sizes) if command is None else [ev.size_bytes])
        rows["size_bytes"].append(sum(ev.frame_sizes) if command is None else ev.size_bytes)
        rows["complete"].append(ev.complete)

    def _on_message(self, st: _Stream, ev: Message) -> None:
        if st.is_pslite is False:
            return
        try:
            msg = st.ps.decode(ev.frame_sizes, ev.frames, ev.complete)
        except DecodeError:
            if st.is_pslite is None and ev.complete:
                st.is_pslite = False        # a ZMTP stream, but not ps-lite
            else:
                self.undecoded_messages += 1
            return
        st.is_pslite = True
        meta = msg.meta
        if meta.control_cmd == pslite.ADD_NODE:
            if meta.request or any(n.id is None for n in meta.nodes):
                st.announced_nodes.extend((n.hostname, n.port) for n in meta.nodes)
            else:
                self.nodes.extend((n.id, n.role, n.hostname, n.port) for n in meta.nodes)
        _append_row(self.msg_rows, {
            "flow_id": st.flow_id, "ts_first_ns": ev.ts_first_ns, "ts_last_ns": ev.ts_last_ns,
            "request": meta.request, "push": meta.push, "pull": meta.pull, "simple_app": meta.simple_app,
            "ps_timestamp": meta.timestamp, "head": meta.head, "app_id": meta.app_id,
            "customer_id": meta.customer_id, "control_cmd": meta.control_cmd,
            "data_sizes": list(msg.data_sizes), "size_bytes": msg.size_bytes, "keys": list(msg.keys),
            "lens": list(msg.lens) if msg.lens is not None else None, "complete": msg.complete,
            "meta_bytes": ev.frame_sizes[1 if msg.routing_id is not None else 0],
            "barrier_group": meta.barrier_group, "flavor": meta.flavor,
        })

    # -- end of capture -------------------------------------------------------------------
    def finish(self) -> None:
        for ev in self.tcp.finish():
            self.on_tcp_event(ev)
        for st in self.streams.values():
            if st.zmtp is not None:
                st.zmtp.receive_data(b"", 0)
                self._drain(st)
        self.app_rows = [(app, app.finish()) for app in self.apps]

    def _flow_ids(self, row: dict) -> dict:
        """A decoder's row with the TCP directions it names by stream number named by flow_id."""
        row = dict(row)
        for stream_column, flow_column in _STREAM_ID_COLUMNS.items():
            if stream_column in row:
                value = row.pop(stream_column)
                row[flow_column] = None if value is None else self.flow_id_base + value
        return row

    def app_columns(self, streams: dict[str, list]) -> dict[str, list]:
        """Fold the collective-library decoders' rows in: their messages after ps-lite's (in `msg_rows`),
        their TCP-direction columns into `streams`, their own stream rows (RoCE) after the TCP ones.
        Returns the collectives' columns and adds to `streams` in place."""
        collectives: dict[str, list] = collections.defaultdict(list)
        row_of_stream = {flow: i for i, flow in enumerate(streams["flow_id"])}
        next_flow = self.flow_id_base + len(self.tcp.streams)
        for app, rows in self.app_rows:
            extra_flow = {}
            for index, row in enumerate(rows.extra_streams):
                extra_flow[index] = next_flow
                _append_row(streams, {**row, "flow_id": next_flow})
                next_flow += 1
            for stream_id, columns in rows.streams.items():
                i = row_of_stream[self.flow_id_base + stream_id]
                for name, value in self._flow_ids(columns).items():
                    _set_cell(streams, name, i, value)
            for row in rows.messages:
                row = self._flow_ids(row)
                stream_id = row.pop("stream_id", None)
                if stream_id is not None:
                    row["flow_id"] = self.flow_id_base + stream_id
                elif row.get("extra_stream") is not None:
                    row["flow_id"] = extra_flow[row["extra_stream"]]
                row.setdefault("protocol", app.protocol)
                _append_row(self.msg_rows, row)
            for row in rows.collectives:
                _append_row(collectives, row)
        return collectives

    def stream_columns(self) -> dict[str, list]:
        cols: dict[str, list] = collections.defaultdict(list)
        by_key = {}
        for sid, st in self.streams.items():
            by_key[st.key] = st.flow_id
        for sid, st in self.streams.items():
            info = self.tcp.streams[sid]
            src, sport, dst, dport = st.key
            z = st.zmtp
            # A stream caught mid-connection has no greeting (version None) but may well be ZMTP.
            is_zmtp = z is not None and (z.version is not None or z.messages > 0 or z.commands > 0)
            cols["flow_id"].append(st.flow_id)
            cols["src_ip"].append(ip_to_str(src))
            cols["src_port"].append(sport)
            cols["dst_ip"].append(ip_to_str(dst))
            cols["dst_port"].append(dport)
            cols["first_ts_ns"].append(info.first_ts_ns)
            cols["last_ts_ns"].append(info.last_ts_ns)
            cols["packets"].append(info.packets)
            cols["bytes"].append(info.bytes)
            cols["missing_bytes"].append(info.missing_bytes)
            cols["uncaptured_bytes"].append(info.uncaptured_bytes)
            cols["retransmitted_bytes"].append(info.retransmitted_bytes)
            cols["protocol"].append(("pslite" if st.is_pslite else "zmtp") if is_zmtp else "tcp")
            cols["zmtp_version"].append(z.version if is_zmtp else None)
            cols["mechanism"].append(z.mechanism if is_zmtp else None)
            cols["socket_type"].append(z.socket_type if is_zmtp else None)
            ident = z.identity if is_zmtp else None
            cols["identity"].append(ident.decode("latin-1") if ident is not None else None)
            cols["encrypted"].append(bool(z.encrypted) if is_zmtp else False)
            cols["reverse_flow_id"].append(by_key.get((dst, dport, src, sport)))
            cols["syn_seen"].append(info.syn_seen)
            cols["fin_seen"].append(info.fin_seen)
            cols["rst_seen"].append(info.rst_seen)
            cols["lost_bytes"].append(z.lost_bytes if z is not None else 0)
            cols["resyncs"].append(z.resyncs if z is not None else 0)
            cols["decode_error"].append(st.decode_error if is_zmtp else None)
        return cols


def decode_capture(capture: Path | CaptureInput, *, flow_id_base: int = 0, progress: ProgressFn | None = None,
                   batched: bool = True) -> CaptureResult:
    """Decode one capture (a file, or a daemon's rotated files in order) on its own (no job-wide
    resolution yet).

    batched=False decodes packet by packet (`fastpath.feed_packet` for each): the reference the batch
    decoder must match exactly, and several times slower."""
    if not isinstance(capture, CaptureInput):
        capture = CaptureInput(capture_name(Path(capture)), (Path(capture),))
    path = capture.path
    dec = _CaptureDecoder(capture.name, flow_id_base)
    stats = ParseStats()
    batches = BatchDecoder(dec.tcp, dec, stats)
    reported = 0
    done_bytes = 0

    def report(pos: int) -> None:
        nonlocal reported
        if progress is not None:
            progress(done_bytes + pos - reported)
            reported = done_bytes + pos

    packets, bytes_read, warnings = 0, 0, []
    for file in capture.files:
        reported = done_bytes = bytes_read
        with open_capture(file) as reader:
            for n, item in enumerate(reader.batches() if batched else reader, 1):
                batches.feed(item)          # a Packet goes the per-packet way
                if batched or not n & 0x3FF:
                    report(reader.bytes_read)
            report(reader.total_bytes)
            packets += reader.packets
            bytes_read += reader.total_bytes
            warnings += reader.warnings
    dec.finish()
    for linktype in sorted(batches.unsupported_linktypes):
        try:
            check_linktype(linktype)
        except UnsupportedLinktype as exc:
            if stats.unknown_linktype == packets:
                raise CaptureError(f"{path}: {exc}") from None
            warnings.append(f"{path}: {stats.unknown_linktype} packets skipped: {exc}")
    streams = dec.stream_columns()
    collectives = dec.app_columns(streams)
    announced = {st.flow_id: st.announced_nodes for st in dec.streams.values() if st.announced_nodes}
    return CaptureResult(
        capture=capture.name, path=str(path), streams=dict(streams), zmtp=dict(dec.zmtp_rows),
        messages=dict(dec.msg_rows), stream_announced=announced, nodes=dec.nodes, collectives=dict(collectives),
        packets=packets, bytes_read=bytes_read, non_tcp_packets=batches.non_tcp_packets,
        parse_stats=stats.as_dict(), warnings=warnings, undecoded_messages=dec.undecoded_messages,
        bulk_packets=batches.bulk_packets,
    )


# -- the job-wide view ------------------------------------------------------------------------

ROLE_NAMES = {pslite.ROLE_SERVER: "server", pslite.ROLE_WORKER: "worker", pslite.ROLE_SCHEDULER: "scheduler"}


@dataclass
class Dataset:
    tables: dict[str, pa.Table]
    summary: dict


def _concat(results: list[CaptureResult], attr: str) -> dict[str, list]:
    """Concatenate one kind of column lists over captures, adding the `capture` column; a column some
    captures lack is null in their rows."""
    names = {name for res in results for name in getattr(res, attr)} - {"capture"}
    out: dict[str, list] = {name: [] for name in names | {"capture"}}
    for res in results:
        cols = getattr(res, attr)
        n = _column_length(cols)
        for name in names:
            out[name].extend(cols.get(name, [None] * n))
        out["capture"].extend([res.capture] * n)
    return out


def _node_table(results: list[CaptureResult]) -> dict[int, tuple[str, str, int]]:
    """node id → (role, hostname, port), from every ADD_NODE reply seen in any capture."""
    nodes: dict[int, tuple[str, str, int]] = {}
    for res in results:
        for node_id, role, hostname, port in res.nodes:
            nodes[node_id] = (ROLE_NAMES.get(role, str(role)), hostname, port)
    return nodes


def _resolve_endpoints(streams: dict[str, list], messages: dict[str, list],
                       results: list[CaptureResult], nodes: dict) -> dict[int, tuple[int | None, int | None]]:
    """flow_id → (sender node id, receiver node id) for every ps-lite stream.

    The sender is named by the DEALER's Identity ("ps<id>"); a node's first connection to the scheduler
    has none, so its ADD_NODE request's own (host, port) names it once the scheduler's reply is known.
    The receiver is the ROUTER's listening (ip, port) from the reply's node list; the scheduler is not in
    that list, so a host that only one node lives on, or control requests (only the scheduler gets them),
    name it.
    """
    addr_to_id = {(host, port): nid for nid, (_, host, port) in nodes.items()}
    announced: dict[int, list] = {}
    for res in results:
        announced.update(res.stream_announced)
    flows = streams["flow_id"]
    sender: dict[int, int | None] = {}
    for i, flow in enumerate(flows):
        if streams["protocol"][i] != "pslite":
            continue
        nid = pslite.parse_identity(streams["identity"][i])
        if nid is None:
            for host_port in announced.get(flow, ()):
                nid = addr_to_id.get(host_port)
                if nid is not None:
                    break
        sender[flow] = nid
    ip_ids: dict[str, set] = collections.defaultdict(set)
    for i, flow in enumerate(flows):
        if sender.get(flow) is not None:
            ip_ids[streams["src_ip"][i]].add(sender[flow])
    for nid, (_, host, _) in nodes.items():
        ip_ids[host].add(nid)
    control_request_flows = {
        f for f, cmd, req in zip(messages.get("flow_id", ()), messages.get("control_cmd", ()),
                                 messages.get("request", ()))
        if cmd is not None and req
    }
    resolved: dict[int, tuple[int | None, int | None]] = {}
    for i, flow in enumerate(flows):
        if flow not in sender:
            continue
        src_ip, dst_ip, dst_port = streams["src_ip"][i], streams["dst_ip"][i], streams["dst_port"][i]
        snd = sender[flow]
        if snd is None and len(ip_ids.get(src_ip, ())) == 1:
            snd = next(iter(ip_ids[src_ip]))
        rcv = addr_to_id.get((dst_ip, dst_port))
        if rcv is None:
            peers = ip_ids.get(dst_ip, set()) - ({snd} if snd is not None else set())
            if len(peers) == 1 and dst_ip != src_ip:
                rcv = next(iter(peers))
            elif flow in control_request_flows:
                rcv = pslite.SCHEDULER_ID
        resolved[flow] = (snd, rcv)
    return resolved


def _attribute(messages: dict[str, list], roles: list, ranks_by_id: dict, num_servers: int) -> int:
    """Fill tensor attribution columns in place (MXNet or BytePS, by the meta's flavor).

    Returns how many KV messages could not be attributed."""
    n = len(messages.get("flow_id", ()))
    unattributed = 0
    tensor_key, server_rank, req_type, dtype, part, rows, app_cmd = ([None] * n for _ in range(7))
    for i in range(n):
        head = messages["head"][i]
        if messages["control_cmd"][i] is not None or head is None:
            continue
        flavor = messages["flavor"][i]
        snd_role, rcv_role = roles[i]
        server_id = messages["sender_id"][i] if snd_role == "server" else (
            messages["recver_id"][i] if rcv_role == "server" else None)
        if server_id is not None:
            server_rank[i] = ranks_by_id[server_id]
        keys = messages["keys"][i]
        try:
            if messages["simple_app"][i]:
                if flavor == "dmlc":
                    app_cmd[i] = mxnet.simple_app_command(head)
                continue
            if flavor == "dmlc":
                req_type[i], dtype[i] = mxnet.decode_head(head)
            if server_id is None or not keys or num_servers == 0:
                continue
            if flavor == "dmlc":
                attr = mxnet.attribute(keys, messages["lens"][i], server_rank[i], num_servers, req_type[i])
                tensor_key[i], part[i], rows[i] = attr.tensor_key, attr.part, attr.rows
            else:
                tensor_key[i], part[i] = byteps.attribute(keys[0], server_rank[i], num_servers)
        except DecodeError:
            unattributed += 1     # not MXNet's head, or keys outside the server's range (servers missing?)
    messages.update(tensor_key=tensor_key, server_rank=server_rank, req_type=req_type, dtype=dtype,
                    part=part, rows=rows, simple_app_cmd=app_cmd)
    return unattributed


def _attribute_responses(messages: dict[str, list]) -> None:
    """A response without keys (a plain push response) names its tensor through its request.

    ps-lite echoes the request's customer_id and timestamp in the response, which travels the other way
    between the same two nodes; within one capture that pair is unique."""
    cols = ("capture", "sender_id", "recver_id", "customer_id", "ps_timestamp")
    requests = {}
    for i, is_request in enumerate(messages.get("request", ())):
        if is_request and messages["tensor_key"][i] is not None:
            requests[tuple(messages[c][i] for c in cols)] = i
    for i, is_request in enumerate(messages.get("request", ())):
        if is_request or messages["tensor_key"][i] is not None or messages["control_cmd"][i] is not None:
            continue
        capture, snd, rcv, customer, ts = (messages[c][i] for c in cols)
        j = requests.get((capture, rcv, snd, customer, ts))
        if j is not None:
            for col in ("tensor_key", "part", "req_type", "dtype"):
                messages[col][i] = messages[col][j]


def _mark_router_sides(streams: dict[str, list], endpoints: dict) -> None:
    """The ROUTER side of a ps-lite connection (greeting and READY only) belongs to ps-lite too."""
    for i, reverse in enumerate(streams["reverse_flow_id"]):
        if reverse in endpoints and streams["protocol"][i] == "zmtp":
            streams["protocol"][i] = "pslite"
            streams["node_id"][i] = endpoints[reverse][1]


def build_dataset(results: list[CaptureResult]) -> Dataset:
    """Merge per-capture results into the contract tables, resolving ps-lite nodes job-wide."""
    from dlcsniff.decoders.schema import MESSAGES_SCHEMA, table_from_columns

    streams = _concat(results, "streams")
    zmtp = _concat(results, "zmtp")
    messages = _concat(results, "messages")
    for name in MESSAGES_SCHEMA.names:       # a capture with no ps-lite at all still has every column
        messages.setdefault(name, [None] * _column_length(messages))
    nodes = _node_table(results)
    endpoints = _resolve_endpoints(streams, messages, results, nodes)

    streams["node_id"] = [endpoints.get(f, (None, None))[0] for f in streams["flow_id"]]
    role_of = {nid: role for nid, (role, _, _) in nodes.items()}
    role_of.setdefault(pslite.SCHEDULER_ID, "scheduler")
    n_msgs = len(messages.get("flow_id", ()))
    sender_ids = [endpoints.get(f, (None, None))[0] for f in messages.get("flow_id", ())]
    recver_ids = [endpoints.get(f, (None, None))[1] for f in messages.get("flow_id", ())]
    messages["sender_id"] = sender_ids
    messages["recver_id"] = recver_ids
    messages["sender_role"] = [role_of.get(s, pslite.role_of_id(s)) for s in sender_ids]
    messages["recver_role"] = [role_of.get(r, pslite.role_of_id(r)) for r in recver_ids]
    messages["protocol"] = [p or "pslite" for p in messages.get("protocol", [None] * n_msgs)]
    server_ids = sorted(nid for nid, role in role_of.items() if role == "server")
    ranks_by_id = {nid: pslite.server_rank(nid) for nid in server_ids}
    for nid in set(sender_ids) | set(recver_ids):
        if nid is not None and pslite.role_of_id(nid) == "server":
            ranks_by_id.setdefault(nid, pslite.server_rank(nid))
    num_servers = len(ranks_by_id)
    unattributed = _attribute(messages, list(zip(messages["sender_role"], messages["recver_role"])),
                              ranks_by_id, num_servers)
    _attribute_responses(messages)
    _mark_router_sides(streams, endpoints)

    node_cols: dict[str, list] = collections.defaultdict(list)
    for nid in sorted(nodes):
        role, host, port = nodes[nid]
        node_cols["node_id"].append(nid)
        node_cols["role"].append(role)
        node_cols["rank"].append(pslite.rank_of_id(nid))
        node_cols["hostname"].append(host)
        node_cols["port"].append(port)

    tables = {
        "streams": table_from_columns("streams", streams),
        "zmtp": table_from_columns("zmtp", zmtp),
        "messages": table_from_columns("messages", messages),
        "nodes": table_from_columns("nodes", node_cols),
        "collectives": table_from_columns("collectives", _concat(results, "collectives")),
    }
    summary = _summary(results, tables)
    summary["unattributed_messages"] = unattributed
    return Dataset(tables=tables, summary=summary)


ROCE_COUNTERS = ("packets", "bytes", "bad_icrc", "cnp", "retransmitted_packets", "naks", "lost_packets")


def _summary(results: list[CaptureResult], tables: dict[str, pa.Table]) -> dict:
    streams = tables["streams"].to_pandas()
    tcp = streams[streams["syn_seen"].notna()]              # TCP directions (RoCE rows have no handshake)
    roce = streams[streams["protocol"] == "roce"]
    messages = tables["messages"].select(["protocol", "complete", "control_cmd"]).to_pandas()
    zmtp = tables["zmtp"].select(["command", "complete"]).to_pandas()
    collectives = tables["collectives"].select(["protocol", "kind"]).to_pandas()
    return {
        "captures": [
            {"capture": r.capture, "path": r.path, "packets": r.packets, "non_tcp_packets": r.non_tcp_packets,
             "warnings": r.warnings, "parse": r.parse_stats, "undecoded_messages": r.undecoded_messages}
            for r in results
        ],
        "packets": sum(r.packets for r in results),
        "flows_by_protocol": streams.groupby("protocol").size().to_dict() if len(streams) else {},
        "tcp_bytes": int(tcp["bytes"].sum()),
        "missing_bytes": int(tcp["missing_bytes"].sum()),
        "uncaptured_bytes": int(tcp["uncaptured_bytes"].sum()),
        "retransmitted_bytes": int(tcp["retransmitted_bytes"].sum()),
        "streams_with_holes": int((tcp["missing_bytes"] > 0).sum()),
        "midstream_streams": int((tcp["syn_seen"] == False).sum()),  # noqa: E712 (a nullable column)
        "zmtp_lost_bytes": int(tcp["lost_bytes"].sum()),
        "roce": {name: int(roce[name].sum()) for name in ROCE_COUNTERS} if len(roce) else {},
        "zmtp_messages": int(zmtp["command"].isna().sum()),
        "zmtp_commands": int(zmtp["command"].notna().sum()),
        "messages": len(messages),
        "messages_by_protocol": messages.groupby("protocol").size().to_dict() if len(messages) else {},
        "incomplete_messages": int((~messages["complete"].fillna(False).astype(bool)).sum()),
        "control_messages": int(messages["control_cmd"].notna().sum()),
        "collectives_by_kind": {f"{protocol}/{kind}": n for (protocol, kind), n in
                                collectives.groupby(["protocol", "kind"]).size().items()},
        "undecoded_messages": sum(r.undecoded_messages for r in results),
        "nodes": tables["nodes"].num_rows,
        "warnings": [w for r in results for w in r.warnings],
    }


def decode_paths(inputs: Iterable[Path], *, progress_total: Callable[[int], ProgressFn] | None = None,
                 workers: int | None = None) -> Dataset:
    """Decode captures (files or directories of them) of one job into one dataset.

    Captures are decoded in `workers` forked processes (default: one per core, when the input is large
    enough for it to pay; 0: in this process), while this one loads what building the tables needs."""
    paths = expand_inputs(inputs)
    sizes = [capture.size_bytes for capture in paths]
    if not hasattr(os, "fork"):
        workers = 0
    elif workers is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        workers = min(len(paths), cores) if sum(sizes) >= FORK_MIN_BYTES else 0
    jobs = [(capture, index << FLOW_ID_CAPTURE_SHIFT) for index, capture in enumerate(paths)]
    if workers <= 0:
        progress = progress_total(sum(sizes)) if progress_total else None
        results = [decode_capture(path, flow_id_base=base, progress=progress) for path, base in jobs]
    else:
        results = _decode_forked(jobs, sizes, workers, progress_total)
    return with_processes(build_dataset(results), paths)


def with_processes(dataset: Dataset, captures: list[CaptureInput]) -> Dataset:
    """Captures from a capture daemon's directories: who owned each connection, and when libzmq was
    handed each message (decoders.processes)."""
    if all(c.directory is None for c in captures):
        return dataset
    from dlcsniff.decoders.processes import join_processes
    return join_processes(dataset, captures)


# -- decoding in forked workers ---------------------------------------------------------------------------

FORK_MIN_BYTES = 8 << 20        # below this, a worker process costs more than it saves
_FRAME = struct.Struct("<I")    # worker -> parent: length-prefixed pickles ("progress", n) / ("result", r)


class _Worker:
    """One forked process decoding one capture; it writes its progress and result to a pipe."""

    def __init__(self, capture: CaptureInput, flow_id_base: int):
        self.path = path = capture.path
        read_fd, write_fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:                     # the child: decode, report, and leave without cleanup
            os.close(read_fd)
            code = 0
            try:
                with os.fdopen(write_fd, "wb") as out:
                    self._run(out, capture, flow_id_base)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(write_fd)
        self.pipe = os.fdopen(read_fd, "rb", buffering=0)
        self.buffer = bytearray()
        self.outcome: tuple | None = None

    @staticmethod
    def _run(out, capture: CaptureInput, flow_id_base: int) -> None:
        def send(message: tuple) -> None:
            data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
            out.write(_FRAME.pack(len(data)) + data)
            out.flush()

        signal.signal(signal.SIGINT, signal.SIG_DFL)     # the parent handles ^C, and kills us
        try:
            result = decode_capture(capture, flow_id_base=flow_id_base, progress=lambda n: send(("progress", n)))
        except Exception as exc:
            try:
                pickle.dumps(exc)
            except Exception:
                exc = RuntimeError(f"decoding {capture.path} failed:\n{traceback.format_exc()}")
            send(("error", exc))
        else:
            send(("result", result))

    def read(self, progress: ProgressFn | None) -> bool:
        """Take what the pipe holds; True once the worker has said its last word (or died)."""
        chunk = self.pipe.read(1 << 20)
        if not chunk:
            if self.outcome is None:
                self.outcome = ("error", RuntimeError(f"the worker decoding {self.path} died"))
            return True
        self.buffer += chunk
        while len(self.buffer) >= _FRAME.size:
            size = _FRAME.unpack_from(self.buffer)[0]
            if len(self.buffer) < _FRAME.size + size:
                break
            message = pickle.loads(self.buffer[_FRAME.size:_FRAME.size + size])
            del self.buffer[:_FRAME.size + size]
            if message[0] == "progress":
                if progress is not None:
                    progress(message[1])
            else:
                self.outcome = message
        return False

    def close(self, kill: bool) -> None:
        if kill:
            os.kill(self.pid, signal.SIGKILL)
        self.pipe.close()
        os.waitpid(self.pid, 0)


def _decode_forked(jobs: list[tuple[Path, int]], sizes: list[int], workers: int,
                   progress_total: Callable[[int], ProgressFn] | None) -> list[CaptureResult]:
    pending = sorted(range(len(jobs)), key=lambda i: -sizes[i])       # the largest first
    running: dict[int, _Worker] = {}
    outcomes: dict[int, tuple] = {}
    selector = selectors.DefaultSelector()

    def start_next() -> None:
        index = pending.pop(0)
        worker = _Worker(*jobs[index])
        running[index] = worker
        selector.register(worker.pipe, selectors.EVENT_READ, index)

    try:
        for _ in range(min(workers, len(pending))):
            start_next()
        # Forked first: the progress bar's thread and these imports happen while the workers decode.
        progress = progress_total(sum(sizes)) if progress_total else None
        import pandas  # noqa: F401  (building the summary needs it: load it while waiting)
        from dlcsniff.decoders import schema as dataset  # noqa: F401
        while running:
            for key, _ in selector.select():
                index = key.data
                worker = running[index]
                if worker.read(progress):
                    selector.unregister(worker.pipe)
                    worker.close(kill=False)
                    del running[index]
                    outcomes[index] = worker.outcome
                    if outcomes[index][0] == "error":
                        raise outcomes[index][1]
                    if pending:
                        start_next()
    finally:
        for worker in running.values():
            worker.close(kill=True)
        selector.close()
    return [outcomes[i][1] for i in range(len(jobs))]
