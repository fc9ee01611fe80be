"""ZMTP's columns in the decode tables: what a direction's greeting says. decoders.schema places each block after its
anchor column."""
from __future__ import annotations

from dlcsniff.decoders.arrow_types import BOOL, I64, LIST_I64, STR

# table -> (anchor column, rows: name, type, description[, unit]) in the order they are written
COLUMNS: dict[str, tuple[tuple[str, list[tuple]], ...]] = {
    "streams": (
        ("protocol", [
            ("zmtp_version", STR, "ZMTP version from the greeting, e.g. \"3.1\""),
            ("mechanism", STR, "ZMTP security mechanism: NULL, PLAIN, CURVE or GSSAPI"),
            ("socket_type", STR, "ZMTP Socket-Type property of the sender (e.g. DEALER)"),
            ("identity", STR, "ZMTP Identity property of the sender (ps-lite: the node's id)"),
            ("encrypted", BOOL, "the ZMTP mechanism encrypts (CURVE, GSSAPI): messages counted and sized only"),
        ]),
    ),
}

# ZMTP's own table: every message and command as its framing counts it, written after the `streams` table:
# (name, command, description, rows)
TABLES: tuple[tuple[str, tuple], ...] = (
    ("streams", ("zmtp", "decode", "ZMTP message or command", [
        ("flow_id", I64, "the stream (streams.flow_id)"),
        ("capture", STR, "the capture it was seen in"),
        ("ts_first_ns", I64, "capture time of the packet carrying its first byte"),
        ("ts_last_ns", I64, "capture time of the packet carrying its last byte"),
        ("command", STR, "the command's name (READY, SUBSCRIBE, PING, ...); null for a message"),
        ("frame_sizes", LIST_I64, "bytes of each frame", "bytes"),
        ("size_bytes", I64, "bytes of all its frames"),
        ("complete", BOOL, "every byte was captured"),
    ])),
)
