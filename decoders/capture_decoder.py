"""One capture, decoded on its own: packets → TCP directions → the protocol decoders → column lists.

`decode_capture` reads a capture's files (decoders.inputs), drives the packets through the batch TCP driver
(decoders.tcp_driver), and hands each TCP direction to the protocol decoder that claims it (the registry,
decoders.protocols.REGISTRY, in its order); packets that are no TCP segments are offered to every decoder in
turn. The result (`CaptureResult`) is plain column lists, picklable, so captures can be decoded in parallel
processes; job-wide resolution (decoders.job) comes after.

Deciding a TCP direction: its first bytes (up to PREFIX_BYTES) are held while decoders answer None ("show me
more"); the first decoder in registry order to answer True gets it, held bytes first. When none does, or the
direction loses bytes or ends before anyone decided, each decoder's `claim_fallback` is asked (weak evidence:
ZMTP found by resynchronisation); else the direction stays plain TCP. Bytes lost before anyone decided do not
decide: the decoders judge the bytes after the gap, as for a direction caught mid-connection (offered without
its start), and the winner gets the held bytes and the gap in order. A direction caught mid-connection that
nobody took is offered again, from its next bytes, when a decoder claims its reverse (a capture that starts
inside a large message shows no header in that direction's first bytes); a fallback claim that has said
nothing yet is released for it (`release`).

The capturing host's addresses, where the link layer marks the packets it sent (Linux cooked captures,
`tcpdump -i any`), are handed to every decoder before the capture ends (`receive_capturing_host`): the local
end of a connection no rendezvous places (a two-rank Gloo job has a single connection).
"""
from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field
from pathlib import Path

from dlcsniff.decoders.errors import CaptureError
from dlcsniff.decoders.inputs.capture_file import Packet, RecordBatch, first_last_ts_ns, open_capture
from dlcsniff.decoders.inputs.capture_set import CaptureInput, ProgressFn, capture_name
from dlcsniff.decoders.inputs.selection import PacketSelection, PacketSelector
from dlcsniff.decoders.packet import (DIRECTION_LINKTYPES, Datagram, ParseStats, UnsupportedLinktype, check_linktype,
                                      ip_to_str, outgoing_source, parse_packet)
from dlcsniff.decoders.protocols import protocol_decoders
from dlcsniff.decoders.protocols.base import UNLIMITED_SKIP_BYTES, Count, ExtraStream, Row, StreamColumns, TcpDirection
from dlcsniff.decoders.sansio import NEED_DATA
from dlcsniff.decoders.tcp import StreamData, StreamEnded, StreamGap, StreamStarted, TcpReassembler
from dlcsniff.decoders.tcp_driver import BatchDecoder

# Bytes of a TCP direction the decoders may look at before they must say whether it is theirs.
PREFIX_BYTES = 64
# Pieces (chunks and lost gaps) of an undecided direction held at most: past them, a gap decides.
MAX_HELD_PIECES = 256
# Pieces of one capture further apart than this are reported (a rotation itself loses no time).
GAP_WARN_NS = 1_000_000_000
# Enough packets to meet the capturing host's own: a capture on a host holds what it sends as much as what it
# receives.
CAPTURING_HOST_PACKETS = 10_000
TCP_STREAM_COLUMNS = ("flow_id", "src_ip", "src_port", "dst_ip", "dst_port", "ts_first_ns", "ts_last_ns", "packets",
                      "bytes", "missing_bytes", "uncaptured_bytes", "retransmitted_bytes", "protocol", "encrypted",
                      "reverse_flow_id", "syn_seen", "fin_seen", "rst_seen", "lost_bytes", "resyncs", "seq_base",
                      "zero_windows", "zero_window_ns")


@dataclass(slots=True)
class _Direction:
    """What the capture decoder keeps per TCP direction."""
    flow_id: int
    offer: TcpDirection
    owner: object | None = None                 # the protocol decoder that claimed it
    decided: bool = False
    held: list = field(default_factory=list)    # (bytes, ts_ns) or a lost StreamGap, before it was decided
    prefix_from: int = 0                        # held items after the last lost gap: what the decoders judge
    declined: set = field(default_factory=set)  # decoders that said "not mine"
    ended: bool = False
    tentative: bool = False                     # its owner took it on weak evidence (claim_fallback)
    resumed_at: int | None = None               # offered again: the stream offset its held pieces start at


