"""bytedance/ps-lite raw struct metas (BytePS), BytePS key and head attribution, and the job-wide naming of a
server's answers on a host it shares with a worker.

Real captures of BytePS's ps-lite are checked against its own logs in test_decode_byteps_real.py; here the
truth comes from upstream source two ways:
- UPSTREAM_METAS: bytes produced by compiling bytedance/ps-lite's own `src/meta.h` of each layout's commit with
  g++ (x86-64) and filling RawMeta/RawNode step by step as that commit's `Van::PackMeta` (src/van.cc) does:
  the whole buffer starts as 0xAB (it comes from `new char[]`, uninitialised), PackMeta bzero()s only the
  RawMeta, so padding inside each RawNode stays 0xAB, as on a real wire. Stored as the runs of non-zero bytes:
  (frame size, ((offset, hex), ...)). Commits: 112/552 a848f53 (HEAD, layout since 6dc1966 2021-01-24),
  104/552 2558dfe (2020-12-23), 88/168 51f7248 (2020-08-13), 88/84 3b7180d (2020-01-01).
- build_raw_meta(): written here from the field offsets of src/meta.h (cited beside each pack_into), with
  struct.pack_into at explicit offsets, independent of the decoder's Struct formats.
"""
from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlcsniff.decoders.protocols.pslite.tensors import byteps
from dlcsniff.decoders.protocols.pslite.tensors.head import unpair
from dlcsniff.decoders.protocols.pslite import decoder as pslite
from dlcsniff.decoders.protocols.base import Row, TcpDirection
from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.protocols.pslite.job import resolve_pslite
from tests.support.protocol_driver import drain
from tests.support.zmtp_tap import command, greeting_v3, message, metadata

