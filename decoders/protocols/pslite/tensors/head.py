"""A KV message's head as MXNet's KVStore and BytePS both set it: one int pairing the request type with the
values' dtype (Cantor's pairing), head = (t + d)(t + d + 1)/2 + d.

MXNet 1.9.1 src/kvstore/kvstore_dist_server.h GetCommandType / DepairDataHandleType; BytePS
byteps/common/common.cc GetCommandType, byteps/server/server.h DepairDataHandleType. Which request types
and dtypes the numbers stand for is each framework's (tensors.mxnet, tensors.byteps).
"""
from __future__ import annotations

import math

from dlcsniff.decoders.errors import DecodeError


def unpair(head: int) -> tuple[int, int]:
    """(request type, dtype) numbers of a head. Raises DecodeError on a negative head (no pair gives one)."""
    if head < 0:
        raise DecodeError(f"head {head} is negative: not a (request type, dtype) pair")
    diagonal = (math.isqrt(8 * head + 1) - 1) // 2
    dtype = head - diagonal * (diagonal + 1) // 2
    return diagonal - dtype, dtype


def name_head(head: int, request_types: tuple[str, ...], dtypes: tuple[str, ...], whose: str) -> tuple[str, str]:
    """(request type, dtype) names of a head, from a framework's enums in order. Raises DecodeError for a head
    that pairs numbers the enums do not have."""
    req_type, dtype = unpair(head)
    if req_type >= len(request_types) or dtype >= len(dtypes):
        raise DecodeError(f"head {head} pairs request type {req_type} with dtype {dtype}: not {whose}")
    return request_types[req_type], dtypes[dtype]
