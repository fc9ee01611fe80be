"""TCP reassembly: scapy-built flows (every kind of disorder), hypothesis, and real tcpdump captures."""
from __future__ import annotations

import hashlib
import os
import random
import subprocess
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.layers.inet import IP, TCP
from scapy.layers.inet6 import IPv6
from scapy.packet import Raw

from dlcsniff.decoders.inputs.capture_file import open_capture
from dlcsniff.decoders.packet import LINKTYPE_RAW, SYN, Segment, ip_to_str, parse_packet
from dlcsniff.decoders.tcp import REORDER_WINDOW_NS, StreamData, StreamEnded, StreamGap, StreamStarted, TcpReassembler
from tests.conftest import PCAPS, require_tool
from tests.support.tcpdump import capture_tcp_transfer

MASK = 0xFFFFFFFF
CLIENT = ("198.18.0.1", 40000)
SERVER = ("198.18.0.2", 9091)
CLIENT6 = ("2001:db8::1", 40000)
SERVER6 = ("2001:db8::2", 9091)


# -- building flows with scapy ----------------------------------------------------------------------------------

def packet(src, dst, seq: int, ack: int, flags: str, payload: bytes = b"", ipv6: bool = False) -> bytes:
    if ipv6:
        src, dst = (CLIENT6, SERVER6) if src == CLIENT else (SERVER6, CLIENT6)
    ip = IPv6(src=src[0], dst=dst[0]) if ipv6 else IP(src=src[0], dst=dst[0])
    return bytes(ip / TCP(sport=src[1], dport=dst[1], seq=seq & MASK, ack=ack & MASK, flags=flags) / Raw(payload))


@dataclass
class Flow:
    """One connection, client -> server data. Offsets are client stream offsets (0 = byte after the SYN)."""
    client_isn: int
    server_isn: int = 0x10000000
    ipv6: bool = False

    def _client(self, offset: int, ack_offset: int, flags: str, payload: bytes = b"") -> bytes:
        return packet(CLIENT, SERVER, self.client_isn + 1 + offset, self.server_isn + 1 + ack_offset, flags,
                      payload, self.ipv6)

    def _server(self, offset: int, ack_offset: int, flags: str, payload: bytes = b"") -> bytes:
        return packet(SERVER, CLIENT, self.server_isn + 1 + offset, self.client_isn + 1 + ack_offset, flags,
                      payload, self.ipv6)

    def handshake(self) -> list[bytes]:
        return [packet(CLIENT, SERVER, self.client_isn, 0, "S", ipv6=self.ipv6),
                packet(SERVER, CLIENT, self.server_isn, self.client_isn + 1, "SA", ipv6=self.ipv6),
                self._client(0, 0, "A")]

    def data(self, offset: int, payload: bytes, flags: str = "PA") -> bytes:
        return self._client(offset, 0, flags, payload)

    def ack(self, offset: int) -> bytes:
        """The server acknowledging client bytes up to `offset` (+1 counts the client's FIN)."""
        return self._server(0, offset, "A")

    def client_fin(self, size: int) -> bytes:
        return self._client(size, 0, "FA")

    def server_fin(self, size: int) -> bytes:
        return self._server(0, size + 1, "FA")

    def teardown(self, size: int) -> list[bytes]:
        return [self.client_fin(size), self.server_fin(size), self._client(size + 1, 1, "A")]


def segments(raws: list[bytes]) -> list[Segment]:
    return [parse_packet(LINKTYPE_RAW, raw, 1_000 * (i + 1)) for i, raw in enumerate(raws)]


@dataclass
class StreamOutput:
    started: StreamStarted
    data: bytearray = field(default_factory=bytearray)   # delivered bytes, gaps left out
    gaps: list[tuple[int, int]] = field(default_factory=list)     # lost: never captured
    cuts: list[tuple[int, int]] = field(default_factory=list)     # captured, cut short by the snaplen
    ended: StreamEnded | None = None
    next_offset: int = 0