UPSTREAM_METAS = {
    (112, 552): {
        "push": (124, ((32, "01"), (40, "05"), (44, "03"), (48, "01"), (56, "01"), (68, "01"), (72, "0c10"),
            (82, "01"), (87, "80"), (89, "beadde"), (93, "7f"), (97, "10"), (104, "07"), (112, "08"), (116, "0b"),
            (120, "03"))),
        "add_node": (1216, ((0, "ffffff7f"), (8, "02"), (12, "02"), (36, "ffffff7f03"), (48, "01"), (56, "01"),
            (64, "ffffff7f"), (104, "07"), (116, "08"), (120, "3139382e31382e302e32"), (184, "01"), (188, "8c23"),
            (316, "8c23"), (577, "ababab"), (656, "ffffffffabababab01"), (668, "09"),
            (672, "3139382e31382e302e33"), (736, "01"), (740, "8d23"), (868, "8d23"), (1129, "ababab"),
            (1208, "ffffffffabababab"))),
        "simple_app": (117, ((0, "02"), (4, "05"), (32, "01"), (40, "09"), (48, "01"), (56, "01"), (69, "01"),
            (104, "07"), (112, "312c302e35"))),
        "barrier": (112, ((0, "ffffff7f"), (8, "03"), (16, "07"), (32, "01"), (36, "ffffff7f04"), (48, "01"),
            (56, "01"), (64, "ffffff7f"), (104, "07"))),
    },
    (104, 552): {
        "push": (116, ((32, "01"), (40, "05"), (44, "03"), (48, "01"), (56, "01"), (68, "01"), (72, "0c10"),
            (82, "01"), (87, "80"), (89, "beadde"), (93, "7f"), (97, "10"), (104, "08"), (108, "0b"), (112, "03"))),
        "add_node": (1208, ((0, "ffffff7f"), (8, "02"), (12, "02"), (36, "ffffff7f03"), (48, "01"), (56, "01"),
            (64, "ffffff7f"), (108, "08"), (112, "3139382e31382e302e32"), (176, "01"), (180, "8c23"),
            (308, "8c23"), (569, "ababab"), (648, "ffffffffabababab01"), (660, "09"),
            (664, "3139382e31382e302e33"), (728, "01"), (732, "8d23"), (860, "8d23"), (1121, "ababab"),
            (1200, "ffffffffabababab"))),
        "simple_app": (109, ((0, "02"), (4, "05"), (32, "01"), (40, "09"), (48, "01"), (56, "01"), (69, "01"),
            (104, "312c302e35"))),
        "barrier": (104, ((0, "ffffff7f"), (8, "03"), (16, "07"), (32, "01"), (36, "ffffff7f04"), (48, "01"),
            (56, "01"), (64, "ffffff7f"))),
    },
    (88, 168): {
        "push": (100, ((32, "01"), (40, "05"), (44, "03"), (52, "01"), (56, "0c10"), (66, "01"), (71, "80"),
            (73, "beadde"), (77, "7f"), (81, "10"), (88, "08"), (92, "0b"), (96, "03"))),
        "add_node": (424, ((0, "ffffff7f"), (8, "02"), (12, "02"), (36, "ffffff7f03"), (48, "ffffff7f"),
            (92, "08"), (96, "3139382e31382e302e32"), (160, "8c23"), (165, "ababab"), (236, "abababab"),
            (248, "ffffffffabababab01"), (260, "09"), (264, "3139382e31382e302e33"), (328, "8d23"),
            (333, "ababab"), (404, "abababab"), (416, "ffffffffabababab"))),
        "simple_app": (93, ((0, "02"), (4, "05"), (32, "01"), (40, "09"), (53, "01"), (88, "312c302e35"))),
        "barrier": (88, ((0, "ffffff7f"), (8, "03"), (16, "07"), (32, "01"), (36, "ffffff7f04"), (48, "ffffff7f"))),
    },
    (88, 84): {
        "push": (100, ((32, "01"), (40, "05"), (44, "03"), (52, "01"), (56, "0c10"), (66, "01"), (71, "80"),
            (73, "beadde"), (77, "7f"), (81, "10"), (88, "08"), (92, "0b"), (96, "03"))),
        "add_node": (256, ((0, "ffffff7f"), (8, "02"), (12, "02"), (36, "ffffff7f03"), (48, "ffffff7f"),
            (92, "08"), (96, "3139382e31382e302e32"), (160, "8c23"), (165, "ababab"), (172, "01"), (176, "09"),
            (180, "3139382e31382e302e33"), (244, "8d23"), (249, "ababab"))),
        "simple_app": (93, ((0, "02"), (4, "05"), (32, "01"), (40, "09"), (53, "01"), (88, "312c302e35"))),
        "barrier": (88, ((0, "ffffff7f"), (8, "03"), (16, "07"), (32, "01"), (36, "ffffff7f04"), (48, "ffffff7f"))),
    },
}
K_EMPTY = 2**31 - 1
BEGIN_RANK1_OF_2 = (2**64 - 1) // 2      # the push meta's `key` is this + (1 << 16) + 1: tensor 1, part 1


def upstream_frame(layout: tuple[int, int], name: str) -> bytes:
    size, runs = UPSTREAM_METAS[layout][name]
    frame = bytearray(size)
    for offset, hex_ in runs:
        chunk = bytes.fromhex(hex_)
        frame[offset:offset + len(chunk)] = chunk
    return bytes(frame)


LAYOUTS = sorted(UPSTREAM_METAS)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_upstream_push_meta(layout):
    meta = pslite.parse_byteps_meta(upstream_frame(layout, "push"))
    assert meta.flavor == "byteps"
    assert (meta.head, meta.app_id, meta.timestamp, meta.customer_id, meta.request, meta.push, meta.pull,
            meta.simple_app, meta.control_cmd, meta.nodes, meta.body) == (
        0, 0, 5, 0, True, True, False, False, None, (), b"")
    assert meta.data_types == (pslite.DATA_TYPE_UINT64, 11, pslite.DATA_TYPE_INT32)   # keys, OTHER (char), lens
    assert (meta.data_size, meta.key, meta.addr, meta.val_len, meta.option) == (
        4108, BEGIN_RANK1_OF_2 + (1 << 16) + 1, 0x7F00DEADBE00, 4096, 0)
    meta_size = layout[0]
    assert meta.sid == (7 if meta_size == 112 else None)
    devices = (meta.src_dev_type, meta.src_dev_id, meta.dst_dev_type, meta.dst_dev_id)
    assert devices == ((1, 0, 1, 0) if meta_size >= 104 else (None,) * 4)
    assert meta.priority is None


