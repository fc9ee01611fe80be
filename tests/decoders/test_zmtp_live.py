"""ZMTP decoder on the bytes real libzmq (pyzmq, libzmq 4.3.5, ZMTP 3.1) puts on TCP connections.

Each test sends known messages between two real ZeroMQ sockets through a recording loopback relay
(tests/support/zmtp_tap.py) and checks the decoded messages, frame by frame, against what was sent. A raw TCP
peer speaking ZMTP 3.0, 2.0 and 1.0 by hand makes libzmq talk down to those versions; libzmq accepting
the hand-built bytes in turn checks them.
"""
from __future__ import annotations

import random
import socket
import time
from contextlib import contextmanager

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zmq.auth.thread import ThreadAuthenticator

from dlcsniff.decoders.protocols.zmtp.decoder import Greeting, Message, Resync
from tests.support.zmtp_tap import (Gap, Tap, TappedConnection, bytewise, command, commands, decode,
                                    decode_with_invariants, frame, greeting_v2, greeting_v3, message, messages,
                                    metadata, random_chunks, v1_frame, v1_message, without_timestamps)

LINGER_MS = 2000
RECV_TIMEOUT_MS = 10_000


def keep_all(frame_index: int, size_bytes: int) -> bool:
    return True


@pytest.fixture(scope="module")
def ctx():
    context = zmq.Context()
    yield context
    context.term()


@contextmanager
def tapped(ctx, server_type: int, client_type: int, *, server_options=(), client_options=()):
    """A bound server socket, a client connected to it through a Tap; yields (server, client, tap).

    On exit the client closes first (flushing what it queued), the relay waits for both directions to
    end, then the server closes: the recording is the whole connection."""
    server = ctx.socket(server_type)
    client = ctx.socket(client_type)
    for sock, options in ((server, server_options), (client, client_options)):
        sock.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
        sock.setsockopt(zmq.LINGER, LINGER_MS)
        for option, value in options:
            sock.setsockopt(option, value)
    tap = Tap(server.bind_to_random_port("tcp://127.0.0.1"))
    try:
        client.connect(tap.endpoint)
        yield server, client, tap
    finally:
        client.close()
        tap.close()
        server.close()


def decoded(chunks: list, **options) -> tuple[list, object]:
    """Decode real chunks; check that whole, random and (if small) byte-by-byte feeding give the same
    events, and that trailing bytes neither change nor delay any of them."""
    options.setdefault("keep_body", keep_all)
    events, dec = decode(chunks, **options)
    expected = without_timestamps(events)
    stream = TappedConnection.joined(chunks)
    assert without_timestamps(decode([(stream, 0)], **options)[0]) == expected
    assert without_timestamps(decode(random_chunks(stream, len(stream)), **options)[0]) == expected
    if len(stream) < 200_000:
        assert without_timestamps(decode(bytewise(stream), **options)[0]) == expected
    unended = without_timestamps(decode([(stream, 0)], end=False, **options)[0])
    assert without_timestamps(decode([(stream + b"\x01", 0)], end=False, **options)[0]) == unended
    return events, dec


def wire_frames(events: list) -> list[list[bytes]]:
    assert all(m.complete for m in messages(events))
    return [[bytes(f) for f in m.frames] for m in messages(events)]


def payloads(rng: random.Random, sizes) -> list[bytes]:
    return [rng.randbytes(size) for size in sizes]


FRAME_SIZES = (0, 1, 255, 256, 70_000)


# -- socket patterns ----------------------------------------------------------------------------------