def collect(events, out: dict[int, StreamOutput]) -> None:
    """Record events, checking the contract: started first, contiguous non-overlapping offsets, ended last."""
    for ev in events:
        if isinstance(ev, StreamStarted):
            assert ev.stream_id not in out and ev.stream_id == len(out)
            out[ev.stream_id] = StreamOutput(ev)
            continue
        stream = out[ev.stream_id]
        assert stream.ended is None, f"event after the end: {ev}"
        if isinstance(ev, StreamEnded):
            stream.ended = ev
        elif isinstance(ev, StreamData):
            assert isinstance(ev.data, memoryview) and len(ev.data) > 0
            assert ev.offset == stream.next_offset
            stream.data += ev.data
            stream.next_offset += len(ev.data)
        else:
            assert isinstance(ev, StreamGap) and ev.size > 0 and ev.offset == stream.next_offset
            holes = stream.gaps if ev.lost else stream.cuts
            if holes and holes[-1][0] + holes[-1][1] == ev.offset:   # adjacent gaps: one hole
                holes[-1] = (holes[-1][0], holes[-1][1] + ev.size)
            else:
                holes.append((ev.offset, ev.size))
            stream.next_offset += ev.size


def reassemble(raws_or_segments, **kwargs) -> tuple[dict[int, StreamOutput], TcpReassembler]:
    reassembler = TcpReassembler(**kwargs)
    out: dict[int, StreamOutput] = {}
    for seg in raws_or_segments:
        collect(reassembler.feed(seg if isinstance(seg, Segment) else parse_packet(LINKTYPE_RAW, seg, 0)), out)
    collect(reassembler.finish(), out)
    assert all(s.ended is not None for s in out.values())
    return out, reassembler


def cut(data: bytes, sizes: list[int]) -> list[tuple[int, bytes]]:
    pieces, offset = [], 0
    for size in sizes:
        pieces.append((offset, data[offset:offset + size]))
        offset += size
    assert offset == len(data)
    return pieces


DATA = bytes(random.Random(7).randbytes(5000))


def simple_flow(flow: Flow, sizes=(1000, 1500, 2500), with_acks=True) -> list[bytes]:
    raws = flow.handshake()
    for offset, piece in cut(DATA, list(sizes)):
        raws.append(flow.data(offset, piece))
        if with_acks:
            raws.append(flow.ack(offset + len(piece)))
    return raws + flow.teardown(len(DATA))


# -- scenarios -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("ipv6", [False, True])
def test_in_order_connection_events_and_stats(ipv6):
    flow = Flow(client_isn=123456, ipv6=ipv6)
    segs = segments(simple_flow(flow))
    reassembler = TcpReassembler()
    events = [ev for seg in segs for ev in reassembler.feed(seg)] + reassembler.finish()
    c, s = segs[0].src, segs[0].dst
    assert events[:2] == [StreamStarted(0, (c, 40000, s, 9091), 1_000, True),
                          StreamStarted(1, (s, 9091, c, 40000), 2_000, True)]
    data_events = [ev for ev in events if isinstance(ev, StreamData)]
    assert [(ev.stream_id, ev.ts_ns, ev.offset, bytes(ev.data)) for ev in data_events] == [
        (0, 4_000, 0, DATA[:1000]), (0, 6_000, 1000, DATA[1000:2500]), (0, 8_000, 2500, DATA[2500:])]
    assert [ev for ev in events if isinstance(ev, StreamEnded)] == [StreamEnded(0, 10_000, "fin"),
                                                                      StreamEnded(1, 11_000, "fin")]
    assert not any(isinstance(ev, StreamGap) for ev in events)
    client, server = reassembler.streams
    assert (client.packets, client.bytes, client.missing_bytes, client.retransmitted_bytes) == (7, 5000, 0, 0)
    assert (client.first_ts_ns, client.last_ts_ns, client.syn_seen, client.fin_seen, client.rst_seen) == (
        1_000, 12_000, True, True, False)
    assert (server.packets, server.bytes, server.first_ts_ns, server.last_ts_ns) == (5, 0, 2_000, 11_000)