@pytest.mark.parametrize("layout", LAYOUTS)
def test_upstream_add_node_meta(layout):
    meta = pslite.parse_byteps_meta(upstream_frame(layout, "add_node"))
    assert (meta.control_cmd, meta.head, meta.app_id, meta.customer_id, meta.timestamp, meta.request, meta.pull,
            meta.barrier_group) == (pslite.ADD_NODE, None, None, None, 3, False, False, None)
    assert meta.nodes == (
        pslite.PsNode(role=pslite.ROLE_SERVER, id=8, hostname="198.18.0.2", port=9100, customer_id=0,
                      is_recovery=False),
        pslite.PsNode(role=pslite.ROLE_WORKER, id=9, hostname="198.18.0.3", port=9101, customer_id=0,
                      is_recovery=False))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_upstream_simple_app_and_barrier_metas(layout):
    simple = pslite.parse_byteps_meta(upstream_frame(layout, "simple_app"))
    assert (simple.simple_app, simple.head, simple.body, simple.request, simple.timestamp, simple.pull) == (
        True, 2, b"1,0.5", True, 9, False)
    barrier = pslite.parse_byteps_meta(upstream_frame(layout, "barrier"))
    assert (barrier.control_cmd, barrier.barrier_group, barrier.request, barrier.timestamp, barrier.msg_sig) == (
        pslite.BARRIER, 7, True, 4, None)


def build_raw_meta(meta_size: int, node_size: int, *, head=K_EMPTY, timestamp=K_EMPTY, request=False,
                   push=False, simple_app=False, cmd=0, barrier_group=0, msg_sig=0, body=b"",
                   data_types=(), nodes=(), key=0, val_len=0, customer_id=K_EMPTY) -> bytes:
    """A RawMeta | body | int32 data_type[] | RawNode[] frame for the 112/552 or 88/168 layout, per
    bytedance/ps-lite src/meta.h. Node padding and unused node fields are filled with 0x5A garbage."""
    frame = bytearray(meta_size + len(body) + 4 * len(data_types) + node_size * len(nodes))
    # RawMeta, both layouts: head@0 body_size@4 control.cmd@8 control.node_size@12 control.barrier_group@16
    # control.msg_sig@24 (u64) request@32 (bool) app_id@36 timestamp@40 data_type_size@44
    struct.pack_into("<iiiii", frame, 0, head, len(body), cmd, len(nodes), barrier_group)
    struct.pack_into("<Q?xxxiii", frame, 24, msg_sig, request, K_EMPTY, timestamp, len(data_types))
    if meta_size == 112:
        # src_dev_type@48 src_dev_id@52 dst_dev_type@56 dst_dev_id@60 customer_id@64 push@68 simple_app@69
        # data_size@72 key@80 addr@88 val_len@96 option@100 sid@104
        struct.pack_into("<iiiii??", frame, 48, 0, -1, 0, -1, customer_id, push, simple_app)
        struct.pack_into("<i4xQQiii", frame, 72, 0, key, 0, val_len, 0, 3)
    else:
        # customer_id@48 push@52 simple_app@53 data_size@56 key@64 addr@72 val_len@80 option@84
        struct.pack_into("<i??", frame, 48, customer_id, push, simple_app)
        struct.pack_into("<i4xQQii", frame, 56, 0, key, 0, val_len, 0)
    pos = meta_size
    frame[pos:pos + len(body)] = body
    pos += len(body)
    struct.pack_into(f"<{len(data_types)}i", frame, pos, *data_types)
    pos += 4 * len(data_types)
    for role, node_id, hostname, port in nodes:
        frame[pos:pos + node_size] = b"\x5a" * node_size
        struct.pack_into("<ii64s", frame, pos, role, node_id, hostname.encode())   # role@0 id@4 hostname@8
        if node_size == 552:
            # num_ports@72 ports[32]@76 port@204 is_recovery@464 customer_id@468
            struct.pack_into("<ii", frame, pos + 72, 1, port)
            struct.pack_into("<i", frame, pos + 204, port)
            struct.pack_into("<?", frame, pos + 464, False)
            struct.pack_into("<i", frame, pos + 468, 0)
        else:
            # port@72 is_recovery@76 customer_id@80 (endpoint_name@84 endpoint_name_len@152 aux_id@160)
            struct.pack_into("<i?", frame, pos + 72, port, False)
            struct.pack_into("<i", frame, pos + 80, 0)
        pos += node_size
    return bytes(frame)


