"""NCCL socket transport and bootstrap decoding on generated captures (NCCL cannot run here: see
tests/support/nccl_gen.py, a simulation of NCCL's sender written from the protocol description).

Captures go through the real capture reader and TCP reassembler (tests/support/protocol_driver.py). The expected
messages are what the simulated sender did; the task splits are also checked against numbers worked out
by hand from NCCL's rule, so the simulation itself is pinned down.
"""
from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcsniff.decoders.protocols.nccl_socket.decoder import NcclSocketCaptureDecoder, line_protocol, task_sizes
from dlcsniff.decoders.protocols.base import TcpDirection
from tests.support.protocol_driver import rows_of, run_decoder
from tests.support.nccl_gen import (ERA_HANDSHAKE, ERA_INLINE, ERA_NO_HANDSHAKE, ERAS, NCCL_SOCKET_MAGIC, NcclSender,
                                    TcpCapture, ll128_buffer, ll_buffer, net_socket_capture)

PROTOS = ("Simple", "LL", "LL128")


def _expected_proto(proto: str, size: int) -> str | None:
    """What a decoder can tell from a message's first bytes: LL is seen in two 16-byte lines, LL128 in two
    128-byte lines; other bytes are Simple once those two are ruled out; an empty message says nothing."""
    if proto == "LL":
        return proto if size >= 32 else None
    if proto == "LL128":
        return proto if size >= 256 else None
    return None if not size or (size % 16 == 0 and size < 32) or (size % 128 == 0 and size < 256) else proto


def _rows_by_control(rows, keys, conn):
    control = [sid for sid, key in keys.items() if key == conn.control_key]
    assert len(control) == 1
    return control[0], [m for m in rows.messages if m["protocol"] == "nccl_socket" and m["stream_id"] == control[0]]


def _check_connections(rows, keys, capture, complete=True) -> None:
    for conn in capture.connections:
        control, got = _rows_by_control(rows, keys, conn)
        assert [m["nccl_seq"] for m in got] == list(range(len(conn.messages)))
        for want, row in zip(conn.messages, got):
            assert (row["size_bytes"], row["nccl_inline"], row["nccl_tasks"]) == \
                (want.size_bytes, want.inline, len(want.tasks)), (conn.nsocks, conn.era, want)
            assert row["complete"] is complete or not want.size_bytes
            assert row["ts_first_ns"] <= row["ts_last_ns"]
            proto = _expected_proto(want.proto, want.size_bytes)
            assert row["nccl_proto"] == proto
            assert row["payload_bytes"] == (want.payload_bytes if proto else None)
        sockets = {keys[sid][1]: extra for sid, extra in rows.streams.items() if keys[sid][2:] ==
                   (conn.receiver, conn.listen_port)}
        assert sorted(sockets) == conn.ports
        for index, port in enumerate(conn.ports):
            assert sockets[port]["protocol"] == "nccl_socket"
            assert (sockets[port]["nccl_socket_index"], sockets[port]["nccl_nsocks"]) == (index, conn.nsocks)
            assert sockets[port]["nccl_control_stream_id"] == control
        inline_known = conn.nsocks > 0 and any(0 < m.size_bytes <= 128 for m in conn.messages)
        assert sockets[conn.ports[-1]]["nccl_inline"] == ((conn.era == ERA_INLINE) if inline_known else None)


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("nccl")
    return {(era, nsocks): net_socket_capture(out / f"{era}-{nsocks}.pcap", era=era, nsocks=nsocks, protos=PROTOS)
            for era in ERAS for nsocks in (0, 2, 16)}


@pytest.mark.parametrize("nsocks", (0, 2, 16))
@pytest.mark.parametrize("era", ERAS)
def test_every_message_and_bootstrap_message_found(captures, era, nsocks):
    capture = captures[(era, nsocks)]
    rows, keys = run_decoder(capture.path, NcclSocketCaptureDecoder())
    _check_connections(rows, keys, capture)
    boot = [(m["peer_rank"], m["tag"], m["size_bytes"], m["complete"]) for m in rows.messages
            if m["protocol"] == "nccl_bootstrap"]
    assert boot == [(b.rank, b.tag, b.size_bytes, True) for b in capture.bootstrap]
    labels = {keys[sid][3]: extra["protocol"] for sid, extra in rows.streams.items()}
    assert 5201 not in labels                                   # the unrelated connection stays unclaimed
    assert (labels.get(40002) == "nccl_proxy") is (era != ERA_NO_HANDSHAKE)
    # the directions towards a listener carry the handshake (the answering directions are labelled from them)
    listeners = {(c.receiver, c.listen_port) for c in capture.connections}
    magics = {extra["nccl_magic"] for sid, extra in rows.streams.items()
              if extra["protocol"] == "nccl_socket" and keys[sid][2:] in listeners}
    assert magics == ({None} if era == ERA_NO_HANDSHAKE else {f"{NCCL_SOCKET_MAGIC:#018x}"})


