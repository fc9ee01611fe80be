"""ps-lite messages: the meta frame of dmlc/ps-lite (protobuf) and bytedance/ps-lite (raw C structs).

Pure functions over bytes; a `PsliteDecoder` per ZMTP stream turns one ZMTP message (its frame sizes and the
bodies the ZMTP decoder kept) into a `PsMessage`. Facts checked against dmlc/ps-lite 34fd45c (the commit MXNet
1.9.1 pins: src/van.cc PackMeta/UnpackMeta, src/zmq_van.h SendMsg, include/ps/kv_app.h) and bytedance/ps-lite
(src/meta.h RawMeta/RawNode in its four historical layouts, src/van.cc PackMeta, src/zmq_van.h).

Wire shape of one message:  dmlc     [meta][keys][vals][lens?]        (no data → a lone meta frame)
                            bytedance [routing "ps<sender id>"]? [meta][keys][vals][lens?]
The routing frame appears only where a bytedance server or scheduler answers a worker through its ROUTER
socket (zmq_van.h NonWorkerSendMsg): the ROUTER consumes the destination frame and the sender's own
"ps<id>" goes on the wire.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import numpy as np

from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.protocols import ZMTP_KEPT_BODIES
from dlcsniff.decoders.protocols.base import (Count, LossCounter, ProtocolDecoderBase, Row, StreamColumns,
                                              TcpDirection)
from dlcsniff.decoders.protocols.pslite import pbmeta
from dlcsniff.decoders.protocols.zmtp.decoder import Command, Message, ZmtpDecoder
from dlcsniff.decoders.protocols.zmtp.midstream import MidstreamZmtp
from dlcsniff.decoders.sansio import NEED_DATA, DecodeFailed

K_EMPTY = 2**31 - 1                  # ps-lite's Meta::kEmpty / Node::kEmpty: an unset id, head, timestamp...
PS_MAX_KEY = 2**64 - 1               # ps-lite base.h kMaxKey

# ps::Control::Command; 6..9 exist only in bytedance/ps-lite
(EMPTY, TERMINATE, ADD_NODE, BARRIER, ACK, HEARTBEAT,
 BOOTSTRAP, ADDR_REQUEST, ADDR_RESOLVED, INSTANCE_BARRIER) = range(10)
CONTROL_CMD_NAMES = ("EMPTY", "TERMINATE", "ADD_NODE", "BARRIER", "ACK", "HEARTBEAT",
                     "BOOTSTRAP", "ADDR_REQUEST", "ADDR_RESOLVED", "INSTANCE_BARRIER")
# ps::Node::Role; JOINT only in bytedance/ps-lite
ROLE_SERVER, ROLE_WORKER, ROLE_SCHEDULER, ROLE_JOINT = range(4)
ROLE_NAMES = ("server", "worker", "scheduler", "joint")
# ps::DataType: one per data frame, in the meta
DATA_TYPE_NAMES = ("CHAR", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64",
                   "FLOAT", "DOUBLE", "OTHER")
DATA_TYPE_INT32 = 3                  # the lens frame (SArray<int>)
# bytes per item of each ps::DataType (OTHER: unknown)
DATA_TYPE_ITEM_BYTES = dict(zip(range(11), (1, 1, 2, 4, 8, 1, 2, 4, 8, 4, 8)))
DATA_TYPE_UINT64 = 8                 # the keys frame (SArray<Key>, Key = uint64_t)
KEYS_FRAME, VALS_FRAME, LENS_FRAME = range(3)   # data frame positions used by KVWorker/KVServer

# Node ids (ps/base.h, postoffice.h): scheduler 1, groups 2 (servers) and 4 (workers) and their sums up to 7,
# server rank r = 8 + 2r, worker rank r = 9 + 2r.
SCHEDULER_ID = 1
# MXNet 1.9.1's fused push and pull (one request, push = pull = 1), as every output prints and draws it; only the
# machine identifiers keep "pushpull" (requests.parquet `kind`, summary.json's latency keys)
PUSH_PULL = "push-pull"

_IDENTITY = re.compile(rb"ps([0-9]{1,10})\Z")
MAX_ROUTING_FRAME_BYTES = 12         # "ps" + at most 10 digits; every meta frame is longer


@dataclass(frozen=True, slots=True)
class PsNode:
    role: int
    id: int | None                   # None: not yet assigned (kEmpty), as in a node's own ADD_NODE request
    hostname: str
    port: int | None
    customer_id: int | None
    is_recovery: bool


@dataclass(frozen=True, slots=True)
class PsMeta:
    flavor: str                      # "dmlc" (protobuf meta) or "byteps" (bytedance raw struct meta)
    head: int | None
    body: bytes
    control_cmd: int | None          # None: a data / SimpleApp message (no control, or cmd EMPTY)
    nodes: tuple[PsNode, ...]
    barrier_group: int | None        # sent with BARRIER (and INSTANCE_BARRIER); replies carry whatever was in memory
    msg_sig: int | None              # sent with ACK
    request: bool
    push: bool
    pull: bool                       # bytedance metas have no pull flag: a data message that is not a push
    simple_app: bool
    app_id: int | None
    timestamp: int | None
    customer_id: int | None
    data_types: tuple[int, ...]
    data_size: int | None            # dmlc's ZMQ van leaves it unset
    priority: int | None = None      # dmlc since 2019
    # bytedance/ps-lite only (None on dmlc metas)
    key: int | None = None
    addr: int | None = None
    val_len: int | None = None
    option: int | None = None
    sid: int | None = None           # layout of 2021-01 onwards
    src_dev_type: int | None = None  # layouts of 2020-12 onwards
    src_dev_id: int | None = None
    dst_dev_type: int | None = None
    dst_dev_id: int | None = None


@dataclass(frozen=True, slots=True)
class PsMessage:
    meta: PsMeta
    data_sizes: tuple[int | None, ...]   # one per data frame the meta announces (None: a capture hole took its size)
    keys: tuple[int, ...]            # u64 ps keys from the keys frame; () when absent or not captured
    lens: tuple[int, ...] | None     # int32 lens frame, when the message has one and it was captured
    size_bytes: int                  # meta + all data frames (not the routing frame)
    routing_id: str | None           # bytedance "ps<sender id>" routing frame
    complete: bool


def _unset(value: int) -> int | None:
    return None if value == K_EMPTY else value


def _text(value: bytes) -> str:
    # proto2 strings are not UTF-8 checked: bytes that are not UTF-8 are kept, escaped
    return value.decode("utf-8", "backslashreplace")


# -- dmlc/ps-lite: protobuf PBMeta -------------------------------------------------------------------------

def _optional(message: dict, name: str) -> int | None:
    """A proto2 optional int field: None when unset or holding ps-lite's kEmpty."""
    value = message.get(name)
    return None if value is None or value == K_EMPTY else value


