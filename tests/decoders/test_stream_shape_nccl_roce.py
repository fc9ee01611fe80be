"""The one stream-decoder shape (decoders.sansio) of the NCCL socket and RoCE decoders' inner decoders:
`receive_data`, `receive_gap`, `receive_end` in, `next_event` out, each fed on its own.

RoCE queue pairs are fed the packets of real NCCL-over-Soft-RoCE captures (pcaps/realcaps/softroce-tutorial/nccl)
and checked against tshark's InfiniBand dissector. The NCCL socket decoders are fed the streams of generated
captures (tests/support/nccl_gen.py) exactly as the capture decoder handed them over, and checked against what
the simulated sender did.
"""
from __future__ import annotations

import collections
import inspect
import subprocess

import pytest

from dlcsniff.decoders.inputs.capture_file import open_capture
from dlcsniff.decoders.packet import ip_to_str
from dlcsniff.decoders.protocols.nccl_socket.decoder import (HANDSHAKE_BYTES, INLINE_MAX_BYTES, BootstrapMessage,
                                                             BootstrapPeer, InlineEra, NcclSocketCaptureDecoder,
                                                             NetSocketMessage, BootstrapStream, _ControlSocket,
                                                             _DataSocket, _InlineUndecided, _MessageStarted,
                                                             _NetSocketConnection)
from dlcsniff.decoders.protocols.roce.decoder import RdmaMessage, ReadResponse, _QueuePair, parse_roce
from dlcsniff.decoders.sansio import NEED_DATA
from tests.conftest import require_tool
from tests.decoders.test_realcaps_nccl import CAPTURES, RUNS, _tshark_messages
from tests.support.nccl_gen import ERA_INLINE, ERA_NO_HANDSHAKE, ERAS, net_socket_capture
from tests.support.protocol_driver import drain, run_decoder

STREAM_DECODERS = [(BootstrapStream, "data"), (_ControlSocket, "data"), (_DataSocket, "data"),
                   (_QueuePair, "packet")]
OLD_SHAPES = ("feed", "feed_control", "control_gap", "feed_data", "control", "data", "request", "advance",
              "count", "messages")


@pytest.mark.parametrize("cls, data_name", STREAM_DECODERS, ids=lambda v: getattr(v, "__name__", v))
def test_the_four_methods_have_the_one_signature(cls, data_name):
    def params(name):
        return [(p.name, p.kind, p.default) for p in inspect.signature(getattr(cls, name)).parameters.values()]

    plain, empty = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.empty
    assert params("receive_data") == [("self", plain, empty), (data_name, plain, empty), ("ts_ns", plain, empty)]
    assert params("receive_gap") == [("self", plain, empty), ("size", plain, empty), ("ts_ns", plain, empty),
                                     ("lost", inspect.Parameter.KEYWORD_ONLY, True)]
    assert params("receive_end") == [("self", plain, empty), ("ts_ns", plain, empty)]
    assert params("next_event") == [("self", plain, empty)]
    assert not [name for name in OLD_SHAPES if hasattr(cls, name)]


# -- RoCE: queue pairs fed real packets ------------------------------------------------------------------

def _streams(capture: str) -> dict[tuple, list]:
    """The RoCE packets of a real capture, by (source, destination, destination QP), in capture order."""
    streams: dict[tuple, list] = {}
    with open_capture(RUNS / f"{capture}.pcap.gz") as reader:
        for packet in reader:
            pkt = parse_roce(packet.linktype, bytes(packet.data), packet.ts_ns)
            if pkt is not None:
                streams.setdefault((pkt.src, pkt.dst, pkt.dest_qp), []).append(pkt)
    return streams


def _feed_packets(packets: list) -> tuple[_QueuePair, list]:
    qp = _QueuePair(0, packets[0])
    events = []
    for pkt in packets:
        qp.receive_data(pkt, pkt.ts_ns)
        events += drain(qp)
    return qp, events


def _messages(events: list) -> list[RdmaMessage]:
    assert all(e.__class__ in (RdmaMessage, ReadResponse) for e in events)
    return [e for e in events if e.__class__ is RdmaMessage]


@pytest.mark.parametrize("capture", CAPTURES)
def test_queue_pairs_yield_the_messages_tshark_reads_then_need_data(capture, tmp_path):
    path = tmp_path / f"{capture}.pcap"
    subprocess.run([require_tool("editcap"), "-F", "pcap", str(RUNS / f"{capture}.pcap.gz"), str(path)], check=True)
    want = collections.Counter((m["src_ip"], m["dst_ip"], m["dest_qp"], m["psn"], m["size"])
                               for m in _tshark_messages(path))
    got: collections.Counter = collections.Counter()
    for (src, dst, dest_qp), packets in _streams(capture).items():
        qp, events = _feed_packets(packets)
        qp.receive_end(packets[-1].ts_ns)
        events += drain(qp)
        assert qp.next_event() is NEED_DATA and qp.next_event() is NEED_DATA
        messages = _messages(events)
        assert all(m.complete for m in messages)
        got.update((ip_to_str(src), ip_to_str(dst), dest_qp, m.psn, m.size_bytes) for m in messages)
    assert got == want and sum(want.values()) > 0