@pytest.mark.parametrize("meta_size, node_size", [(112, 552), (88, 168)])
def test_hand_built_metas(meta_size, node_size):
    nodes = ((pslite.ROLE_SCHEDULER, 1, "198.18.3.1", 9000), (pslite.ROLE_SERVER, 8, "198.18.3.2", 9001),
             (pslite.ROLE_WORKER, 9, "198.18.3.3", 9002))
    add_node = pslite.parse_byteps_meta(build_raw_meta(meta_size, node_size, cmd=pslite.ADD_NODE, nodes=nodes,
                                                       timestamp=2))
    assert [(n.role, n.id, n.hostname, n.port, n.is_recovery) for n in add_node.nodes] == [
        (*node, False) for node in nodes]
    pull = pslite.parse_byteps_meta(build_raw_meta(
        meta_size, node_size, head=0, timestamp=11, request=True, customer_id=0, data_types=(8, 11),
        key=BEGIN_RANK1_OF_2 + 3, body=b"x" * 5))
    assert (pull.request, pull.push, pull.pull, pull.body, pull.data_types, pull.key) == (
        True, False, True, b"xxxxx", (8, 11), BEGIN_RANK1_OF_2 + 3)
    ack = pslite.parse_byteps_meta(build_raw_meta(meta_size, node_size, cmd=pslite.ACK, msg_sig=2**64 - 5,
                                                  barrier_group=99))
    assert (ack.control_cmd, ack.msg_sig, ack.barrier_group) == (pslite.ACK, 2**64 - 5, None)
    instance_barrier = pslite.parse_byteps_meta(build_raw_meta(meta_size, node_size, request=True,
                                                               cmd=pslite.INSTANCE_BARRIER, barrier_group=6))
    assert instance_barrier.barrier_group == 6


def test_layout_errors():
    frame = upstream_frame((112, 552), "push")
    with pytest.raises(DecodeError, match="no bytedance"):
        pslite.parse_byteps_meta(frame + b"\0")
    with pytest.raises(DecodeError, match="no bytedance"):
        pslite.parse_byteps_meta(frame[:-1])
    bad_bool = bytearray(frame)
    bad_bool[68] = 2                       # push@68
    with pytest.raises(DecodeError, match="bool"):
        pslite.parse_byteps_meta(bytes(bad_bool))
    bad_cmd = build_raw_meta(112, 552, cmd=42)
    with pytest.raises(DecodeError, match="cmd 42"):
        pslite.parse_byteps_meta(bad_cmd)
    bad_role = build_raw_meta(88, 168, cmd=pslite.ADD_NODE, nodes=((7, 1, "h", 1),))
    with pytest.raises(DecodeError, match="role 7"):
        pslite.parse_byteps_meta(bad_role)
    negative = bytearray(build_raw_meta(88, 84))
    struct.pack_into("<i", negative, 4, -88)     # body_size@4
    with pytest.raises(DecodeError):
        pslite.parse_byteps_meta(bytes(negative))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_looks_like_meta(layout):
    for name in UPSTREAM_METAS[layout]:
        assert pslite.looks_like_meta(upstream_frame(layout, name))