def test_payload_is_passed_through_without_a_copy_when_in_order():
    flow = Flow(client_isn=5)
    segs = segments(flow.handshake() + [flow.data(0, DATA[:100])])
    reassembler = TcpReassembler()
    for seg in segs[:-1]:
        reassembler.feed(seg)
    (data_event,) = reassembler.feed(segs[-1])
    assert data_event.data.obj is segs[-1].payload.obj


def test_one_byte_segments_give_the_same_bytes_as_one_segment():
    flow = Flow(client_isn=99)
    whole, _ = reassemble(simple_flow(flow, sizes=[len(DATA)]))
    raws = flow.handshake() + [flow.data(i, DATA[i:i + 1]) for i in range(300)] + [flow.data(300, DATA[300:])]
    bytewise, _ = reassemble(raws + flow.teardown(len(DATA)))
    assert bytes(bytewise[0].data) == bytes(whole[0].data) == DATA


def test_reordered_duplicated_and_overlapping_retransmissions():
    flow = Flow(client_isn=0xFFFFF000)
    raws = flow.handshake()
    pieces = cut(DATA, [700, 800, 900, 1000, 1600])
    order = [2, 0, 4, 1, 3]                                   # reordered
    raws += [flow.data(*pieces[i]) for i in order]
    raws += [flow.data(300, DATA[300:1200])]                  # retransmission across two original segments
    raws += [flow.data(*pieces[1]), flow.data(*pieces[1])]    # duplicates
    raws += [flow.data(3300, DATA[3300:4500])]                # overlapping the last two, different boundaries
    out, r = reassemble(raws + flow.teardown(len(DATA)))
    assert bytes(out[0].data) == DATA and out[0].gaps == [] and out[0].ended.reason == "fin"
    assert r.streams[0].retransmitted_bytes == 900 + 2 * 800 + 1200
    assert r.streams[0].bytes == len(DATA)


def test_sequence_numbers_wrap_around():
    for isn in (MASK, MASK - 1, MASK - 700, MASK - 4999):
        flow = Flow(client_isn=isn, server_isn=MASK - 2)
        out, _ = reassemble(simple_flow(flow))
        assert bytes(out[0].data) == DATA and out[0].gaps == [] and out[1].ended.reason == "fin"


def test_dropped_segment_is_a_gap_once_the_receiver_acknowledged_past_it():
    flow = Flow(client_isn=1000)
    pieces = cut(DATA, [1000, 1500, 2500])
    segs = segments(flow.handshake() + [flow.data(*pieces[0]), flow.ack(1000),        # piece 1 not captured
                                        flow.data(*pieces[2]), flow.ack(2499), flow.ack(5000)])
    reassembler = TcpReassembler()
    out: dict[int, StreamOutput] = {}
    for seg in segs[:-2]:
        collect(reassembler.feed(seg), out)
    assert out[0].gaps == [] and reassembler.streams[0].buffered_bytes == 2500   # may still be reordering
    collect(reassembler.feed(segs[-2]), out)                  # the ack ends 1 byte short of the hole end: waiting
    assert out[0].gaps == []
    collect(reassembler.feed(segs[-1]), out)                  # acknowledged past the hole...
    assert out[0].gaps == []                                  # ...but a reordered segment may still come
    late = parse_packet(LINKTYPE_RAW, flow.ack(5000), segs[-1].ts_ns + REORDER_WINDOW_NS)
    collect(reassembler.feed(late), out)                      # the reorder window has passed: it is lost
    assert out[0].gaps == [(1000, 1500)] and bytes(out[0].data) == DATA[:1000] + DATA[2500:]
    assert reassembler.streams[0].missing_bytes == 1500 and reassembler.streams[0].buffered_bytes == 0


def test_segment_captured_after_its_acknowledgement_still_fills_the_hole():
    # `-i any` and merged captures can record an ACK before the data it acknowledges.
    flow = Flow(client_isn=1000)
    pieces = cut(DATA, [1000, 1500, 2500])
    raws = flow.handshake() + [flow.data(*pieces[0]), flow.data(*pieces[2]), flow.ack(5000), flow.data(*pieces[1])]
    out, reassembler = reassemble_with(raws)
    assert out[0].gaps == [] and bytes(out[0].data) == DATA and reassembler.streams[0].missing_bytes == 0