def _multi_packet_stream(capture: str) -> list:
    return max(_streams(capture).values(), key=lambda packets: sum(p.opcode.position == "FIRST" for p in packets))


@pytest.mark.parametrize("capture", CAPTURES[:2])
def test_a_message_cut_short_by_the_end_comes_at_receive_end(capture):
    packets = _multi_packet_stream(capture)
    first = max(i for i, p in enumerate(packets) if p.opcode.position == "FIRST")
    cut = packets[:first + 1]                   # the capture ends after the FIRST packet of the last message
    qp, events = _feed_packets(cut)
    assert cut[-1].psn not in {m.psn for m in _messages(events)}
    qp.receive_end(cut[-1].ts_ns)
    assert [(m.psn, m.complete, m.has_last) for m in _messages(drain(qp))] == [(cut[-1].psn, False, False)]
    assert qp.next_event() is NEED_DATA


@pytest.mark.parametrize("capture", CAPTURES[:2])
def test_a_reported_gap_releases_the_packets_held_behind_a_psn_hole(capture):
    packets = _multi_packet_stream(capture)
    starts = [i for i, p in enumerate(packets) if p.opcode.kind == "WRITE" and p.opcode.position in ("FIRST", "ONLY")]
    hole = starts[-2]
    after = {packets[i].psn for i in starts if i > hole}
    qp, events = _feed_packets(packets[:hole] + packets[hole + 1:])
    assert not after & {m.psn for m in _messages(events)}        # held behind the hole, waiting for it
    qp.receive_gap(1, packets[hole].ts_ns)
    released = _messages(drain(qp))
    assert after <= {m.psn for m in released if m.complete} and qp.lost_packets == 1
    qp.receive_end(packets[-1].ts_ns)
    drain(qp)
    assert qp.next_event() is NEED_DATA


# -- NCCL sockets: stream decoders fed the streams the capture decoder delivered ----------------------------