def _dmlc_meta(pb: dict) -> PsMeta:
    control = pb.get("control")
    nodes = tuple(
        PsNode(role=n["role"], id=_optional(n, "id"), hostname=_text(n.get("hostname", b"")),
               port=_optional(n, "port"), customer_id=_optional(n, "customer_id"),
               is_recovery=n.get("is_recovery", False))
        for n in (control.get("node", ()) if control is not None else ()))
    return PsMeta(
        flavor="dmlc",
        head=_optional(pb, "head"),
        body=pb.get("body", b""),
        control_cmd=control["cmd"] if control is not None and control["cmd"] != EMPTY else None,
        nodes=nodes,
        barrier_group=_optional(control, "barrier_group") if control is not None else None,
        msg_sig=_optional(control, "msg_sig") if control is not None else None,
        request=pb.get("request", False),
        push=pb.get("push", False),
        pull=pb.get("pull", False),
        simple_app=pb.get("simple_app", False),
        app_id=_optional(pb, "app_id"),
        timestamp=_optional(pb, "timestamp"),
        customer_id=_optional(pb, "customer_id"),
        data_types=tuple(pb.get("data_type", ())),
        data_size=_optional(pb, "data_size"),
        priority=_optional(pb, "priority"),
    )


def parse_dmlc_meta(body: bytes | memoryview) -> PsMeta:
    """Decode a dmlc/ps-lite meta frame (protobuf ps.PBMeta). Raises DecodeError."""
    return _dmlc_meta(pbmeta.read(body))


def _is_pslite_shaped(pb: dict, body: bytes | memoryview) -> bool:
    """What every dmlc/ps-lite sender produces: Van::PackMeta has always set head, request, push and simple_app,
    and protobuf's serializer writes fields in number order with minimal varints, so a real meta re-encodes
    to exactly its own bytes and holds no field outside the schema."""
    return (all(name in pb for name in ("head", "request", "push", "simple_app"))
            and pbmeta.UNKNOWN not in pb
            and pbmeta.encode(pb) == body)


# -- bytedance/ps-lite: raw structs, host byte order (little-endian on x86-64) ------------------------------

@dataclass(frozen=True, slots=True)
class _RawLayout:
    meta: struct.Struct
    meta_fields: tuple[str, ...]
    node: struct.Struct              # unpacks to (role, id, hostname, port, is_recovery, customer_id)


