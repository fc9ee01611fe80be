"""ps-lite's columns in the decode tables: node ids, the meta's fields, the tensor a message's keys name.
decoders.schema places each block after its anchor column."""
from __future__ import annotations

from dlcsniff.decoders.arrow_types import BOOL, I32, I64, LIST_I64, LIST_U64, STR

# table -> (anchor column, rows: name, type, description[, unit]) in the order they are written
COLUMNS: dict[str, tuple[tuple[str, list[tuple]], ...]] = {
    "streams": (
        ("resyncs", [
            ("undecoded_messages", I64, "ps-lite streams: ZMTP messages whose ps-lite header was not captured "
                                        "whole, so not decoded; zmtp streams: ZMTP messages not captured whole"),
        ]),
        ("decode_error", [
            ("node_id", I32, "ps-lite node id of the sending endpoint, when known"),
        ]),
    ),
    "messages": (
        ("ts_last_ns", [
            ("sender_id", I32, "ps-lite: sender's node id"),
            ("recver_id", I32, "ps-lite: receiver's node id"),
            ("sender_role", STR, "ps-lite: scheduler, server or worker"),
            ("recver_role", STR, "ps-lite: scheduler, server or worker"),
            ("request", BOOL, "ps-lite: a request (false: a response)"),
            ("push", BOOL, "ps-lite: a push"),
            ("pull", BOOL, "ps-lite: a pull"),
            ("simple_app", BOOL, "ps-lite: a SimpleApp command"),
            ("ps_timestamp", I32, "ps-lite: the message's timestamp, a per-customer request counter (not a time)"),
            ("head", I32, "ps-lite: the meta's head (MXNet: request type and dtype; SimpleApp: the command)"),
            ("app_id", I32, "ps-lite: application id"),
            ("customer_id", I32, "ps-lite: customer id"),
            ("control_cmd", I32, "ps-lite: control command number (null for a data or SimpleApp message)"),
            ("data_sizes", LIST_I64, "ps-lite: bytes of each data frame", "bytes"),
        ]),
        ("size_bytes", [
            ("keys", LIST_U64, "ps-lite: the ps keys it carries"),
            ("tensor_key", I64, "ps-lite: the tensor (MXNet key / BytePS tensor) the keys belong to"),
            ("server_rank", I32, "ps-lite: rank of the server holding the keys"),
            ("iteration", I32, "ps-lite data messages between a worker and a server: the training iteration, from 0, "
                               "as `stats` counts it; -1: initialisation (kv.init, the initial pulls); null: "
                               "commands, control, a response of an unknown tensor whose request no capture saw, and "
                               "the collective libraries (their messages name their collective and `seq` instead; "
                               "decoders/protocols/pslite/job.py)"),
            ("req_type", STR, "MXNet: request type (default, row_sparse, ...)"),
            ("dtype", STR, "MXNet: data type of the values"),
        ]),
        ("complete", [
            ("meta_bytes", I64, "ps-lite: size of the meta frame"),
            ("lens", LIST_I64, "ps-lite: the lens array (values per key; row-sparse and multi-key messages)"),
            ("part", I32, "MXNet: part of a big array split over servers; BytePS: the tensor's partition"),
            ("rows", I32, "MXNet row-sparse: rows carried"),
            ("simple_app_cmd", STR, "MXNet: SimpleApp command name"),
            ("barrier_group", I32, "ps-lite control: barrier group"),
            ("flavor", STR, "ps-lite: dmlc (MXNet) or byteps"),
        ]),
    ),
}

# ps-lite's own table: the nodes the scheduler announced, written after the `messages` table:
# (name, command, description, rows)
TABLES: tuple[tuple[str, tuple], ...] = (
    ("messages", ("nodes", "decode", "ps-lite node the scheduler announced", [
        ("node_id", I32, "ps-lite node id"),
        ("role", STR, "scheduler, server or worker"),
        ("rank", I32, "the node's rank among its role"),
        ("hostname", STR, "its address, as announced"),
        ("port", I32, "its port, as announced"),
    ])),
)