def test_req_rep(ctx):
    rng = random.Random(1)
    requests = [payloads(rng, [size]) for size in FRAME_SIZES] + [payloads(rng, FRAME_SIZES)]
    replies = []
    with tapped(ctx, zmq.REP, zmq.REQ) as (rep, req, tap):
        for request in requests:
            req.send_multipart(request)
            got = rep.recv_multipart(copy=False)
            assert [f.bytes for f in got] == request
            peer_type = got[0].get("Socket-Type")
            replies.append(list(reversed(request)))
            rep.send_multipart(replies[-1])
            assert req.recv_multipart() == replies[-1]
    conn = tap.only_connection()
    up, up_dec = decoded(conn.client_to_server)
    down, down_dec = decoded(conn.server_to_client)
    # REQ and REP put the empty delimiter frame on the wire
    assert wire_frames(up) == [[b""] + r for r in requests]
    assert wire_frames(down) == [[b""] + r for r in replies]
    assert (up_dec.version, up_dec.socket_type, down_dec.socket_type) == ("3.1", peer_type, "REP")
    assert isinstance(up[0], Greeting) and up[0].mechanism == "NULL"
    assert [c.name for c in commands(up)] == ["READY"] and up_dec.lost_bytes == 0


def exchange(router, dealer, sent_up, sent_down) -> bytes:
    """DEALER → ROUTER then ROUTER → DEALER multipart messages, each checked on arrival; the DEALER's
    routing id as the ROUTER saw it."""
    for frames in sent_up:
        dealer.send_multipart(frames)
        peer, *got = router.recv_multipart()
        assert got == frames
    for frames in sent_down:
        router.send_multipart([peer] + frames)
        assert dealer.recv_multipart() == frames
    return peer


@pytest.mark.parametrize("routing_id", [b"ps9", None])
def test_dealer_router(ctx, routing_id):
    rng = random.Random(2)
    sent_up = [payloads(rng, [20, size]) for size in FRAME_SIZES]
    sent_down = [payloads(rng, [size, 3]) for size in FRAME_SIZES]
    options = [(zmq.ROUTING_ID, routing_id)] if routing_id else []
    with tapped(ctx, zmq.ROUTER, zmq.DEALER, client_options=options) as (router, dealer, tap):
        peer = exchange(router, dealer, sent_up, sent_down)
    conn = tap.only_connection()
    up, up_dec = decoded(conn.client_to_server)
    down, down_dec = decoded(conn.server_to_client)
    assert wire_frames(up) == sent_up and wire_frames(down) == sent_down
    # libzmq sends an Identity property for DEALER and ROUTER even when it is empty
    assert up_dec.identity == (peer if routing_id else b"") and down_dec.identity == b""
    assert (up_dec.socket_type, down_dec.socket_type) == ("DEALER", "ROUTER")


def test_pub_sub_subscriptions_are_commands_and_messages_follow_them(ctx):
    rng = random.Random(3)
    with tapped(ctx, zmq.PUB, zmq.SUB) as (pub, sub, tap):
        sub.setsockopt(zmq.SUBSCRIBE, b"a")
        sub.setsockopt(zmq.SUBSCRIBE, b"b")
        while True:                          # the subscription reaches the publisher asynchronously
            pub.send(b"a-sync")
            if sub.poll(20):
                break
        published = [[b"a" + p] for p in payloads(rng, [0, 255, 256, 70_000])] + [[b"b-multi", b"part"]]
        for frames in published:
            pub.send_multipart(frames)
        received = []
        while not received or received[-1] != published[-1]:
            received.append(sub.recv_multipart())
        sub.setsockopt(zmq.UNSUBSCRIBE, b"b")
        pub.send(b"a-end")
        assert sub.recv_multipart() == [b"a-end"]
    conn = tap.only_connection()
    up, up_dec = decoded(conn.client_to_server)
    down, _ = decoded(conn.server_to_client)
    assert [(c.name, c.size_bytes) for c in commands(up)] == [
        ("READY", up[1].size_bytes), ("SUBSCRIBE", 10 + 1), ("SUBSCRIBE", 10 + 1), ("CANCEL", 7 + 1)]
    assert up_dec.socket_type == "SUB" and messages(up) == []
    assert wire_frames(down) == received + [[b"a-end"]]
    assert received[-len(published):] == published


