"""Batch decoding: a `RecordBatch` of captured packets into stream events, the common case in bulk.

The per-packet decode (`feed_packet`: `parse_packet`, then `TcpReassembler.feed`) costs microseconds a
packet. Almost every packet of a bulk transfer is the common case: a TCP segment that continues its stream
in order, or a bare acknowledgement. This module handles those in bulk and sends every other packet
through `feed_packet`, in capture order, so the result is exactly the per-packet one:

- headers: link (Ethernet, Linux cooked v1/v2, BSD loopback, raw IP), IPv4 (options included) or IPv6
  without extension headers, and TCP are read with numpy over the whole batch; any packet the vectorised
  reader is not sure of (VLAN tags, fragments, unset IP lengths, other protocols, cut headers) is parsed
  by `parse_packet`, which also counts it in the ParseStats;
- TCP: a segment is *fast* when it carries no SYN/FIN/RST, its payload (whole, or cut short by the
  snaplen: the rest is uncaptured, not lost) starts at the next
  expected byte of a stream that has nothing buffered out of order and no FIN, and its acknowledgement
  (if any) is for a stream in the same clean state (or for none). Fast segments change a stream only by
  counters and positions, so they are applied lazily, a connection at a time, when a packet of that
  connection needs the per-packet path (or at the end of the batch); the acknowledgement rule of the
  reorder window (`TcpStream._acked_ts_ns`) is evaluated over the whole run;
- payload: a fast segment's bytes go to the consumer only when it wants to see them; inside a frame body
  it does not keep, the consumer (`StreamConsumer.skippable_bytes`) says how many bytes it can account for
  without seeing them, and whole runs of segments are skipped by arithmetic (`skip_bytes`). The events the
  consumer sees, and their order across streams, are those of the per-packet decode.
"""
from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from typing import Protocol

import numpy as np

from dlcsniff.decoders.compiled import compiled_module
from dlcsniff.decoders.inputs.capture_file import Packet, RecordBatch, struct_rows
from dlcsniff.decoders.packet import (ACK, FIN, LINKTYPE_ETHERNET, LINKTYPE_IPV4, LINKTYPE_IPV6, LINKTYPE_LINUX_SLL,
                             LINKTYPE_LINUX_SLL2, LINKTYPE_LOOP, LINKTYPE_NULL, LINKTYPE_RAW, RST,
                             SUPPORTED_LINKTYPES, SYN, ParseStats, Segment, parse_packet)
from dlcsniff.decoders.tcp import (REORDER_WINDOW_NS, SEQ_MODULUS, StreamData, StreamEvent, StreamGap, TcpReassembler,
                                   TcpStream)

_SEQ_MASK = SEQ_MODULUS - 1
_COMPILED_HEADERS = compiled_module("dlcsniff.decoders._tcp_headers")
# An acknowledgement this close to a stream's next byte names the same stream offset whenever, within one
# batch, it is read (a batch moves a stream by far less than the rest of 2^31).
_ACK_SANE_DISTANCE = 1 << 29
_VECTOR_ACKS_FROM = 24              # acknowledgement runs at least this long are evaluated with numpy
_MIN_BULK_SHARE = 0.5               # a batch with fewer of its packets applied in bulk...
_MAX_BACKOFF_BATCHES = 8            # ...sends up to this many next batches through the per-packet path

_IPV4_HEADER = np.dtype([("version_ihl", "u1"), ("tos", "u1"), ("total_len", ">u2"), ("id", ">u2"),
                         ("fragment", ">u2"), ("ttl", "u1"), ("protocol", "u1"), ("checksum", ">u2"),
                         ("src", ">u4"), ("dst", ">u4")])
_IPV6_HEADER = np.dtype([("version", "u1"), ("flow", "V3"), ("payload_len", ">u2"), ("next_header", "u1"),
                         ("hop_limit", "u1"), ("src_hi", ">u8"), ("src_lo", ">u8"), ("dst_hi", ">u8"),
                         ("dst_lo", ">u8")])
_TCP_HEADER = np.dtype([("sport", ">u2"), ("dport", ">u2"), ("seq", ">u4"), ("ack", ">u4"),
                        ("data_offset", "u1"), ("flags", "u1"), ("window", ">u2")])
_ETHERTYPE_IPV4 = 0x0800
_ETHERTYPE_IPV6 = 0x86DD
_IPPROTO_TCP = 6
_AF_INET = 2
_AF_INET6 = (24, 28, 30)
# Link types read with an ethertype: (offset of the ethertype, length of the link header).
_ETHERTYPE_LINKS = {LINKTYPE_ETHERNET: (12, 14), LINKTYPE_LINUX_SLL: (14, 16), LINKTYPE_LINUX_SLL2: (0, 20)}
# Multipliers of the flow-key hash (odd 64-bit constants); a hash match is always verified.
_HASH = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93,
                  0xFF51AFD7ED558CCD], dtype=np.uint64)


class StreamConsumer(Protocol):
    """What the batch decoder feeds: stream events, and the arithmetic skip of payload it need not see."""

    def on_tcp_event(self, event: StreamEvent) -> None: ...

    def skippable_bytes(self, stream_id: int) -> int:
        """How many of the stream's next bytes the consumer can account for without seeing them."""

    def skip_bytes(self, stream_id: int, size: int, ts_ns: int, cut: int) -> None:
        """Account for `size` bytes (at most skippable_bytes), the last of them captured at ts_ns, of which the
        snaplen cut `cut` (the per-packet path shows those as StreamGap(lost=False))."""

    # Optional: stream ids whose bytes the consumer let pass unseen (skippable) and wants to see again from
    # the next packet on; the driver clears it once it has acted on it.
    offered_again: list[int]

    def on_other_packet(self, linktype: int, data: memoryview | bytes, ts_ns: int) -> None:
        """A packet that is no TCP segment."""


