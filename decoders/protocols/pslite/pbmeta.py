"""dmlc/ps-lite's meta frame, ps.PBMeta (`src/meta.proto`, package `ps`, proto2), read from and written to the
protobuf wire format here, in pure Python.

Why not google.protobuf: its runtime would have to be imported and the message classes built from a descriptor
before the first meta, and a message object is slow to read field by field; the schema is three small messages.
Field numbers and types are those of dmlc/ps-lite at 34fd45c, the commit MXNet 1.9.1 pins (unchanged on
dmlc/ps-lite master); `pull` (12) and `priority` (13) arrived in 2019, so older senders simply leave them unset.

What protobuf's parser (upb, python protobuf's runtime) accepts, `read` accepts, with the same values, and what it
rejects `read` rejects (tests/decoders/test_pbmeta.py holds the two readers to each other):
- a tag is a varint of at most 5 bytes and 32 bits; field number 0 and wire types 6 and 7 are corrupt;
- a varint has at most 10 bytes, the bits past the 64th dropped; int32 keeps the low 32 bits, signed;
  bool is any non-zero varint; a value, length or group running past its message's end is corrupt;
- a scalar seen twice keeps the last value, a message seen twice is merged into the first, repeated fields
  append; the repeated int32 `data_type` is read packed (wire type 2) or not (wire type 0);
- a known field on another wire type, and any field outside the schema, is an unknown field, kept as its bytes;
  groups (wire types 3 and 4) must nest and match, at most 100 messages and groups deep below the meta;
- strings are not UTF-8 checked (proto2).

A message is a dict by field name holding the fields present (proto2 presence: `"head" in meta` is
`HasField("head")`), with its unknown fields' bytes under UNKNOWN; `encode` writes one back as protobuf's
serializer does: fields in number order, minimal varints (a negative int32 sign-extended to 10 bytes),
`data_type` packed, unknown fields last.
"""
from __future__ import annotations

from dlcsniff.decoders.errors import DecodeError

UNKNOWN = ""                         # a message's key for its unknown fields (bytes as on the wire, in order)

# How a field reads from the wire (its proto2 type and label)
_INT32, _UINT64, _BOOL, _BYTES, _MESSAGE, _REPEATED_MESSAGE, _REPEATED_INT32 = range(7)
_VARINT, _I64, _LEN, _SGROUP, _EGROUP, _I32 = range(6)      # wire types
_U64 = (1 << 64) - 1
_MAX_DEPTH = 100                     # python protobuf's recursion limit (upb_DecodeOptions_MaxDepth)
_CORRUPT = "Wire format was corrupt"

# message -> (field name, number, how it reads[, submessage]) in number order; hostname (a proto2 string) reads as
# bytes; the `required` fields (PBControl.cmd, PBNode.role) are checked by _missing
_NODE = (("role", 1, _INT32), ("id", 2, _INT32), ("hostname", 3, _BYTES), ("port", 4, _INT32),
         ("is_recovery", 5, _BOOL), ("customer_id", 10, _INT32))
_CONTROL = (("cmd", 1, _INT32), ("node", 2, _REPEATED_MESSAGE, _NODE), ("barrier_group", 3, _INT32),
            ("msg_sig", 4, _UINT64))
_META = (("head", 1, _INT32), ("body", 2, _BYTES), ("control", 3, _MESSAGE, _CONTROL), ("request", 4, _BOOL),
         ("push", 5, _BOOL), ("simple_app", 6, _BOOL), ("app_id", 7, _INT32), ("timestamp", 8, _INT32),
         ("data_type", 9, _REPEATED_INT32), ("customer_id", 10, _INT32), ("data_size", 11, _INT32),
         ("pull", 12, _BOOL), ("priority", 13, _INT32))


def _tags(fields: tuple) -> dict[int, tuple]:
    """tag -> (name, how it reads, submessage tags) for the wire type each field reads from."""
    tags = {}
    for name, number, kind, *sub in fields:
        sub_tags = _tags(sub[0]) if sub else None
        wire_types = {_REPEATED_INT32: (_VARINT, _LEN), _BYTES: (_LEN,), _MESSAGE: (_LEN,),
                      _REPEATED_MESSAGE: (_LEN,)}.get(kind, (_VARINT,))
        for wire_type in wire_types:
            tags[number << 3 | wire_type] = (name, kind, sub_tags)
    return tags


_META_TAGS = _tags(_META)
_NO_TAGS: dict[int, tuple] = {}      # a group's fields: all unknown


