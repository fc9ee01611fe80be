"""Gloo's columns in the decode tables: the pair connection, the preamble's fields, the process group. decoders.schema
places each block after its anchor column."""
from __future__ import annotations

from dlcsniff.decoders.arrow_types import I32, I64, STR

# table -> (anchor column, rows: name, type, description[, unit]) in the order they are written
COLUMNS: dict[str, tuple[tuple[str, list[tuple]], ...]] = {
    "streams": (
        ("comm", [
            ("gloo_role", STR, "Gloo pair connection: initiator (connected and sent the sequence number), listener, "
                               "unknown"),
            ("pair_sequence", I64, "Gloo: the pair's sequence number written by the connecting side"),
            ("rank", I32, "Gloo: rank of the sending side"),
            ("peer_rank", I32, "Gloo: rank of the receiving side"),
        ]),
    ),
    "messages": (
        ("send_queue_delay_ns", [
            ("opcode", STR, "Gloo: SEND_BUFFER, SEND_UNBOUND_BUFFER, NOTIFY_SEND_READY, NOTIFY_RECV_READY"),
            ("slot", I64, "Gloo: the preamble's slot (collective prefix, tag, delta)"),
        ]),
        ("tag", [
            ("slot_delta", I32, "Gloo: the slot's delta (the step within the collective)"),
            ("offset_bytes", I64, "Gloo: the preamble's offset into the registered buffer"),
            ("length_bytes", I64, "Gloo: the preamble's length (payload, or bytes announced)"),
            ("roffset_bytes", I64, "Gloo: the preamble's offset into the remote buffer"),
        ]),
        ("payload_bytes", [
            ("missing_bytes", I64, "Gloo: payload bytes the capture lost"),
        ]),
        ("peer_rank", [
            ("peer_address", STR, "Gloo: address:port at the other end"),
        ]),
        ("world_size", [
            ("pg", STR, "Gloo: the process group's store prefix"),
        ]),
    ),
}