def test_push_pull_with_application_metadata(ctx):
    rng = random.Random(4)
    sent = [payloads(rng, [rng.choice(FRAME_SIZES + (1 << 20,)) for _ in range(rng.randint(1, 4))])
            for _ in range(40)]
    with tapped(ctx, zmq.PULL, zmq.PUSH, client_options=[(zmq.METADATA, b"X-Job:mlp")]) as (pull, push, tap):
        for frames in sent:
            push.send_multipart(frames)
        for frames in sent:
            got = pull.recv_multipart(copy=False)
            assert [f.bytes for f in got] == frames
        job = got[0].get("X-Job")
    events, dec = decoded(tap.only_connection().client_to_server)
    assert wire_frames(events) == sent
    assert dec.properties["X-Job"].decode() == job == "mlp"
    assert dec.frames == sum(map(len, sent))


def test_plain_mechanism_never_shows_the_password(ctx):
    password = "Pa55-w0rd-never-shown"
    server_options = [(zmq.PLAIN_SERVER, 1)]
    client_options = [(zmq.PLAIN_USERNAME, b"alice"), (zmq.PLAIN_PASSWORD, password.encode())]
    authenticator = ThreadAuthenticator(ctx)          # libzmq's PLAIN server asks a ZAP handler
    authenticator.start()
    try:
        authenticator.configure_plain(domain="*", passwords={"alice": password})
        with tapped(ctx, zmq.REP, zmq.REQ, server_options=server_options, client_options=client_options) as (
                rep, req, tap):
            req.send(b"job")
            assert rep.recv() == b"job"
            rep.send(b"done")
            assert req.recv() == b"done"
    finally:
        authenticator.stop()
    conn = tap.only_connection()
    assert password.encode() in TappedConnection.joined(conn.client_to_server)    # it is on the wire
    up, up_dec = decoded(conn.client_to_server)
    down, down_dec = decoded(conn.server_to_client)
    assert [c.name for c in commands(up)] == ["HELLO", "INITIATE"]
    assert [c.name for c in commands(down)] == ["WELCOME", "READY"]
    assert commands(up)[0].properties == {"Username": b"alice"}
    assert (up_dec.mechanism, up_dec.socket_type, down_dec.socket_type) == ("PLAIN", "REQ", "REP")
    assert wire_frames(up) == [[b"", b"job"]] and wire_frames(down) == [[b"", b"done"]]
    for dec, events in ((up_dec, up), (down_dec, down)):
        shown = repr(events) + repr({k: v for k, v in vars(dec).items() if k != "_queue"})
        assert password not in shown and password.encode().hex() not in shown


def test_curve_streams_are_encrypted_and_every_frame_is_a_message_command(ctx):
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    server_options = [(zmq.CURVE_SERVER, 1), (zmq.CURVE_SECRETKEY, server_secret)]
    client_options = [(zmq.CURVE_SERVERKEY, server_public), (zmq.CURVE_PUBLICKEY, client_public),
                      (zmq.CURVE_SECRETKEY, client_secret)]
    rng = random.Random(5)
    sent_up = [payloads(rng, [10, size]) for size in FRAME_SIZES]
    sent_down = [payloads(rng, [size]) for size in FRAME_SIZES]
    with tapped(ctx, zmq.ROUTER, zmq.DEALER, server_options=server_options,
                client_options=client_options) as (router, dealer, tap):
        peer = exchange(router, dealer, sent_up, sent_down)
    conn = tap.only_connection()
    up, up_dec = decoded(conn.client_to_server)
    down, down_dec = decoded(conn.server_to_client)
    assert up_dec.encrypted and down_dec.encrypted and up_dec.mechanism == "CURVE"
    assert messages(up) == [] and messages(down) == []
    assert [c.name for c in commands(up) if c.name != "MESSAGE"] == ["HELLO", "INITIATE"]
    assert [c.name for c in commands(down) if c.name != "MESSAGE"] == ["WELCOME", "READY"]
    # one MESSAGE per frame sent; its box holds the flags byte + body + 16-byte MAC after name and nonce
    for events, sent in ((up, sent_up), (down, sent_down)):
        sizes = [c.size_bytes for c in commands(events, "MESSAGE")]
        assert sizes == [8 + 8 + 16 + 1 + len(body) for frames in sent for body in frames]