def feed_packet(tcp: TcpReassembler, consumer: StreamConsumer, linktype: int, data: memoryview | bytes,
                ts_ns: int, stats: ParseStats) -> bool:
    """The per-packet decode of one packet; False when it is no TCP segment (the reason is in stats)."""
    seg = parse_packet(linktype, data, ts_ns, stats)
    if seg.__class__ is not Segment:
        return False
    on_event = consumer.on_tcp_event
    for event in tcp.feed(seg):
        on_event(event)
    return True


class BatchDecoder:
    """Decodes RecordBatches of one capture, in file order, into one reassembler; a single Packet fed to
    it goes the per-packet way."""

    def __init__(self, tcp: TcpReassembler, consumer: StreamConsumer, stats: ParseStats):
        self.tcp = tcp
        self.consumer = consumer
        self.stats = stats
        self.non_tcp_packets = 0
        self.bulk_packets = 0               # TCP packets applied in bulk, without a feed() each
        self.unsupported_linktypes: set[int] = set()
        self.offered_again: list[int] | None = getattr(consumer, "offered_again", None)
        self._per_packet_batches = 0        # batches still to decode packet by packet...
        self._backoff_batches = 1           # ...and how many the next time bulk does not pay

    def feed(self, item: RecordBatch | Packet) -> None:
        if item.__class__ is Packet:
            self._feed_packet(item.linktype, item.data, item.ts_ns)
            return
        columns = None
        if self._per_packet_batches:
            self._per_packet_batches -= 1
        else:
            columns = item.columns()
        if columns is None:
            for packet in item.packets():
                self._feed_packet(packet.linktype, packet.data, packet.ts_ns)
            return
        bulk_before = self.bulk_packets
        _Batch(self, item.buf, columns.data_start, columns.caplen, columns.ts_ns, columns.linktype).run()
        # Where most packets need the per-packet path anyway (heavy reordering or loss), the bookkeeping
        # of the bulk path costs more than it saves: decode the next batches packet by packet, then retry.
        if self.bulk_packets - bulk_before < _MIN_BULK_SHARE * len(item):
            self._per_packet_batches = self._backoff_batches
            self._backoff_batches = min(2 * self._backoff_batches, _MAX_BACKOFF_BATCHES)
        else:
            self._backoff_batches = 1

    def _feed_packet(self, linktype: int, data, ts_ns: int) -> None:
        if not feed_packet(self.tcp, self.consumer, linktype, data, ts_ns, self.stats):
            self.not_tcp(linktype, data, ts_ns)
        if self.offered_again:              # packet by packet, every byte is shown anyway
            self.offered_again.clear()

    def not_tcp(self, linktype: int, data, ts_ns: int) -> None:
        """A packet that is no TCP segment (the reason is in the ParseStats): the consumer may still read
        it (UDP: RoCEv2; non-IP: RoCEv1)."""
        self.non_tcp_packets += 1
        if linktype not in SUPPORTED_LINKTYPES:
            self.unsupported_linktypes.add(linktype)
        self.consumer.on_other_packet(linktype, data, ts_ns)


# -- record headers ----------------------------------------------------------------------------------------

def _byte(u8: np.ndarray, at: np.ndarray) -> np.ndarray:
    return u8[np.minimum(at, len(u8) - 1)].astype(np.int64)


def _link(u8: np.ndarray, start: np.ndarray, caplen: np.ndarray, linktype: int) -> tuple[np.ndarray, int]:
    """(IP version per packet: 4, 6 or 0 = not read here, length of the link header) for one link type."""
    if linktype in _ETHERTYPE_LINKS:
        at, header = _ETHERTYPE_LINKS[linktype]
        ethertype = (_byte(u8, start + at) << 8) | _byte(u8, start + at + 1)
        version = np.where(ethertype == _ETHERTYPE_IPV4, 4, np.where(ethertype == _ETHERTYPE_IPV6, 6, 0))
        return np.where(caplen >= at + 2, version, 0), header
    if linktype in (LINKTYPE_NULL, LINKTYPE_LOOP):
        b = [_byte(u8, start + k) for k in range(4)]
        little = b[0] | (b[1] << 8) | (b[2] << 16) | (b[3] << 24)
        big = (b[0] << 24) | (b[1] << 16) | (b[2] << 8) | b[3]
        family = np.where(little > 0xFFFF, big, little)     # written in the capturing host's byte order
        version = np.where(family == _AF_INET, 4, np.where(np.isin(family, _AF_INET6), 6, 0))
        return np.where(caplen >= 4, version, 0), 4
    if linktype == LINKTYPE_RAW:
        nibble = _byte(u8, start) >> 4
        return np.where((caplen >= 1) & ((nibble == 4) | (nibble == 6)), nibble, 0), 0
    if linktype in (LINKTYPE_IPV4, LINKTYPE_IPV6):
        return np.full(len(start), 4 if linktype == LINKTYPE_IPV4 else 6), 0
    return np.zeros(len(start), dtype=np.int64), 0


