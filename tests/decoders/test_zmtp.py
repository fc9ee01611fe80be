"""ZMTP decoder on hand-built bytes (RFC 13/15/23/37): every version, mechanisms, gaps, resync, fuzz.

Each stream is fed whole, one byte at a time, in random chunks and with trailing bytes: the events
must not depend on how the stream was cut. Real libzmq bytes are in test_zmtp_live.py.
"""
from __future__ import annotations

import random
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.protocols.zmtp.decoder import Command, DecodeFailed, Greeting, Message, Resync, ZmtpDecoder
from tests.support.zmtp_tap import (Gap, bytewise, command, decode, decode_with_invariants, drain, frame, greeting_v2,
                            greeting_v3, message, messages, metadata, random_chunks, v1_frame, v1_message,
                            without_timestamps)

RNG = random.Random(20240611)


def payload(size: int) -> bytes:
    return RNG.randbytes(size)


@pytest.fixture(autouse=True)
def same_payloads_in_any_test_order():
    RNG.seed(20240611)


def decode_every_way(stream: bytes, **options) -> tuple[list, ZmtpDecoder]:
    """Decode whole; check byte-by-byte, random chunks and trailing bytes give the same events."""
    events, decoder = decode([(stream, 0)], **options)
    expected = without_timestamps(events)
    assert without_timestamps(decode(bytewise(stream), **options)[0]) == expected
    for seed in range(3):
        assert without_timestamps(decode(random_chunks(stream, seed, 700), **options)[0]) == expected
    # trailing bytes: the start of one more frame must not change or delay anything before it
    unended = without_timestamps(decode([(stream, 0)], end=False, **options)[0])
    assert without_timestamps(decode([(stream + b"\x01", 0)], end=False, **options)[0]) == unended
    return events, decoder


def data_events(events: list) -> list:
    """Messages and commands, normalised for comparison with hand-written expectations."""
    return [ev for ev in without_timestamps(events) if isinstance(ev, (Message, Command))]


def msg(*frames, complete: bool = True, kept: bool = True) -> Message:
    return Message(0, 0, tuple(len(f) for f in frames),
                   tuple(f if kept and len(f) <= 65536 else None for f in frames), complete)


def cmd(name: str, size: int, properties: dict | None = None, complete: bool = True) -> Command:
    return Command(name, 0, 0, size, properties or {}, complete)


READY_DEALER = {b"Socket-Type": b"DEALER", b"Identity": b"ps9", b"X-Job": b"mlp"}


# -- versions -----------------------------------------------------------------------------------------

def test_zmtp31_null_stream_with_every_frame_form():
    big = payload(70_000)
    ready = metadata(READY_DEALER)
    stream = (greeting_v3() + command(b"READY", ready)
              + message(b"meta", b"")
              + message(bytes(255), b"\x01" * 256)
              + frame(b"a", more=True) + command(b"PING", b"\x00\x64ctx") + frame(b"b")   # PING inside a message
              + message(big)
              + command(b"SUBSCRIBE", b"topic") + command(b"CANCEL", b"topic")
              + message(b""))
    events, dec = decode_every_way(stream)
    assert events[0] == Greeting("3.1", "NULL", False, None, 0)
    assert data_events(events) == [
        cmd("READY", 6 + len(ready), {k.decode(): v for k, v in READY_DEALER.items()}),
        msg(b"meta", b""),
        msg(bytes(255), b"\x01" * 256),
        cmd("PING", 5 + 5),
        msg(b"a", b"b"),
        msg(big),
        cmd("SUBSCRIBE", 10 + 5),
        cmd("CANCEL", 7 + 5),
        msg(b""),
    ]
    assert (dec.version, dec.mechanism, dec.as_server, dec.encrypted) == ("3.1", "NULL", False, False)
    assert (dec.socket_type, dec.identity, dec.properties["X-Job"]) == ("DEALER", b"ps9", b"mlp")
    assert (dec.messages, dec.commands, dec.frames, dec.lost_bytes, dec.resyncs) == (5, 4, 8, 0, 0)


