"""The MLCommons Chakra execution-trace schema (proto3, package ChakraProtoMsg), built at import time.

Written from Chakra's published field numbers (`schema/protobuf/et_def.proto`, checked against the
`mlc-chakra` 1.0.0 release): a FileDescriptorProto assembled here, added to a private descriptor pool, and
turned into message classes by protobuf's message_factory — no protoc, no generated code, and no clash with
another copy of the schema (Chakra's own et_def_pb2) in the default pool.

An .et file is a sequence of messages, each preceded by its length as a varint: one GlobalMetadata, then
one Node per operation (`delimited`).
"""
from __future__ import annotations

import enum

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PACKAGE = "ChakraProtoMsg"
_Field = descriptor_pb2.FieldDescriptorProto

NODE_TYPES = (("INVALID_NODE", 0), ("METADATA_NODE", 1), ("MEM_LOAD_NODE", 2), ("MEM_STORE_NODE", 3),
              ("COMP_NODE", 4), ("COMM_SEND_NODE", 5), ("COMM_RECV_NODE", 6), ("COMM_COLL_NODE", 7))
COLLECTIVE_COMM_TYPES = (("ALL_REDUCE", 0), ("REDUCE", 1), ("ALL_GATHER", 2), ("GATHER", 3), ("SCATTER", 4),
                         ("BROADCAST", 5), ("ALL_TO_ALL", 6), ("REDUCE_SCATTER", 7), ("REDUCE_SCATTER_BLOCK", 8),
                         ("BARRIER", 9))
# AttributeProto's oneof `value`: the k-th scalar type is `<type>_val = 3 + 2k`, and its list
# `<type>_list = 4 + 2k`, a message `<Type>List { repeated <type> values = 1; }`.
ATTRIBUTE_SCALARS = (
    ("double", _Field.TYPE_DOUBLE), ("float", _Field.TYPE_FLOAT), ("int32", _Field.TYPE_INT32),
    ("int64", _Field.TYPE_INT64), ("uint32", _Field.TYPE_UINT32), ("uint64", _Field.TYPE_UINT64),
    ("sint32", _Field.TYPE_SINT32), ("sint64", _Field.TYPE_SINT64), ("fixed32", _Field.TYPE_FIXED32),
    ("fixed64", _Field.TYPE_FIXED64), ("sfixed32", _Field.TYPE_SFIXED32), ("sfixed64", _Field.TYPE_SFIXED64),
    ("bool", _Field.TYPE_BOOL), ("string", _Field.TYPE_STRING), ("bytes", _Field.TYPE_BYTES),
)

NodeType = enum.IntEnum("NodeType", NODE_TYPES)
CollectiveCommType = enum.IntEnum("CollectiveCommType", COLLECTIVE_COMM_TYPES)


def _add_field(message: descriptor_pb2.DescriptorProto, name: str, number: int, field_type: int, *,
               repeated: bool = False, type_name: str | None = None, oneof: int | None = None) -> None:
    found = message.field.add(name=name, number=number, type=field_type,
                              label=_Field.LABEL_REPEATED if repeated else _Field.LABEL_OPTIONAL)
    if type_name is not None:
        found.type_name = f".{PACKAGE}.{type_name}"
    if oneof is not None:
        found.oneof_index = oneof


def _schema() -> descriptor_pb2.FileDescriptorProto:
    schema = descriptor_pb2.FileDescriptorProto(name="dlcsniff/chakra_et_def.proto", package=PACKAGE,
                                                syntax="proto3")
    for name, values in (("NodeType", NODE_TYPES), ("CollectiveCommType", COLLECTIVE_COMM_TYPES)):
        found = schema.enum_type.add(name=name)
        for value_name, number in values:
            found.value.add(name=value_name, number=number)

    attribute = schema.message_type.add(name="AttributeProto")
    _add_field(attribute, "name", 1, _Field.TYPE_STRING)
    _add_field(attribute, "doc_string", 2, _Field.TYPE_STRING)
    attribute.oneof_decl.add(name="value")
    for k, (scalar, field_type) in enumerate(ATTRIBUTE_SCALARS):
        list_name = f"{scalar.capitalize()}List"
        _add_field(schema.message_type.add(name=list_name), "values", 1, field_type, repeated=True)
        _add_field(attribute, f"{scalar}_val", 3 + 2 * k, field_type, oneof=0)
        _add_field(attribute, f"{scalar}_list", 4 + 2 * k, _Field.TYPE_MESSAGE, type_name=list_name, oneof=0)

    metadata = schema.message_type.add(name="GlobalMetadata")
    _add_field(metadata, "version", 1, _Field.TYPE_STRING)
    _add_field(metadata, "attr", 2, _Field.TYPE_MESSAGE, repeated=True, type_name="AttributeProto")

    io_info = schema.message_type.add(name="IOInfo")
    for number, name in enumerate(("values", "shapes", "types"), start=1):
        _add_field(io_info, name, number, _Field.TYPE_STRING)

    node = schema.message_type.add(name="Node")
    _add_field(node, "id", 1, _Field.TYPE_UINT64)
    _add_field(node, "name", 2, _Field.TYPE_STRING)
    _add_field(node, "type", 3, _Field.TYPE_ENUM, type_name="NodeType")
    _add_field(node, "ctrl_deps", 4, _Field.TYPE_UINT64, repeated=True)
    _add_field(node, "data_deps", 5, _Field.TYPE_UINT64, repeated=True)
    _add_field(node, "start_time_micros", 6, _Field.TYPE_UINT64)
    _add_field(node, "duration_micros", 7, _Field.TYPE_UINT64)
    _add_field(node, "inputs", 8, _Field.TYPE_MESSAGE, type_name="IOInfo")
    _add_field(node, "outputs", 9, _Field.TYPE_MESSAGE, type_name="IOInfo")
    _add_field(node, "attr", 10, _Field.TYPE_MESSAGE, repeated=True, type_name="AttributeProto")
    return schema


_pool = descriptor_pool.DescriptorPool()
_pool.Add(_schema())


def _message_class(name: str) -> type:
    return message_factory.GetMessageClass(_pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))


AttributeProto = _message_class("AttributeProto")
GlobalMetadata = _message_class("GlobalMetadata")
IOInfo = _message_class("IOInfo")
Node = _message_class("Node")


def varint(value: int) -> bytes:
    """Protobuf base-128 varint of a non-negative integer (the length prefix of each .et message)."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def delimited(message) -> bytes:
    """A message as it is stored in an .et file: its length as a varint, then its bytes."""
    body = message.SerializeToString()
    return varint(len(body)) + body