class _Headers:
    """The TCP segments the vectorised reader is sure of, in batch order (arrays indexed alike). Read by the
    compiled reader (decoders/tcp_headers.c) when it is built, else with numpy (`numpy=True` asks for it)."""

    def __init__(self, u8: np.ndarray, start: np.ndarray, caplen: np.ndarray, linktype, *, numpy: bool = False):
        if _COMPILED_HEADERS is not None and not numpy:
            self._read_compiled(u8, start, caplen, linktype)
        else:
            self._read_numpy(u8, start, caplen, linktype)

    def _read_compiled(self, u8: np.ndarray, start: np.ndarray, caplen: np.ndarray, linktype) -> None:
        per_packet = b"" if isinstance(linktype, int) else np.ascontiguousarray(linktype, dtype=np.int64)
        fields = _COMPILED_HEADERS.read(u8, np.ascontiguousarray(start, dtype=np.int64),
                                        np.ascontiguousarray(caplen, dtype=np.int64),
                                        linktype if isinstance(linktype, int) else -1, per_packet)
        (self.index, self.sport, self.dport, self.seq, self.ack, self.flags, self.payload_start, self.payload_len,
         self.wire_len, self.window) = (np.frombuffer(field, dtype=np.int64) for field in fields[:-1])
        self.key = np.frombuffer(fields[-1], dtype=np.uint64).reshape(-1, 5)

    def _read_numpy(self, u8: np.ndarray, start: np.ndarray, caplen: np.ndarray, linktype) -> None:
        n = len(start)
        if isinstance(linktype, int):
            version, link_len = _link(u8, start, caplen, linktype)
            ip_at = np.full(n, link_len, dtype=np.int64)
        else:
            version = np.zeros(n, dtype=np.int64)
            ip_at = np.zeros(n, dtype=np.int64)
            for lt in np.unique(linktype).tolist():
                mask = linktype == lt
                version[mask], ip_at[mask] = _link(u8, start[mask], caplen[mask], lt)
        parts = [self._ipv4(u8, start, ip_at, np.flatnonzero((version == 4) & (caplen >= ip_at + 20))),
                 self._ipv6(u8, start, ip_at, np.flatnonzero((version == 6) & (caplen >= ip_at + 40)))]
        parts = [p for p in parts if len(p[0])]
        if len(parts) == 2:
            order = np.argsort(np.concatenate([parts[0][0], parts[1][0]]), kind="stable")
            idx, tcp_at, ip_payload, key = (np.concatenate([a, b])[order] for a, b in zip(*parts))
        elif parts:
            idx, tcp_at, ip_payload, key = parts[0]
        else:
            idx = tcp_at = ip_payload = np.zeros(0, dtype=np.int64)
            key = np.zeros((0, 5), dtype=np.uint64)
        # TCP (RFC 9293): the header must be whole in the capture and within the IP payload.
        readable = caplen[idx] >= tcp_at + 14
        idx, tcp_at, ip_payload, key = idx[readable], tcp_at[readable], ip_payload[readable], key[readable]
        tcp = struct_rows(u8, start[idx] + tcp_at, _TCP_HEADER)
        header_len = (tcp["data_offset"].astype(np.int64) >> 4) * 4
        captured_end = np.minimum(tcp_at + ip_payload, caplen[idx])
        ok = (header_len >= 20) & (header_len <= ip_payload) & (tcp_at + header_len <= captured_end)
        self.index = idx[ok]
        self.sport = tcp["sport"][ok].astype(np.int64)
        self.dport = tcp["dport"][ok].astype(np.int64)
        self.seq = tcp["seq"][ok].astype(np.int64)
        self.ack = tcp["ack"][ok].astype(np.int64)
        self.flags = tcp["flags"][ok].astype(np.int64)
        payload_at = (tcp_at + header_len)[ok]
        self.payload_start = start[self.index] + payload_at
        self.payload_len = captured_end[ok] - payload_at
        self.wire_len = (ip_payload - header_len)[ok]
        self.window = tcp["window"][ok].astype(np.int64)
        self.key = key[ok]          # src hi, src lo, dst hi, dst lo, ip version << 32 | sport << 16 | dport

    @staticmethod
    def _ipv4(u8, start, ip_at, idx):
        ip = struct_rows(u8, start[idx] + ip_at[idx], _IPV4_HEADER)
        version_ihl = ip["version_ihl"].astype(np.int64)
        header_len = (version_ihl & 0x0F) * 4
        total_len = ip["total_len"].astype(np.int64)
        # An unset total length (segmentation offload), fragments, options too long: parse_packet's business.
        ok = ((version_ihl >> 4 == 4) & (header_len >= 20) & (total_len >= header_len)
              & (ip["fragment"] & 0x3FFF == 0) & (ip["protocol"] == _IPPROTO_TCP))
        idx, ip, header_len, total_len = idx[ok], ip[ok], header_len[ok], total_len[ok]
        key = np.zeros((len(idx), 5), dtype=np.uint64)
        key[:, 0] = ip["src"]
        key[:, 2] = ip["dst"]
        key[:, 4] = 4 << 32
        return idx, ip_at[idx] + header_len, total_len - header_len, key

    @staticmethod
    def _ipv6(u8, start, ip_at, idx):
        ip = struct_rows(u8, start[idx] + ip_at[idx], _IPV6_HEADER)
        payload_len = ip["payload_len"].astype(np.int64)
        # Extension headers, jumbograms: parse_packet's business.
        ok = (ip["version"] >> 4 == 6) & (payload_len > 0) & (ip["next_header"] == _IPPROTO_TCP)
        idx, ip, payload_len = idx[ok], ip[ok], payload_len[ok]
        key = np.empty((len(idx), 5), dtype=np.uint64)
        for column, name in enumerate(("src_hi", "src_lo", "dst_hi", "dst_lo")):
            key[:, column] = ip[name]
        key[:, 4] = 6 << 32
        return idx, ip_at[idx] + 40, payload_len, key