def reassemble_with(raws):
    reassembler = TcpReassembler()
    out: dict[int, StreamOutput] = {}
    for seg in segments(raws):
        collect(reassembler.feed(seg), out)
    collect(reassembler.finish(), out)
    return out, reassembler


@pytest.mark.parametrize("dropped", [[0], [1], [2], [0, 2], [1, 2]])
def test_dropped_segments_without_acks_are_gaps_at_the_end_of_input(dropped):
    flow = Flow(client_isn=77)
    pieces = cut(DATA, [1000, 1500, 2500])
    raws = flow.handshake() + [flow.data(*p) for i, p in enumerate(pieces) if i not in dropped]
    out, r = reassemble(raws + [flow.client_fin(len(DATA))])
    expected_gaps = [(pieces[i][0], len(pieces[i][1])) for i in dropped]
    if dropped == [1, 2]:
        expected_gaps = [(1000, 4000)]
    assert out[0].gaps == expected_gaps
    assert bytes(out[0].data) == b"".join(p for i, (_, p) in enumerate(pieces) if i not in dropped)
    assert out[0].ended.reason == "fin" and r.streams[0].missing_bytes == sum(s for _, s in expected_gaps)


def test_capture_started_mid_connection():
    flow = Flow(client_isn=4242)
    raws = simple_flow(flow)
    first_data = raws.index(flow.data(1000, DATA[1000:2500]))
    out, r = reassemble(raws[first_data:])
    assert out[0].started.syn_seen is False and r.streams[0].syn_seen is False
    assert bytes(out[0].data) == DATA[1000:] and out[0].gaps == [] and out[0].ended.reason == "fin"
    # the server's direction starts with an ACK: offset 0 is its first byte seen, too
    assert out[1].started.syn_seen is False and out[1].ended.reason == "fin"


def test_lost_syn_starts_the_stream_at_the_first_byte_seen():
    flow = Flow(client_isn=31337)
    raws = simple_flow(flow)
    out, _ = reassemble(raws[1:])           # the SYN is missing, the SYN-ACK is there
    server, client = out[0], out[1]
    assert client.started.key[1] == CLIENT[1] and server.started.key[1] == SERVER[1]
    assert client.started.syn_seen is False and bytes(client.data) == DATA and client.ended.reason == "fin"
    assert server.started.syn_seen is True


def test_reset_delivers_what_is_buffered_and_ends_the_stream():
    flow = Flow(client_isn=10)
    pieces = cut(DATA, [1000, 1500, 2500])
    raws = flow.handshake() + [flow.data(*pieces[0]), flow.data(*pieces[2]),
                               packet(CLIENT, SERVER, flow.client_isn + 1 + 5000, 0, "R")]
    reassembler = TcpReassembler()
    out: dict[int, StreamOutput] = {}
    for seg in segments(raws):
        collect(reassembler.feed(seg), out)
    assert out[0].ended.reason == "rst" and out[0].gaps == [(1000, 1500)]    # before finish()
    assert bytes(out[0].data) == DATA[:1000] + DATA[2500:]
    assert reassembler.streams[0].rst_seen and not reassembler.streams[0].fin_seen
    collect(reassembler.finish(), out)
    assert out[1].ended.reason == "eof"


def test_new_connection_on_the_same_ports_is_a_new_stream():
    first, second = Flow(client_isn=1000), Flow(client_isn=900_000_000, server_isn=5)
    syn_again = first.handshake()[0]
    out, r = reassemble(simple_flow(first)[:1] + [syn_again] + simple_flow(first)[1:] + simple_flow(second))
    assert len(out) == 4 and [s.ended.reason for s in out.values()] == ["fin"] * 4
    assert bytes(out[0].data) == bytes(out[2].data) == DATA
    assert r.streams[0].packets == 8 and r.streams[2].key == r.streams[0].key