def test_zmtp30_sends_subscriptions_as_messages():
    stream = (greeting_v3(minor=0, as_server=True) + command(b"READY", metadata({b"Socket-Type": b"SUB"}))
              + message(b"\x01topic") + message(b"\x00topic"))
    events, dec = decode_every_way(stream)
    assert events[0] == Greeting("3.0", "NULL", True, None, 0)
    assert messages(without_timestamps(events)) == [msg(b"\x01topic"), msg(b"\x00topic")]
    assert dec.socket_type == "SUB" and dec.identity is None


def test_zmtp20_greeting_identity_frame_and_frames():
    stream = greeting_v2(5) + frame(b"ps4") + message(b"meta", payload(300)) + message(b"x")
    events, dec = decode_every_way(stream)
    assert events[0] == Greeting("2.0", "NULL", False, "DEALER", 0)
    assert [m.frame_sizes for m in messages(events)] == [(4, 300), (1,)]
    assert (dec.version, dec.socket_type, dec.identity) == ("2.0", "DEALER", b"ps4")


def test_zmtp3_peer_talking_down_to_a_20_peer():
    # libzmq >= 3 sends revision 3 and then, seeing a 2.0 peer, its socket type and 2.0 frames.
    stream = b"\xff" + bytes(7) + b"\x01\x7f" + bytes([3, 6]) + frame(b"") + message(b"hello")
    events, dec = decode_every_way(stream)
    assert events[0] == Greeting("2.0", "NULL", False, "ROUTER", 0)
    assert messages(without_timestamps(events)) == [msg(b"hello")]
    assert dec.identity == b""


def test_zmtp10_unversioned_with_short_and_long_lengths():
    stream = v1_frame(b"peer") + v1_message(b"a", payload(300)) + v1_message(bytes(253)) + v1_message(bytes(254))
    events, dec = decode_every_way(stream)
    assert events[0] == Greeting("1.0", "NULL", False, None, 0)
    assert [m.frame_sizes for m in messages(events)] == [(1, 300), (253,), (254,)]
    assert (dec.version, dec.identity) == ("1.0", b"peer")


def test_zmtp10_long_identity_frame_is_not_a_signature():
    identity = payload(300)
    stream = v1_frame(identity) + v1_message(b"x")
    assert stream[0] == 0xFF and not stream[9] & 1
    _, dec = decode_every_way(stream)
    assert (dec.version, dec.identity, dec.messages) == ("1.0", identity, 1)


def test_zmtp3_peer_talking_down_to_an_unversioned_peer():
    # libzmq stops after its signature, which the 1.0 peer reads as a long identity frame (flags 0x7F).
    signature = b"\xff" + (1).to_bytes(8, "big") + b"\x7f"
    for first in (b"", b"o", b"one", b"ONE"):      # byte 10 reads as revision 1, 2, 4, byte 12 as a mechanism
        stream = signature + v1_message(first, b"x") + v1_message(b"two", b"three")
        events, dec = decode_every_way(stream)
        assert dec.version == "1.0" and dec.identity == b""
        assert messages(without_timestamps(events)) == [msg(first, b"x"), msg(b"two", b"three")]


def test_zmtp10_with_revision_byte():
    stream = greeting_v2(3, revision=0) + v1_frame(b"") + v1_message(b"req")
    events, dec = decode_every_way(stream)
    assert events[0] == Greeting("1.0", "NULL", False, "REQ", 0)
    assert messages(without_timestamps(events)) == [msg(b"req")]


# -- mechanisms -----------------------------------------------------------------------------------------