def _prefix_sums(values: np.ndarray, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each group's running sums from 0 (values cut into groups by bounds): group g's are
    sums[at[g]:at[g + 1]], one more than its values."""
    total = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(values, out=total[1:])
    sizes = np.diff(bounds) + 1
    at = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=at[1:])
    starts = np.repeat(bounds[:-1], sizes)
    index = starts + np.arange(at[-1]) - np.repeat(at[:-1], sizes)
    return total[index] - total[starts], at


def _address(hi: int, lo: int, version: int) -> bytes:
    return hi.to_bytes(4, "big") if version == 4 else ((hi << 64) | lo).to_bytes(16, "big")


def _flow_keys(key: np.ndarray, sport: np.ndarray, dport: np.ndarray) -> tuple[np.ndarray, list[tuple]]:
    """(flow number per segment, the flows' StreamKeys) for the vectorised segments."""
    key = key.copy()
    key[:, 4] |= (sport.astype(np.uint64) << np.uint64(16)) | dport.astype(np.uint64)
    hashed = key * _HASH               # wraps around: a hash
    mixed = hashed[:, 0] ^ hashed[:, 1] ^ hashed[:, 2] ^ hashed[:, 3] ^ hashed[:, 4]
    _, first, flow = np.unique(mixed, return_index=True, return_inverse=True)
    if not (key == key[first][flow]).all():
        # Two flows with one hash: number them exactly (never seen, but never wrong).
        _, first, flow = np.unique(key, axis=0, return_index=True, return_inverse=True)
    keys = []
    for src_hi, src_lo, dst_hi, dst_lo, rest in key[first].tolist():
        version = rest >> 32
        keys.append((_address(src_hi, src_lo, version), (rest >> 16) & 0xFFFF,
                     _address(dst_hi, dst_lo, version), rest & 0xFFFF))
    return flow.reshape(-1), keys


# -- one batch ---------------------------------------------------------------------------------------------

_TOUCH, _SLOW = 0, 1


class _Flow:
    """One TCP direction's packets in the batch; `positions` index its `packets` list."""
    __slots__ = ("number", "key", "reverse", "pair", "packets", "packets_np", "cum", "cum_np", "cum_captured",
                 "slow", "data",
                 "chain_breaks", "back_breaks", "cuts", "acks", "acks_np", "ack_values", "ack_offsets", "ack_insane",
                 "ack_target",
                 "stream", "applied", "shown", "version")

    def __init__(self, number: int, key: tuple):
        self.number = number
        self.key = key
        self.reverse = number               # number of the other direction's flow (no reference cycle)
        self.pair = number                   # number of the connection's first flow
        self.packets: list[int] = []        # batch indices of its TCP packets
        self.cum = [0]                      # payload bytes (on the wire) before each position (and in all)
        self.cum_captured = [0]             # of which the capture holds (the rest was cut by the snaplen)
        self.slow: list[int] = []           # positions that always take the per-packet path
        self.data: list[int] = []           # positions of segments with payload
        self.chain_breaks: list[int] = []   # data positions not starting where the previous one ended...
        self.back_breaks: list[int] = []    # ...of which those not starting after it (overlapping, repeating)
        self.cuts: list[int] = []           # data positions whose payload the snaplen cut
        self.acks: list[int] = []           # positions of segments with the ACK flag
        self.ack_values = np.zeros(0, dtype=np.int64)
        self.ack_offsets = np.zeros(0, dtype=np.int64)   # their offsets in the reverse stream
        self.ack_insane: list[int] = []     # ack positions too far from the reverse stream's next byte
        self.ack_target = None              # (stream, its next seq) ack_offsets were computed against
        self.stream: TcpStream | None = None
        self.applied = 0                    # positions before it are applied to the stream...
        self.shown = 0                      # ...and were shown to (or skipped by) the consumer
        self.version = 0                    # of its queued payload entry


class _Batch:
    """The walk over one batch: packets that need the per-packet path and payload the consumer must see,
    in batch order, everything between them applied in bulk."""

    def __init__(self, owner: BatchDecoder, buf: memoryview, start: np.ndarray, caplen: np.ndarray,
                 ts_ns: np.ndarray, linktype):
        self.owner = owner
        self.tcp = owner.tcp
        self.consumer = owner.consumer
        self.offered_again = owner.offered_again
        self.stats = owner.stats
        self.buf = buf
        self.start = start
        self.caplen = caplen
        self.ts_ns = ts_ns
        self.linktype = linktype
        self.n = n = len(start)
        h = _Headers(np.frombuffer(buf, dtype=np.uint8), start, caplen, linktype)
        self.row = np.full(n, -1, dtype=np.int64)            # batch index -> row of the header arrays
        self.row[h.index] = np.arange(len(h.index))
        self.seq, self.payload_start, self.payload_len = h.seq, h.payload_start, h.payload_len
        self.segments: dict[int, Segment] = {}               # batch index -> what parse_packet read
        self.flow_of = np.full(n, -1, dtype=np.int64)
        self.flows: list[_Flow] = []
        by_key: dict[tuple, _Flow] = {}
        if len(h.index):
            numbers, keys = _flow_keys(h.key, h.sport, h.dport)
            for key in keys:
                by_key[key] = self._new_flow(key)
            self.flow_of[h.index] = numbers
        # What the vectorised reader left: parse_packet decides, once, and counts the reasons in stats.
        vectorised = np.zeros(n, dtype=bool)
        vectorised[h.index] = True
        for i in np.flatnonzero(~vectorised).tolist():
            lt = self._linktype_of(i)
            seg = parse_packet(lt, self._data(i), int(ts_ns[i]), self.stats)
            if seg.__class__ is not Segment:
                owner.not_tcp(lt, self._data(i), int(ts_ns[i]))
                continue
            self.segments[i] = seg
            key = (seg.src, seg.sport, seg.dst, seg.dport)
            flow = by_key.get(key)
            if flow is None:
                by_key[key] = flow = self._new_flow(key)
            self.flow_of[i] = flow.number
        for flow in list(self.flows):
            src, sport, dst, dport = flow.key
            reverse_key = (dst, dport, src, sport)
            reverse = by_key.get(reverse_key)
            if reverse is None:
                by_key[reverse_key] = reverse = self._new_flow(reverse_key)
            flow.reverse, reverse.reverse = reverse.number, flow.number
            flow.pair = reverse.pair = min(flow.number, reverse.number)
        self._index_flows(h, vectorised)
        self.heap: list[tuple[int, int, int, int]] = []
        self.pair_version = [0] * len(self.flows)
        self.pair_next_slow = [n] * len(self.flows)

    def _new_flow(self, key: tuple) -> _Flow:
        flow = _Flow(len(self.flows), key)
        self.flows.append(flow)
        return flow

    def _linktype_of(self, i: int) -> int:
        return self.linktype if isinstance(self.linktype, int) else int(self.linktype[i])

    def _data(self, i: int) -> memoryview:
        start = int(self.start[i])
        return self.buf[start:start + int(self.caplen[i])]

    def _index_flows(self, h: _Headers, vectorised: np.ndarray) -> None:
        """Per flow: its packets, payload prefix sums, and the positions that decide when it needs the
        per-packet path (found once; the stream state they are held against is read at each sync). Computed
        for all flows at once over the packets sorted by flow, then cut into each flow's share."""
        n = self.n
        tcp_index = np.flatnonzero(self.flow_of >= 0)
        order = tcp_index[np.argsort(self.flow_of[tcp_index], kind="stable")]
        flow_of = self.flow_of[order]
        bounds = np.searchsorted(flow_of, np.arange(len(self.flows) + 1))
        flags, wire, captured, seq, ack, window = (np.zeros(n, dtype=np.int64) for _ in range(6))
        flags[h.index], wire[h.index], captured[h.index] = h.flags, h.wire_len, h.payload_len
        seq[h.index], ack[h.index], window[h.index] = h.seq, h.ack, h.window
        position = np.arange(len(order)) - bounds[flow_of]          # of each packet in its flow's list
        wire, flags = wire[order], flags[order]
        cum, cum_bounds = _prefix_sums(wire, bounds)
        cum_captured, _ = _prefix_sums(captured[order], bounds)
        # a zero window advertised: counted by TcpReassembler.feed, as is the advertisement that opens it again
        # (_next_slow sends it there)
        slow = np.flatnonzero(~vectorised[order] | (flags & (SYN | FIN | RST) != 0) | (window[order] == 0))
        data = np.flatnonzero(wire > 0)
        # a data segment not starting where its flow's previous one ended breaks the chain
        d = order[data]
        jump = (seq[d[1:]] - seq[d[:-1]] - wire[data[:-1]]) & _SEQ_MASK
        same_flow = flow_of[data[1:]] == flow_of[data[:-1]]
        breaks = data[1:][same_flow & (jump != 0)]
        back_breaks = data[1:][same_flow & (jump >= _ACK_SANE_DISTANCE)]     # not a jump forward over a hole
        cuts = np.flatnonzero(captured[order] < wire)
        acks = np.flatnonzero(flags & ACK)
        ack_positions = position[acks]
        ack_values = ack[order[acks]]
        packets, cum_list, cum_captured_list = order.tolist(), cum.tolist(), cum_captured.tolist()
        # each flow's share of a list: list[cuts[k]:cuts[k + 1]] for flow number k
        ((slow_list, slow_cuts), (data_list, data_cuts), (break_list, break_cuts), (back_list, back_cuts),
         (cut_list, cut_cuts)) = ((position[found].tolist(), np.searchsorted(found, bounds).tolist())
                                  for found in (slow, data, breaks, back_breaks, cuts))
        ack_list, ack_cuts = ack_positions.tolist(), np.searchsorted(acks, bounds).tolist()
        bounds, cum_bounds = bounds.tolist(), cum_bounds.tolist()
        for flow in self.flows:
            k = flow.number
            first, last = bounds[k], bounds[k + 1]
            flow.packets, flow.packets_np = packets[first:last], order[first:last]
            flow.cum, flow.cum_np = cum_list[cum_bounds[k]:cum_bounds[k + 1]], cum[cum_bounds[k]:cum_bounds[k + 1]]
            flow.cum_captured = cum_captured_list[cum_bounds[k]:cum_bounds[k + 1]]
            self_connection = flow.reverse == flow.number
            flow.slow = list(range(last - first)) if self_connection else slow_list[slow_cuts[k]:slow_cuts[k + 1]]
            flow.data = data_list[data_cuts[k]:data_cuts[k + 1]]
            flow.chain_breaks = break_list[break_cuts[k]:break_cuts[k + 1]]
            flow.back_breaks = back_list[back_cuts[k]:back_cuts[k + 1]]
            flow.cuts = cut_list[cut_cuts[k]:cut_cuts[k + 1]]
            flow.acks, flow.acks_np = ack_list[ack_cuts[k]:ack_cuts[k + 1]], ack_positions[ack_cuts[k]:ack_cuts[k + 1]]
            flow.ack_values = ack_values[ack_cuts[k]:ack_cuts[k + 1]]

    def run(self) -> None:
        flows = self.flows
        for flow in flows:
            if flow.pair == flow.number:
                self._sync(flow)
        heap = self.heap
        while heap:
            index, kind, number, version = heapq.heappop(heap)
            if kind == _TOUCH:
                if version == flows[number].version:
                    self._touch(flows[number], index)
            elif version == self.pair_version[number]:
                self._slow(flows[number], index)
        for flow in flows:
            if flow.pair == flow.number:
                self._catch_up(flow, self.n)

    # -- the per-packet path and what it needs -------------------------------------------------------

    def _slow(self, flow: _Flow, index: int) -> None:
        """The packet at `index`, of flow's connection, through the per-packet path."""
        self._catch_up(flow, index)
        seg = self.segments.get(index)
        if seg is None:
            seg = parse_packet(self._linktype_of(index), self._data(index), int(self.ts_ns[index]), self.stats)
        self._hand_over(self.tcp.feed(seg))
        own = self.flows[self.flow_of[index]]
        own.applied = own.shown = own.applied + 1
        self._sync(flow)                        # (both directions' payload queued again)
        if self.offered_again:
            self.offered_again.clear()

    def _hand_over(self, events: list[StreamEvent]) -> None:
        """One packet's stream events to the consumer, in order; a run of StreamData of one stream (what a hole
        given up lets through: the bytes buffered past it) is skipped at once where the consumer can account for
        all of it unseen, as it would for the run's events one by one."""
        consumer = self.consumer
        k, n = 0, len(events)
        while k < n:
            event = events[k]
            end = k + 1
            if event.__class__ is StreamData:
                stream_id = event.stream_id
                size = len(event.data)
                while end < n and events[end].__class__ is StreamData and events[end].stream_id == stream_id:
                    size += len(events[end].data)
                    end += 1
                if end - k > 1 and size <= consumer.skippable_bytes(stream_id):
                    consumer.skip_bytes(stream_id, size, events[end - 1].ts_ns, 0)
                    k = end
                    continue
            for event in events[k:end]:
                consumer.on_tcp_event(event)
            k = end

    def _catch_up(self, flow: _Flow, index: int) -> None:
        """Apply the connection's fast packets before `index`: counters, positions, acknowledgements; and
        skip their payload the consumer did not need to see."""
        reverse = self.flows[flow.reverse]
        ends = (bisect_left(flow.packets, index, flow.applied),
                bisect_left(reverse.packets, index, reverse.applied))
        if ends[0] == flow.applied and ends[1] == reverse.applied:
            return                              # slow packets in a row: nothing fast between them
        for f, end in zip((flow, reverse), ends):
            if f.shown < end:
                if f.stream.takes_bulk():
                    self._skip(f, end)
                else:
                    f.shown = end               # buffered past a hole: shown once the hole is resolved
        self._acknowledge(flow, reverse, ends[0])
        self._acknowledge(reverse, flow, ends[1])
        for f, end in zip((flow, reverse), ends):
            if end > f.applied:
                last_ts_ns = int(self.ts_ns[f.packets[end - 1]])
                if f.stream.takes_bulk():
                    f.stream.deliver_bulk(end - f.applied, f.cum[end] - f.cum[f.applied],
                                          f.cum_captured[end] - f.cum_captured[f.applied], last_ts_ns)
                else:
                    f.stream.buffer_bulk(self._pieces(f, end), end - f.applied, last_ts_ns)
                self.owner.bulk_packets += end - f.applied
                f.applied = end

    def _pieces(self, flow: _Flow, end: int) -> list[tuple[int, int, bytes, int]]:
        """The payload of the flow's fast data segments before position `end`, as TcpStream buffers them past a
        hole: (start offset, end offset, a copy of the bytes, capture ts) each."""
        offset_of, buf, packets = flow.stream.offset_of, self.buf, flow.packets
        index = [packets[p] for p in flow.data[bisect_left(flow.data, flow.applied):bisect_left(flow.data, end)]]
        rows = self.row[index]
        pieces = []
        for seq, at, size, ts_ns in zip(self.seq[rows].tolist(), self.payload_start[rows].tolist(),
                                        self.payload_len[rows].tolist(), self.ts_ns[index].tolist()):
            start = offset_of(seq)
            pieces.append((start, start + size, bytes(buf[at:at + size]), ts_ns))
        return pieces

    def _acknowledge(self, carrier: _Flow, target: _Flow, carrier_end: int) -> None:
        """What the acknowledgements in carrier's fast packets (to carrier_end) do to target's stream, as
        TcpReassembler.feed would: the highest offset, and the time of the last rise from at most the
        next byte target had delivered by then."""
        stream = target.stream
        if stream is None or stream.ended:
            return
        first = bisect_left(carrier.acks, carrier.applied)
        last = bisect_left(carrier.acks, carrier_end, first)
        if first == last:
            return
        acked = stream.acked_offset
        # + cum[position]: the next byte by then; buffering past a hole, the next byte stays where it starts
        delivering = stream.takes_bulk()
        base = stream.next_offset - (target.cum[target.applied] if delivering else 0)
        rose_at = None
        if last - first < _VECTOR_ACKS_FROM:
            for k in range(first, last):
                offset = int(carrier.ack_offsets[k])
                if offset > acked:
                    index = carrier.packets[carrier.acks[k]]
                    if acked <= base + (target.cum[bisect_left(target.packets, index, target.applied)]
                                        if delivering else 0):
                        rose_at = index
                    acked = offset
        else:
            offsets = carrier.ack_offsets[first:last]
            index = carrier.packets_np[carrier.acks_np[first:last]]
            before = np.maximum.accumulate(np.concatenate(([acked], offsets)))[:-1]
            delivered = base + (target.cum_np[np.searchsorted(target.packets_np, index)] if delivering else 0)
            rises = np.flatnonzero((offsets > before) & (before <= delivered))
            rose_at = int(index[rises[-1]]) if len(rises) else None
            acked = max(acked, int(offsets.max()))
        stream.acknowledge_bulk(acked, None if rose_at is None else int(self.ts_ns[rose_at]))

    def _sync(self, flow: _Flow) -> None:
        """After the per-packet path changed the connection (or at the start): read its streams' state,
        queue its next slow packet and the next payload each direction must show."""
        reverse = self.flows[flow.reverse]
        for f in (flow, reverse):
            f.stream = self.tcp.stream(f.key)
        next_slow = min(self._next_slow(flow), self._next_slow(reverse),
                        self._hole_given_up(flow, reverse), self._hole_given_up(reverse, flow))
        pair = flow.pair
        self.pair_version[pair] += 1
        self.pair_next_slow[pair] = next_slow
        if next_slow < self.n:
            heapq.heappush(self.heap, (next_slow, _SLOW, pair, self.pair_version[pair]))
        self._queue_payload(flow)
        if reverse is not flow:
            self._queue_payload(reverse)

    def _next_slow(self, flow: _Flow) -> int:
        """Batch index of the flow's next packet that must take the per-packet path (n: none)."""
        start = flow.applied
        packets = flow.packets
        if start == len(packets):
            return self.n
        stream = flow.stream
        if stream is None or stream.window_closed:
            return packets[start]
        delivering = stream.takes_bulk()
        if not delivering and not stream.buffers_bulk():
            return packets[start]
        position = len(packets)
        k = bisect_left(flow.slow, start)
        if k < len(flow.slow):
            position = flow.slow[k]
        k = bisect_left(flow.data, start)
        if k < len(flow.data) and flow.data[k] < position:
            first_data = flow.data[k]
            seq = int(self.seq[self.row[packets[first_data]]])
            if delivering and seq != stream.next_seq:
                position = first_data
            elif not delivering and stream.offset_of(seq) < stream.buffered_end_offset:
                position = first_data           # bytes already buffered, or a wrap-around: per packet
            else:
                # delivering: the next bytes, in a chain; buffering: pieces in order, holes between them allowed
                breaks = flow.chain_breaks if delivering else flow.back_breaks
                k = bisect_right(breaks, first_data)
                if k < len(breaks):
                    position = min(position, breaks[k])
                if not delivering:
                    position = min(position, self._bound_position(flow, first_data))
        target = self.flows[flow.reverse].stream
        k = bisect_left(flow.acks, start)
        if target is not None and not target.ended and k < len(flow.acks) and flow.acks[k] < position:
            if not (target.takes_bulk() or target.buffers_bulk()):
                position = flow.acks[k]
            else:
                self._reference_acks(flow, target)
                k = bisect_left(flow.ack_insane, start)
                if k < len(flow.ack_insane):
                    position = min(position, flow.ack_insane[k])
        return packets[position] if position < len(packets) else self.n

    def _bound_position(self, flow: _Flow, first_data: int) -> int:
        """Buffering past a hole: the first data position from first_data on that the per-packet path must
        take: one the snaplen cut, or the one that takes the buffered bytes over the per-stream bound (the
        reassembler then gives the first hole up)."""
        cut = bisect_left(flow.cuts, first_data)
        position = flow.cuts[cut] if cut < len(flow.cuts) else len(flow.packets)
        room = self.tcp.max_buffered_bytes_per_stream - flow.stream.buffered_bytes
        cum = flow.cum_captured
        over = bisect_right(cum, cum[flow.applied] + room, first_data + 1) - 1
        return min(position, over)

    def _hole_given_up(self, flow: _Flow, reverse: _Flow) -> int:
        """Batch index from which a packet of the connection may give up the first hole of flow's stream,
        while it buffers past the hole in bulk (n: none in this batch). TcpReassembler._resolve_acked does it at a
        packet of either direction once the other direction has acknowledged the hole's end and
        REORDER_WINDOW_NS has passed since the acknowledgement rose past the stream's next byte."""
        stream = flow.stream
        if stream is None or not stream.buffers_bulk():
            return self.n
        next_offset, hole_end = stream.next_offset, stream.hole_end_offset
        acked = stream.acked_offset
        rose_ts_ns = stream.acked_ts_ns if acked > next_offset else None
        from_index = -1 if acked >= hole_end else None
        if from_index is None or rose_ts_ns is None:
            first = bisect_left(reverse.acks, reverse.applied)
            if first == len(reverse.acks):
                return self.n
            self._reference_acks(reverse, stream)
            offsets = reverse.ack_offsets[first:]
            index = reverse.packets_np[reverse.acks_np[first:]]
            if rose_ts_ns is None:
                rises = np.flatnonzero(offsets > next_offset)      # the first one rises from at most next_offset
                if not len(rises):
                    return self.n
                rose_ts_ns = int(self.ts_ns[index[rises[0]]])
            if from_index is None:
                reached = np.flatnonzero(offsets >= hole_end)
                if not len(reached):
                    return self.n
                from_index = int(index[reached[0]])
        due_ts_ns = rose_ts_ns + REORDER_WINDOW_NS
        found = self.n
        for f in (flow, reverse):
            packets = f.packets_np[f.applied:]
            due = np.flatnonzero((packets >= from_index) & (self.ts_ns[packets] >= due_ts_ns))
            if len(due):
                found = min(found, int(packets[due[0]]))
        return found

    @staticmethod
    def _reference_acks(flow: _Flow, target: TcpStream) -> None:
        """The stream offsets the flow's acknowledgements name in target: the same whenever, in this batch,
        they are read, unless target moves far (then they are computed again) or they lie far."""
        reference = flow.ack_target
        if (reference is not None and reference[0] is target
                and (target.next_seq - reference[1]) & _SEQ_MASK < _ACK_SANE_DISTANCE):
            return
        flow.ack_target = (target, target.next_seq)
        relative = (flow.ack_values - target.next_seq) & _SEQ_MASK
        relative = np.where(relative >= SEQ_MODULUS // 2, relative - SEQ_MODULUS, relative)
        flow.ack_offsets = relative + target.next_offset
        flow.ack_insane = np.flatnonzero(np.abs(relative) >= _ACK_SANE_DISTANCE).tolist()

    # -- payload ---------------------------------------------------------------------------------------

    def _queue_payload(self, flow: _Flow) -> None:
        """Queue the flow's next fast segment whose payload the consumer must see (beyond what it can
        skip), if it comes before the connection's next slow packet."""
        flow.version += 1
        stream = flow.stream
        if (stream is None or not stream.takes_bulk() or flow.shown == len(flow.packets)
                or flow.packets[flow.shown] >= self.pair_next_slow[flow.pair]):
            return                              # (buffering past a hole, nothing is shown)
        cum = flow.cum
        skippable = self.consumer.skippable_bytes(stream.stream_id)
        position = bisect_right(cum, cum[flow.shown] + skippable, flow.shown + 1) - 1
        if position < len(flow.packets) and flow.packets[position] < self.pair_next_slow[flow.pair]:
            heapq.heappush(self.heap, (flow.packets[position], _TOUCH, flow.number, flow.version))

    def _skip(self, flow: _Flow, end: int) -> None:
        """Fast positions shown..end, all within what the consumer can skip: accounted for, not shown."""
        cum = flow.cum
        size = cum[end] - cum[flow.shown]
        if size:
            last = bisect_left(cum, cum[end], flow.shown) - 1         # the last of them with payload
            cut = size - (flow.cum_captured[end] - flow.cum_captured[flow.shown])
            self.consumer.skip_bytes(flow.stream.stream_id, size, int(self.ts_ns[flow.packets[last]]), cut)
        flow.shown = end

    def _touch(self, flow: _Flow, index: int) -> None:
        position = bisect_left(flow.packets, index, flow.shown)
        self._skip(flow, position)
        stream = flow.stream
        row = self.row[index]
        start = int(self.payload_start[row])
        offset = stream.next_offset + flow.cum[position] - flow.cum[flow.applied]
        captured, ts_ns = int(self.payload_len[row]), int(self.ts_ns[index])
        if captured:
            self.consumer.on_tcp_event(StreamData(stream.stream_id, ts_ns, offset, self.buf[start:start + captured]))
        cut = flow.cum[position + 1] - flow.cum[position] - captured
        if cut:
            self.consumer.on_tcp_event(StreamGap(stream.stream_id, ts_ns, offset + captured, cut, lost=False))
        flow.shown = position + 1
        self._queue_payload(flow)
        if self.offered_again:
            self._show_again(flow, index)

    def _show_again(self, flow: _Flow, index: int) -> None:
        """The consumer wants the bytes of the reverse direction again (decoders.capture_decoder: the reverse of a
        direction just claimed): what it let pass before `index` stays skipped, what follows is shown."""
        reverse = self.flows[flow.reverse]
        stream = reverse.stream
        if stream is not None and stream.stream_id in self.offered_again:
            before = bisect_left(reverse.packets, index, reverse.shown)
            if stream.takes_bulk():
                self._skip(reverse, before)
            else:
                reverse.shown = before          # buffered past a hole: shown once the hole is resolved
            self._queue_payload(reverse)
        self.offered_again.clear()