# Offsets from bytedance/ps-lite src/meta.h (checked with offsetof on each version compiled by g++, x86-64):
# head@0 body_size@4 control{cmd@8 node_size@12 barrier_group@16 msg_sig@24} request@32 app_id@36 timestamp@40
# data_type_size@44, then   88-byte meta: customer_id@48 push@52 simple_app@53 data_size@56 key@64 addr@72
#                                         val_len@80 option@84
#                     104/112-byte meta: src_dev_type@48 src_dev_id@52 dst_dev_type@56 dst_dev_id@60
#                                         customer_id@64 push@68 simple_app@69 data_size@72 key@80 addr@88
#                                         val_len@96 option@100 (sid@104 in the 112-byte meta)
# RawNode: role@0 id@4 hostname[64]@8, then  84 bytes: port@72 is_recovery@76 customer_id@80
#                                           168 bytes: as 84, + endpoint_name[64]@84 endpoint_name_len@152 aux_id@160
#                                           552 bytes: num_ports@72 ports[32]@76 port@204 dev_types[32]@208
#                                                      dev_ids[32]@336 is_recovery@464 customer_id@468
#                                                      endpoint_name[64]@472 endpoint_name_len@536 aux_id@544
_COMMON = ("head", "body_size", "cmd", "node_size", "barrier_group", "msg_sig", "request",
           "app_id", "timestamp", "data_type_size")
_DEVICES = ("src_dev_type", "src_dev_id", "dst_dev_type", "dst_dev_id")
_TAIL = ("customer_id", "push", "simple_app", "data_size", "key", "addr", "val_len", "option")
_META_112 = struct.Struct("<5i4xQB3x3i4i i BB2x i4x QQ 3i4x")
_META_104 = struct.Struct("<5i4xQB3x3i4i i BB2x i4x QQ 2i")
_META_88 = struct.Struct("<5i4xQB3x3i i BB2x i4x QQ 2i")
_NODE_552 = struct.Struct("<ii64s4x128xi256xB3xi80x")
_NODE_168 = struct.Struct("<ii64siB3xi84x")
_NODE_84 = struct.Struct("<ii64siB3xi")
_BYTEPS_LAYOUTS = (     # newest first; each from the bytedance/ps-lite commit of that date to the next
    _RawLayout(_META_112, _COMMON + _DEVICES + _TAIL + ("sid",), _NODE_552),     # 2021-01-24 6dc1966 → today
    _RawLayout(_META_104, _COMMON + _DEVICES + _TAIL, _NODE_552),               # 2020-12-23 2558dfe
    _RawLayout(_META_88, _COMMON + _TAIL, _NODE_168),                           # 2020-08-13 51f7248
    _RawLayout(_META_88, _COMMON + _TAIL, _NODE_84),                            # 2020-01-01 3b7180d
)
_BOOL_FIELDS = ("request", "push", "simple_app")


def _byteps_layout(frame: memoryview) -> tuple[_RawLayout, dict]:
    """The layout whose sizeof(RawMeta) + body + 4·data_type_size + node_size·sizeof(RawNode) is the frame size
    (Van::GetPackMetaLen). With no node both 88-byte layouts decode alike; otherwise the count tells them apart."""
    for layout in _BYTEPS_LAYOUTS:
        if len(frame) < layout.meta.size:
            continue
        raw = dict(zip(layout.meta_fields, layout.meta.unpack_from(frame)))
        counts = (raw["body_size"], raw["data_type_size"], raw["node_size"])
        if min(counts) < 0:
            continue
        if layout.meta.size + counts[0] + 4 * counts[1] + counts[2] * layout.node.size == len(frame):
            return layout, raw
    raise DecodeError(f"a {len(frame)}-byte frame matches no bytedance/ps-lite RawMeta layout")


