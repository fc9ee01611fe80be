"""dmlc/ps-lite's wire schema (`src/meta.proto`, package `ps`, proto2) for google.protobuf: the independent reader
the tests hold decoders.protocols.pslite.pbmeta to.

The descriptor is assembled here from the field table below instead of compiling the upstream .proto: no protoc
and no generated code in the tree. Its table is written apart from pbmeta's on purpose (a wrong field number in
one is caught by the other, and both by the real sender's bytes in test_pslite.py). Field numbers and types are
those of dmlc/ps-lite at 34fd45c, the commit MXNet 1.9.1 pins (unchanged on dmlc/ps-lite master).
"""
from __future__ import annotations

import functools

# FieldDescriptorProto's Label and Type numbers (descriptor.proto)
_OPTIONAL, _REQUIRED, _REPEATED = 1, 2, 3
_INT32, _UINT64, _BOOL = 5, 4, 8
_STRING, _BYTES, _MESSAGE = 9, 12, 11

# message name -> (field name, number, label, type, message type name, default) in meta.proto order
_SCHEMA: dict[str, tuple[tuple, ...]] = {
    "PBNode": (
        ("role", 1, _REQUIRED, _INT32, None, None),
        ("id", 2, _OPTIONAL, _INT32, None, None),
        ("hostname", 3, _OPTIONAL, _STRING, None, None),
        ("port", 4, _OPTIONAL, _INT32, None, None),
        ("is_recovery", 5, _OPTIONAL, _BOOL, None, None),
        ("customer_id", 10, _OPTIONAL, _INT32, None, None),
    ),
    "PBControl": (
        ("cmd", 1, _REQUIRED, _INT32, None, None),
        ("node", 2, _REPEATED, _MESSAGE, ".ps.PBNode", None),
        ("barrier_group", 3, _OPTIONAL, _INT32, None, None),
        ("msg_sig", 4, _OPTIONAL, _UINT64, None, None),
    ),
    "PBMeta": (
        ("head", 1, _OPTIONAL, _INT32, None, None),
        ("body", 2, _OPTIONAL, _BYTES, None, None),
        ("control", 3, _OPTIONAL, _MESSAGE, ".ps.PBControl", None),
        ("request", 4, _OPTIONAL, _BOOL, None, "false"),
        ("app_id", 7, _OPTIONAL, _INT32, None, None),
        ("timestamp", 8, _OPTIONAL, _INT32, None, None),
        ("data_type", 9, _REPEATED, _INT32, None, None),      # [packed=true]
        ("customer_id", 10, _OPTIONAL, _INT32, None, None),
        ("push", 5, _OPTIONAL, _BOOL, None, None),
        ("pull", 12, _OPTIONAL, _BOOL, None, None),
        ("simple_app", 6, _OPTIONAL, _BOOL, None, "false"),
        ("data_size", 11, _OPTIONAL, _INT32, None, None),
        ("priority", 13, _OPTIONAL, _INT32, None, "0"),
    ),
}
_PACKED = {("PBMeta", "data_type")}


def _file_descriptor():
    from google.protobuf import descriptor_pb2

    proto = descriptor_pb2.FileDescriptorProto(name="ps/meta.proto", package="ps", syntax="proto2")
    proto.options.optimize_for = descriptor_pb2.FileOptions.LITE_RUNTIME
    for message_name, fields in _SCHEMA.items():
        message = proto.message_type.add(name=message_name)
        for name, number, label, type_, type_name, default in fields:
            field = message.field.add(name=name, number=number, label=label, type=type_)
            if type_name is not None:
                field.type_name = type_name
            if default is not None:
                field.default_value = default
            if (message_name, name) in _PACKED:
                field.options.packed = True
    return proto


@functools.cache
def message_classes() -> dict[str, type]:
    """The message classes by name (PBNode, PBControl, PBMeta), built once."""
    from google.protobuf import descriptor_pool, message_factory

    # A private pool: another `ps/meta.proto` loaded into the default pool by some other library cannot clash.
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file_descriptor())
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"ps.{name}")) for name in _SCHEMA}


def __getattr__(name: str) -> type:
    """`pbmeta_protobuf.PBMeta` and the others, built on first use (PEP 562)."""
    if name in _SCHEMA:
        return message_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