def test_plain_hello_shows_the_user_name_never_the_password():
    password = b"s3cret-Pa55word"
    hello = b"\x05alice" + bytes([len(password)]) + password
    stream = (greeting_v3(b"PLAIN") + command(b"HELLO", hello)
              + command(b"INITIATE", metadata({b"Socket-Type": b"REQ", b"Identity": b""}))
              + message(b"", b"job"))
    events, dec = decode_every_way(stream)
    assert commands_named(events) == ["HELLO", "INITIATE"]
    assert events[1].properties == {"Username": b"alice"}
    assert (dec.mechanism, dec.encrypted, dec.socket_type) == ("PLAIN", False, "REQ")
    seen = repr(events) + repr(vars(dec) | {"_queue": None})
    assert password not in seen.encode() and password.decode() not in seen


def commands_named(events: list) -> list[str]:
    return [ev.name for ev in events if isinstance(ev, Command)]


def test_curve_frames_are_sized_commands_and_the_stream_is_encrypted():
    boxes = [payload(n) for n in (17, 300, 5000)]
    stream = (greeting_v3(b"CURVE") + command(b"HELLO", payload(194)) + command(b"INITIATE", payload(250))
              # after the handshake libzmq sends every frame as a MESSAGE command in a plain frame
              + b"".join(frame(b"\x07MESSAGE" + box) for box in boxes))
    events, dec = decode_every_way(stream)
    assert dec.encrypted and dec.mechanism == "CURVE" and dec.properties == {}
    assert data_events(events) == [cmd("HELLO", 200), cmd("INITIATE", 259)] + [
        cmd("MESSAGE", 8 + len(box)) for box in boxes]


def test_error_command():
    stream = greeting_v3() + command(b"ERROR", b"\x0dAccess denied")
    events, _ = decode_every_way(stream)
    assert data_events(events) == [cmd("ERROR", 6 + 14)]


# -- timestamps and bodies --------------------------------------------------------------------------------

def test_timestamps_are_those_of_the_chunks_with_the_first_and_last_byte():
    head = greeting_v3() + command(b"READY", metadata({b"Socket-Type": b"PUSH"}))
    body = message(b"meta", payload(1000))
    chunks = [(head[:10], 50), (head[10:] + body[:1], 100), (body[1:500], 200), (body[500:], 300),
              (message(b"z"), 400)]
    events, _ = decode(chunks)
    first, second = messages(events)
    assert (first.ts_first_ns, first.ts_last_ns) == (100, 300)
    assert (second.ts_first_ns, second.ts_last_ns) == (400, 400)
    assert events[0].ts_ns == 100       # the greeting's last byte


def test_keep_body_decides_per_frame_and_kept_bodies_are_views_when_whole_in_a_chunk():
    calls = []

    def keep_first(frame_index: int, size_bytes: int) -> bool:
        calls.append((frame_index, size_bytes))
        return frame_index == 0

    chunk = greeting_v3() + message(b"meta", b"data") + message(payload(100_000), b"tail")
    events, _ = decode([(chunk, 0)], keep_body=keep_first)
    assert calls == [(0, 4), (1, 4), (0, 100_000), (1, 4)]
    first, second = messages(events)
    assert first.frames[0] == b"meta" and first.frames[1] is None
    assert isinstance(first.frames[0], memoryview) and first.frames[0].obj is chunk
    assert bytes(second.frames[0]) == chunk[64 + 2 + 4 + 2 + 4 + 9:][:100_000] and second.frames[1] is None
    # split over chunks, a kept body is joined
    events, _ = decode(random_chunks(chunk, 1, 500), keep_body=keep_first)
    assert without_timestamps(events) == without_timestamps(decode([(chunk, 0)], keep_body=keep_first)[0])


# -- gaps, end of stream, resynchronisation ------------------------------------------------------------------

def single_frame_stream(count: int, size: int = 600) -> tuple[bytes, list[bytes], list[int]]:
    """Greeting + READY + `count` one-frame messages starting b"M"; returns (stream, bodies, frame offsets)."""
    stream = greeting_v3() + command(b"READY", metadata({b"Socket-Type": b"PUSH"}))
    bodies, offsets = [], []
    for i in range(count):
        body = b"M%03d" % i + payload(size - 4)
        offsets.append(len(stream))
        stream += message(body)
        bodies.append(body)
    return stream, bodies, offsets