def parse_byteps_meta(body: bytes | memoryview) -> PsMeta:
    """Decode a bytedance/ps-lite raw meta frame (RawMeta | body | int32 data_type[] | RawNode[]).

    Detects the layout (112/552, 104/552, 88/168, 88/84 bytes) from the frame size. Raises DecodeError."""
    frame = memoryview(body).cast("B")
    layout, raw = _byteps_layout(frame)
    bad_bools = [name for name in _BOOL_FIELDS if raw[name] > 1]
    if bad_bools:
        raise DecodeError(f"RawMeta bool fields {bad_bools} hold bytes other than 0/1")
    cmd = raw["cmd"]
    if not 0 <= cmd < len(CONTROL_CMD_NAMES):
        raise DecodeError(f"RawMeta control cmd {cmd} is not a ps-lite command")
    pos = layout.meta.size
    meta_body = bytes(frame[pos:pos + raw["body_size"]])
    pos += raw["body_size"]
    data_types = struct.unpack_from(f"<{raw['data_type_size']}i", frame, pos)
    pos += 4 * raw["data_type_size"]
    nodes = []
    for role, node_id, hostname, port, is_recovery, customer_id in layout.node.iter_unpack(frame[pos:]):
        if not 0 <= role < len(ROLE_NAMES) or is_recovery > 1:
            raise DecodeError(f"RawNode role {role} / is_recovery {is_recovery} out of range")
        nodes.append(PsNode(role=role, id=_unset(node_id), hostname=_text(hostname.split(b"\0", 1)[0]),
                            port=_unset(port), customer_id=_unset(customer_id), is_recovery=bool(is_recovery)))
    control = cmd != EMPTY
    simple_app = bool(raw["simple_app"])
    return PsMeta(
        flavor="byteps",
        head=_unset(raw["head"]),
        body=meta_body,
        control_cmd=cmd if control else None,
        nodes=tuple(nodes),
        # PackMeta copies barrier_group only for BARRIER/INSTANCE_BARRIER and msg_sig only for ACK
        barrier_group=raw["barrier_group"] if cmd in (BARRIER, INSTANCE_BARRIER) else None,
        msg_sig=raw["msg_sig"] if cmd == ACK else None,
        request=bool(raw["request"]),
        push=bool(raw["push"]),
        pull=not (control or simple_app or raw["push"]),
        simple_app=simple_app,
        app_id=_unset(raw["app_id"]),
        timestamp=_unset(raw["timestamp"]),
        customer_id=_unset(raw["customer_id"]),
        data_types=data_types,
        data_size=raw["data_size"],
        key=raw["key"],
        addr=raw["addr"],
        val_len=raw["val_len"],
        option=raw["option"],
        sid=raw.get("sid"),
        src_dev_type=raw.get("src_dev_type"),
        src_dev_id=raw.get("src_dev_id"),
        dst_dev_type=raw.get("dst_dev_type"),
        dst_dev_id=raw.get("dst_dev_id"),
    )


_HEAD_TAG = b"\x08"                   # PBMeta.head: field 1, wire type 0 (varint)


def _parse_strict(body: bytes | memoryview) -> PsMeta:
    """Either flavor, accepting a dmlc meta only when it is shaped as ps-lite writes it (see _is_pslite_shaped):
    how a stream's flavor is first decided and how a resynchronising ZMTP decoder tells a meta frame. A frame not
    opening with head's tag (field 1, a varint: 0x08, written first) is no such dmlc meta, and is not parsed as one:
    most of the candidates a resynchronisation judges are bytes of tensor values."""
    if body[:1] != _HEAD_TAG:
        return parse_byteps_meta(body)
    try:
        pb = pbmeta.read(body)
    except DecodeError:
        return parse_byteps_meta(body)
    if _is_pslite_shaped(pb, body):
        return _dmlc_meta(pb)
    return parse_byteps_meta(body)


def looks_like_meta(body_prefix: bytes | memoryview) -> bool:
    """Whether a ZMTP frame body can open a ps-lite message: a meta frame of either flavor, or a bytedance
    routing frame "ps<id>" (which precedes the meta). The ZMTP decoder's resync validator.

    Needs the whole frame: a meta frame is small (tens of bytes; ADD_NODE lists and SimpleApp bodies more),
    and a cut one is rejected."""
    if len(body_prefix) <= MAX_ROUTING_FRAME_BYTES and parse_identity(body_prefix) is not None:
        return True
    try:
        _parse_strict(body_prefix)
    except DecodeError:
        return False
    return True


# -- node ids ----------------------------------------------------------------------------------------------

def parse_identity(identity: bytes | memoryview | str | None) -> int | None:
    """Node id from a ps-lite ZMQ identity or routing frame (`b"ps9"` → 9); None for anything else (an empty
    identity: a node's first connection to the scheduler, before it has an id)."""
    if identity is None:
        return None
    raw = identity.encode("latin-1") if isinstance(identity, str) else bytes(identity)
    match = _IDENTITY.match(raw)
    return int(match.group(1)) if match else None


def node_role(node_id: int | None) -> str | None:
    """"scheduler", "server", "worker", "group" (2..7: a set of the scheduler, server and worker groups) or
    None (no id / not a ps-lite id)."""
    if node_id is None or node_id < 1:
        return None
    if node_id == SCHEDULER_ID:
        return "scheduler"
    if node_id < 8:
        return "group"
    return "server" if node_id % 2 == 0 else "worker"


def server_rank(node_id: int) -> int:
    if node_role(node_id) != "server":
        raise ValueError(f"node id {node_id} is not a server id (even, >= 8)")
    return (node_id - 8) // 2


def worker_rank(node_id: int) -> int:
    if node_role(node_id) != "worker":
        raise ValueError(f"node id {node_id} is not a worker id (odd, >= 9)")
    return (node_id - 9) // 2


