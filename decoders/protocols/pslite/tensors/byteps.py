"""BytePS on top of bytedance/ps-lite: which tensor partition a ps key names, what a push or pull's head says.

bytedance/byteps byteps/common/operations.cc gives the i-th declared tensor the keys (i << 16) + part, one per
partition of at most BYTEPS_PARTITION_BYTES; global.cc EncodeDefaultKey sends each to one server (a hash of
the key, djb2 by default) as ps key = that server's range begin + key. A push or pull's head is
GetCommandType(request type, dtype) (common.cc; decoders.protocols.pslite.tensors.head), which the server takes apart
(server.h DepairDataHandleType): request types of server.h RequestType, dtypes of common.h DataType. Checked
on the BytePS 0.2.5.post15 sdist's own server (pcaps/byteps_server_*). Other programs on bytedance/ps-lite
choose their own heads: these are read as BytePS's.
"""
from __future__ import annotations

from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.protocols.pslite.decoder import server_key_ranges
from dlcsniff.decoders.protocols.pslite.tensors.head import name_head

PARTITION_BITS = 16
PARTITION_MASK = (1 << PARTITION_BITS) - 1
# byteps/server/server.h RequestType and byteps/common/common.h DataType, in enum order
REQUEST_TYPES = ("default", "row_sparse", "compressed")
DTYPES = ("float32", "float64", "float16", "uint8", "int32", "int8", "int64")


def attribute(ps_key: int, server_rank: int, num_servers: int) -> tuple[int, int]:
    """(declared tensor index, partition index) of a BytePS ps key sent to or from server `server_rank`.
    Raises DecodeError when the key is not in that server's range."""
    if not 0 <= server_rank < num_servers:
        raise DecodeError(f"server rank {server_rank} is not among {num_servers} servers")
    begin, end = server_key_ranges(num_servers)[server_rank]
    if not begin <= ps_key < end:
        raise DecodeError(f"ps key {ps_key} outside server {server_rank}'s range [{begin}, {end}) of {num_servers}")
    key = ps_key - begin
    return key >> PARTITION_BITS, key & PARTITION_MASK


def decode_head(head: int) -> tuple[str, str]:
    """(request type, dtype) of a BytePS push or pull from its head. Raises DecodeError for a head that pairs
    no BytePS request type with a BytePS dtype."""
    return name_head(head, REQUEST_TYPES, DTYPES, "BytePS's")