def test_new_syn_replaces_a_stream_whose_end_was_not_captured():
    first, second = Flow(client_isn=1000), Flow(client_isn=77_000_000, server_isn=3)
    raws = simple_flow(first)[:-3] + simple_flow(second)      # the first connection's FINs were not captured
    out, _ = reassemble(raws)
    assert [out[i].ended.reason for i in range(4)] == ["eof", "eof", "fin", "fin"]
    assert bytes(out[0].data) == bytes(out[2].data) == DATA


def test_keepalives_and_zero_window_probes():
    flow = Flow(client_isn=555)
    raws = flow.handshake() + [flow.data(0, DATA[:1000]), flow.ack(1000),
                               flow.data(999, b"\x00", flags="A"),      # keep-alive: one old garbage byte
                               flow.data(1000, b"", flags="A"),         # zero-window probe...
                               flow.data(1000, DATA[1000:1001]),        # ...with one new byte
                               flow.data(1000, DATA[1000:])]            # the window opens: sent again
    out, r = reassemble(raws + flow.teardown(len(DATA)))
    assert bytes(out[0].data) == DATA and out[0].gaps == []
    assert r.streams[0].retransmitted_bytes == 2


def test_snaplen_cut_segments_report_the_uncaptured_tail_apart_from_lost_bytes():
    flow = Flow(client_isn=2024)
    segs = segments(simple_flow(flow))
    for seg in segs:                        # a 1100-byte snaplen on the data segments: 40-byte headers
        if seg.wire_payload_len > 1060:
            seg.payload = seg.payload[:1060]
    out, r = reassemble(segs)
    assert out[0].cuts == [(2060, 440), (3560, 1440)] and out[0].gaps == []
    assert bytes(out[0].data) == DATA[:2060] + DATA[2500:3560]
    stream = r.streams[0]
    assert (stream.missing_bytes, stream.uncaptured_bytes) == (0, 440 + 1440)
    assert stream.bytes + stream.uncaptured_bytes == len(DATA) and out[0].ended.reason == "fin"


def test_fin_captured_before_the_last_data():
    flow = Flow(client_isn=8)
    raws = simple_flow(flow, with_acks=False)
    last = raws.index(flow.data(2500, DATA[2500:]))
    raws.insert(last, raws.pop(last + 1))      # the FIN overtakes the last segment
    out, _ = reassemble(raws)
    assert bytes(out[0].data) == DATA and out[0].gaps == [] and out[0].ended.reason == "fin"


def test_buffer_bound_declares_the_hole_lost_and_keeps_memory_bounded():
    flow = Flow(client_isn=1)
    cap = 3000
    raws = flow.handshake() + [flow.data(i, DATA[i:i + 500]) for i in range(500, 5000, 500)]  # bytes 0-499 lost
    reassembler = TcpReassembler(max_buffered_bytes_per_stream=cap)
    out: dict[int, StreamOutput] = {}
    for seg in segments(raws):
        collect(reassembler.feed(seg), out)
        assert reassembler.streams[0].buffered_bytes <= cap
    assert out[0].gaps == [(0, 500)]           # declared while feeding, not at the end
    collect(reassembler.finish(), out)
    assert bytes(out[0].data) == DATA[500:] and out[0].ended.reason == "eof"


# -- hypothesis: random segmentation, reordering, duplication, retransmission, capture loss -----------------------

@st.composite
def captures(draw):
    data = draw(st.binary(min_size=1, max_size=2000))
    isn = draw(st.one_of(st.integers(0, MASK), st.integers(MASK - 2100, MASK)))
    n = len(data)
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=min(n - 1, 25))) if n > 1 else set())
    bounds = list(zip([0, *cuts], [*cuts, n]))
    dropped = draw(st.sets(st.sampled_from(range(len(bounds))), max_size=len(bounds) - 1)) if draw(
        st.booleans()) else set()
    kept = [b for i, b in enumerate(bounds) if i not in dropped]
    kept_bytes = {x for a, b in kept for x in range(a, b)}
    # retransmissions: random ranges within what the capture has (see the docstring of the test)
    extra = []
    for _ in range(draw(st.integers(0, 6))):
        a = draw(st.integers(0, n - 1))
        b = draw(st.integers(a + 1, min(n, a + 600)))
        if all(x in kept_bytes for x in range(a, b)):
            extra.append((a, b))
    extra += draw(st.lists(st.sampled_from(kept), max_size=4)) if kept else []   # plain duplicates
    window = draw(st.integers(1, 8))
    jitter = draw(st.lists(st.floats(0, window), min_size=len(bounds) + len(extra) + 1,
                           max_size=len(bounds) + len(extra) + 1))
    with_acks = draw(st.booleans())
    return data, isn, bounds, dropped, extra, jitter, with_acks