def rank_of_id(node_id: int | None) -> int | None:
    """Server or worker rank of a node id; None for the scheduler, groups and unknown ids."""
    role = node_role(node_id)
    if role == "server":
        return server_rank(node_id)
    if role == "worker":
        return worker_rank(node_id)
    return None


def server_key_ranges(num_servers: int) -> list[tuple[int, int]]:
    """[begin, end) ps key range of each server rank (ps-lite Postoffice::GetServerKeyRanges:
    kMaxKey / S · i, the division first, in u64)."""
    if num_servers < 1:
        raise ValueError(f"num_servers must be >= 1, not {num_servers}")
    width = PS_MAX_KEY // num_servers
    return [(width * rank, width * (rank + 1)) for rank in range(num_servers)]


# -- one ZMTP message → one ps-lite message ---------------------------------------------------------------

def _array(frame: bytes | memoryview | None, size: int, dtype: str, what: str) -> np.ndarray | None:
    """The frame as a little-endian array; None when its body was not captured (skipped or cut short)."""
    if frame is None or len(frame) != size:
        return None
    itemsize = np.dtype(dtype).itemsize
    if size % itemsize:
        raise DecodeError(f"{what} frame of {size} bytes is not a whole number of {itemsize}-byte items")
    return np.frombuffer(frame, dtype=dtype)


def _stated_sizes(types: tuple[int, ...], seen: tuple[int, ...], keys: np.ndarray | None,
                  lens: np.ndarray | None) -> tuple[int | None, ...]:
    """The sizes of all the data frames the meta announces, for a message a capture hole cut short: those
    seen, then what the message itself states of the others (None where it states nothing): the lens frame
    holds one int32 per key (KVServer's rule), the vals frame sum(lens) items of its data type."""
    sizes: list[int | None] = [*seen, *([None] * (len(types) - len(seen)))]
    if sizes[LENS_FRAME:] and sizes[LENS_FRAME] is None and types[LENS_FRAME] == DATA_TYPE_INT32 and keys is not None:
        sizes[LENS_FRAME] = 4 * len(keys)
    item_bytes = DATA_TYPE_ITEM_BYTES.get(types[VALS_FRAME]) if len(types) > VALS_FRAME else None
    if sizes[VALS_FRAME:] and sizes[VALS_FRAME] is None and lens is not None and item_bytes is not None:
        sizes[VALS_FRAME] = int(lens.sum()) * item_bytes
    return tuple(sizes)


class PsliteDecoder:
    """Decodes the ps-lite messages of one ZMTP stream (one direction of one connection).

    Learns the flavor (dmlc or bytedance) from the first message it decodes and whether this stream carries
    bytedance routing frames, then holds to both."""

    def __init__(self) -> None:
        self.flavor: str | None = None
        self.routed: bool | None = None
        self._first_frame_size = 0

    def keep_body(self, frame_index: int, size: int) -> bool:
        """For ZmtpDecoder: keep the routing frame, the meta, the keys and the lens frame; never the values.
        Past a message's first two frames, bodies over ZMTP_KEPT_BODIES.max_body_bytes are not kept either (a
        lens frame that large lists over 8,000 keys): the capture daemon's in-kernel cut follows the same rule
        (sniffer/probes/zmtp_snap.c), so a capture it cut decodes as a whole one does.

        Called for the frames of a message in order, before their bodies arrive."""
        if frame_index == 0:
            self._first_frame_size = size
            return True
        if frame_index >= ZMTP_KEPT_BODIES.first_frames and size > ZMTP_KEPT_BODIES.max_body_bytes:
            return False
        routed = self.routed
        if routed is None:
            routed = self.flavor != "dmlc" and self._first_frame_size <= MAX_ROUTING_FRAME_BYTES
        data_index = frame_index - (2 if routed else 1)
        return data_index != VALS_FRAME

    def _meta(self, frame: bytes | memoryview, routed: bool) -> PsMeta:
        if self.flavor == "dmlc":
            return parse_dmlc_meta(frame)
        if self.flavor == "byteps" or routed:
            return parse_byteps_meta(frame)
        return _parse_strict(frame)

    def decode(self, frame_sizes: tuple[int, ...], frames: tuple[bytes | memoryview | None, ...],
               complete: bool) -> PsMessage:
        """One ZMTP message → PsMessage. Raises DecodeError when it is not a ps-lite message."""
        if not frame_sizes:
            raise DecodeError("a ZMTP message without frames")
        routing_id = None
        if (self.flavor != "dmlc" and len(frame_sizes) > 1 and frame_sizes[0] <= MAX_ROUTING_FRAME_BYTES
                and parse_identity(frames[0]) is not None):
            routing_id = bytes(frames[0]).decode("ascii")
        meta_index = 0 if routing_id is None else 1
        meta_frame = frames[meta_index]
        if meta_frame is None or len(meta_frame) != frame_sizes[meta_index]:
            raise DecodeError(f"the meta frame ({frame_sizes[meta_index]} bytes) was not captured whole")
        meta = self._meta(meta_frame, routing_id is not None)

        data_sizes = tuple(frame_sizes[meta_index + 1:])
        data_frames = frames[meta_index + 1:]
        types = meta.data_types
        if len(types) != len(data_sizes) and (complete or len(data_sizes) > len(types)):
            raise DecodeError(f"the meta announces {len(types)} data frames, the message has {len(data_sizes)}")
        keys = lens = None
        if len(data_sizes) > KEYS_FRAME and types[KEYS_FRAME] == DATA_TYPE_UINT64:
            keys = _array(data_frames[KEYS_FRAME], data_sizes[KEYS_FRAME], "<u8", "keys")
        if len(data_sizes) > LENS_FRAME and types[LENS_FRAME] == DATA_TYPE_INT32:
            lens = _array(data_frames[LENS_FRAME], data_sizes[LENS_FRAME], "<i4", "lens")
        if keys is not None and lens is not None and len(keys) != len(lens):
            raise DecodeError(f"{len(keys)} keys but {len(lens)} lens (KVServer requires one len per key)")
        if len(data_sizes) < len(types):
            data_sizes = _stated_sizes(types, data_sizes, keys, lens)

        self.flavor = meta.flavor
        self.routed = routing_id is not None
        return PsMessage(
            meta=meta,
            data_sizes=data_sizes,
            keys=tuple(keys.tolist()) if keys is not None else (),
            lens=tuple(lens.tolist()) if lens is not None else None,
            size_bytes=frame_sizes[meta_index] + sum(size for size in data_sizes if size is not None),
            routing_id=routing_id,
            complete=complete,
        )