def test_decoder_routed_stream():
    """A bytedance server answering a worker through its ROUTER: [b"ps<server id>"][meta][keys][vals][lens]."""
    decoder = pslite.PsliteDecoder()
    meta = build_raw_meta(112, 552, head=0, timestamp=5, customer_id=0, push=False, data_types=(8, 11, 3))
    keys = struct.pack("<Q", BEGIN_RANK1_OF_2 + (4 << 16) + 2)
    frames = [b"ps10", meta, keys, b"\0" * 4096, struct.pack("<i", 4096)]
    assert [decoder.keep_body(i, len(f)) for i, f in enumerate(frames)] == [True, True, True, False, True]
    msg = decoder.decode(tuple(len(f) for f in frames), (frames[0], meta, keys, None, frames[4]), True)
    assert (msg.routing_id, msg.keys, msg.lens, msg.data_sizes, msg.size_bytes) == (
        "ps10", (BEGIN_RANK1_OF_2 + (4 << 16) + 2,), (4096,), (8, 4096, 4), len(meta) + 8 + 4096 + 4)
    assert (decoder.flavor, decoder.routed, msg.meta.pull) == ("byteps", True, True)
    assert pslite.parse_identity(msg.routing_id) == 10
    assert byteps.attribute(msg.keys[0], pslite.server_rank(10), 2) == (4, 2)
    # from now on frame 2 is the keys frame and frame 3 the values, whatever frame 0 looks like
    assert [decoder.keep_body(i, size) for i, size in enumerate((4, 112, 8, 9, 4))] == [True, True, True, False, True]


def test_decoder_unrouted_stream():
    """Control and SimpleApp messages, and everything a worker sends, travel without a routing frame."""
    decoder = pslite.PsliteDecoder()
    push = build_raw_meta(88, 168, head=0, timestamp=1, request=True, push=True, customer_id=0,
                          data_types=(8, 11, 3))
    keys = struct.pack("<Q", (7 << 16) + 0)
    frames = [push, keys, b"\1" * 64, struct.pack("<i", 64)]
    assert [decoder.keep_body(i, len(f)) for i, f in enumerate(frames)] == [True, True, False, True]
    msg = decoder.decode(tuple(len(f) for f in frames), (push, keys, None, frames[3]), True)
    assert (msg.routing_id, msg.keys, msg.meta.flavor, decoder.routed) == (None, ((7 << 16),), "byteps", False)
    assert byteps.attribute(msg.keys[0], 0, 2) == (7, 0)
    with pytest.raises(DecodeError):        # the stream is bytedance: a protobuf meta no longer decodes
        decoder.decode((2,), (bytes.fromhex("0800"),), True)


def test_attribute():
    begin, end = pslite.server_key_ranges(3)[2]
    assert byteps.attribute(begin + (513 << 16) + 65535, 2, 3) == (513, 65535)
    assert byteps.attribute(begin, 2, 3) == (0, 0)
    for bad_key, rank in ((begin - 1, 2), (end, 2), (begin, 1)):
        with pytest.raises(DecodeError, match="outside"):
            byteps.attribute(bad_key, rank, 3)
    with pytest.raises(DecodeError):
        byteps.attribute(0, 3, 3)