@dataclass
class CaptureResult:
    """One capture decoded on its own: column lists per table, still without job-wide resolution.

    tables: streams, zmtp, messages, and the protocols' capture-level tables (pslite_nodes, pslite_announced,
    gloo_sequence_space); counts: the protocols' counters (undecoded_messages...); unclaimed_udp: datagrams no
    protocol took, by service port; unclaimed_packets: packets neither TCP nor UDP that no protocol took."""
    capture: str
    path: str
    tables: dict[str, dict[str, list]]
    counts: dict[str, int] = field(default_factory=dict)
    unclaimed_udp: dict[int, int] = field(default_factory=dict)
    unclaimed_packets: int = 0
    packets: int = 0
    bytes_read: int = 0
    non_tcp_packets: int = 0
    parse_stats: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    bulk_packets: int = 0                      # TCP packets the batch decoder applied in bulk
    # of each file read: path, packets, ts_first_ns, ts_last_ns, snaplen (its interfaces' smallest; 0: none),
    # dropped (packets the capture tool recorded as dropped before it got them: a pcapng's statistics, a capture
    # daemon's capture.json (decoders.job); None: not recorded)
    files: list[dict] = field(default_factory=list)
    packets_decoded: int = 0                   # the packets a selection (filter, time window) kept: all without one
    first_ts_ns: int | None = None             # the capture's first and last packet (read, selected or not)
    last_ts_ns: int | None = None
    sha256: list[str | None] = field(default_factory=list)   # of each file read, as stored (None: a stream)


def _column_length(columns: dict[str, list]) -> int:
    return len(next(iter(columns.values()))) if columns else 0


def append_row(columns: dict[str, list], row: dict) -> None:
    """Append one row to aligned column lists; a column new to them is null in the rows before."""
    n = _column_length(columns)
    for name in row.keys() - columns.keys():
        columns[name] = [None] * n
    for name, values in columns.items():
        values.append(row.get(name))


