"""Generated NCCL ring all-reduces over the socket transport, with their ground truth (tests only).

Written from the protocol description (NCCL's ring all-reduce as nccl-tests and the NCCL docs describe it),
not from the decoder: each channel's share of the tensor is cut into k chunks; in 2(k-1) steps every rank
sends one chunk to the next rank on the ring (reduce-scatter: steps 0..k-2, all-gather: the rest), the
chunk rank r sends at step s being (r - s) mod k. A chunk travels as isends of at most `slice_bytes`
(NCCL's Simple protocol moves a chunk in slices of a step buffer). The ranks of a step send at the same time:
their isends alternate. Between operations the job computes: the capture clock jumps `idle_gap_us`.
Socket transport (tests/nccl_gen.py's NcclSender) or net-IB over RoCE (tests/roce_gen.py's NcclIbConnection:
per slice, the receiver's CTS write, then the data write with its immediate).
"""
from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.support.nccl_gen import ERA_INLINE, NcclSender, TcpCapture
from tests.support.roce_gen import NcclIbConnection, RoceCapture, RoceWire

FLOAT32_BYTES = 4


@dataclass
class GeneratedAllReduce:
    seq: int
    tensor_bytes: int
    ts_first_us: int
    ts_last_us: int
    isend_frames: list[int]      # index in the capture's frames where each isend began


@dataclass
class RingCapture:
    path: Path
    hosts: list[str]             # rank r's address is hosts[r]
    operations: list[GeneratedAllReduce]


def split(total: int, parts: int, unit: int = FLOAT32_BYTES) -> list[int]:
    """`total` bytes cut into `parts` pieces of whole `unit`s, the first ones one unit larger."""
    units, extra = divmod(total // unit, parts)
    return [(units + (i < extra)) * unit for i in range(parts)]


def ring_all_reduce(senders: list[list], tensor_bytes: int, slice_bytes: int,
                    isend: Callable[[object, int], None]) -> None:
    """One all-reduce: senders[channel][rank] is rank's connection to the next rank on that channel, on which
    `isend(sender, size)` sends one slice."""
    k = len(senders[0])
    chunks = [split(share, k) for share in split(tensor_bytes, len(senders))]
    for step in range(2 * (k - 1)):
        isends = []          # per (channel, rank): the slices it sends at this step
        for channel, ring in enumerate(senders):
            for rank, sender in enumerate(ring):
                chunk = chunks[channel][(rank - step) % k]
                isends.append((sender, [min(slice_bytes, chunk - offset) for offset in range(0, chunk, slice_bytes)]))
        while any(slices for _, slices in isends):
            for sender, slices in isends:
                if slices:
                    isend(sender, slices.pop(0))


def _all_reduces(cap: TcpCapture, senders: list[list], tensor_sizes: list[int], idle_gap_us: int, slice_bytes: int,
                 isend: Callable[[object, int], None]) -> list[GeneratedAllReduce]:
    operations = []
    for seq, tensor_bytes in enumerate(tensor_sizes):
        cap.now_us += idle_gap_us
        first_us, isend_frames = cap.now_us, []

        def recorded_isend(sender: object, size: int) -> None:
            isend_frames.append(len(cap.frames))
            isend(sender, size)

        ring_all_reduce(senders, tensor_bytes, slice_bytes, recorded_isend)
        operations.append(GeneratedAllReduce(seq, tensor_bytes, first_us, cap.now_us, isend_frames))
    return operations


def _hosts(world_size: int) -> list[str]:
    return [f"198.18.2.{rank + 1}" for rank in range(world_size)]


def ring_capture(path: Path, *, world_size: int, tensor_sizes: list[int], idle_gap_us: int, channels: int = 1,
                 nsocks: int = 0, era: str = ERA_INLINE, slice_bytes: int = 128 << 10, seed: int = 11,
                 drop: Callable[[list[GeneratedAllReduce]], set[int]] = lambda operations: set()) -> RingCapture:
    """Socket transport: ranks 0..world_size-1 on their own addresses, `channels` rings, one all-reduce per
    tensor size; `drop` picks frames the capture misses."""
    rng = random.Random(seed)
    cap = TcpCapture(seed=seed)
    hosts = _hosts(world_size)
    senders = [[NcclSender(cap, hosts[rank], hosts[(rank + 1) % world_size], 43000 + channel, nsocks, era,
                           42000 + 100 * channel) for rank in range(world_size)] for channel in range(channels)]
    operations = _all_reduces(cap, senders, tensor_sizes, idle_gap_us, slice_bytes,
                              lambda sender, size: sender.isend(rng.randbytes(size)))
    for ring in senders:
        for sender in ring:
            sender.close()
    cap.write(path, drop(operations))
    return RingCapture(path, hosts, operations)


def roce_ring_capture(path: Path, *, world_size: int, tensor_sizes: list[int], idle_gap_us: int,
                      step_bytes: int = 1 << 16, seed: int = 13) -> RingCapture:
    """net-IB over RoCEv2: one ring, each slice a CTS from the receiver then the sender's data write."""
    rng = random.Random(seed)
    cap = TcpCapture(seed=seed)
    wire = RoceWire(cap, RoceCapture(path), "ipv4")
    hosts = _hosts(world_size)
    ring = [NcclIbConnection(wire, hosts[rank], hosts[(rank + 1) % world_size], rank, 0x1000 + 2 * rank,
                             0x1001 + 2 * ((rank + 1) % world_size), "2.30", rng, step_bytes)
            for rank in range(world_size)]
    operations = _all_reduces(cap, [ring], tensor_sizes, idle_gap_us, step_bytes,
                              lambda connection, size: connection.transfer([size]))
    cap.write(path)
    return RingCapture(path, hosts, operations)