def test_heads_unpair():
    # common.cc GetCommandType(RequestType, dtype) = ((t + d) * (t + d + 1)) / 2 + d, for every pair
    pairs = [(t, d) for t in range(40) for d in range(40)]
    assert [unpair((t + d) * (t + d + 1) // 2 + d) for t, d in pairs] == pairs
    with pytest.raises(DecodeError, match="negative"):
        unpair(-1)


def test_decode_head():
    for t, req_type in enumerate(byteps.REQUEST_TYPES):
        for d, dtype in enumerate(byteps.DTYPES):
            assert byteps.decode_head((t + d) * (t + d + 1) // 2 + d) == (req_type, dtype)
    # the heads kv_app sent BytePS's own server in pcaps/byteps_server_*: float32, float64, int32 pushes and pulls
    assert [byteps.decode_head(h) for h in (0, 2, 14)] == [
        ("default", "float32"), ("default", "float64"), ("default", "int32")]
    for bad in (-1, 7 * 8 // 2 + 7, 3 * 4 // 2):    # dtype 7 (no BytePS DataType), request type 3
        with pytest.raises(DecodeError):
            byteps.decode_head(bad)


HOST, SCHEDULER_HOST = "198.18.0.2", "198.18.0.1"
SERVER, WORKER, WORKER_PORT = 10, 11, 40000       # server and worker on one host, as BytePS deploys them


def test_a_routed_stream_is_reported_once_with_its_sender():
    """The server's ROUTER side of the worker's connection: [b"ps10"][meta][keys][vals][lens] messages."""
    decoder = pslite.PsliteCaptureDecoder()
    ip = bytes(map(int, HOST.split(".")))
    assert decoder.claim(TcpDirection(0, (ip, 9100, ip, WORKER_PORT), True), greeting_v3()) is True
    answer = build_raw_meta(88, 168, head=0, timestamp=5, customer_id=0, data_types=(8, 11, 3))
    frames = (b"ps10", answer, struct.pack("<Q", 7), b"\1" * 4, struct.pack("<i", 4))
    decoder.receive_data(0, memoryview(greeting_v3(as_server=True) + command(b"READY", metadata(
        {b"Socket-Type": b"ROUTER"})) + message(*frames) + message(*frames)), 1)
    decoder.end_of_capture()
    rows = [event for event in drain(decoder) if isinstance(event, Row)]
    assert [row.values for row in rows if row.table == "pslite_routed"] == [{"stream_id": 0, "node_id": SERVER}]
    assert len([row for row in rows if row.table == "messages"]) == 2


def test_routed_answers_name_their_sender_and_the_worker_that_asked():
    """A host with a server and a worker: the worker's DEALER stream names it (identity "ps11"), its reverse
    direction (the server's ROUTER) has no identity and one address for two nodes; its routing frames name
    the server, and the reverse's identity the worker."""
    streams = {"flow_id": [1, 2], "protocol": ["pslite", "pslite"], "identity": ["ps11", None],
               "src_ip": [HOST, HOST], "src_port": [WORKER_PORT, 9100], "dst_ip": [HOST, HOST],
               "dst_port": [9100, WORKER_PORT], "reverse_flow_id": [2, 1]}
    columns = ("flow_id", "control_cmd", "request", "head", "flavor", "simple_app", "keys", "lens", "capture",
               "customer_id", "ps_timestamp")
    key = BEGIN_RANK1_OF_2 + (3 << 16) + 1
    messages = dict(zip(columns, ([1, 2], [None, None], [True, False], [0, 0], ["byteps"] * 2, [False] * 2,
                                  [[key]] * 2, [None] * 2, ["host0"] * 2, [0, 0], [5, 5])))
    nodes = {"node_id": [1, 8, SERVER, WORKER], "hostname": [SCHEDULER_HOST, "198.18.0.3", HOST, HOST],
             "role": [pslite.ROLE_SCHEDULER, pslite.ROLE_SERVER, pslite.ROLE_SERVER, pslite.ROLE_WORKER],
             "port": [9091, 9100, 9100, 9200]}
    unrouted = {name: list(values) for name, values in messages.items()}
    resolve_pslite({name: list(values) for name, values in streams.items()}, unrouted, nodes, {}, {})
    assert (unrouted["sender_id"], unrouted["recver_id"]) == ([WORKER, None], [SERVER, None])
    resolve_pslite(streams, messages, nodes, {}, {"flow_id": [2], "node_id": [SERVER]})
    assert (messages["sender_id"], messages["recver_id"]) == ([WORKER, SERVER], [SERVER, WORKER])
    assert streams["node_id"] == [WORKER, SERVER]
    # server rank 1 of 2 (ids 8 and 10): tensor 3, part 1; head 0 is BytePS's float32
    assert (messages["tensor_key"], messages["part"], messages["dtype"]) == ([3, 3], [1, 1], ["float32"] * 2)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([(layout, name) for layout in LAYOUTS for name in UPSTREAM_METAS[layout]]),
       st.lists(st.tuples(st.integers(0, 1300), st.integers(0, 255)), min_size=1, max_size=8))
def test_fuzz_mutated_upstream_metas(which, edits):
    frame = bytearray(upstream_frame(*which))
    for pos, value in edits:
        frame[pos % len(frame)] = value
    try:
        meta = pslite.parse_byteps_meta(bytes(frame))
    except DecodeError:
        return
    assert len(meta.body) <= len(frame)