def cut(stream: bytes, start: int, end: int, *, seed: int = 0) -> list:
    """The stream with [start, end) lost, in random chunks around a Gap."""
    return random_chunks(stream[:start], seed) + [Gap(end - start)] + [
        (data, ts + end) for data, ts in random_chunks(stream[end:], seed + 1)]


def test_gap_inside_a_body_costs_nothing_but_the_message():
    stream, bodies, offsets = single_frame_stream(6)
    events, dec = decode(cut(stream, offsets[2] + 100, offsets[2] + 400))
    assert messages(without_timestamps(events)) == [
        msg(b) if i != 2 else Message(0, 0, (600,), (None,), False) for i, b in enumerate(bodies)]
    assert (dec.lost_bytes, dec.resyncs) == (0, 0)


def test_gap_from_a_body_into_the_next_header_resynchronises_after_that_frame():
    stream, bodies, offsets = single_frame_stream(8)
    frame_size = offsets[4] - offsets[3]
    pieces = cut(stream, offsets[2] + 300, offsets[3] + 5)
    damaged = Message(0, 0, (600,), (None,), False)
    events, dec = decode(pieces, frame_validator=lambda body: body[:1] == b"M")
    assert [(r.offset, r.lost_bytes) for r in events if isinstance(r, Resync)] == [(offsets[4], frame_size)]
    assert messages(without_timestamps(events)) == [msg(b) for b in bodies[:2]] + [damaged] + [
        msg(b) for b in bodies[4:]]
    assert (dec.lost_bytes, dec.resyncs) == (frame_size, 1)
    # Without a validator a boundary is guessed from headers alone: never after the true one, and the
    # first message found is not trusted (a false boundary in payload can chain into the true frames).
    events, dec = decode(pieces)
    (resync,) = [ev for ev in events if isinstance(ev, Resync)]
    assert offsets[3] + 5 <= resync.offset <= offsets[4] and dec.lost_bytes == resync.offset - offsets[3]
    found = messages(without_timestamps(events))
    assert found[:3] == [msg(b) for b in bodies[:2]] + [damaged] and found[3].complete is False
    assert found[-3:] == [msg(b) for b in bodies[5:]]


def test_gap_at_a_header_inside_a_multipart_message_ends_it_incomplete():
    stream = greeting_v3() + message(b"M0", b"x" * 50, b"y" * 60) + message(b"M1") + message(b"M2")
    start = len(greeting_v3()) + 2 + 2 + 2 + 50            # the third frame's header
    events, dec = decode(cut(stream, start, start + 2), frame_validator=lambda body: body[:1] == b"M")
    assert messages(without_timestamps(events)) == [Message(0, 0, (2, 50), (b"M0", b"x" * 50), False),
                                                    msg(b"M1"), msg(b"M2")]
    assert dec.lost_bytes == 2 + 60


def test_gap_in_the_greeting():
    stream, bodies, _ = single_frame_stream(5)
    events, dec = decode(cut(stream, 20, 30), frame_validator=lambda body: body[:1] == b"M")
    assert isinstance(events[0], Resync) and events[0].reason == "gap in the greeting"
    assert dec.version is None
    assert messages(without_timestamps(events)) == [msg(b) for b in bodies]


def test_end_of_stream_inside_a_message_or_a_header():
    stream = greeting_v3() + message(b"M0", payload(1000), b"z")
    events, dec = decode_every_way(stream[:-30])
    assert messages(without_timestamps(events)) == [Message(0, 0, (2, 1000), (b"M0", None), False)]
    assert dec.lost_bytes == 0
    events, dec = decode_every_way(stream[:-2])     # the last frame's header is cut in half
    assert messages(events)[0].complete is False and dec.lost_bytes == 1
    dec.receive_end(0)                              # the end, again, then bytes after it: only counted
    dec.receive_data(b"late", 0)
    dec.receive_gap(6, 0)
    assert drain(dec) == [] and dec.lost_bytes == 1 + 4 + 6