@given(captures())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_captures_reassemble_exactly(capture):
    """Every captured byte comes out once and in place; every byte never captured is in a gap of exact size.

    Segments (original cuts, retransmissions of other ranges, duplicates, the FIN) are reordered within a
    window; capture loss drops original segments. The receiver's ACKs, when present, follow causality at
    the capture point: an ACK is captured after every segment it covers that the capture kept, and the
    lost originals count at their place. Retransmissions stay within the kept bytes: a byte the receiver
    acknowledged, never captured before the ACK, is lost to this capture even if a copy comes later."""
    data, isn, bounds, dropped, extra, jitter, with_acks = capture
    n = len(data)
    flow = Flow(client_isn=isn)
    sent = [(a, b, i in dropped) for i, (a, b) in enumerate(bounds)] + [(a, b, False) for a, b in extra]
    sent.append((n, n, False))                                # the FIN
    order = sorted(range(len(sent)), key=lambda k: k + jitter[k])
    raws = flow.handshake()
    received = set()
    for k in order:
        a, b, lost = sent[k]
        received.update(range(a, b + (1 if k == len(sent) - 1 else 0)))    # FIN takes one sequence number
        if not lost:
            raws.append(flow.client_fin(n) if k == len(sent) - 1 else flow.data(a, data[a:b]))
        if with_acks:
            acked = 0
            while acked in received:
                acked += 1
            raws.append(flow.ack(acked))
    out, r = reassemble(raws)
    covered_set = {x for a, b, lost in sent if not lost for x in range(a, b)}
    covered = sorted(covered_set)
    expected_gaps = []
    for x in range(n):
        if x not in covered_set:
            if expected_gaps and sum(expected_gaps[-1]) == x:
                expected_gaps[-1] = (expected_gaps[-1][0], expected_gaps[-1][1] + 1)
            else:
                expected_gaps.append((x, 1))
    stream = r.streams[0]
    assert out[0].gaps == expected_gaps
    assert bytes(out[0].data) == bytes(data[x] for x in covered)
    assert out[0].ended.reason == "fin" and out[0].next_offset == n
    assert (stream.bytes, stream.missing_bytes) == (len(covered), n - len(covered))
    assert stream.retransmitted_bytes == sum(b - a for a, b, lost in sent if not lost) - len(covered)


_ENDPOINTS = [(b"\xc6\x12\x00\x01", 1), (b"\xc6\x12\x00\x02", 2), (b"\xc6\x12\x00\x01", 3)]


@given(st.lists(st.tuples(st.sampled_from([(0, 1), (1, 0), (2, 1), (1, 2)]),
                          st.one_of(st.integers(0, MASK), st.integers(MASK - 300, MASK), st.integers(0, 300)),
                          st.one_of(st.integers(0, MASK), st.integers(0, 400)),
                          st.integers(0, 0xFF), st.binary(max_size=120), st.integers(0, 40)), max_size=60))
@settings(max_examples=400, deadline=None)
def test_fuzz_arbitrary_segments_keep_the_contract(packets):
    """Any segments at all: no exception, the event contract holds, buffers stay bounded, stats add up."""
    cap = 256
    reassembler = TcpReassembler(max_buffered_bytes_per_stream=cap)
    out: dict[int, StreamOutput] = {}
    for ts, ((a, b), seq, ack, flags, payload, cut_bytes) in enumerate(packets):
        (src, sport), (dst, dport) = _ENDPOINTS[a], _ENDPOINTS[b]
        captured = payload[:max(0, len(payload) - cut_bytes)]
        collect(reassembler.feed(Segment(ts, src, dst, sport, dport, seq, ack, flags, memoryview(captured),
                                         len(payload), 4, 65535)), out)
        assert all(s.buffered_bytes <= cap for s in reassembler.streams)
    collect(reassembler.finish(), out)
    for stream in reassembler.streams:
        result = out[stream.stream_id]
        assert result.ended is not None and stream.buffered_bytes == 0
        assert stream.bytes == len(result.data) and stream.missing_bytes == sum(size for _, size in result.gaps)
        assert stream.uncaptured_bytes == sum(size for _, size in result.cuts)