class CaptureDecoder:
    """The per-capture dispatch: a consumer of the TCP driver's events (decoders.tcp_driver.StreamConsumer)."""

    def __init__(self, flow_id_base: int = 0, protocols: list | None = None):
        self.flow_id_base = flow_id_base
        self.tcp = TcpReassembler()
        self.protocols = protocol_decoders() if protocols is None else protocols
        self.directions: dict[int, _Direction] = {}
        self._direction_of_key: dict[tuple, int] = {}      # the latest direction of each 4-tuple
        # Directions whose bytes it let pass unseen and wants to see again (decoders.tcp_driver)
        self.offered_again: list[int] = []
        self.unclaimed_udp: collections.Counter[int] = collections.Counter()   # service port -> datagrams
        self.unclaimed_packets = 0          # neither TCP nor UDP, and no protocol's (ARP, ICMP...)
        self.capturing_host: set[bytes] = set()     # addresses the link layer says the capturing host sent from
        self._host_packets_left = CAPTURING_HOST_PACKETS

    # -- TCP events -----------------------------------------------------------------------------------
    def on_tcp_event(self, ev) -> None:
        cls = ev.__class__
        if cls is StreamData:
            d = self.directions[ev.stream_id]
            if d.owner is not None:
                d.owner.receive_data(ev.stream_id, ev.data, ev.ts_ns)
            elif not d.decided:
                if d.resumed_at == -1:
                    d.resumed_at = ev.offset
                d.held.append((bytes(ev.data), ev.ts_ns))
                self._decide(d, final=False)
        elif cls is StreamGap:
            d = self.directions[ev.stream_id]
            if d.resumed_at == -1 and not d.decided:
                d.resumed_at = ev.offset
            if not d.decided and ev.lost and len(d.held) < MAX_HELD_PIECES:
                # Judged on what follows, as a direction caught mid-connection; held for the winner in order.
                d.held.append(ev)
                d.prefix_from = len(d.held)
                d.offer = TcpDirection(d.offer.stream_id, d.offer.key, False)
                d.declined.clear()
                return
            if not d.decided:
                self._decide(d, final=True)
            if d.owner is not None:
                d.owner.receive_gap(ev.stream_id, ev.size, ev.ts_ns, ev.lost)
        elif cls is StreamStarted:
            self.directions[ev.stream_id] = _Direction(self.flow_id_base + ev.stream_id,
                                                       TcpDirection(ev.stream_id, ev.key, ev.syn_seen))
            self._direction_of_key[ev.key] = ev.stream_id
        elif cls is StreamEnded:
            d = self.directions[ev.stream_id]
            d.ended = True
            if not d.decided:
                self._decide(d, final=True)
            if d.owner is not None:
                d.owner.receive_end(ev.stream_id, ev.ts_ns)

    def on_other_packet(self, linktype: int, data, ts_ns: int) -> None:
        """A packet that is no TCP segment (UDP, RoCEv1...): offered to the decoders in turn; a UDP datagram
        none of them takes is counted by its service port (the lower of its two)."""
        packet = Packet(ts_ns, linktype, data, len(data), 0)
        for protocol in self.protocols:
            if protocol.receive_packet(packet):
                return
        datagram = parse_packet(linktype, data, ts_ns)
        if datagram.__class__ is Datagram:
            self.unclaimed_udp[min(datagram.sport, datagram.dport)] += 1
        else:
            self.unclaimed_packets += 1

    def skippable_bytes(self, stream_id: int) -> int:
        """How many of the direction's next bytes need not be seen (decoders.tcp_driver.StreamConsumer)."""
        d = self.directions[stream_id]
        if d.owner is not None:
            return d.owner.skippable_bytes(stream_id)
        return UNLIMITED_SKIP_BYTES if d.decided else 0

    def skip_bytes(self, stream_id: int, size: int, ts_ns: int, cut: int) -> None:
        owner = self.directions[stream_id].owner
        if owner is not None:
            owner.skip(stream_id, size, ts_ns, cut)

    def _decide(self, d: _Direction, *, final: bool) -> None:
        prefix = b"".join(chunk for chunk, _ in d.held[d.prefix_from:])[:PREFIX_BYTES]
        winner = None
        waiting = False
        for protocol in self.protocols:
            if protocol in d.declined:
                continue
            verdict = protocol.claim(d.offer, prefix)
            if verdict:
                winner = protocol
                break
            if verdict is None:
                waiting = True
            else:
                d.declined.add(protocol)
        if winner is None:
            if waiting and not final and len(prefix) < PREFIX_BYTES:
                return
            seen_data = len(d.held) > d.prefix_from
            winner = next((p for p in self.protocols if p.claim_fallback(d.offer, prefix, seen_data)), None)
            d.tentative = winner is not None
        d.decided = True
        held, d.held = d.held, []
        d.owner = winner
        if winner is not None:
            stream_id = d.offer.stream_id
            if d.resumed_at is not None and d.resumed_at > 0:
                # offered again: the bytes before, captured, were nobody's; to the winner unseen, as if cut short
                first = held[0] if held else (b"", 0)
                first_ts_ns = first.ts_ns if first.__class__ is StreamGap else first[1]
                winner.receive_gap(stream_id, d.resumed_at, first_ts_ns, False)
            d.resumed_at = None
            for item in held:
                if item.__class__ is StreamGap:
                    winner.receive_gap(stream_id, item.size, item.ts_ns, item.lost)
                else:
                    winner.receive_data(stream_id, memoryview(item[0]), item[1])
            self._offer_reverse_again(d)

    def _offer_reverse_again(self, d: _Direction) -> None:
        """The reverse of a direction just claimed is offered again from its next bytes where it was caught
        mid-connection and nobody took it, or only on weak evidence its decoder gives up: a capture that starts
        inside a large message shows no header in that direction's first bytes, and its reverse is evidence.
        The bytes before are nobody's."""
        src, sport, dst, dport = d.offer.key
        stream_id = self._direction_of_key.get((dst, dport, src, sport))
        r = None if stream_id is None else self.directions[stream_id]
        if r is None or not r.decided or r.ended or r.offer.syn_seen:
            return
        if r.owner is d.owner or r.owner is not None and not (r.tentative and r.owner.release(stream_id)):
            return                              # (its owner had the reverse's evidence at hand)
        r.owner = None
        r.tentative = False
        r.resumed_at = -1                       # (set by the next piece)
        r.decided = False
        r.declined.clear()
        r.prefix_from = 0
        self.offered_again.append(stream_id)

    # -- end of capture ---------------------------------------------------------------------------------
    def end_of_input(self) -> None:
        """No more packets: the TCP directions still open end, and so does each protocol's capture."""
        for ev in self.tcp.finish():
            self.on_tcp_event(ev)
        host = frozenset(self.capturing_host)
        for protocol in self.protocols:
            protocol.receive_capturing_host(host)
            protocol.end_of_capture()

    def observe_link_layer(self, item: RecordBatch | Packet) -> None:
        """Note the source addresses of the packets the link layer marks as sent by the capturing host, among
        the capture's first CAPTURING_HOST_PACKETS."""
        if self._host_packets_left <= 0:
            return
        linktype = None if item.__class__ is Packet else getattr(item.layout, "linktype", None)    # pcap: one
        if linktype is not None and linktype not in DIRECTION_LINKTYPES:
            self._host_packets_left -= len(item)     # a link type that marks no direction: nothing to note
            return
        packets = (item,) if item.__class__ is Packet else itertools.islice(item.packets(), self._host_packets_left)
        for packet in packets:
            self._host_packets_left -= 1
            source = outgoing_source(packet.linktype, packet.data)
            if source is not None:
                self.capturing_host.add(source)

    def finish(self) -> tuple[dict[str, dict[str, list]], dict[str, int]]:
        """End the capture: every table's column lists, and the protocols' counters."""
        self.end_of_input()
        tables: dict[str, dict[str, list]] = collections.defaultdict(dict)
        streams = self._stream_columns()
        tables["streams"] = streams
        row_of_stream = {flow: i for i, flow in enumerate(streams["flow_id"])}
        counts: dict[str, int] = collections.Counter()
        next_flow = self.flow_id_base + len(self.tcp.streams)
        for protocol in self.protocols:
            extra_flow: dict[int, int] = {}
            while (ev := protocol.next_event()) is not NEED_DATA:
                cls = ev.__class__
                if cls is Row:
                    append_row(tables[ev.table], self._named_by_flow(
                        ev.values, extra_flow, protocol.name if ev.table == "messages" else None))
                elif cls is StreamColumns:
                    i = row_of_stream[self.flow_id_base + ev.stream_id]
                    for name, value in self._named_by_flow(ev.values, extra_flow, None).items():
                        if name not in streams:
                            streams[name] = [None] * _column_length(streams)
                        streams[name][i] = value
                elif cls is ExtraStream:
                    extra_flow[ev.index] = next_flow
                    append_row(streams, {**self._named_by_flow(ev.values, extra_flow, None), "flow_id": next_flow})
                    next_flow += 1
                elif cls is Count:
                    counts[ev.name] += ev.value
        return dict(tables), dict(counts)

    def _named_by_flow(self, values: dict, extra_flow: dict[int, int], protocol: str | None) -> dict:
        """A row whose TCP directions are named by stream number (stream_id, <x>_stream_id) or extra stream
        index, named by flow id instead; message rows get their decoder's protocol unless they say."""
        row = dict(values)
        for name in [name for name in row if name == "stream_id" or name.endswith("_stream_id")]:
            value = row.pop(name)
            flow_name = "flow_id" if name == "stream_id" else name[:-len("stream_id")] + "flow_id"
            row[flow_name] = None if value is None else self.flow_id_base + value
        extra = row.get("extra_stream")
        if extra is not None:
            row["flow_id"] = extra_flow[extra]
        if protocol is not None:
            row.setdefault("protocol", protocol)
        return row

    def _stream_columns(self) -> dict[str, list]:
        """The streams.parquet columns every TCP direction has (all of them, for a capture without TCP too);
        protocols extend them (StreamColumns)."""
        cols: dict[str, list] = {name: [] for name in TCP_STREAM_COLUMNS}
        flow_of_key = {d.offer.key: d.flow_id for d in self.directions.values()}
        for sid, d in self.directions.items():
            info = self.tcp.streams[sid]
            src, sport, dst, dport = d.offer.key
            cols["flow_id"].append(d.flow_id)
            cols["src_ip"].append(ip_to_str(src))
            cols["src_port"].append(sport)
            cols["dst_ip"].append(ip_to_str(dst))
            cols["dst_port"].append(dport)
            cols["ts_first_ns"].append(info.first_ts_ns)
            cols["ts_last_ns"].append(info.last_ts_ns)
            cols["packets"].append(info.packets)
            cols["bytes"].append(info.bytes)
            cols["missing_bytes"].append(info.missing_bytes)
            cols["uncaptured_bytes"].append(info.uncaptured_bytes)
            cols["retransmitted_bytes"].append(info.retransmitted_bytes)
            cols["protocol"].append("tcp")
            cols["encrypted"].append(False)
            cols["reverse_flow_id"].append(flow_of_key.get((dst, dport, src, sport)))
            cols["syn_seen"].append(info.syn_seen)
            cols["fin_seen"].append(info.fin_seen)
            cols["rst_seen"].append(info.rst_seen)
            cols["lost_bytes"].append(0)
            cols["resyncs"].append(0)
            cols["seq_base"].append(info.seq_base)
            cols["zero_windows"].append(info.zero_windows)
            cols["zero_window_ns"].append(info.zero_window_ns)
        return cols