def test_values_cut_by_the_snaplen_leave_the_message_whole_but_lost_ones_do_not():
    values = payload(200_000)
    stream = greeting_v3() + message(b"M0", values, b"lens") + message(b"M1")
    body_start = len(greeting_v3()) + len(frame(b"M0", more=True)) + 9      # a long frame's 9-byte header
    kept, rest = stream[:body_start + 1000], stream[body_start + 200_000:]  # 1000 value bytes were captured
    for lost in (False, True):
        events, dec = decode([(kept, 0), Gap(199_000, 0, lost=lost), (rest, 0)])
        assert messages(without_timestamps(events)) == [
            Message(0, 0, (2, 200_000, 4), (b"M0", None, b"lens"), not lost), msg(b"M1")]
        assert dec.lost_bytes == 0 and dec.resyncs == 0
    # A cut inside a body that is kept (the meta) leaves that frame incomplete: its bytes were wanted.
    events, _ = decode([(stream[:len(greeting_v3()) + 3], 0), Gap(1, 0, lost=False),
                        (stream[len(greeting_v3()) + 4:], 0)])
    assert [m.complete for m in messages(events)] == [False, True]


def test_midstream_resynchronises_on_the_next_validated_message():
    stream, bodies, offsets = single_frame_stream(10)
    for start in (offsets[0] + 1, offsets[3] - 1, offsets[3] + 300):
        following = next(i for i, off in enumerate(offsets) if off >= start)
        events, dec = decode_every_way(stream[start:], midstream=True, frame_validator=lambda b: b[:1] == b"M")
        assert events[0] == Resync(offsets[following] - start, offsets[following] - start, 0,
                                   "capture started mid-stream")
        assert messages(without_timestamps(events)) == [msg(b) for b in bodies[following:]]
        assert dec.version is None
        # without a validator the first message found is not trusted to be whole
        events, _ = decode([(stream[start:], 0)], midstream=True)
        found = messages(without_timestamps(events))
        assert found[0].complete is False and found[-5:] == [msg(b) for b in bodies[-5:]]


def test_midstream_capture_that_starts_at_the_greeting():
    stream, bodies, _ = single_frame_stream(3)
    events, dec = decode_every_way(stream, midstream=True)
    assert isinstance(events[0], Greeting) and dec.version == "3.1" and dec.resyncs == 0
    assert messages(without_timestamps(events)) == [msg(b) for b in bodies]


def test_reserved_flag_bits_lose_sync_and_the_frame():
    stream, bodies, offsets = single_frame_stream(6)
    broken = bytearray(stream)
    broken[offsets[2]] |= 0x80
    events, dec = decode_every_way(bytes(broken), frame_validator=lambda b: b[:1] == b"M")
    resync = next(ev for ev in events if isinstance(ev, Resync))
    assert resync.reason.startswith("reserved flag bits") and resync.lost_bytes == offsets[3] - offsets[2]
    assert messages(without_timestamps(events)) == [msg(b) for i, b in enumerate(bodies) if i != 2]


def test_zmtp10_stream_that_stops_making_sense_fails_and_counts_the_rest():
    stream = v1_frame(b"") + v1_message(b"ok") + b"\x00\x00" + v1_message(b"never")
    events, dec = decode_every_way(stream)
    assert messages(without_timestamps(events)) == [msg(b"ok")]
    failed = [ev for ev in events if isinstance(ev, DecodeFailed)]
    assert failed == [DecodeFailed(2 + 4, "ZMTP 1.0 frame of length 0 (it must count its flags byte) "
                                          "(ZMTP 1.0 streams are not resynchronised)")]
    assert dec.lost_bytes == len(stream) - 6
    dec.receive_data(b"more", 1)
    dec.receive_gap(10, 2)
    assert drain(dec) == [] and dec.lost_bytes == len(stream) - 6 + 14