# -- real TCP transfers captured by tcpdump -------------------------------------------------------------------

@pytest.fixture(scope="module")
def transfer(tmp_path_factory):
    request = os.urandom(6_000_000)
    return capture_tcp_transfer(tmp_path_factory.mktemp("tcp"), request, hashlib.sha256(request).digest(),
                                {"lo.pcap": ["-i", "lo"], "any.pcap": ["-i", "any", "-y", "LINUX_SLL2"],
                                 "lo_snap96.pcap": ["-i", "lo", "-s", "96"]})


def _captured_segments(path) -> list[Segment]:
    """The TCP segments of a capture (ARP and the like left out)."""
    with open_capture(path) as reader:
        parsed = [parse_packet(p.linktype, p.data, p.ts_ns) for p in reader]
    return [seg for seg in parsed if seg.__class__ is Segment]


def _client_truth(segs: list[Segment], transfer) -> tuple[bytes, list[tuple[int, int]], int]:
    """What the client's direction must reassemble to, placing segments by their sequence numbers: a byte
    is data if the first segment (in capture order) that carries it on the wire has it in its captured part,
    a gap otherwise; returns (data, gaps, all payload bytes on the wire). Not by position in the capture:
    under load the sender probes a closed window or retransmits, so segments overlap."""
    syn = next(s for s in segs if s.dport == transfer.port and s.flags & SYN)
    unseen, data, gap = 0, 1, 2
    state = np.zeros(len(transfer.request), dtype=np.uint8)
    wire_bytes = 0
    for seg in segs:
        if seg.dport == transfer.port and seg.wire_payload_len:
            offset = (seg.seq - syn.seq - 1) & MASK
            captured_end, wire_end = offset + len(seg.payload), offset + seg.wire_payload_len
            assert bytes(seg.payload) == transfer.request[offset:captured_end]
            for a, b, kind in ((offset, captured_end, data), (captured_end, wire_end, gap)):
                region = state[a:b]
                region[region == unseen] = kind
            wire_bytes += seg.wire_payload_len
    is_data = state == data
    expected = np.frombuffer(transfer.request, dtype=np.uint8)[is_data].tobytes()
    edges = np.flatnonzero(np.diff(np.concatenate(([1], is_data.astype(np.int8), [1]))))
    gaps = [(int(a), int(b - a)) for a, b in zip(edges[::2], edges[1::2])]
    return expected, gaps, wire_bytes


def _client_and_server(out: dict[int, StreamOutput], transfer) -> tuple[StreamOutput, StreamOutput]:
    return (next(s for s in out.values() if s.started.key[3] == transfer.port),
            next(s for s in out.values() if s.started.key[1] == transfer.port))


@pytest.mark.root
@pytest.mark.parametrize("name", ["lo.pcap", "any.pcap"])
def test_real_loopback_transfer_is_reassembled_byte_exact(transfer, name):
    segs = _captured_segments(transfer.captures[name].path)
    out, r = reassemble(segs)
    client, server = _client_and_server(out, transfer)
    assert len(out) == 2 and bytes(client.data) == transfer.request and bytes(server.data) == transfer.reply
    assert client.gaps == server.gaps == [] and _client_truth(segs, transfer)[1] == []
    assert client.ended.reason == server.ended.reason == "fin"
    assert all(s.syn_seen and s.fin_seen for s in r.streams)
    stream = r.streams[client.started.stream_id]
    assert stream.retransmitted_bytes == _client_truth(segs, transfer)[2] - len(transfer.request)