def decode_capture(capture: Path | CaptureInput, *, flow_id_base: int = 0, progress: ProgressFn | None = None,
                   batched: bool = True, protocols: list | None = None,
                   selection: PacketSelection | None = None) -> CaptureResult:
    """Decode one capture (a file, or the pieces of one in order) on its own (no job-wide resolution).

    batched=False decodes packet by packet (`tcp_driver.feed_packet` for each): the reference the batch
    decoder must match exactly, and several times slower. `protocols`: decoder instances to use instead of
    one of each registered protocol (tests of one protocol). `selection`: only the packets it keeps (a pcap
    filter, a time window) are decoded."""
    if not isinstance(capture, CaptureInput):
        capture = CaptureInput(capture_name(Path(capture)), (Path(capture),))
    path = capture.path
    dec = CaptureDecoder(flow_id_base, protocols)
    stats = ParseStats()
    batches = BatchDecoder(dec.tcp, dec, stats)
    selector = PacketSelector(selection) if selection is not None else None
    reported = 0
    done_bytes = 0

    def report(pos: int) -> None:
        nonlocal reported
        if progress is not None:
            progress(done_bytes + pos - reported)
            reported = done_bytes + pos

    packets, bytes_read, warnings, files, digests = 0, 0, list(capture.notes), [], []
    try:
        for file in capture.files:
            reported = done_bytes = bytes_read
            first_ts_ns = last_ts_ns = None
            with open_capture(file) as reader:
                for n, item in enumerate(reader.batches() if batched else reader, 1):
                    first, last_ts_ns = first_last_ts_ns(item)
                    if first_ts_ns is None:
                        first_ts_ns = first
                    dec.observe_link_layer(item)
                    if selector is not None and (item := selector.select(item)) is None:
                        continue
                    batches.feed(item)          # a Packet goes the per-packet way
                    if batched or not n & 0x3FF:
                        report(reader.bytes_read)
                digests.append(reader.sha256())
                report(reader.bytes_read)
                packets += reader.packets
                bytes_read += reader.bytes_read
                warnings += reader.warnings
                files.append({"path": str(file), "packets": reader.packets, "ts_first_ns": first_ts_ns,
                              "ts_last_ns": last_ts_ns, "snaplen": min((i.snaplen for i in reader.interfaces
                                                                         if i.snaplen), default=0),
                              "dropped": reader.dropped_packets})
    finally:
        if selector is not None:
            selector.close()
    warnings += piece_warnings(capture.name, files)
    tables, counts = dec.finish()
    for linktype in sorted(batches.unsupported_linktypes):
        try:
            check_linktype(linktype)
        except UnsupportedLinktype as exc:
            if stats.unknown_linktype == packets:
                raise CaptureError(f"{path}: {exc}") from None
            warnings.append(f"{path}: {stats.unknown_linktype} packets skipped: {exc}")
    spans = [(f["ts_first_ns"], f["ts_last_ns"]) for f in files if f["ts_first_ns"] is not None]
    return CaptureResult(
        capture=capture.name, path=str(path), tables=tables, counts=counts, unclaimed_udp=dict(dec.unclaimed_udp),
        unclaimed_packets=dec.unclaimed_packets, packets=packets, bytes_read=bytes_read,
        non_tcp_packets=batches.non_tcp_packets, parse_stats=stats.as_dict(), warnings=warnings,
        bulk_packets=batches.bulk_packets, files=files,
        packets_decoded=packets if selector is None else selector.selected,
        first_ts_ns=min((first for first, _ in spans), default=None),
        last_ts_ns=max((last for _, last in spans), default=None), sha256=digests,
    )


def piece_warnings(capture: str, files: list[dict]) -> list[str]:
    """A capture read from several files: where one file's packets end long before the next one's start
    (more than GAP_WARN_NS: a piece missing?), or go on after they start (pieces overlapping)."""
    warnings = []
    spans = [f for f in files if f["ts_first_ns"] is not None]
    for before, after in zip(spans, spans[1:]):
        apart_ns = after["ts_first_ns"] - before["ts_last_ns"]
        names = f"{Path(before['path']).name} and {Path(after['path']).name}"
        if apart_ns > GAP_WARN_NS:
            warnings.append(f"{capture}: no packets for {apart_ns / 1e9:.3f} s between {names} (a piece missing?)")
        elif apart_ns < 0:
            warnings.append(f"{capture}: {names} overlap by {-apart_ns / 1e3:.1f} µs")
    return warnings