def test_heartbeats_are_ping_and_pong_commands(ctx):
    with tapped(ctx, zmq.PULL, zmq.PUSH, client_options=[(zmq.HEARTBEAT_IVL, 20), (zmq.HEARTBEAT_TIMEOUT, 10_000)]) as (
            pull, push, tap):
        push.send(b"first")
        assert pull.recv() == b"first"
        wait_for(lambda: TappedConnection.joined(tap.only_connection().server_to_client).count(b"PONG") >= 2)
        push.send(b"last")
        assert pull.recv() == b"last"
    conn = tap.only_connection()
    up, _ = decoded(conn.client_to_server)
    down, _ = decoded(conn.server_to_client)
    pings, pongs = commands(up, "PING"), commands(down, "PONG")
    # libzmq's PING: flags COMMAND, size 7, "\x04PING", TTL (2 bytes); PONG: "\x04PONG", empty context
    raw_up = TappedConnection.joined(conn.client_to_server)
    raw_down = TappedConnection.joined(conn.server_to_client)
    assert len(pings) == raw_up.count(b"\x04\x07\x04PING") >= 2
    assert len(pongs) == raw_down.count(b"\x04\x05\x04PONG") and len(pings) - 1 <= len(pongs) <= len(pings)
    assert wire_frames(up) == [[b"first"], [b"last"]]


