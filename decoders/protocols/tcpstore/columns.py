"""TCPStore's columns in the decode tables: the query and torchelastic's rendezvous. decoders.schema places each block
after its anchor column."""
from __future__ import annotations

from dlcsniff.decoders.arrow_types import I32, I64, STR

# table -> (anchor column, rows: name, type, description[, unit]) in the order they are written
COLUMNS: dict[str, tuple[tuple[str, list[tuple]], ...]] = {
    "messages": (
        ("pg", [
            ("store_query", STR, "TCPStore: the query (SET, GET, ADD, WAIT, ...)"),
            ("store_key", STR, "TCPStore: its first key"),
            ("store_keys", I32, "TCPStore: keys in the query"),
            ("value_bytes", I64, "TCPStore: bytes of the values set or returned"),
            ("response_bytes", I64, "TCPStore: bytes of the response"),
            ("store_number", I64, "TCPStore: the number a query carries or returns (ADD amount or result, ...)"),
            ("local_world_size", I32, "torchelastic's rendezvous in the store: processes on the node "
                                      "(role_info/<node>; src_rank is then the node's base rank, world_size from "
                                      "assigned_ranks/<node>)"),
        ]),
    ),
}
