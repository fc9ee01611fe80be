"""dmlc/ps-lite meta frames and the per-stream ps-lite decoder.

Ground truth: meta frames copied from a capture of a real MXNet 1.9.1 dist_sync job (scheduler, 2 servers,
1 worker on loopback; libzmq 4.2.2 speaking ZMTP 3.0), each next to the line ps-lite itself logged for it with
PS_VERBOSE=2, and bytes written by hand from dmlc/ps-lite src/meta.proto. tests/decoders/test_mxnet_attr.py runs such
a job live; tests/decoders/test_byteps.py covers the bytedance raw-struct metas.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlcsniff.decoders.protocols.pslite import decoder as pslite
from dlcsniff.decoders.errors import DecodeError
from tests.decoders.pbmeta_protobuf import PBMeta

K_EMPTY_VARINT = "ffffffff07"       # 2**31 - 1 (ps-lite's kEmpty) as a protobuf varint

# Tags below: (field number << 3) | wire type. 08 head, 12 body, 1a control (length-delimited), 20 request,
# 28 push, 30 simple_app, 38 app_id, 40 timestamp, 4a data_type (packed), 50 customer_id, 60 pull, 68 priority.
# Inside PBControl: 08 cmd, 12 node, 18 barrier_group. Inside PBNode: 08 role, 10 id, 1a hostname, 20 port,
# 28 is_recovery, 50 customer_id. dmlc's PackMeta always writes head, push, pull, request, simple_app, priority
# and customer_id; app_id and timestamp only when not kEmpty; data_size never (ZMQ van).
REAL_METAS = {
    # "? => 10. Meta: request=1, timestamp=1, app_id=0, customer_id=0, simple_app=0, push=1, head=0,
    #  data_type={ UINT64 OTHER INT32 } Body: data_size=8 data_size=80 data_size=4"
    "push": "0800" "2001" "2801" "3000" "3800" "4001" "4a03080b03" "5000" "6000" "6800",
    # "? => 10. Meta: request=1, timestamp=5, ..., push=0, head=0, data_type={ UINT64 OTHER }
    #  Body: data_size=8 data_size=0"   (a pull request: keys and an empty vals frame)
    "pull": "0800" "2001" "2800" "3000" "3800" "4005" "4a02080b" "5000" "6001" "6800",
    # "10 => 9. Meta: request=0, timestamp=20, ..., push=1, head=5, data_type={ UINT64 OTHER INT32 }
    #  Body: data_size=8 data_size=20 data_size=4"   (the answer to a pushpull of a float16 array)
    "pushpull_response": "0805" "2000" "2801" "3000" "3800" "4014" "4a03080b03" "5000" "6001" "6800",
    # "? => 1. Meta: request=1, timestamp=3, control={ cmd=BARRIER, barrier_group=7 }"
    "barrier": "08" + K_EMPTY_VARINT + "1a04" "0803" "1807" "2001" "2800" "3000" "3800" "4003" "5000" "6000" "6800",
    # "1 => 9. Meta: request=0, timestamp=7, control={ cmd=BARRIER, barrier_group=244304512 }": the reply's
    # group is whatever was in the scheduler's memory
    "barrier_reply": "08" + K_EMPTY_VARINT + "1a07" "0803" "188095bf74" "2000" "2800" "3000" "3800" "4007"
                     "5000" "6000" "6800",
    # "? => 8. Meta: request=1, timestamp=21, ..., simple_app=1, push=0, head=4, body=1,0.500000"
    # (SimpleApp command 4: set gradient compression)
    "simple_app": "0804" "120a" + b"1,0.500000".hex() + "2001" "2800" "3001" "3800" "4015" "5000" "6000" "6800",
    # "? => 1. Meta: request=0, timestamp=0, control={ cmd=ADD_NODE, node={ role=server, ip=127.77.1.1,
    #  port=51431, is_recovery=0 } }": a node's own ADD_NODE request; its id is still kEmpty
    "add_node_request": "08" + K_EMPTY_VARINT + "1a20" "0802" "121c" "0800" "10" + K_EMPTY_VARINT
                        + "1a0a" + b"127.77.1.1".hex() + "20e79103" "2800" "5000"
                        + "2000" "2800" "3000" "4000" "50" + K_EMPTY_VARINT + "6000" "6800",
    # The scheduler's ADD_NODE reply to node 8 (timestamp 1): server 8, worker 9, server 10, scheduler 1
    # (the scheduler's customer_id 376 is uninitialised memory on the sender)
    "add_node_reply": "08" + K_EMPTY_VARINT + "1a6b" "0802"
                      "1218" "0800" "1008" "1a0a" + b"127.77.1.1".hex() + "20e79103" "2800" "5000"
                      "1218" "0801" "1009" "1a0a" + b"127.77.1.1".hex() + "2081a903" "2800" "5000"
                      "1218" "0800" "100a" "1a0a" + b"127.77.1.1".hex() + "20b3b603" "2800" "5000"
                      "1219" "0802" "1001" "1a0a" + b"127.77.1.1".hex() + "20e78802" "2800" "50f802"
                      + "2000" "2800" "3000" "4001" "50" + K_EMPTY_VARINT + "6000" "6800",
    # "9 => 9. Meta: request=0, control={ cmd=TERMINATE }": sent to itself on stop (no timestamp, no app)
    "terminate": "08" + K_EMPTY_VARINT + "1a02" "0801" "2000" "2800" "3000" "5000" "6000" "6800",
}
REAL = {name: bytes.fromhex(hex_) for name, hex_ in REAL_METAS.items()}
NODE_HOST = "127.77.1.1"


def meta_fields(meta: pslite.PsMeta, *names: str) -> tuple:
    return tuple(getattr(meta, name) for name in names)


def test_real_kv_metas():
    push = pslite.parse_dmlc_meta(REAL["push"])
    assert push.flavor == "dmlc"
    assert meta_fields(push, "head", "request", "push", "pull", "simple_app", "app_id", "timestamp",
                       "customer_id", "data_types", "control_cmd", "nodes", "body", "data_size", "priority") == (
        0, True, True, False, False, 0, 1, 0, (8, 11, 3), None, (), b"", None, 0)
    pull = pslite.parse_dmlc_meta(REAL["pull"])
    assert meta_fields(pull, "request", "push", "pull", "timestamp", "data_types") == (True, False, True, 5, (8, 11))
    answer = pslite.parse_dmlc_meta(REAL["pushpull_response"])
    assert meta_fields(answer, "head", "request", "push", "pull", "timestamp") == (5, False, True, True, 20)
    for meta in (push, pull, answer):     # the bytedance-only fields stay unset on a dmlc meta
        assert meta_fields(meta, "key", "addr", "val_len", "option", "sid", "src_dev_type") == (None,) * 6


def test_real_control_metas():
    barrier = pslite.parse_dmlc_meta(REAL["barrier"])
    assert meta_fields(barrier, "control_cmd", "barrier_group", "request", "timestamp", "head", "msg_sig") == (
        pslite.BARRIER, 7, True, 3, None, None)
    reply = pslite.parse_dmlc_meta(REAL["barrier_reply"])
    assert meta_fields(reply, "control_cmd", "barrier_group", "request", "timestamp") == (
        pslite.BARRIER, 244304512, False, 7)
    terminate = pslite.parse_dmlc_meta(REAL["terminate"])
    assert meta_fields(terminate, "control_cmd", "timestamp", "app_id", "head", "customer_id") == (
        pslite.TERMINATE, None, None, None, 0)
    simple = pslite.parse_dmlc_meta(REAL["simple_app"])
    assert meta_fields(simple, "simple_app", "head", "body", "request", "timestamp", "control_cmd") == (
        True, 4, b"1,0.500000", True, 21, None)


def test_real_add_node_metas():
    request = pslite.parse_dmlc_meta(REAL["add_node_request"])
    assert request.control_cmd == pslite.ADD_NODE and not request.request and request.customer_id is None
    assert request.nodes == (pslite.PsNode(role=pslite.ROLE_SERVER, id=None, hostname=NODE_HOST, port=51431,
                                           customer_id=0, is_recovery=False),)
    reply = pslite.parse_dmlc_meta(REAL["add_node_reply"])
    assert [(n.role, n.id, n.hostname, n.port) for n in reply.nodes] == [
        (pslite.ROLE_SERVER, 8, NODE_HOST, 51431), (pslite.ROLE_WORKER, 9, NODE_HOST, 54401),
        (pslite.ROLE_SERVER, 10, NODE_HOST, 56115), (pslite.ROLE_SCHEDULER, 1, NODE_HOST, 33895)]
    assert reply.nodes[3].customer_id == 376 and reply.timestamp == 1


def test_schema_serialises_like_the_real_sender():
    """The message classes built from our descriptor write exactly the bytes ps-lite's C++ wrote: every field
    number, type and the packed data_type agree with what MXNet 1.9.1 put on the wire."""
    pb = PBMeta(head=0, request=True, push=True, simple_app=False, app_id=0, timestamp=1, customer_id=0,
                pull=False, priority=0)
    pb.data_type.extend([8, 11, 3])
    assert pb.SerializeToString() == REAL["push"]
    pb = PBMeta(head=2**31 - 1, request=False, push=False, simple_app=False, timestamp=0,
                customer_id=2**31 - 1, pull=False, priority=0)
    pb.control.cmd = pslite.ADD_NODE
    pb.control.node.add(role=pslite.ROLE_SERVER, id=2**31 - 1, hostname=NODE_HOST, port=51431,
                        is_recovery=False, customer_id=0)
    assert pb.SerializeToString() == REAL["add_node_request"]


def test_hand_written_fields():
    # ACK with msg_sig (PBControl field 4, uint64: tag 0x20), data_size (field 11: 0x58), a negative priority
    # (field 13: 0x68, int32 -1 as a 10-byte varint), a HEARTBEAT-style node with is_recovery set
    ack = bytes.fromhex("1a0d" "0804" "20" "80808080808080808001"      # cmd=ACK, msg_sig=2**63
                        "58d00f" "68ffffffffffffffffff01")             # data_size=2000, priority=-1
    meta = pslite.parse_dmlc_meta(ack)
    assert meta_fields(meta, "control_cmd", "msg_sig", "data_size", "priority", "head", "request") == (
        pslite.ACK, 2**63, 2000, -1, None, False)
    heartbeat = bytes.fromhex("1a0f" "0805" "120b" "0801" "1009" "1a01" + b"h".hex() + "2001" "2801")
    node = pslite.parse_dmlc_meta(heartbeat).nodes[0]
    assert (node.role, node.id, node.hostname, node.port, node.is_recovery) == (pslite.ROLE_WORKER, 9, "h", 1, True)
    # control with cmd EMPTY is no control message
    assert pslite.parse_dmlc_meta(bytes.fromhex("1a020800")).control_cmd is None


@pytest.mark.parametrize("hex_, missing", [("1a00", "cmd"), ("1a04" "0802" "1200", "role")])
def test_required_fields(hex_, missing):
    with pytest.raises(DecodeError, match=missing):
        pslite.parse_dmlc_meta(bytes.fromhex(hex_))


def test_hostname_not_utf8():
    meta = pslite.parse_dmlc_meta(bytes.fromhex("1a09" "0802" "1205" "0800" "1a01ff"))
    assert meta.nodes[0].hostname == "\\xff"


def test_looks_like_meta_accepts_routing_frames():
    # a bytedance server's answer to a worker opens with its "ps<id>" routing frame, then the meta
    assert pslite.looks_like_meta(b"ps9") and pslite.looks_like_meta(b"ps1234567890")
    assert not pslite.looks_like_meta(b"ps") and not pslite.looks_like_meta(b"ps12345678901")


@pytest.mark.parametrize("name", sorted(REAL))
def test_looks_like_meta_on_real_frames(name):
    frame = REAL[name]
    assert pslite.looks_like_meta(frame)
    assert pslite.looks_like_meta(memoryview(frame))
    # cut inside the last field, or one byte more (tag 0 does not exist): not a meta frame
    assert not pslite.looks_like_meta(frame[:-1])
    assert not pslite.looks_like_meta(frame + b"\0")


@pytest.mark.parametrize("frame", [
    b"",
    bytes.fromhex("0200000000000080"),                                  # a keys frame: begin(1 of 2) + 3
    bytes.fromhex("0000803f") * 20,                                     # a vals frame of float32 ones
    b"\x05READY\x0bSocket-Type\x00\x00\x00\x06DEALER\x08Identity\x00\x00\x00\x03ps9",   # a ZMTP command body
    bytes.fromhex("ff00000000000000017f0300") + b"NULL" + bytes(48),    # a ZMTP greeting
    bytes.fromhex("088000" "2001" "2801" "3000"),                       # head as a non-minimal varint
    REAL["push"] + bytes.fromhex("f00101"),                             # a field outside the schema
    bytes.fromhex("2001" "2801" "3000"),                                # no head: PackMeta always writes it
])
def test_looks_like_meta_rejects(frame):
    assert not pslite.looks_like_meta(frame)


def test_tolerant_parse_of_unusual_but_valid_protobuf():
    # parse_dmlc_meta reads what protobuf reads (a newer sender may add fields); only looks_like_meta is strict
    meta = pslite.parse_dmlc_meta(REAL["push"] + bytes.fromhex("f00101"))
    assert meta.timestamp == 1 and meta.push


# -- node ids and key ranges -------------------------------------------------------------------------------

def test_node_ids():
    assert [pslite.parse_identity(x) for x in (b"ps9", "ps10", memoryview(b"ps1"), b"", None, b"ps", b"ps-1",
                                               b"xs9", b"ps9\0", b"ps12345678901")] == [
        9, 10, 1, None, None, None, None, None, None, None]
    assert [pslite.node_role(i) for i in (None, 0, 1, 2, 4, 7, 8, 9, 10, 11)] == [
        None, None, "scheduler", "group", "group", "group", "server", "worker", "server", "worker"]
    assert [pslite.server_rank(i) for i in (8, 10, 12)] == [0, 1, 2]
    assert [pslite.worker_rank(i) for i in (9, 11, 13)] == [0, 1, 2]
    assert [pslite.rank_of_id(i) for i in (1, 4, 8, 9, 12, 15, None)] == [None, None, 0, 0, 2, 3, None]
    with pytest.raises(ValueError):
        pslite.server_rank(9)
    with pytest.raises(ValueError):
        pslite.worker_rank(1)


def test_server_key_ranges():
    assert pslite.server_key_ranges(1) == [(0, 2**64 - 1)]
    # The real job's worker sent key 3 to server rank 1 of 2 as ps key 0x8000000000000002 (keys frame
    # 0200000000000080): rank 1 begins at (2**64 - 1) // 2
    assert pslite.server_key_ranges(2) == [(0, 2**63 - 1), (2**63 - 1, 2**64 - 2)]
    assert 0x8000000000000002 - pslite.server_key_ranges(2)[1][0] == 3
    ranges = pslite.server_key_ranges(7)
    assert all(end == next_begin for (_, end), (next_begin, _) in zip(ranges, ranges[1:]))
    with pytest.raises(ValueError):
        pslite.server_key_ranges(0)


# -- the per-stream decoder --------------------------------------------------------------------------------

KEYS_RANK1_KEY3 = bytes.fromhex("0200000000000080")
VALS_20_FLOATS = bytes.fromhex("0000803f") * 20
LENS_80 = bytes.fromhex("50000000")


def feed(decoder: pslite.PsliteDecoder, frames: list[bytes], complete: bool = True) -> pslite.PsMessage:
    """As the ZMTP decoder does: ask keep_body frame by frame, hand over only the kept bodies."""
    kept = tuple(frame if decoder.keep_body(i, len(frame)) else None for i, frame in enumerate(frames))
    return decoder.decode(tuple(len(f) for f in frames), kept, complete)


def test_decode_real_push_message():
    decoder = pslite.PsliteDecoder()
    frames = [REAL["push"], KEYS_RANK1_KEY3, VALS_20_FLOATS, LENS_80]
    msg = feed(decoder, frames)
    assert (msg.data_sizes, msg.keys, msg.lens, msg.size_bytes, msg.routing_id, msg.complete) == (
        (8, 80, 4), (0x8000000000000002,), (80,), 23 + 8 + 80 + 4, None, True)
    assert decoder.flavor == "dmlc" and decoder.routed is False
    # once the flavor is known the vals frame is never kept, whatever its size
    assert [decoder.keep_body(i, size) for i, size in enumerate((23, 8, 4, 4))] == [True, True, False, True]
    # frames as memoryviews into one buffer (the ZMTP decoder's zero-copy path) decode the same
    buffer = memoryview(b"".join(frames))
    offsets = np.cumsum([0] + [len(f) for f in frames])
    views = tuple(buffer[a:b] for a, b in zip(offsets, offsets[1:]))
    assert decoder.decode(tuple(len(f) for f in frames), views, True) == msg


def test_decode_pull_request_and_answers():
    decoder = pslite.PsliteDecoder()
    pull = feed(decoder, [REAL["pull"], KEYS_RANK1_KEY3, b""])
    assert (pull.data_sizes, pull.keys, pull.lens, pull.meta.pull) == ((8, 0), (0x8000000000000002,), None, True)
    control = feed(decoder, [REAL["barrier"]])
    assert (control.data_sizes, control.keys, control.lens, control.size_bytes) == ((), (), None, len(REAL["barrier"]))


def test_decode_rejects_inconsistent_messages():
    decoder = pslite.PsliteDecoder()
    with pytest.raises(DecodeError, match="announces 3 data frames"):
        feed(decoder, [REAL["push"], KEYS_RANK1_KEY3, VALS_20_FLOATS])
    with pytest.raises(DecodeError, match="whole number"):
        feed(decoder, [REAL["push"], KEYS_RANK1_KEY3[:6], VALS_20_FLOATS, LENS_80])
    with pytest.raises(DecodeError, match="lens"):
        feed(decoder, [REAL["push"], KEYS_RANK1_KEY3, VALS_20_FLOATS, LENS_80 * 2])
    with pytest.raises(DecodeError, match="not captured"):
        decoder.decode((23, 8, 80, 4), (None, KEYS_RANK1_KEY3, None, LENS_80), True)
    with pytest.raises(DecodeError):
        decoder.decode((), (), True)
    assert decoder.flavor is None      # nothing decoded: nothing learned


def test_decode_incomplete_message():
    # the stream ended (or a gap hit) after the keys frame: decode what is there
    decoder = pslite.PsliteDecoder()
    msg = decoder.decode((23, 8), (REAL["push"], KEYS_RANK1_KEY3), False)
    assert (msg.keys, msg.lens, msg.complete) == ((0x8000000000000002,), None, False)
    # the meta announces keys, vals and lens; one key states a 4-byte lens frame, the vals' size is not stated
    assert msg.data_sizes == (8, None, 4) and msg.size_bytes == 23 + 8 + 4
    # a keys frame cut short is reported as not captured
    msg = decoder.decode((23, 8, 80, 4), (REAL["push"], KEYS_RANK1_KEY3[:3], None, LENS_80), False)
    assert msg.keys == () and msg.lens == (80,)


def test_first_message_decides_the_stream():
    decoder = pslite.PsliteDecoder()
    with pytest.raises(DecodeError):
        feed(decoder, [b"hello", b"world"])      # not ps-lite: nothing is learned
    assert decoder.flavor is None and decoder.routed is None
    feed(decoder, [REAL["terminate"]])
    assert decoder.flavor == "dmlc"
    # a dmlc stream has no routing frames: a leading "ps8" would be a (broken) meta
    with pytest.raises(DecodeError):
        feed(decoder, [b"ps8", REAL["push"], KEYS_RANK1_KEY3, VALS_20_FLOATS, LENS_80])


# -- fuzz ---------------------------------------------------------------------------------------------------

def mutations(seed_frames: list[bytes]):
    """Real frames with bytes flipped, inserted, deleted or cut."""
    def mutate(frame: bytes, edits: list[tuple[int, int, int]]) -> bytes:
        data = bytearray(frame)
        for kind, pos, value in edits:
            pos = pos % (len(data) + 1)
            if kind == 0 and pos < len(data):
                data[pos] ^= value or 1
            elif kind == 1:
                data.insert(pos, value)
            elif kind == 2 and pos < len(data):
                del data[pos]
            else:
                del data[pos:]
        return bytes(data)
    edit = st.tuples(st.integers(0, 3), st.integers(0, 2000), st.integers(0, 255))
    return st.builds(mutate, st.sampled_from(seed_frames), st.lists(edit, min_size=1, max_size=6))


FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def only_decode_errors(fn, *args):
    try:
        fn(*args)
    except DecodeError:
        pass


@FUZZ
@given(st.one_of(st.binary(max_size=200), mutations(list(REAL.values()))))
def test_fuzz_meta_parsers(frame):
    only_decode_errors(pslite.parse_dmlc_meta, frame)
    only_decode_errors(pslite.parse_byteps_meta, frame)
    assert pslite.looks_like_meta(frame) in (True, False)


frame_bytes = st.one_of(st.binary(max_size=40), mutations(list(REAL.values())),
                        st.sampled_from([KEYS_RANK1_KEY3, VALS_20_FLOATS, LENS_80, b"ps8", b""]))


@FUZZ
@given(st.lists(st.lists(frame_bytes, min_size=0, max_size=5), min_size=1, max_size=4), st.booleans())
def test_fuzz_decoder(messages, complete):
    decoder = pslite.PsliteDecoder()
    for frames in messages:
        try:
            msg = feed(decoder, frames, complete)
        except DecodeError:
            continue
        data = frames[1:] if msg.routing_id is None else frames[2:]
        if complete or len(data) >= len(msg.meta.data_types):
            assert msg.size_bytes <= sum(len(f) for f in frames)
            assert len(msg.data_sizes) <= len(frames) - 1
        else:       # cut short: every frame the meta announces, those seen with their own sizes
            assert len(msg.data_sizes) == len(msg.meta.data_types)
            assert list(msg.data_sizes[:len(data)]) == [len(f) for f in data]