def wait_for(condition, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the condition never came true")
        time.sleep(0.01)


# -- libzmq talking to older peers (a raw TCP peer speaks the old version by hand) ------------------------

@contextmanager
def raw_peer(ctx, socket_type: int, greeting_and_frames: bytes):
    """A bound pyzmq socket and a raw TCP peer that has sent `greeting_and_frames` to it."""
    sock = ctx.socket(socket_type)
    sock.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
    sock.setsockopt(zmq.LINGER, LINGER_MS)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    raw = socket.create_connection(("127.0.0.1", port))
    try:
        raw.sendall(greeting_and_frames)
        yield sock, raw
    finally:
        raw.close()
        sock.close()


def received_until_closed(sock, raw: socket.socket) -> bytes:
    """Close the pyzmq socket (it flushes what it queued, then closes the connection); return all raw got."""
    sock.close()
    raw.settimeout(RECV_TIMEOUT_MS / 1000)
    chunks = []
    while data := raw.recv(1 << 16):
        chunks.append(data)
    return b"".join(chunks)


def test_libzmq_speaks_zmtp20_to_a_20_peer(ctx):
    rng = random.Random(6)
    from_raw = payloads(rng, [5, 300])
    to_raw = [payloads(rng, [size, 2]) for size in FRAME_SIZES]
    with raw_peer(ctx, zmq.DEALER, greeting_v2(5) + frame(b"") + message(*from_raw)) as (dealer, raw):
        assert dealer.recv_multipart() == from_raw          # libzmq accepts the hand-built 2.0 bytes
        for frames in to_raw:
            dealer.send_multipart(frames)
        stream = received_until_closed(dealer, raw)
    events, dec = decoded(random_chunks(stream, 6))
    assert events[0] == Greeting("2.0", "NULL", False, "DEALER", events[0].ts_ns)
    assert stream[10] == 3                                   # it announced ZMTP 3, then talked down
    assert wire_frames(events) == to_raw and dec.identity == b""


def test_libzmq_speaks_zmtp10_to_an_unversioned_peer(ctx):
    rng = random.Random(7)
    from_raw = payloads(rng, [5, 300])
    to_raw = [payloads(rng, [size, 2]) for size in FRAME_SIZES]
    with raw_peer(ctx, zmq.DEALER, v1_frame(b"raw-peer") + v1_message(*from_raw)) as (dealer, raw):
        assert dealer.recv_multipart() == from_raw          # libzmq accepts the hand-built 1.0 bytes
        for frames in to_raw:
            dealer.send_multipart(frames)
        stream = received_until_closed(dealer, raw)
    events, dec = decoded(random_chunks(stream, 7))
    assert (dec.version, dec.identity) == ("1.0", b"")
    assert wire_frames(events) == to_raw


def test_libzmq_sends_zmtp30_style_subscriptions_to_a_30_peer(ctx):
    rng = random.Random(8)
    published = [payloads(rng, [size]) for size in FRAME_SIZES]
    handshake = greeting_v3(minor=0) + command(b"READY", metadata({b"Socket-Type": b"PUB"}))
    hand_built = handshake + b"".join(message(*frames) for frames in published)
    with raw_peer(ctx, zmq.SUB, handshake) as (sub, raw):
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        # like a real peer, send messages only once the other side's READY is in (libzmq insists)
        raw.settimeout(RECV_TIMEOUT_MS / 1000)
        stream = b""
        while len(stream) < 64 + 2 or len(stream) < 64 + 2 + stream[65]:
            stream += raw.recv(1 << 16)
        raw.sendall(hand_built[len(handshake):])
        assert [sub.recv_multipart() for _ in published] == published   # the hand-built 3.0 stream is valid
        stream += received_until_closed(sub, raw)
    events, dec = decoded(random_chunks(stream, 8))
    assert dec.version == "3.1" and dec.socket_type == "SUB"
    # to a 3.0 peer, libzmq 4.3.5 sends the subscription as a message: 1, then the topic
    assert wire_frames(events) == [[b"\x01"]] and commands(events, "SUBSCRIBE") == []
    ours, _ = decoded(random_chunks(hand_built, 9))
    assert ours[0].version == "3.0" and wire_frames(ours) == published


# -- lost bytes on a real stream --------------------------------------------------------------------------

META = b"META"


def is_meta(body: bytes) -> bool:
    return body[:4] == META


@pytest.fixture(scope="module")
def recorded(ctx):
    """A real PUSH stream of [meta, data] messages, the frames sent, and each frame's wire offset.

    The offsets come from the known frame sizes (libzmq writes an 8-byte size exactly above 255 bytes)
    anchored where the first meta body is found in the bytes: not from the decoder."""
    rng = random.Random(9)
    sent = [[META + b"%04d" % i + rng.randbytes(40), rng.randbytes(rng.choice([7, 200, 3000, 40_000]))]
            for i in range(60)]
    with tapped(ctx, zmq.PULL, zmq.PUSH) as (pull, push, tap):
        for frames in sent:
            push.send_multipart(frames)
        for frames in sent:
            assert pull.recv_multipart() == frames
    chunks = tap.only_connection().client_to_server
    stream = TappedConnection.joined(chunks)
    offset = stream.index(sent[0][0]) - 2
    offsets = []
    for frames in sent:
        offsets.append([])
        for body in frames:
            offsets[-1].append(offset)
            offset += (9 if len(body) > 255 else 2) + len(body)
    assert offset == len(stream)
    return stream, chunks, sent, offsets


def gapped(chunks: list, start: int, end: int) -> list:
    """The real chunks with stream bytes [start, end) replaced by a Gap."""
    out, pos = [], 0
    for data, ts_ns in chunks:
        chunk_start, pos = pos, pos + len(data)
        if chunk_start < start:
            out.append((data[:start - chunk_start], ts_ns))
        if chunk_start <= start < pos:
            out.append(Gap(end - start, ts_ns))
        if pos > end:
            out.append((data[max(0, end - chunk_start):], ts_ns))
    return out


def test_gap_inside_a_real_body(recorded):
    stream, chunks, sent, offsets = recorded
    k = next(i for i, frames in enumerate(sent) if len(frames[1]) == 40_000)
    start = offsets[k][1] + 9 + 1000
    events, dec = decode(gapped(chunks, start, start + 30_000), keep_body=keep_all)
    got = messages(events)
    assert got[k] == Message(got[k].ts_first_ns, got[k].ts_last_ns, (48, 40_000), (sent[k][0], None), False)
    assert [[bytes(f) for f in m.frames] for i, m in enumerate(got) if i != k] == sent[:k] + sent[k + 1:]
    assert (dec.lost_bytes, dec.resyncs) == (0, 0)


@pytest.mark.parametrize("seed", range(6))
def test_gap_into_a_real_header_resynchronises(recorded, seed):
    stream, chunks, sent, offsets = recorded
    rng = random.Random(seed)
    k = rng.randrange(5, len(sent) - 5)
    data_start = offsets[k][1]
    data_end = offsets[k + 1][0]
    start = rng.randrange(data_start + (9 if len(sent[k][1]) > 255 else 2), data_end)   # in k's data body...
    end = data_end + 1                                    # ...into message k+1's meta header
    # with the meta validator the decoder resumes at message k+2; lost: all of message k+1
    events, dec = decode(gapped(chunks, start, end), keep_body=keep_all, frame_validator=is_meta)
    assert [(r.offset, r.lost_bytes) for r in events if isinstance(r, Resync)] == [
        (offsets[k + 2][0], offsets[k + 2][0] - data_end)]
    got = [[None if f is None else bytes(f) for f in m.frames] for m in messages(events)]
    assert got == sent[:k] + [[sent[k][0], None]] + sent[k + 2:]
    assert [m.complete for m in messages(events)] == [True] * k + [False] + [True] * (len(sent) - k - 2)
    # Without it, a boundary guessed from headers alone: never after the true one (message k+1's data
    # frame), and the first message found is not trusted to be whole.
    events, dec = decode(gapped(chunks, start, end), keep_body=keep_all)
    (resync,) = [ev for ev in events if isinstance(ev, Resync)]
    assert end <= resync.offset <= offsets[k + 1][1] and resync.lost_bytes == resync.offset - data_end
    got = messages(events)
    assert not got[k + 1].complete
    assert [[bytes(f) for f in m.frames] for m in got[-(len(sent) - k - 3):]] == sent[k + 3:]


@pytest.mark.parametrize("seed", range(12))
def test_capture_starting_mid_stream(recorded, seed):
    stream, chunks, sent, offsets = recorded
    start = random.Random(seed).randrange(1, len(stream) - 50_000)
    first = next(i for i, frame_offsets in enumerate(offsets) if frame_offsets[0] >= start)
    tail = random_chunks(stream[start:], seed, 1460)
    events, dec = decode(tail, midstream=True, keep_body=keep_all, frame_validator=is_meta)
    assert events[0] == Resync(offsets[first][0] - start, offsets[first][0] - start, events[0].ts_ns,
                               "capture started mid-stream")
    assert [[bytes(f) for f in m.frames] for m in messages(events)] == sent[first:]
    assert all(m.complete for m in messages(events)) and dec.lost_bytes == offsets[first][0] - start
    events, _ = decode(tail, midstream=True, keep_body=keep_all)
    got = messages(events)
    assert not got[0].complete and [[bytes(f) for f in m.frames] for m in got[-10:]] == sent[-10:]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_mutated_real_stream(recorded, data):
    stream, _, _, _ = recorded
    stream = bytearray(stream[:data.draw(st.integers(1000, 120_000))])
    for _ in range(data.draw(st.integers(0, 6))):
        stream[data.draw(st.integers(0, len(stream) - 1))] = data.draw(st.integers(0, 255))
    start = data.draw(st.integers(0, len(stream) - 1))
    gap = data.draw(st.integers(1, 5000))
    segments = [bytes(stream[:start]), Gap(gap), bytes(stream[start:])]
    skip = data.draw(st.integers(0, 2000))
    midstream = data.draw(st.booleans())
    if midstream:
        segments[0] = segments[0][skip:]
    options = dict(midstream=midstream, frame_validator=data.draw(st.sampled_from([None, is_meta])),
                   max_buffer=data.draw(st.sampled_from([4096, 1 << 20])))
    sizes = data.draw(st.lists(st.integers(1, 3000), min_size=1, max_size=5))
    chunked_events = decode_with_invariants(segments, sizes, **options)
    assert without_timestamps(chunked_events) == without_timestamps(decode_with_invariants(segments, [], **options))