# -- the capture decoder: ZMTP directions → ZMTP and ps-lite rows -------------------------------------------

_ZMTP_GREETING_SIGNATURE_END = 0x7F


def _zmtp_signature(prefix: bytes) -> bool | None:
    """ZMTP 2.0/3.x greeting signature (0xFF, 8 padding bytes, 0x7F): True/False, None while unknown."""
    if not prefix:
        return None
    if prefix[0] != 0xFF:
        return False
    return None if len(prefix) < 10 else prefix[9] == _ZMTP_GREETING_SIGNATURE_END


def _looks_like_zmtp10(prefix: bytes) -> bool:
    """ZMTP 1.0 (or its long form): a short identity frame `len flags` with flags 0, or 0xFF + 8-byte
    length. Weak on its own: asked only once no other decoder claimed the stream."""
    if len(prefix) >= 10 and prefix[0] == 0xFF:
        return (prefix[9] & 0x01) == 0
    return len(prefix) >= 2 and prefix[1] == 0 and len(prefix) >= prefix[0] + 1 and prefix[0] >= 1


def _ends(direction: TcpDirection) -> tuple[tuple[bytes, int], tuple[bytes, int]]:
    src, sport, dst, dport = direction.key
    return (src, sport), (dst, dport)


def _readings(st: _ZmtpStream) -> list[ZmtpDecoder]:
    """The ZMTP decoders reading a direction: for ps-lite, and as plain ZMTP while that is undecided."""
    return [st.zmtp] if st.plain is None else [st.zmtp, st.plain.zmtp]


@dataclass(slots=True)
class _ZmtpStream:
    """A TCP direction read as ZMTP, and the ps-lite decoding of its messages."""
    zmtp: ZmtpDecoder
    ps: PsliteDecoder
    is_pslite: bool | None = None       # None: undecided, until the first message
    decode_error: str | None = None
    routed_sender: int | None = None    # the node its routing frames name (reported once: a pslite_routed row)
    undecoded_messages: int = 0         # ZMTP messages whose ps-lite part could not be read (plain ZMTP: incomplete)
    plain: MidstreamZmtp | None = None  # caught mid-connection: its plain-ZMTP reading, while ps-lite is unseen
    ends: tuple = ()                    # its two (address, port) ends