@pytest.mark.root
def test_real_capture_with_a_small_snaplen_reports_every_missing_byte(transfer):
    """tcpdump -s 96 keeps 96 bytes of each packet: what is left of the payload is exact, the rest is gaps."""
    segs = _captured_segments(transfer.captures["lo_snap96.pcap"].path)
    out, r = reassemble(segs)
    client, _ = _client_and_server(out, transfer)
    data, gaps, wire_bytes = _client_truth(segs, transfer)
    assert bytes(client.data) == data and client.cuts == gaps and len(gaps) > 10 and client.gaps == []
    stream = r.streams[client.started.stream_id]
    assert stream.bytes + stream.uncaptured_bytes == len(transfer.request) and stream.missing_bytes == 0
    assert stream.retransmitted_bytes == wire_bytes - len(transfer.request)


@pytest.mark.root
def test_real_capture_edited_to_lose_and_reorder_packets(transfer):
    """Loss and reordering made by editing a real capture (netem is not in this kernel)."""
    segs = _captured_segments(transfer.captures["lo.pcap"].path)
    data_idx = [i for i, s in enumerate(segs) if s.dport == transfer.port and s.wire_payload_len]
    assert len(data_idx) > 10
    isn = next(s.seq for s in segs if s.dport == transfer.port and s.flags & SYN)
    ranges = {i: ((segs[i].seq - isn) & MASK, ((segs[i].seq - isn) & MASK) + segs[i].wire_payload_len)
              for i in data_idx}
    lost = next(i for i in data_idx[3:]                     # a segment whose bytes no other one carries
                if not any(a < ranges[i][1] and ranges[i][0] < b for j, (a, b) in ranges.items() if j != i))
    later = [i for i in data_idx if i > lost]
    edited = list(segs)
    edited.insert(later[2], edited.pop(later[4]))          # captured two segments early
    del edited[lost]                                        # and one never captured
    out, _ = reassemble(edited)
    client, _ = _client_and_server(out, transfer)
    data, gaps, _ = _client_truth(edited, transfer)
    assert gaps and bytes(client.data) == data and client.gaps == gaps


def test_retransmissions_and_losses_agree_with_tshark_on_real_job_captures():
    """The two largest committed captures of real jobs: per direction, the bytes tshark's TCP analysis
    flags as retransmitted equal our retransmitted_bytes (retransmissions here resend whole segments;
    tshark would count a partial overlap whole), and the directions it sees a lost segment in are the
    ones with missing bytes."""
    captures = sorted(PCAPS.glob("*/*.pcap*"), key=lambda p: p.stat().st_size)[-2:]
    assert captures, f"no captures in {PCAPS}: run `make pcaps`"
    for path in captures:
        out = subprocess.run(
            [require_tool("tshark"), "-r", str(path), "-Y",
             "tcp.analysis.retransmission or tcp.analysis.fast_retransmission or "
             "tcp.analysis.spurious_retransmission or tcp.analysis.lost_segment",
             "-T", "fields", "-e", "ip.src", "-e", "tcp.srcport", "-e", "ip.dst", "-e", "tcp.dstport",
             "-e", "tcp.len", "-e", "tcp.analysis.lost_segment"],
            capture_output=True, text=True, check=True).stdout
        theirs_retransmitted, theirs_lossy = Counter(), set()
        for line in out.splitlines():
            src, sport, dst, dport, length, lost = line.split("\t")
            key = (src, int(sport), dst, int(dport))
            if lost:
                theirs_lossy.add(key)
            else:
                theirs_retransmitted[key] += int(length)
        _, r = reassemble(_captured_segments(path))
        ours_retransmitted, ours_lossy = Counter(), set()
        for stream in r.streams:
            src, sport, dst, dport = stream.key
            key = (ip_to_str(src), sport, ip_to_str(dst), dport)
            if stream.retransmitted_bytes:
                ours_retransmitted[key] += stream.retransmitted_bytes
            if stream.missing_bytes:
                ours_lossy.add(key)
        assert ours_retransmitted == theirs_retransmitted, path
        assert ours_lossy == theirs_lossy, path