class _Recording(NcclSocketCaptureDecoder):
    """The protocol decoder, noting each call the capture decoder makes for a TCP direction, in order."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def receive_data(self, stream_id, data, ts_ns):
        self.calls.append((stream_id, bytes(data), len(data), ts_ns))
        super().receive_data(stream_id, data, ts_ns)

    def receive_gap(self, stream_id, size, ts_ns, lost):
        self.calls.append((stream_id, None, size, ts_ns))
        super().receive_gap(stream_id, size, ts_ns, lost)

    def receive_end(self, stream_id, ts_ns):
        self.calls.append((stream_id, "end", 0, ts_ns))
        super().receive_end(stream_id, ts_ns)

    def replay(self, stream_ids: set[int], skip: int):
        """(stream id, bytes or None for lost, size, ts) and (stream id, "end", 0, ts) after each stream's first
        `skip` bytes (its handshake and index), in the order the capture decoder delivered them."""
        left = dict.fromkeys(stream_ids, skip)
        for stream_id, data, size, ts_ns in self.calls:
            if stream_id not in left:
                continue
            if data != "end":
                skipped = min(left[stream_id], size)
                left[stream_id] -= skipped
                data, size = (None if data is None else data[skipped:]), size - skipped
                if not size:
                    continue
            yield stream_id, data, size, ts_ns


def _decode(tmp_path, era: str, nsocks: int):
    capture = net_socket_capture(tmp_path / f"{era}-{nsocks}.pcap", era=era, nsocks=nsocks,
                                 sizes=[0, 8, 129, 70_000, 3])
    recording = _Recording()
    rows, keys = run_decoder(capture.path, recording)
    return capture, recording, rows, keys


def _feed_stream(decoder, ops) -> list:
    """Each op into the stream decoder, its events taken as they come; the end included."""
    events = []
    for _, data, size, ts_ns in ops:
        if data == "end":
            decoder.receive_end(ts_ns)
        elif data is None:
            decoder.receive_gap(size, ts_ns)
        else:
            decoder.receive_data(data, ts_ns)
        events += drain(decoder)
    return events


@pytest.mark.parametrize("era", ERAS)
def test_bootstrap_streams_yield_the_messages_sent_then_need_data(tmp_path, era):
    capture, recording, rows, _ = _decode(tmp_path, era, 2)
    found: collections.Counter = collections.Counter()
    for stream_id, columns in rows.streams.items():
        if columns["protocol"] != "nccl_bootstrap":
            continue
        ops = list(recording.replay({stream_id}, HANDSHAKE_BYTES if era != ERA_NO_HANDSHAKE else 0))
        if all(op[1] == "end" for op in ops):
            continue                    # the answering direction, silent: only labelled
        decoder = BootstrapStream()
        events = _feed_stream(decoder, ops)
        assert decoder.next_event() is NEED_DATA and events[-1].__class__ is BootstrapMessage
        peers = [e for e in events if e.__class__ is BootstrapPeer]
        assert events[:len(peers)] == peers and len(peers) <= 1
        rank, tag = (peers[0].rank, peers[0].tag) if peers else (None, None)
        found.update((rank, tag, e.size_bytes, e.complete) for e in events[len(peers):])
    assert found == collections.Counter((b.rank, b.tag, b.size_bytes, True) for b in capture.bootstrap)


def test_a_bootstrap_message_cut_short_by_the_end_comes_at_receive_end(tmp_path):
    capture, recording, rows, keys = _decode(tmp_path, ERA_INLINE, 2)
    ring = next(sid for sid in rows.streams if keys[sid][1] == 41003)       # the ring: plain messages (28, 56)
    ops = [op for op in recording.replay({ring}, HANDSHAKE_BYTES) if op[1] != "end"]
    stream = b"".join(op[1] for op in ops)
    decoder = BootstrapStream()
    decoder.receive_data(stream[:-10], ops[-1][3])
    assert [e.size_bytes for e in drain(decoder)] == [28]
    decoder.receive_end(ops[-1][3])
    assert [(e.size_bytes, e.complete) for e in drain(decoder)] == [(56, False)]
    assert decoder.next_event() is NEED_DATA


@pytest.mark.parametrize("nsocks", (0, 2))
@pytest.mark.parametrize("era", ERAS)
def test_a_control_socket_announces_every_message_then_needs_data(tmp_path, era, nsocks):
    """nSocks 0: sizes and payloads on the control socket; nSocks 2: sizes only, except inline payloads (2.27+),
    which it cannot know at the first small message: it stops there until told which era to read."""
    capture, recording, rows, keys = _decode(tmp_path, era, nsocks)
    skip = 1 if era == ERA_NO_HANDSHAKE else HANDSHAKE_BYTES + 1
    for truth in capture.connections:
        control = next(sid for sid, key in keys.items() if key == truth.control_key)
        decoder = _ControlSocket(nsocks)
        events, stops = [], []
        for op in recording.replay({control}, skip):
            events += _feed_stream(decoder, [op])
            if events and events[-1].__class__ is _InlineUndecided:
                stops.append(events.pop())
                decoder.assume_inline(INLINE_MAX_BYTES if era == ERA_INLINE else 0)
                events += drain(decoder)
        assert decoder.next_event() is NEED_DATA
        assert [(s.size_bytes, s.ts_ns > 0) for s in stops] == ([(8, True)] if nsocks else [])
        assert all(e.__class__ is _MessageStarted for e in events)
        assert [e.message.size_bytes for e in events] == [m.size_bytes for m in truth.messages]
        assert [e.message.inline for e in events] == [m.inline for m in truth.messages]


@pytest.mark.parametrize("nsocks", (0, 2, 16))
@pytest.mark.parametrize("era", ERAS)
def test_net_socket_connections_couple_their_sockets_decoders(tmp_path, era, nsocks):
    """Each socket's stream into its decoders in the order the capture had them; once ended, every reading's
    socket decoders need data, and the connection yields the messages sent, then NEED_DATA."""
    capture, recording, rows, keys = _decode(tmp_path, era, nsocks)
    for truth in capture.connections:
        control = next(sid for sid, key in keys.items() if key == truth.control_key)
        index = {sid: columns["nccl_socket_index"] for sid, columns in rows.streams.items()
                 if columns.get("nccl_control_stream_id") == control}
        assert sorted(index.values()) == list(range(nsocks + 1))
        conn = _NetSocketConnection(era != ERA_NO_HANDSHAKE, truth.sender, truth.receiver)
        conn.seal(nsocks)
        skip = 1 if era == ERA_NO_HANDSHAKE else HANDSHAKE_BYTES + 1
        for stream_id, data, size, ts_ns in recording.replay(set(index), skip):
            if data == "end":
                conn.end_socket(index[stream_id], ts_ns)
            else:
                conn.receive_socket(index[stream_id], None if data is None else memoryview(data), size, ts_ns)
        for reading in conn.models:
            assert all(sock.next_event() is NEED_DATA for sock in [reading.control, *reading.data])
        assert conn.next_event() is NEED_DATA              # nothing before the end: the best reading is not known
        conn.end()
        events = drain(conn)
        assert conn.next_event() is NEED_DATA
        messages = [e for e in events if e.__class__ is NetSocketMessage]
        assert [(m.seq, m.size_bytes, m.inline, m.tasks, m.complete) for m in messages] == \
            [(m.seq, m.size_bytes, m.inline, len(m.tasks), True) for m in truth.messages]
        assert [e.inline for e in events if e.__class__ is InlineEra] == ([era == ERA_INLINE] if nsocks else [])
        assert len(events) == len(messages) + (1 if nsocks else 0)
