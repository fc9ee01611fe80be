"""One rank of a real torch.distributed Gloo job that runs every operation of a plan (run by the workload venv).

    gloo_matrix_job.py --rank R --world-size K --master-addr IP --master-port P --plan PLAN.json --record PATH

The plan (lab/gloo_matrix.py, written by the recorder lab/record.py: the same file for every rank) is a list of
cells, run in order: `{"op": ..., "nominal_bytes": ..., "dtype": ..., "root": ..., "tag": ...}`. `op` is the
PyTorch API the cell calls (`Cell.run`, `run_p2p`); `nominal_bytes` the operation's size as nccl-tests count it
(all_reduce, broadcast, reduce: the tensor; all_gather, gather: the whole output; reduce_scatter, scatter: the
whole input; all_to_all: one rank's input; send/recv: the message). Sizes are cut to whole elements, and ops
that split a tensor into one chunk per rank to whole chunks, so the bytes actually moved are recorded beside the
nominal size.

Each rank writes its own record (JSON) of every cell it ran, with wall-clock ns taken just before the call
and just after it returned (every call is synchronous):
- op, dtype, element_bytes, numel (of the main tensor), tensor_bytes (nccl-tests convention, as run),
  input_bytes / output_bytes (what this rank handed in and got back), root / peer / tag where the op has one;
- pg_sequence: PyTorch's own per-group counter after the call (`_get_sequence_number_for_group`: it counts
  send/recv too);
- gloo_works: the Gloo work items PyTorch ran for the call, as its profiler saw them ("gloo:<name>" events,
  with their input shapes), and gloo_tags: the tags of the collective ones. PyTorch tags every collective
  Gloo work with its group's collective counter (send/recv use the caller's tag; monitored_barrier takes two
  counter values for its send/recv tags without a work of its own), so tags are counted from the works the
  profiler saw, plus two for each monitored_barrier.
Tensors are filled with one value per rank, so the captures gzip well. The recorder reads `finished` to know
when a straggler may be killed.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
# the bundled Gloo job's workload, beside this file (a script's folder is on its path)
from gloo_job import finish_rank, profiled, rank_parser, start_rank

P2P_WORKS = ("send", "recv", "recvAnySource")
TIMEOUT = timedelta(seconds=300)
DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32, "int8": torch.int8,
          "uint8": torch.uint8, "bool": torch.bool}
# Ops whose main tensor is cut into one chunk per rank (nominal_bytes = world_size chunks).
CHUNKED_OPS = frozenset({"all_gather", "all_gather_into_tensor", "all_gather_coalesced", "reduce_scatter",
                         "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "all_to_all_single_uneven",
                         "gather", "scatter"})
# monitored_barrier draws two values of the collective counter for the tags of its send/recv.
MONITORED_BARRIER_TAGS = 2


def uneven_split(sender: int, receiver: int, unit: int) -> int:
    """Elements rank `sender` sends to `receiver` in the uneven all_to_all_single: 1..3 units."""
    return unit * (1 + (sender + 2 * receiver) % 3)


class Cell:
    """One planned operation as this rank runs it."""

    def __init__(self, spec: dict, rank: int, world: int):
        self.op = spec["op"]
        self.dtype_name = spec["dtype"]
        self.dtype = DTYPES[self.dtype_name]
        self.element_bytes = torch.empty((), dtype=self.dtype).element_size()
        self.nominal_bytes = spec["nominal_bytes"]
        self.root = spec.get("root")
        self.tag = spec.get("tag", 0)
        self.rank, self.world = rank, world
        per = world if self.op in CHUNKED_OPS else 1
        if self.op == "all_to_all_single_uneven":
            per = 2 * world            # splits of 1..3 units: about 2 units per peer on average
        self.chunk_numel = max(1, self.nominal_bytes // (self.element_bytes * per))

    def tensor(self, numel: int) -> torch.Tensor:
        value = (self.rank + 1) % 2 if self.dtype is torch.bool else self.rank + 1
        return torch.full((numel,), value, dtype=self.dtype)

    def empty(self, numel: int) -> torch.Tensor:
        return torch.empty(numel, dtype=self.dtype)

    def run(self) -> dict:
        """Run the cell; return its sizes (bytes) and peers."""
        op, n, k, rank, root = self.op, self.chunk_numel, self.world, self.rank, self.root
        b = self.element_bytes
        if op == "all_reduce":
            dist.all_reduce(self.tensor(n))
            return sizes(n * b, n * b, n * b, numel=n)
        if op == "all_reduce_coalesced":
            first = n // 2
            dist.all_reduce_coalesced([self.tensor(first), self.tensor(n - first)])
            return sizes(n * b, n * b, n * b, numel=n)
        if op == "reduce":
            dist.reduce(self.tensor(n), dst=root)
            return sizes(n * b, n * b, n * b if rank == root else 0, numel=n, root=root)
        if op == "broadcast":
            dist.broadcast(self.tensor(n), src=root)
            return sizes(n * b, n * b, n * b, numel=n, root=root)
        if op == "all_gather":
            dist.all_gather([self.empty(n) for _ in range(k)], self.tensor(n))
            return sizes(k * n * b, n * b, k * n * b, numel=n)
        if op == "all_gather_into_tensor":
            dist.all_gather_into_tensor(self.empty(k * n), self.tensor(n))
            return sizes(k * n * b, n * b, k * n * b, numel=n)
        if op == "all_gather_coalesced":
            first = max(1, n // 2)
            inputs = [self.tensor(first), self.tensor(n - first)] if n > 1 else [self.tensor(1)]
            outputs = [[self.empty(t.numel()) for t in inputs] for _ in range(k)]
            dist.all_gather_coalesced(outputs, inputs)
            return sizes(k * n * b, n * b, k * n * b, numel=n)
        if op == "reduce_scatter":
            dist.reduce_scatter(self.empty(n), [self.tensor(n) for _ in range(k)])
            return sizes(k * n * b, k * n * b, n * b, numel=n)
        if op == "reduce_scatter_tensor":
            dist.reduce_scatter_tensor(self.empty(n), self.tensor(k * n))
            return sizes(k * n * b, k * n * b, n * b, numel=n)
        if op == "all_to_all":
            dist.all_to_all([self.empty(n) for _ in range(k)], [self.tensor(n) for _ in range(k)])
            return sizes(k * n * b, k * n * b, k * n * b, numel=n)
        if op == "all_to_all_single":
            dist.all_to_all_single(self.empty(k * n), self.tensor(k * n))
            return sizes(k * n * b, k * n * b, k * n * b, numel=n)
        if op == "all_to_all_single_uneven":
            send = [uneven_split(rank, peer, n) for peer in range(k)]
            recv = [uneven_split(peer, rank, n) for peer in range(k)]
            dist.all_to_all_single(self.empty(sum(recv)), self.tensor(sum(send)), recv, send)
            return sizes(sum(send) * b, sum(send) * b, sum(recv) * b, numel=n,
                         sent_to_peers_bytes=(sum(send) - send[rank]) * b,
                         received_from_peers_bytes=(sum(recv) - recv[rank]) * b)
        if op == "gather":
            outputs = [self.empty(n) for _ in range(k)] if rank == root else None
            dist.gather(self.tensor(n), outputs, dst=root)
            return sizes(k * n * b, n * b, k * n * b if rank == root else 0, numel=n, root=root)
        if op == "scatter":
            inputs = [self.tensor(n) for _ in range(k)] if rank == root else None
            dist.scatter(self.empty(n), inputs, src=root)
            return sizes(k * n * b, k * n * b if rank == root else 0, n * b, numel=n, root=root)
        if op == "barrier":
            dist.barrier()
            return sizes(0, 0, 0, numel=0)
        if op == "monitored_barrier":
            dist.monitored_barrier(timeout=TIMEOUT)
            return sizes(0, 0, 0, numel=0)
        raise ValueError(f"unknown op {op}")


def sizes(tensor_bytes: int, input_bytes: int, output_bytes: int, **extra) -> dict:
    return {"tensor_bytes": tensor_bytes, "input_bytes": input_bytes, "output_bytes": output_bytes, **extra}


def p2p_steps(cell: Cell) -> list[tuple[str, int | None]]:
    """send_recv: rank r sends to r+1 and receives from r-1 (even ranks send first); recv_any: the same but
    received from any source; batch_p2p: both at once through batch_isend_irecv."""
    rank, k = cell.rank, cell.world
    steps = [("send", (rank + 1) % k), ("recv", (rank - 1) % k)]
    return steps if rank % 2 == 0 else steps[::-1]


def run_p2p(cell: Cell, direction: str, peer: int) -> dict:
    n, b = cell.chunk_numel, cell.element_bytes
    if cell.op == "batch_p2p":
        ops = [dist.P2POp(dist.isend, cell.tensor(n), (cell.rank + 1) % cell.world, tag=cell.tag),
               dist.P2POp(dist.irecv, cell.empty(n), (cell.rank - 1) % cell.world, tag=cell.tag)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return sizes(n * b, n * b, n * b, numel=n, peers=[(cell.rank + 1) % cell.world, (cell.rank - 1) % cell.world],
                     tag=cell.tag)
    if direction == "send":
        dist.send(cell.tensor(n), dst=peer, tag=cell.tag)
        return sizes(n * b, n * b, 0, numel=n, peer=peer, tag=cell.tag)
    source = None if cell.op == "recv_any" else peer
    dist.recv(cell.empty(n), src=source, tag=cell.tag)
    return sizes(n * b, 0, n * b, numel=n, peer=peer, tag=cell.tag)


def planned_calls(plan: list[dict], rank: int, world: int) -> list[tuple[int, Cell, str, object]]:
    """(cell index, cell, what the rank calls, the call) in program order."""
    calls = []
    for index, spec in enumerate(plan):
        cell = Cell(spec, rank, world)
        if cell.op in ("send_recv", "recv_any"):
            for direction, peer in p2p_steps(cell):
                calls.append((index, cell, direction, lambda c=cell, d=direction, p=peer: run_p2p(c, d, p)))
        elif cell.op == "batch_p2p":
            calls.append((index, cell, "batch_p2p", lambda c=cell: run_p2p(c, "batch", None)))
        else:
            calls.append((index, cell, cell.op, cell.run))
    return calls


def main() -> None:
    parser = rank_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--plan", type=Path, required=True)
    args = parser.parse_args()
    rank, world = args.rank, args.world_size
    plan = json.loads(args.plan.read_text())
    record = start_rank(args, TIMEOUT)
    next_tag = 0
    for index, cell, called, call in planned_calls(plan, rank, world):
        result, works, start_ns, end_ns = profiled(call)
        collective_works = [work for work in works if work["name"] not in P2P_WORKS]
        tags = list(range(next_tag, next_tag + len(collective_works)))
        if cell.op == "monitored_barrier":
            tags = list(range(next_tag, next_tag + MONITORED_BARRIER_TAGS))
        next_tag += len(tags)
        record["operations"].append({
            "cell": index, "op": cell.op, "called": called, "dtype": cell.dtype_name,
            "element_bytes": cell.element_bytes, "nominal_bytes": cell.nominal_bytes, **result,
            "start_ns": start_ns, "end_ns": end_ns, "gloo_works": works, "gloo_tags": tags,
            "pg_sequence": dist.group.WORLD._get_sequence_number_for_group()})
    finish_rank(args, record)


if __name__ == "__main__":
    main()
