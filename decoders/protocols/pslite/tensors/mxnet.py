"""MXNet 1.9.1's KVStore on top of dmlc/ps-lite: what a message's head and ps keys say about the tensor.

Facts from apache/mxnet 1.9.1: src/kvstore/kvstore_dist_server.h (CommandType, RequestType, GetCommandType /
DepairDataHandleType, DataHandle*), src/kvstore/kvstore_dist.h (EncodeDefaultKey, EncodeCompressedKey,
EncodeRowSparseKey), 3rdparty/mshadow/mshadow/base.h (TypeFlag).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.protocols.pslite.decoder import server_key_ranges
from dlcsniff.decoders.protocols.pslite.tensors.head import name_head

# RequestType, in enum order
REQUEST_TYPES = ("default", "row_sparse", "compressed")
# mshadow TypeFlag, in enum order
DTYPES = ("float32", "float64", "float16", "uint8", "int32", "int8", "int64", "bool", "int16", "uint16",
          "uint32", "uint64", "bfloat16")
# CommandType (SimpleApp head), in enum order ("maintain same order in frontend")
SIMPLE_APP_COMMANDS = ("controller", "set_multi_precision", "stop_server", "sync_mode",
                       "set_gradient_compression", "set_profiler_params")
_HOME_SERVER_FACTOR = 9973         # EncodeDefaultKey: server = (key * 9973) % num_servers


def decode_head(head: int) -> tuple[str, str]:
    """(request type, dtype) of an MXNet push or pull from its head (decoders.protocols.pslite.tensors.head). Raises
    DecodeError."""
    return name_head(head, REQUEST_TYPES, DTYPES, "MXNet 1.9.1's")


def simple_app_command(head: int) -> str:
    """Name of the SimpleApp command a worker sends the servers (head of a simple_app message)."""
    if not 0 <= head < len(SIMPLE_APP_COMMANDS):
        raise DecodeError(f"SimpleApp head {head} is not an MXNet 1.9.1 server command")
    return SIMPLE_APP_COMMANDS[head]


def home_server(tensor_key: int, num_servers: int) -> int | None:
    """The server a tensor below MXNET_KVSTORE_BIGARRAY_BOUND goes to whole: C++ `(key * 9973) % num_servers`
    in int arithmetic. None where that int product overflows negative (MXNet indexes out of range there)."""
    product = (tensor_key * _HOME_SERVER_FACTOR + 2**31) % 2**32 - 2**31
    return product % num_servers if product >= 0 else None


@dataclass(frozen=True, slots=True)
class MxnetAttribution:
    tensor_key: int                  # the key the program passed to kv.init/push/pull
    part: int | None                 # big-array slice (= server rank) when the array is known to be split
                                     # across servers; None when it is, or may be, the whole array
    rows: int | None                 # row_sparse: number of rows carried (or asked for)
    row_ids: np.ndarray | None       # row_sparse: int64 row ids, counted from this server's first row
                                     # when the array is split
    uncompressed_elems: int | None   # compressed push: elements of the slice before compression


def attribute(keys, lens, server_rank: int, num_servers: int, req_type: str) -> MxnetAttribution:
    """Tensor behind the ps keys of one KV message to or from server `server_rank` of `num_servers`.

    keys: the message's u64 ps keys (sequence or array); lens: its lens (or None); req_type: from
    decode_head. Raises DecodeError when the keys do not fit that server or request type."""
    if not 0 <= server_rank < num_servers:
        raise DecodeError(f"server rank {server_rank} is not among {num_servers} servers")
    ps_keys = np.asarray(keys, dtype=np.uint64)
    if ps_keys.ndim != 1 or ps_keys.size == 0:
        raise DecodeError("a KV message without keys")
    begin, end = server_key_ranges(num_servers)[server_rank]
    if ps_keys.min() < begin or ps_keys.max() >= end:
        raise DecodeError(f"ps keys outside server {server_rank}'s range [{begin}, {end}) of {num_servers}")
    offsets = ps_keys - np.uint64(begin)
    if req_type == "default":
        if offsets.size != 1:     # DataHandleDefault: CHECK_EQ(keys.size(), 1)
            raise DecodeError(f"{offsets.size} keys in a default push/pull (MXNet sends one)")
        return _attribution(int(offsets[0]), server_rank, num_servers)
    if req_type == "row_sparse":
        # EncodeRowSparseKey: [begin + key (the master, len 0), begin + key + row, ...]
        if lens is not None and len(lens) > 0 and lens[0] != 0:
            raise DecodeError(f"row_sparse master key with len {lens[0]} (MXNet sends 0)")
        master = offsets[0]
        if (offsets[1:] < master).any():
            raise DecodeError("row_sparse row keys below their master key")
        return _attribution(int(master), server_rank, num_servers,
                            row_ids=(offsets[1:] - master).astype(np.int64))
    if req_type == "compressed":
        # EncodeCompressedKey: a push carries [begin + original elements (len 0), begin + key];
        # a pull carries [begin + key]
        if offsets.size == 2:
            return _attribution(int(offsets[1]), server_rank, num_servers, uncompressed_elems=int(offsets[0]))
        if offsets.size == 1:
            return _attribution(int(offsets[0]), server_rank, num_servers)
        raise DecodeError(f"{offsets.size} keys in a compressed push/pull (MXNet sends 1 or 2)")
    raise DecodeError(f"unknown MXNet request type {req_type!r}")


def _attribution(tensor_key: int, server_rank: int, num_servers: int, *, row_ids: np.ndarray | None = None,
                 uncompressed_elems: int | None = None) -> MxnetAttribution:
    home = home_server(tensor_key, num_servers)
    split = home is not None and home != server_rank
    if row_ids is not None:
        row_ids.flags.writeable = False
    return MxnetAttribution(tensor_key=tensor_key, part=server_rank if split else None,
                            rows=None if row_ids is None else int(row_ids.size), row_ids=row_ids,
                            uncompressed_elems=uncompressed_elems)