def test_a_validator_that_raises_decode_error_rejects_the_candidate():
    def strict(body: bytes) -> bool:
        if body[:1] != b"M":
            raise DecodeError("not a meta")
        return True

    stream, bodies, offsets = single_frame_stream(5)
    events, _ = decode_every_way(stream[offsets[0] + 10:], midstream=True, frame_validator=strict)
    assert messages(without_timestamps(events)) == [msg(b) for b in bodies[1:]]


def test_frames_larger_than_the_scan_window_are_believed_on_their_own_header():
    stream = greeting_v3() + b"".join(message(b"M%d" % i + payload(10_000)) for i in range(6))
    events, dec = decode_every_way(stream[100:], midstream=True, max_buffer=4096)
    found = messages(without_timestamps(events))
    assert [m.frame_sizes for m in found] == [(10_002,)] * 5 and found[0].complete is False
    assert [bytes(m.frames[0][:2]) for m in found[1:]] == [b"M2", b"M3", b"M4", b"M5"]
    assert dec.lost_bytes == 64 + 9 + 10_002 - 100


def test_a_lone_short_frame_before_the_end_needs_a_validator():
    stream = payload(50) + message(b"M1" + payload(100))
    events, dec = decode_every_way(stream, midstream=True)
    assert (messages(events), dec.lost_bytes) == ([], len(stream))
    events, dec = decode_every_way(stream, midstream=True, frame_validator=lambda b: b[:1] == b"M")
    assert [(m.frame_sizes, m.complete) for m in messages(events)] == [((102,), True)] and dec.lost_bytes == 50
    # cut by the end, its body cannot be validated
    _, dec = decode_every_way(stream[:-20], midstream=True, frame_validator=lambda b: b[:1] == b"M")
    assert (dec.messages, dec.lost_bytes) == (0, len(stream) - 20)


def test_a_lone_command_before_the_end_is_believed_by_its_name():
    stream = bytes(50) + command(b"PING", b"\x00\x01")
    events, dec = decode_every_way(stream, midstream=True)
    assert [ev.name for ev in events if isinstance(ev, Command)] == ["PING"] and dec.lost_bytes == 50


def test_malformed_commands_lose_sync_on_that_frame_only():
    plain = [message(b"M0"), message(b"M1"), message(b"M2")]
    for head, good, bad in (
            (greeting_v3(), plain, frame(b"\x09READ", command=True)),                      # name cut short
            (greeting_v3(), plain, frame(b"\x05RE@DY", command=True)),                     # not letters
            (greeting_v3(b"CURVE"), [frame(b"\x07MESSAGE" + payload(60)) for _ in range(3)],
             frame(b"\x04ABCD" + payload(40)))):                                           # not a command
        stream = head + good[0] + bad + good[1] + good[2]
        events, dec = decode_every_way(stream, frame_validator=lambda b: b[:1] == b"M")
        assert (dec.lost_bytes, dec.resyncs) == (len(bad), 1)
        assert dec.messages + dec.commands == 3


def test_truncated_metadata_keeps_the_whole_properties():
    props = metadata({b"Socket-Type": b"PUB", b"X-Half": b"value"})[:-3]
    _, dec = decode_every_way(greeting_v3() + command(b"READY", props) + message(b"x"))
    assert dec.properties == {"Socket-Type": b"PUB"} and dec.messages == 1


# -- fuzz ---------------------------------------------------------------------------------------------