class PsliteCaptureDecoder(ProtocolDecoderBase):
    """ZMTP streams of a capture and the ps-lite messages they carry (decoders.protocols.base API).

    Rows: `zmtp` (every ZMTP message and command), `messages` (ps-lite messages, protocol "pslite"), stream
    columns (ZMTP version, mechanism, socket type, identity...), and three capture-level tables the job-wide
    resolution reads: `pslite_nodes` (node id, role, host, port from ADD_NODE replies), `pslite_announced`
    (the (host, port) a stream's ADD_NODE request announced) and `pslite_routed` (the sender a stream's
    bytedance routing frames name).

    A direction caught mid-connection is read for ps-lite (its metas vouch for the frames found) and, until
    ps-lite shows, as plain ZMTP (decoders.protocols.zmtp.midstream); the capture's end decides the latter:
    ZMTP when a run of frames supports it and another connection to one of its ends opened with a ZMTP
    greeting in the capture (a server whose port speaks ZMTP), else plain TCP."""

    name = "pslite"
    # a plain-ZMTP stream's undecoded messages are its ZMTP messages not captured whole: no ps-lite header there
    _skipped = LossCounter("lost_bytes", "B skipped to find the ZMTP framing again")
    losses = {"pslite": (LossCounter("undecoded_messages", "messages unreadable (their ps-lite header not captured)",
                                     messages=True), _skipped),
              "zmtp": (LossCounter("undecoded_messages", "ZMTP messages incomplete (bytes of them not captured)",
                                   messages=True), _skipped)}

    def __init__(self) -> None:
        super().__init__()
        self._streams: dict[int, _ZmtpStream] = {}
        self._greeted: set[tuple[bytes, int]] = set()     # the ends of directions that began with a greeting

    # -- claims ---------------------------------------------------------------------------------------
    def claim(self, direction: TcpDirection, prefix: bytes) -> bool | None:
        signature = _zmtp_signature(prefix)
        if signature is None:
            return None
        if signature and direction.syn_seen:
            self._start(direction.stream_id, midstream=False)
            self._greeted.update(_ends(direction))
            return True
        return False

    def claim_fallback(self, direction: TcpDirection, prefix: bytes, seen_data: bool) -> bool:
        """A direction nobody claimed: ZMTP found by resynchronisation when its start is not in the capture
        (the ps-lite meta validator vouches for the frames it lands on; read as plain ZMTP too, which the
        capture's end decides), or ZMTP 1.0 by its identity frame."""
        if not direction.syn_seen or not seen_data:
            self._start(direction.stream_id, midstream=True)
            self._streams[direction.stream_id].plain = MidstreamZmtp()
            self._streams[direction.stream_id].ends = _ends(direction)
            return True
        if _looks_like_zmtp10(prefix):
            self._start(direction.stream_id, midstream=False)
            return True
        return False

    def release(self, stream_id: int) -> bool:
        """A direction caught mid-connection that has not shown ZMTP yet is given up: nothing was said of it (its
        plain-ZMTP reading waits for the capture's end, its ps-lite reading for evidence)."""
        st = self._streams.get(stream_id)
        if st is None or st.plain is None or st.zmtp.evidence:
            return False
        del self._streams[stream_id]
        return True

    def _start(self, stream_id: int, *, midstream: bool) -> None:
        ps = PsliteDecoder()
        zmtp = ZmtpDecoder(keep_body=ps.keep_body, midstream=midstream, frame_validator=looks_like_meta)
        self._streams[stream_id] = _ZmtpStream(zmtp, ps)

    # -- input ----------------------------------------------------------------------------------------
    def receive_data(self, stream_id: int, data: memoryview, ts_ns: int) -> None:
        st = self._streams[stream_id]
        if data and len(data) <= self.skippable_bytes(stream_id):
            self.skip(stream_id, len(data), ts_ns, 0)   # inside a body not kept (bytes drained after a hole): counted
            return
        for zmtp in _readings(st):
            zmtp.receive_data(data, ts_ns)
        self._drain(stream_id, st)

    def receive_gap(self, stream_id: int, size: int, ts_ns: int, lost: bool) -> None:
        st = self._streams[stream_id]
        for zmtp in _readings(st):
            zmtp.receive_gap(size, ts_ns, lost=lost)
        self._drain(stream_id, st)

    def receive_end(self, stream_id: int, ts_ns: int) -> None:
        st = self._streams[stream_id]
        for zmtp in _readings(st):
            zmtp.receive_end(ts_ns)
        self._drain(stream_id, st)

    def skippable_bytes(self, stream_id: int) -> int:
        return min(zmtp.skippable_bytes() for zmtp in _readings(self._streams[stream_id]))

    def skip(self, stream_id: int, size: int, ts_ns: int, cut: int) -> None:
        # (cut bytes inside a body not kept are nothing lost, as the StreamGap(lost=False) they stand for)
        for zmtp in _readings(self._streams[stream_id]):
            zmtp.skip(size, ts_ns)

    def end_of_capture(self) -> None:
        for stream_id, st in self._streams.items():
            for zmtp in _readings(st):
                zmtp.receive_end(0)
            self._drain(stream_id, st)
            if (st.plain is not None and not st.zmtp.evidence and st.plain.believed
                    and self._greeted.intersection(st.ends)):
                for ev in st.plain.events():
                    self._zmtp_row(stream_id, ev, ev.name if isinstance(ev, Command) else None)
                self._emit(StreamColumns(stream_id, {
                    "protocol": "zmtp", "encrypted": False, "lost_bytes": st.plain.lost_bytes,
                    "resyncs": st.plain.resyncs, "undecoded_messages": 0}))
            else:
                self._emit(StreamColumns(stream_id, self._stream_columns(st)))

    # -- ZMTP events ----------------------------------------------------------------------------------
    def _drain(self, stream_id: int, st: _ZmtpStream) -> None:
        dec = st.zmtp
        if st.plain is not None:
            st.plain.drain()
            if dec.evidence:                # the ps-lite reading found ZMTP: it is the stream's
                st.plain = None
        while (ev := dec.next_event()) is not NEED_DATA:
            if isinstance(ev, Message):
                self._zmtp_row(stream_id, ev, None)
                self._on_message(stream_id, st, ev)
            elif isinstance(ev, Command):
                self._zmtp_row(stream_id, ev, ev.name)
            elif isinstance(ev, DecodeFailed):
                st.decode_error = f"offset {ev.offset}: {ev.reason}"
            # Greeting, Resync: visible through the decoder's state (version, lost_bytes, resyncs)

    def _zmtp_row(self, stream_id: int, ev: Message | Command, command: str | None) -> None:
        self._emit(Row("zmtp", {
            "stream_id": stream_id, "ts_first_ns": ev.ts_first_ns, "ts_last_ns": ev.ts_last_ns, "command": command,
            "frame_sizes": list(ev.frame_sizes) if command is None else [ev.size_bytes],
            "size_bytes": sum(ev.frame_sizes) if command is None else ev.size_bytes, "complete": ev.complete}))

    def _on_message(self, stream_id: int, st: _ZmtpStream, ev: Message) -> None:
        if st.is_pslite is False:
            if not ev.complete:
                st.undecoded_messages += 1
                self._emit(Count("undecoded_messages", 1))
            return
        try:
            msg = st.ps.decode(ev.frame_sizes, ev.frames, ev.complete)
        except DecodeError:
            if st.is_pslite is None and ev.complete:
                st.is_pslite = False        # a ZMTP stream, but not ps-lite
            else:
                st.undecoded_messages += 1
                self._emit(Count("undecoded_messages", 1))
            return
        st.is_pslite = True
        meta = msg.meta
        if msg.routing_id is not None and st.routed_sender is None:
            st.routed_sender = parse_identity(msg.routing_id)
            self._emit(Row("pslite_routed", {"stream_id": stream_id, "node_id": st.routed_sender}))
        if meta.control_cmd == ADD_NODE:
            if meta.request or any(n.id is None for n in meta.nodes):
                for node in meta.nodes:
                    self._emit(Row("pslite_announced", {"stream_id": stream_id, "hostname": node.hostname,
                                                        "port": node.port}))
            else:
                for node in meta.nodes:
                    self._emit(Row("pslite_nodes", {"node_id": node.id, "role": node.role,
                                                    "hostname": node.hostname, "port": node.port}))
        self._emit(Row("messages", {
            "stream_id": stream_id, "ts_first_ns": ev.ts_first_ns, "ts_last_ns": ev.ts_last_ns,
            "request": meta.request, "push": meta.push, "pull": meta.pull, "simple_app": meta.simple_app,
            "ps_timestamp": meta.timestamp, "head": meta.head, "app_id": meta.app_id,
            "customer_id": meta.customer_id, "control_cmd": meta.control_cmd,
            "data_sizes": list(msg.data_sizes), "size_bytes": msg.size_bytes, "keys": list(msg.keys),
            "lens": list(msg.lens) if msg.lens is not None else None, "complete": msg.complete,
            "meta_bytes": ev.frame_sizes[1 if msg.routing_id is not None else 0],
            "barrier_group": meta.barrier_group, "flavor": meta.flavor, "protocol": "pslite",
        }))

    @staticmethod
    def _stream_columns(st: _ZmtpStream) -> dict:
        z = st.zmtp
        # A stream caught mid-connection has no greeting (version None) but may well be ZMTP; one whose
        # bytes merely parse as unversioned ZMTP 1.0 may well not be. Without positive evidence
        # (ZmtpDecoder.evidence) the direction is plain TCP: nothing of it is ZMTP's, not even the bytes read.
        if not z.evidence:
            return {}
        ident = z.identity
        return {"protocol": "pslite" if st.is_pslite else "zmtp", "zmtp_version": z.version, "mechanism": z.mechanism,
                "socket_type": z.socket_type, "identity": ident.decode("latin-1") if ident is not None else None,
                "encrypted": bool(z.encrypted), "decode_error": st.decode_error, "lost_bytes": z.lost_bytes,
                "resyncs": z.resyncs, "undecoded_messages": st.undecoded_messages}