class _Corrupt(Exception):
    pass


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while pos < end and shift < 70:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & _U64, pos
        shift += 7
    raise _Corrupt


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _read(buf: bytes, pos: int, end: int, tags: dict, message: dict | None, depth: int) -> tuple[int, int]:
    """The fields of buf[pos:end] into `message` (None: only checked); returns where it stopped and the field
    number of the end-group tag it stopped at (-1: at `end`)."""
    while pos < end:
        start = pos
        tag = buf[pos]
        pos += 1
        if tag >= 0x80:
            tag, pos = _varint(buf, start, end)
            if pos - start > 5 or tag > 0xFFFFFFFF:
                raise _Corrupt
        wire_type = tag & 7
        if wire_type == _EGROUP:
            return pos, tag >> 3
        known = tags.get(tag)
        if known is not None:
            name, kind, sub_tags = known
            if wire_type == _VARINT:
                if pos < end and buf[pos] < 0x80:       # one byte: the same for every type
                    value = buf[pos]
                    pos += 1
                else:
                    value, pos = _varint(buf, pos, end)
                    if kind == _INT32 or kind == _REPEATED_INT32:
                        value = _int32(value)
                if kind == _BOOL:
                    message[name] = value != 0
                elif kind == _REPEATED_INT32:
                    message.setdefault(name, []).append(value)
                else:
                    message[name] = value
                continue
            size, pos = _varint(buf, pos, end)
            if size > end - pos:
                raise _Corrupt
            stop = pos + size
            if kind == _BYTES:
                message[name] = buf[pos:stop]
            elif kind == _REPEATED_INT32:
                values = message.setdefault(name, [])
                while pos < stop:
                    value, pos = _varint(buf, pos, stop)
                    values.append(_int32(value))
            else:
                if depth == 0:
                    raise _Corrupt
                if kind == _MESSAGE:
                    sub = message.setdefault(name, {})
                else:
                    sub = {}
                    message.setdefault(name, []).append(sub)
                if _read(buf, pos, stop, sub_tags, sub, depth - 1)[1] != -1:
                    raise _Corrupt
            pos = stop
            continue
        if tag >> 3 == 0:
            raise _Corrupt
        if wire_type == _VARINT:
            pos = _varint(buf, pos, end)[1]
        elif wire_type == _LEN:
            size, pos = _varint(buf, pos, end)
            if size > end - pos:
                raise _Corrupt
            pos += size
        elif wire_type == _I64 or wire_type == _I32:
            pos += 8 if wire_type == _I64 else 4
            if pos > end:
                raise _Corrupt
        elif wire_type == _SGROUP:
            if depth == 0:
                raise _Corrupt
            pos, end_group = _read(buf, pos, end, _NO_TAGS, None, depth - 1)
            if end_group != tag >> 3:
                raise _Corrupt
        else:
            raise _Corrupt
        if message is not None:
            message[UNKNOWN] = message.get(UNKNOWN, b"") + buf[start:pos]
    return pos, -1


def _missing(message: dict) -> list[str]:
    """The required fields not set, named as protobuf's FindInitializationErrors names them."""
    control = message.get("control")
    if control is None:
        return []
    missing = [] if "cmd" in control else ["control.cmd"]
    return missing + [f"control.node[{i}].role" for i, node in enumerate(control.get("node", ())) if "role" not in node]


def read(body: bytes | memoryview) -> dict:
    """A ps.PBMeta from its wire bytes, as protobuf parses it. Raises DecodeError on what protobuf rejects, and
    on a meta missing PBControl.cmd or PBNode.role (`required`: ps-lite's ParseFromArray rejects those)."""
    buf = bytes(body)
    meta: dict = {}
    try:
        if _read(buf, 0, len(buf), _META_TAGS, meta, _MAX_DEPTH)[1] != -1:
            raise _Corrupt
    except _Corrupt:
        raise DecodeError(f"not a ps.PBMeta protobuf ({len(buf)} bytes): Error parsing message with type "
                          f"'ps.PBMeta': {_CORRUPT}") from None
    missing = _missing(meta)
    if missing:
        raise DecodeError(f"ps.PBMeta misses required fields: {', '.join(missing)}")
    return meta


_SMALL_VARINTS = tuple(bytes((i,)) for i in range(0x80))


def _encode_varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _SMALL_VARINTS[value]
    value &= _U64
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _writers(fields: tuple) -> tuple:
    """(field name, how it reads, its tag's bytes, the submessage's writers) in number order."""
    return tuple((name, kind, _encode_varint(number << 3 | (_VARINT if kind in (_INT32, _UINT64, _BOOL) else _LEN)),
                  _writers(sub[0]) if sub else None) for name, number, kind, *sub in fields)


_META_WRITERS = _writers(_META)


def _encode(writers: tuple, message: dict) -> bytes:
    out = []
    for name, kind, tag, sub in writers:
        value = message.get(name)
        if value is None:
            continue
        if kind == _INT32 or kind == _UINT64 or kind == _BOOL:
            out += (tag, _encode_varint(int(value)))
            continue
        if kind == _REPEATED_INT32:
            chunks = [b"".join(map(_encode_varint, value))] if value else []
        elif kind == _BYTES:
            chunks = [value]
        elif kind == _MESSAGE:
            chunks = [_encode(sub, value)]
        else:
            chunks = [_encode(sub, node) for node in value]
        for chunk in chunks:
            out += (tag, _encode_varint(len(chunk)), chunk)
    out.append(message.get(UNKNOWN, b""))
    return b"".join(out)


def encode(meta: dict) -> bytes:
    """A ps.PBMeta's wire bytes as protobuf's serializer writes them (the canonical encoding)."""
    return _encode(_META_WRITERS, meta)