BASE_STREAMS = [
    single_frame_stream(6, 300)[0],
    greeting_v3() + message(b"M0", bytes(700)) + command(b"PING", b"\x00\x01") + message(b"M1", b"", payload(40)),
    greeting_v3(b"CURVE") + command(b"HELLO", payload(194)) + frame(b"\x07MESSAGE" + payload(400)),
    greeting_v2(7) + frame(b"id") + message(b"M", payload(280)),
    v1_frame(b"") + v1_message(b"a", payload(400)),
]


@st.composite
def mutated_streams(draw):
    stream = bytearray(draw(st.sampled_from(BASE_STREAMS)))
    for _ in range(draw(st.integers(0, 4))):
        pos = draw(st.integers(0, len(stream) - 1))
        stream[pos] = draw(st.integers(0, 255))
    segments: list = [bytes(stream)]
    if draw(st.booleans()):
        start = draw(st.integers(0, len(stream) - 1))
        end = draw(st.integers(start + 1, len(stream)))
        segments = [bytes(stream[:start]), Gap(end - start), bytes(stream[end:])]
    return segments


VALIDATORS = st.sampled_from([None, lambda body: body[:1] == b"M"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(segments=mutated_streams(), sizes=st.lists(st.integers(1, 600), max_size=8),
       midstream=st.booleans(), validator=VALIDATORS)
def test_fuzz_mutated_streams_never_raise_and_do_not_depend_on_chunking(segments, sizes, midstream, validator):
    events = decode_with_invariants(segments, sizes, midstream=midstream, frame_validator=validator)
    whole = decode_with_invariants(segments, [], midstream=midstream, frame_validator=validator)
    assert without_timestamps(events) == without_timestamps(whole)


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=3000), sizes=st.lists(st.integers(1, 700), max_size=6),
       midstream=st.booleans(), validator=VALIDATORS)
def test_fuzz_random_bytes(data, sizes, midstream, validator):
    events = decode_with_invariants([data], sizes, midstream=midstream, frame_validator=validator)
    assert without_timestamps(events) == without_timestamps(
        decode_with_invariants([data], [], midstream=midstream, frame_validator=validator))


def test_resync_skips_zero_filled_sparse_and_random_payloads():
    sparse = bytearray(200_000)
    sparse[::997] = b"\x01" * len(sparse[::997])   # "01 00" is an empty frame with MORE, but "00 00" follows
    for filler in (bytes(200_000), bytes(sparse), payload(200_000)):
        for validator in (None, lambda body: body[:1] == b"M"):
            events = decode_with_invariants([filler + message(b"M0") + message(b"M1") + message(b"M2")], [1460],
                                            midstream=True, frame_validator=validator)
            assert [ev.lost_bytes for ev in events if isinstance(ev, Resync)] == [len(filler)]
            assert [m.frames for m in messages(events)] == [(b"M0",), (b"M1",), (b"M2",)]


def test_resync_does_not_believe_long_sizes_libzmq_would_write_short():
    # 02, then 5 as 8 bytes: its last two bytes, 00 05, are a believable short header of the same frame
    stream = b"\x02" + (5).to_bytes(8, "big") + b"abcde" + message(b"M0") + message(b"M1")
    events, dec = decode_every_way(stream, midstream=True)
    assert dec.lost_bytes == 7 and [m.frames for m in messages(events)] == [(b"abcde",), (b"M0",), (b"M1",)]


# -- cost -----------------------------------------------------------------------------------------------

def test_skipped_64mb_frame_is_counted_down_not_copied():
    size = 64 << 20
    head = greeting_v3() + b"\x02" + size.to_bytes(8, "big")
    body = bytes(size)
    view = memoryview(body)
    dec = ZmtpDecoder(keep_body=lambda index, size_bytes: False)
    dec.receive_data(head, 0)
    drain(dec)
    tracemalloc.start()
    try:
        events = []
        for pos in range(0, size, 1460):
            dec.receive_data(view[pos:pos + 1460], pos)
            events.extend(drain(dec))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    assert messages(events) == [Message(0, size - size % 1460, (size,), (None,), True)]
