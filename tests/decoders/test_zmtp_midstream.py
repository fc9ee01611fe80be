"""Plain ZMTP caught mid-connection: a direction whose start is not in the capture is ZMTP from the first frame
boundary a run of frames supports, when another connection to the same server opened with a ZMTP greeting in
the capture; flagged as mid-stream (syn_seen false, zmtp_version null, resyncs 1, its first message marked
incomplete: no greeting vouches for it). Random bytes, text and arrays of small integers on the same port stay
plain TCP.

Real traffic: the pyzmq captures recorded elsewhere (/work/shared/realcaps/pyzmq-docker, copied to
pcaps/realcaps/pyzmq-docker with their README: a PUB sending "WAKTU <date>" every second to a SUB on port
12345, from the connection's SYN), cut with editcap so that the capture starts inside that connection, merged with
mergecap with the other run's capture, whose own SUB connects to the same server address and port with a
greeting; ground truth: the messages tshark's TCP follow (-z follow,tcp,raw) shows on the cut direction. And real
libzmq bytes (pyzmq through tests/support/zmtp_tap.py's recording relay), written as TCP segments, the
connection's start dropped at every segment: truth is what the program sent.
"""
from __future__ import annotations

import os
import random
import re
import struct
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import zmq

from dlcsniff.decoders.job import decode_paths
from dlcsniff.decoders.protocols.zmtp.decoder import Message
from dlcsniff.decoders.protocols.zmtp.midstream import MIDSTREAM_RUN_FRAMES, MIDSTREAM_RUN_MESSAGES, MidstreamZmtp
from tests.conftest import PCAPS, require_tool
from tests.support.nccl_gen import TcpCapture
from tests.support.zmtp_tap import Tap

PYZMQ = PCAPS / "realcaps" / "pyzmq-docker"
# in aryobagus_zmq the SUB 172.19.0.7:53834 connects to the PUB at 172.19.0.3:12345 at 11:59:39.58 UTC and
# receives one message a second; the capture is cut 15.4 s later, inside that connection
CUT_AT = "2025-09-19 11:59:55"
# daptong_zmq moved into the cut capture's time (its first packet 5 s after the cut): its SUB connects to the same
# 172.19.0.3:12345 a hundred seconds later, greeting and all
SHIFT_S = "343762.344"
MIDSTREAM_END = ("172.19.0.7", 53834)
SERVER, PUSHER = ("198.18.0.2", 5555), ("198.18.0.1", 40000)


def _tshark_messages(path: Path, client: tuple[str, int]) -> list[bytes]:
    """The server's bytes to `client` by tshark's TCP follow, cut into the PUB's WAKTU messages (a one-frame
    ZMTP message: flags 0, size 30, "WAKTU <date>")."""
    stream = subprocess.run([require_tool("tshark"), "-r", str(path), "-Y",
                             f"ip.addr == {client[0]} && tcp.port == {client[1]}", "-T", "fields", "-e", "tcp.stream"],
                            capture_output=True, text=True, check=True).stdout.split()[0]
    follow = subprocess.run([require_tool("tshark"), "-r", str(path), "-q", "-z", f"follow,tcp,raw,{stream}"],
                            capture_output=True, text=True, check=True).stdout
    node0 = re.search(r"Node 0: ([\d.]+):(\d+)", follow).groups()
    lines = [line for line in follow.splitlines() if re.fullmatch(r"\t?[0-9a-f]+", line)]
    # tshark indents node 1's bytes: the server's are node 0's when it sent the capture's first packet
    server_indent = "" if node0 != (client[0], str(client[1])) else "\t"
    data = bytes.fromhex("".join(line.strip() for line in lines if line.startswith("\t") == bool(server_indent)))
    return re.findall(rb"\x00\x1eWAKTU .{24}", data, re.S)


