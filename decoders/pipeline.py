"""Capture files → packets → TCP streams → ZMTP → ps-lite, collected into the decode tables.

The one place that wires the sans-IO layers together. Each capture is decoded on its own
(`decode_capture`, picklable results so captures can be decoded in parallel); `build_dataset`
then resolves what only the whole job reveals — ps-lite node ids, roles and tensor keys — and
returns the contract tables (see `decoders.dataset`).
"""
from __future__ import annotations

import collections
import os
import pickle
import selectors
import signal
import struct
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from decoders import byteps, mxnet, pslite
from decoders.capture import CaptureError, open_capture
from decoders.errors import DecodeError
from decoders.fastpath import BatchDecoder
from decoders.packet import ParseStats, UnsupportedLinktype, check_linktype, ip_to_str
from decoders.tcp import StreamData, StreamEnded, StreamGap, StreamStarted, TcpReassembler
from decoders.zmtp import (NEED_DATA, UNLIMITED_SKIP_BYTES, Command, DecodeFailed, Greeting, Message, Resync,
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


def expand_inputs(inputs: Iterable[Path]) -> list[Path]:
    """Files as given; a directory stands for the capture files directly inside it."""
    paths: list[Path] = []
    for item in inputs:
        item = Path(item)
        if item.is_dir():
            found = sorted(p for p in item.iterdir() if p.is_file() and p.name.lower().endswith(CAPTURE_SUFFIXES))
            if not found:
                raise CaptureError(f"{item}: directory holds no capture files (*.pcap, *.pcapng, optionally .gz)")
            paths.extend(found)
        elif not item.exists():
            raise CaptureError(f"{item}: no such file")
        else:
            paths.append(item)
    names = [capture_name(p) for p in paths]
    dupes = [n for n, c in collections.Counter(names).items() if c > 1]
    if dupes:
        raise CaptureError(f"two inputs share the capture name {dupes[0]!r}; rename one of them")
    return paths


@dataclass(slots=True)
class _Stream:
    """What the pipeline keeps per TCP direction while decoding."""
    flow_id: int
    key: tuple
    zmtp: ZmtpDecoder | None = None
    ps: pslite.PsliteDecoder | None = None
    is_pslite: bool | None = None       # None: undecided, until the first message
    prefix: bytes = b""                 # first bytes, until the protocol is decided
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
    packets: int = 0
    bytes_read: int = 0
    non_tcp_packets: int = 0
    parse_stats: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    undecoded_messages: int = 0
    bulk_packets: int = 0                      # TCP packets the batch decoder applied in bulk


_ZMTP_GREETING_SIGNATURE_END = 0x7F


def _looks_like_zmtp(prefix: bytes) -> bool | None:
    """True/False once enough bytes are known, None while more are needed.

    ZMTP 2.0/3.x: 0xFF, 8 padding bytes, 0x7F (signature). ZMTP 1.0: a short identity frame
    `len flags` with flags 0 (no MORE) — accepted only as the very first bytes of a stream.
    """
    if not prefix:
        return None
    if prefix[0] == 0xFF:
        if len(prefix) < 10:
            return None
        return prefix[9] == _ZMTP_GREETING_SIGNATURE_END or (prefix[9] & 0x01) == 0
    if len(prefix) < 2:
        return None
    return prefix[1] == 0 and len(prefix) >= prefix[0] + 1 and prefix[0] >= 1


class _CaptureDecoder:
    def __init__(self, capture: str, flow_id_base: int):
        self.capture = capture
        self.flow_id_base = flow_id_base
        self.tcp = TcpReassembler()
        self.streams: dict[int, _Stream] = {}
        self.zmtp_rows: dict[str, list] = collections.defaultdict(list)
        self.msg_rows: dict[str, list] = collections.defaultdict(list)
        self.nodes: list[tuple] = []
        self.undecoded_messages = 0

    # -- TCP events -----------------------------------------------------------------------
    def on_tcp_event(self, ev) -> None:
        if isinstance(ev, StreamData):
            st = self.streams[ev.stream_id]
            if st.zmtp is not None:
                st.zmtp.receive_data(ev.data, ev.ts_ns)
                self._drain(st)
            elif not st.decided:
                self._detect(st, ev.data, ev.ts_ns)
        elif isinstance(ev, StreamGap):
            st = self.streams[ev.stream_id]
            if st.zmtp is not None:
                st.zmtp.receive_gap(ev.size, ev.ts_ns)
                self._drain(st)
            elif not st.decided:
                # The protocol's first bytes are lost: try ZMTP resynchronisation on ps-lite metas.
                self._start_zmtp(st, midstream=True)
                st.zmtp.receive_gap(ev.size, ev.ts_ns)
        elif isinstance(ev, StreamStarted):
            st = _Stream(flow_id=self.flow_id_base + ev.stream_id, key=ev.key)
            self.streams[ev.stream_id] = st
            if not ev.syn_seen:
                self._start_zmtp(st, midstream=True)
        elif isinstance(ev, StreamEnded):
            st = self.streams[ev.stream_id]
            if st.zmtp is not None:
                st.zmtp.receive_data(b"", ev.ts_ns)
                self._drain(st)

    def skippable_bytes(self, stream_id: int) -> int:
        """How many of the stream's next bytes need not be seen (decoders.fastpath.StreamConsumer)."""
        st = self.streams[stream_id]
        if st.zmtp is not None:
            return st.zmtp.skippable_bytes()
        return UNLIMITED_SKIP_BYTES if st.decided else 0

    def skip_bytes(self, stream_id: int, size: int, ts_ns: int) -> None:
        zmtp = self.streams[stream_id].zmtp
        if zmtp is not None:
            zmtp.skip(size, ts_ns)

    def _detect(self, st: _Stream, data: memoryview, ts_ns: int) -> None:
        prefix = st.prefix + bytes(data[: 16 - len(st.prefix)]) if len(st.prefix) < 16 else st.prefix
        verdict = _looks_like_zmtp(prefix)
        if verdict is None:
            st.prefix = prefix
            if len(prefix) >= 16:
                st.decided = True
            return
        st.decided = True
        if verdict:
            self._start_zmtp(st, midstream=False)
            if st.prefix:
                st.zmtp.receive_data(st.prefix, ts_ns)
            st.zmtp.receive_data(data, ts_ns)
            self._drain(st)
        st.prefix = b""

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
        r = self.msg_rows
        r["flow_id"].append(st.flow_id)
        r["ts_first_ns"].append(ev.ts_first_ns)
        r["ts_last_ns"].append(ev.ts_last_ns)
        r["request"].append(meta.request)
        r["push"].append(meta.push)
        r["pull"].append(meta.pull)
        r["simple_app"].append(meta.simple_app)
        r["ps_timestamp"].append(meta.timestamp)
        r["head"].append(meta.head)
        r["app_id"].append(meta.app_id)
        r["customer_id"].append(meta.customer_id)
        r["control_cmd"].append(meta.control_cmd)
        r["data_sizes"].append(list(msg.data_sizes))
        r["size_bytes"].append(msg.size_bytes)
        r["keys"].append(list(msg.keys))
        r["lens"].append(list(msg.lens) if msg.lens is not None else None)
        r["complete"].append(msg.complete)
        r["meta_bytes"].append(ev.frame_sizes[1 if msg.routing_id is not None else 0])
        r["barrier_group"].append(meta.barrier_group)
        r["flavor"].append(meta.flavor)

    # -- end of capture -------------------------------------------------------------------
    def finish(self) -> None:
        for ev in self.tcp.finish():
            self.on_tcp_event(ev)
        for st in self.streams.values():
            if st.zmtp is not None:
                st.zmtp.receive_data(b"", 0)
                self._drain(st)

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


def decode_capture(path: Path, *, flow_id_base: int = 0, progress: ProgressFn | None = None,
                   batched: bool = True) -> CaptureResult:
    """Decode one capture file on its own (no job-wide resolution yet).

    batched=False decodes packet by packet (`fastpath.feed_packet` for each): the reference the batch
    decoder must match exactly, and several times slower."""
    name = capture_name(path)
    dec = _CaptureDecoder(name, flow_id_base)
    stats = ParseStats()
    batches = BatchDecoder(dec.tcp, dec, stats)
    reported = 0

    def report(pos: int) -> None:
        nonlocal reported
        if progress is not None:
            progress(pos - reported)
            reported = pos

    with open_capture(path) as reader:
        for n, item in enumerate(reader.batches() if batched else reader, 1):
            batches.feed(item)          # a Packet goes the per-packet way
            if batched or not n & 0x3FF:
                report(reader.bytes_read)
        dec.finish()
        report(reader.total_bytes)
        packets, bytes_read, warnings = reader.packets, reader.bytes_read, list(reader.warnings)
    for linktype in sorted(batches.unsupported_linktypes):
        try:
            check_linktype(linktype)
        except UnsupportedLinktype as exc:
            if stats.unknown_linktype == packets:
                raise CaptureError(f"{path}: {exc}") from None
            warnings.append(f"{path}: {stats.unknown_linktype} packets skipped: {exc}")
    streams = dec.stream_columns()
    announced = {st.flow_id: st.announced_nodes for st in dec.streams.values() if st.announced_nodes}
    return CaptureResult(
        capture=name, path=str(path), streams=dict(streams), zmtp=dict(dec.zmtp_rows),
        messages=dict(dec.msg_rows), stream_announced=announced, nodes=dec.nodes,
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
    """Concatenate one kind of column lists over captures, adding the `capture` column."""
    out: dict[str, list] = collections.defaultdict(list)
    for res in results:
        cols = getattr(res, attr)
        n = len(next(iter(cols.values()))) if cols else 0
        for name, values in cols.items():
            out[name].extend(values)
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
    from decoders.dataset import table_from_columns

    streams = _concat(results, "streams")
    zmtp = _concat(results, "zmtp")
    messages = _concat(results, "messages")
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
    messages["protocol"] = ["pslite"] * n_msgs
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
    }
    summary = _summary(results, tables)
    summary["unattributed_messages"] = unattributed
    return Dataset(tables=tables, summary=summary)


def _summary(results: list[CaptureResult], tables: dict[str, pa.Table]) -> dict:
    streams = tables["streams"].to_pandas()
    messages = tables["messages"].select(["complete", "control_cmd", "sender_role", "recver_role"]).to_pandas()
    zmtp = tables["zmtp"].select(["command", "complete"]).to_pandas()
    return {
        "captures": [
            {"capture": r.capture, "path": r.path, "packets": r.packets, "non_tcp_packets": r.non_tcp_packets,
             "warnings": r.warnings, "parse": r.parse_stats, "undecoded_messages": r.undecoded_messages}
            for r in results
        ],
        "packets": sum(r.packets for r in results),
        "flows_by_protocol": streams.groupby("protocol").size().to_dict() if len(streams) else {},
        "tcp_bytes": int(streams["bytes"].sum()) if len(streams) else 0,
        "missing_bytes": int(streams["missing_bytes"].sum()) if len(streams) else 0,
        "retransmitted_bytes": int(streams["retransmitted_bytes"].sum()) if len(streams) else 0,
        "streams_with_holes": int((streams["missing_bytes"] > 0).sum()) if len(streams) else 0,
        "midstream_streams": int((~streams["syn_seen"]).sum()) if len(streams) else 0,
        "zmtp_lost_bytes": int(streams["lost_bytes"].sum()) if len(streams) else 0,
        "zmtp_messages": int(zmtp["command"].isna().sum()),
        "zmtp_commands": int(zmtp["command"].notna().sum()),
        "messages": len(messages),
        "incomplete_messages": int((~messages["complete"]).sum()),
        "control_messages": int(messages["control_cmd"].notna().sum()),
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
    sizes = [p.stat().st_size for p in paths]
    if not hasattr(os, "fork"):
        workers = 0
    elif workers is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        workers = min(len(paths), cores) if sum(sizes) >= FORK_MIN_BYTES else 0
    jobs = [(path, index << FLOW_ID_CAPTURE_SHIFT) for index, path in enumerate(paths)]
    if workers <= 0:
        progress = progress_total(sum(sizes)) if progress_total else None
        results = [decode_capture(path, flow_id_base=base, progress=progress) for path, base in jobs]
    else:
        results = _decode_forked(jobs, sizes, workers, progress_total)
    return build_dataset(results)


# -- decoding in forked workers ---------------------------------------------------------------------------

FORK_MIN_BYTES = 8 << 20        # below this, a worker process costs more than it saves
_FRAME = struct.Struct("<I")    # worker -> parent: length-prefixed pickles ("progress", n) / ("result", r)


class _Worker:
    """One forked process decoding one capture; it writes its progress and result to a pipe."""

    def __init__(self, path: Path, flow_id_base: int):
        self.path = path
        read_fd, write_fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:                     # the child: decode, report, and leave without cleanup
            os.close(read_fd)
            code = 0
            try:
                with os.fdopen(write_fd, "wb") as out:
                    self._run(out, path, flow_id_base)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(write_fd)
        self.pipe = os.fdopen(read_fd, "rb", buffering=0)
        self.buffer = bytearray()
        self.outcome: tuple | None = None

    @staticmethod
    def _run(out, path: Path, flow_id_base: int) -> None:
        def send(message: tuple) -> None:
            data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
            out.write(_FRAME.pack(len(data)) + data)
            out.flush()

        signal.signal(signal.SIGINT, signal.SIG_DFL)     # the parent handles ^C, and kills us
        try:
            result = decode_capture(path, flow_id_base=flow_id_base, progress=lambda n: send(("progress", n)))
        except Exception as exc:
            try:
                pickle.dumps(exc)
            except Exception:
                exc = RuntimeError(f"decoding {path} failed:\n{traceback.format_exc()}")
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
        from decoders import dataset  # noqa: F401
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