def test_task_split_worked_out_by_hand():
    """max(64 KiB, ceil(size / nSocks)) per task, the last one shorter."""
    assert task_sizes(200_003, 2) == [100_002, 100_001]
    assert task_sizes(200_003, 16) == [65536, 65536, 65536, 3395]
    assert task_sizes((4 << 20) + 3, 16) == [262_145] * 15 + [262_132]
    assert task_sizes(129, 4) == [129]


def test_the_simulation_deals_tasks_round_robin_across_messages(tmp_path):
    """Hand-worked: nSocks 2, sizes 200003 then 70000: socket 0 gets 100002, socket 1 100001; the second
    message starts again at socket 0: 65536 there, 4464 on socket 1."""
    cap = TcpCapture()
    sender = NcclSender(cap, "198.18.0.1", "198.18.0.2", 43000, 2, ERA_HANDSHAKE, 42000)
    sender.isend(bytes(200_003))
    sender.isend(bytes(70_000))
    assert [m.tasks for m in sender.info.messages] == [[(0, 100_002), (1, 100_001)], [(0, 65536), (1, 4464)]]
    sender.isend(bytes(70_000))
    assert sender.info.messages[-1].tasks == [(0, 65536), (1, 4464)]
    capture_path = cap.write(tmp_path / "rr.pcap")
    rows, keys = run_decoder(capture_path, NcclSocketCaptureDecoder())
    assert [(m["size_bytes"], m["nccl_tasks"], m["complete"]) for m in rows.messages] == \
        [(200_003, 2, True), (70_000, 2, True), (70_000, 2, True)]


class _ByteByByte(NcclSocketCaptureDecoder):
    def receive_data(self, stream_id, data, ts_ns):
        for i in range(len(data)):
            super().receive_data(stream_id, data[i:i + 1], ts_ns)


@pytest.mark.parametrize("era", ERAS)
def test_byte_by_byte_whole_and_trailing_bytes_give_the_same_rows(tmp_path, era):
    capture = net_socket_capture(tmp_path / "small.pcap", era=era, nsocks=2, sizes=[0, 8, 129, 70_000, 3],
                                 protos=PROTOS)
    whole, keys = run_decoder(capture.path, NcclSocketCaptureDecoder())
    assert run_decoder(capture.path, _ByteByByte())[0] == whole
    _check_connections(whole, keys, capture)
    # trailing bytes: half a size header on each control socket after the last message
    cap = TcpCapture(seed=11)
    sender = NcclSender(cap, "198.18.0.1", "198.18.0.2", 43000, 2, era, 42000)
    for size in (0, 8, 129, 70_000, 3):
        sender.isend(random.Random(size).randbytes(size))
    plain = run_decoder(cap.write(tmp_path / "plain.pcap"), NcclSocketCaptureDecoder())[0]
    cap.send(sender.socks[-1], b"\x07\x00")
    trailing = run_decoder(cap.write(tmp_path / "trailing.pcap"), NcclSocketCaptureDecoder())[0]
    assert trailing.messages == plain.messages and len(plain.messages) == 5


def test_a_lost_data_segment_only_spoils_its_message(tmp_path):
    cap = TcpCapture(mss=1448)
    sender = NcclSender(cap, "198.18.0.1", "198.18.0.2", 43000, 2, ERA_INLINE, 42000)
    sender.isend(bytes(200_003))
    sender.isend(bytes(70_000))          # tasks: 65536 on socket 0, 4464 on socket 1
    start = len(cap.frames)
    sender.isend(bytes(70_000))
    data_frames = [i for i in range(start, len(cap.frames))
                   if len(cap.frames[i][1]) > 200 and cap.frames[i][1][34:36] == struct.pack("!H", 42001)]
    sender.isend(bytes(300))
    rows, _ = run_decoder(cap.write(tmp_path / "lossy.pcap", drop={data_frames[1]}), NcclSocketCaptureDecoder())
    assert [(m["size_bytes"], m["complete"]) for m in rows.messages] == \
        [(200_003, True), (70_000, True), (70_000, False), (300, True)]