@pytest.fixture(scope="module")
def caught_mid_connection(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("pyzmq")
    cut, shifted, merged = directory / "cut.pcap", directory / "shifted.pcap", directory / "merged.pcap"
    subprocess.run([require_tool("editcap"), "-A", CUT_AT, str(PYZMQ / "aryobagus_zmq.pcap.gz"), str(cut)], check=True,
                   capture_output=True, env={**os.environ, "TZ": "UTC"})
    subprocess.run([require_tool("editcap"), "-t", SHIFT_S, str(PYZMQ / "daptong_zmq.pcap.gz"), str(shifted)],
                   check=True, capture_output=True)
    subprocess.run([require_tool("mergecap"), "-w", str(merged), str(cut), str(shifted)], check=True,
                   capture_output=True)
    return merged


def _direction(tables, src: tuple[str, int] | None, dst: tuple[str, int]) -> tuple[pd.Series, pd.DataFrame]:
    """The streams row of the direction from `src` (any, if None) to `dst`, and its ZMTP rows."""
    streams = tables["streams"].to_pandas()
    chosen = (streams["dst_ip"] == dst[0]) & (streams["dst_port"] == dst[1])
    if src is not None:
        chosen &= (streams["src_ip"] == src[0]) & (streams["src_port"] == src[1])
    (index,) = streams.index[chosen]
    row = streams.loc[index]
    zmtp = tables["zmtp"].to_pandas()
    return row, zmtp[zmtp["flow_id"] == row["flow_id"]].reset_index(drop=True)


def test_real_pyzmq_caught_mid_connection(caught_mid_connection):
    """Every message tshark follows on the cut direction, each 30 bytes; flagged as caught mid-stream."""
    job = decode_paths([caught_mid_connection], workers=0)
    truth = _tshark_messages(caught_mid_connection, MIDSTREAM_END)
    assert len(truth) > 200
    row, zmtp = _direction(job.tables, None, MIDSTREAM_END)
    assert row["protocol"] == "zmtp" and not row["syn_seen"] and pd.isna(row["zmtp_version"])
    assert row["resyncs"] == 1 and row["lost_bytes"] == 0
    assert zmtp["command"].isna().all() and len(zmtp) == len(truth)
    assert [list(sizes) for sizes in zmtp["frame_sizes"]] == [[30]] * len(truth)
    assert list(zmtp["complete"]) == [False] + [True] * (len(truth) - 1)


def test_without_a_greeting_to_that_server_it_stays_tcp(tmp_path):
    """The same cut connection alone: nothing in the capture says its server speaks ZMTP."""
    cut = tmp_path / "cut.pcap"
    subprocess.run([require_tool("editcap"), "-A", CUT_AT, str(PYZMQ / "aryobagus_zmq.pcap.gz"), str(cut)], check=True,
                   capture_output=True, env={**os.environ, "TZ": "UTC"})
    row, zmtp = _direction(decode_paths([cut], workers=0).tables, None, MIDSTREAM_END)
    assert row["protocol"] == "tcp" and zmtp.empty


def _pyzmq_push(messages: list[list[bytes]]) -> bytes:
    """What libzmq's PUSH puts on the wire to a PULL for these multipart messages, greeting included."""
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    for sock in (pull, push):
        sock.setsockopt(zmq.LINGER, 2000)
        sock.setsockopt(zmq.RCVTIMEO, 10_000)
    tap = Tap(pull.bind_to_random_port("tcp://127.0.0.1"))
    push.connect(tap.endpoint)
    for parts in messages:
        push.send_multipart(parts)
    assert [pull.recv_multipart() for _ in messages] == messages
    push.close()            # the relay's recording is whole once both ends closed
    tap.close()
    pull.close()
    ctx.term()
    return tap.only_connection().joined(tap.only_connection().client_to_server)


def _capture(path: Path, stream: bytes, drop_bytes: int, mss: int, other: bytes | None = None,
             hole: int | None = None) -> Path:
    """`stream` from a PUSH at 198.18.0.1:40000 to 198.18.0.2:5555 in segments of `mss` bytes, the connection's
    start (handshake and first segments, up to drop_bytes of its bytes) not captured, nor (`hole`) that data
    segment; with `other`, a second connection to the same server carrying it from its SYN."""
    cap = TcpCapture(mss=mss, seed=drop_bytes)
    conn = cap.connect(PUSHER, SERVER)
    first = len(cap.frames)
    frames = cap.send(conn, stream)
    data = {i for n, i in enumerate(frames) if n * mss < drop_bytes or n == hole}
    dropped = set(range(first)) | data | {i + 1 for i in data}       # and the receiver's ACKs of them
    if other is not None:
        greeted = cap.connect(("198.18.0.1", 40001), SERVER)
        cap.send(greeted, other)
        cap.close(greeted)
    cap.close(conn)
    return cap.write(path, drop=dropped)


@pytest.fixture(scope="module")
def pushed() -> tuple[list[list[bytes]], bytes]:
    rng = random.Random(7)
    messages = [[rng.randbytes(rng.choice([5, 40, 300, 3000]))] + ([rng.randbytes(9)] if i % 3 == 0 else [])
                for i in range(40)]
    return messages, _pyzmq_push(messages)


@pytest.mark.parametrize("mss", [536, 1448, 8960])
def test_real_libzmq_bytes_from_any_segment_on(tmp_path, pushed, mss):
    """Whatever segment the capture starts at: the first frame boundary after it is found, the message it
    falls in is the rest of that message (its earlier frames lost with the segments before), every later one
    is a sent message exactly (the frames' sizes), and the bytes before that boundary are lost."""
    messages, stream = pushed
    # where each frame begins in the stream: after the 64-byte greeting and the READY command (a short command
    # frame: flags 0x04, its size, then the body "\x05READY" and the socket's properties)
    ready = stream.index(b"\x05READY")
    frames, at = [], ready + stream[ready - 1]          # (message, frame, where it begins)
    for m, parts in enumerate(messages):
        for f, part in enumerate(parts):
            frames.append((m, f, at))
            at += (2 if len(part) < 256 else 9) + len(part)
    assert at == len(stream)
    sizes = [[len(part) for part in parts] for parts in messages]
    believed = 0
    segments = len(stream) // mss
    for drop in range(mss, segments * mss + 1, mss * max(1, segments // 12)):
        path = _capture(tmp_path / f"m{drop}.pcap", stream, drop, mss, other=stream)
        row, zmtp = _direction(decode_paths([path], workers=0).tables, PUSHER, SERVER)
        m, f, begins = next(frame for frame in frames if frame[2] >= drop)
        # too little left to rule out chance: the first message (a rest, or untrusted) and what follows must
        # hold MIDSTREAM_RUN_FRAMES frames with a body, MIDSTREAM_RUN_MESSAGES whole messages after the first
        if len(sizes[m][f:]) + sum(map(len, sizes[m + 1:])) < MIDSTREAM_RUN_FRAMES \
                or len(sizes) - m - 1 < MIDSTREAM_RUN_MESSAGES:
            assert row["protocol"] == "tcp" and zmtp.empty, drop
            continue
        believed += 1
        assert row["protocol"] == "zmtp" and not row["syn_seen"] and row["resyncs"] == 1, drop
        got = [list(s) for s in zmtp["frame_sizes"]]
        assert got == [sizes[m][f:]] + sizes[m + 1:], (drop, m, f)
        assert row["lost_bytes"] == begins - drop
        assert not zmtp["complete"][0] and zmtp["complete"][1:].all()
    assert believed >= 2


def test_a_hole_later_costs_only_what_it_touched(tmp_path, pushed):
    """A segment lost further on (after the first boundary): the direction is still ZMTP, the messages the hole
    touched are incomplete, every other one is a sent message, in order."""
    messages, stream = pushed
    sizes = [[len(part) for part in parts] for parts in messages]
    path = _capture(tmp_path / "hole.pcap", stream, 1448 * 2, 1448, other=stream, hole=10)
    row, zmtp = _direction(decode_paths([path], workers=0).tables, PUSHER, SERVER)
    assert row["protocol"] == "zmtp" and row["missing_bytes"] == 1448
    whole = [list(s) for s, complete in zip(zmtp["frame_sizes"], zmtp["complete"]) if complete]
    later = iter(sizes)
    assert all(any(got == sent for sent in later) for got in whole)          # a subsequence of what was sent
    assert len(whole) >= len(sizes) - 10


NEAR_MISSES = {
    "random bytes": lambda rng: rng.randbytes(60_000),
    "HTTP": lambda rng: b"".join(b"GET /x/%d HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n" % i for i in range(2000)),
    # int16 ones and small values: "01 00 01 00": endless empty MORE frames, never a message's end
    "small integers": lambda rng: struct.pack("<30000h", *([1] * 20000 + [rng.randrange(4) for _ in range(10000)])),
    "a length-prefixed protocol": lambda rng: b"".join(struct.pack("!I", len(b)) + b for b in
                                                       (rng.randbytes(rng.randrange(1, 200)) for _ in range(500))),
    # what passed a run of 8 frames with a body and 2 whole messages (module doc of decoders.protocols.zmtp.midstream)
    "int32 small values": lambda rng: struct.pack("<15000i", *(rng.randrange(8) for _ in range(15000))),
    "sparse bytes": lambda rng: bytes(rng.choice([0, 0, 0, 0, 1, 2, rng.randrange(256)]) for _ in range(60_000)),
}


@pytest.mark.parametrize("kind", NEAR_MISSES)
def test_other_bytes_to_a_zmtp_server_stay_tcp(tmp_path, pushed, kind):
    """A connection caught mid-stream to the very server another connection greeted with ZMTP, carrying no
    ZMTP: no run of frames long enough to rule out chance; it stays plain TCP."""
    _, stream = pushed
    for seed in range(5):
        rng = random.Random(f"{kind} {seed}")
        path = _capture(tmp_path / "near.pcap", NEAR_MISSES[kind](rng), 1448 * 2, 1448, other=stream)
        row, zmtp = _direction(decode_paths([path], workers=0).tables, PUSHER, SERVER)
        assert row["protocol"] == "tcp" and zmtp.empty, seed


def _read(chunks: list[bytes]) -> tuple[list, int, int]:
    reading = MidstreamZmtp()
    for i, chunk in enumerate(chunks):
        reading.zmtp.receive_data(chunk, i)
        reading.drain()
    reading.zmtp.receive_end(0)
    reading.drain()
    return ([(type(ev).__name__, ev.frame_sizes if isinstance(ev, Message) else ev.name) for ev in reading.events()],
            reading.lost_bytes, reading.resyncs)


def test_the_reading_is_the_same_however_the_bytes_come(pushed):
    """Whole, one byte at a time, in random chunks, with bytes of no frame after the last one: the same run."""
    _, stream = pushed
    tail = stream[1000:]
    rng = random.Random(3)
    cuts = sorted(rng.sample(range(1, len(tail)), 200))
    whole = _read([tail])
    assert whole[0] and whole[2] == 1
    assert _read([tail[i:i + 1] for i in range(len(tail))]) == whole
    assert _read([tail[a:b] for a, b in zip([0] + cuts, cuts + [len(tail)])]) == whole
    trailing = _read([tail + b"\xff" * 40])
    assert trailing[0] == whole[0]