def test_a_lost_control_header_stops_that_connection_with_a_reason(tmp_path):
    cap = TcpCapture()
    sender = NcclSender(cap, "198.18.0.1", "198.18.0.2", 43000, 0, ERA_INLINE, 42000)
    sender.isend(bytes(1000))
    before = len(cap.frames)
    sender.isend(bytes(10))              # size + 10 bytes: one segment
    header_frame = before
    sender.isend(bytes(5000))
    rows, keys = run_decoder(cap.write(tmp_path / "lost-header.pcap", drop={header_frame}),
                             NcclSocketCaptureDecoder())
    assert [(m["size_bytes"], m["complete"]) for m in rows.messages] == [(1000, True)]
    control = next(sid for sid, key in keys.items() if key[1] == 42000)
    assert "lost 14 control-socket bytes" in rows.streams[control]["decode_error"]


@pytest.mark.parametrize("prefix", [
    b"\xff" + bytes(8) + b"\x7f\x03\x01NULL" + bytes(16),                      # ZMTP 3.1 greeting
    bytes(8) + struct.pack("<6Q", 48 + 4096, 1, 4 << 56, 0, 4096, 0),          # Gloo: seq 0, then a preamble
    b"\x00" + struct.pack("<I", 0x3C85F7CE) + b"\x01" + struct.pack("<Q", 12),  # TCPStore VALIDATE then SET
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    struct.pack("<Qi", NCCL_SOCKET_MAGIC, 4) + bytes(40),                       # NCCL IB set-up: not ours
    struct.pack("<Qi", 0x1234, 2) + bytes(20),                                  # proxy with an unknown magic
])
def test_other_protocols_are_not_claimed(prefix):
    decoder = NcclSocketCaptureDecoder()
    key = (bytes([198, 18, 0, 1]), 40000, bytes([198, 18, 0, 2]), 5000)
    assert decoder.claim(TcpDirection(1, key, True), prefix[:64]) is False


def test_line_protocol_needs_evidence():
    rng = random.Random(1)
    assert line_protocol(ll_buffer(rng.randbytes(128), 3), 256) == "LL"
    assert line_protocol(ll128_buffer(rng.randbytes(240), 9), 256) == "LL128"
    assert line_protocol(rng.randbytes(256), 4096) == "Simple"
    assert line_protocol(bytes(256), 4096) is None                       # a zero tensor proves nothing
    assert line_protocol(struct.pack("<f", 1.0) * 64, 4096) is None     # nor does a constant one
    assert line_protocol(ll_buffer(rng.randbytes(8), 3), 16) is None     # one LL line is not enough


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.binary(max_size=80), st.booleans()), min_size=1, max_size=40),
       st.sampled_from([b"", struct.pack("<Qi", NCCL_SOCKET_MAGIC, 3), struct.pack("<Qi", 7, 1)]))
def test_fuzz_random_streams_never_raise(chunks, start):
    """Random bytes and gaps on a few TCP directions, some opened with an NCCL handshake, some not."""
    decoder = NcclSocketCaptureDecoder()
    prefixes: dict[int, bytes] = {}
    claimed: set[int] = set()
    for stream_id, chunk, is_gap in chunks:
        key = (bytes([198, 18, 0, 1]), 40000 + stream_id, bytes([198, 18, 0, 2]), 5000 + stream_id % 2)
        if stream_id in claimed:
            if is_gap:
                decoder.receive_gap(stream_id, len(chunk) + 1, 5, True)
            else:
                decoder.receive_data(stream_id, memoryview(chunk), 5)
            continue
        prefixes[stream_id] = prefixes.get(stream_id, start + bytes([stream_id])) + chunk
        if decoder.claim(TcpDirection(stream_id, key, True), prefixes[stream_id][:64]):
            claimed.add(stream_id)
            decoder.receive_data(stream_id, memoryview(prefixes[stream_id]), 5)
    decoder.end_of_capture()
    rows_of(decoder)


def test_a_one_way_stream_of_zero_bytes_is_not_nccl(tmp_path):
    """2 MB of zeros from the SYN on (dd from /dev/zero over netcat, a sparse file copied) reads as a pre-2.16
    control socket of index 0 carrying a message of size 0 every four bytes: nothing announces NCCL and no
    message has a byte in it, so the stream stays plain TCP."""
    cap = TcpCapture()
    conn = cap.connect(("198.18.0.1", 40000), ("198.18.0.2", 5000))
    cap.send(conn, bytes(2_000_000))
    cap.close(conn)
    rows, keys = run_decoder(cap.write(tmp_path / "zeros.pcap"), NcclSocketCaptureDecoder())
    assert (rows.messages, rows.streams) == ([], {})
