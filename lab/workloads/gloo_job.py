"""One rank of a real torch.distributed job on the Gloo backend (run by the workload venv, not the tool's).

    gloo_job.py --rank R --world-size K --master-addr IP --master-port P --record PATH

Rank 0 hosts the TCPStore the ranks rendezvous through (init_method tcp://IP:P). The ranks then run the
same list of operations (OPERATIONS, in order): all_reduce small / medium / > 10 MB, all_to_all (the
single-tensor and the list form), broadcast, all_gather (list and single-tensor), reduce_scatter, reduce,
gather, scatter, barrier, and send/recv pairs between neighbours. Tensors are filled with one value per
rank, so the bundled captures gzip well.

Each rank writes its own record (JSON) of every operation, with wall-clock ns taken just before the call
and just after it returned (every call is synchronous):
- kind: the operation as the program called it (all_reduce, all_to_all, broadcast, ..., send, recv);
- order: index of the operation in this rank's program;
- tensor_bytes: the operation's size as nccl-tests count it (all_reduce, broadcast, reduce: the tensor;
  all_gather, gather: the whole output; reduce_scatter, scatter: the whole input; all_to_all: one rank's
  input; send/recv: the message); input_bytes / output_bytes: what this rank handed in and got back;
- root / peer / tag where the operation has one; pg_sequence: torch's own per-group counter after the call;
- gloo_works: the Gloo work items PyTorch ran for the call, as its profiler saw them ("gloo:<name>" events
  with their input shapes), and gloo_tags: their tags. PyTorch tags every Gloo collective work with its
  process group's collective counter (send/recv works use the caller's tag instead); one call may run
  several works (2.13 runs reduce_scatter as one all_reduce per rank), so the tags are counted here from
  the works the profiler saw, not from the calls.
With --train-steps N the ranks run a data-parallel training loop instead of the list: per step, computation
(--compute-matmuls products of 256×256 float32 matrices, on one thread), then one all_reduce of a
--grad-elements float32 gradient; `steps` lists each step's start, the all_reduce's call and its return, and
`seq`, the all_reduce's sequence number in the process group (the Gloo tag its messages carry).
A fault can be injected into the training loop: --stall-step N --stall-s S makes the rank sleep S seconds
before step N's all_reduce (the rank is late: a straggler; or, with S beyond the others' --timeout-s, a rank
that stops taking part while the others wait until their timeout: a hang); with --stall-by sigstop the rank's
whole process (Gloo's transport threads too: nothing reads its sockets, its kernel buffers what arrives) is
stopped by SIGSTOP instead and continued by SIGCONT S seconds later, as an operator's `kill -STOP` or a frozen
container does. `fault` records it (step, seq, seconds, how, wall-clock start and end). A collective that fails
(the others' timeout, a peer gone) is recorded as `error` (step, seq, when, the message) and the rank exits with
status 1, as a job's rank does.
The recorder (lab/record.py) reads `finished` to know when a straggler may be killed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

FLOAT32_BYTES = 4
GLOO_WORK_PREFIX = "gloo:"        # PyTorch's profiler names each Gloo work item "gloo:<operation>"
P2P_WORKS = ("send", "recv")
TIMEOUT = timedelta(seconds=60)
P2P_TAG = 7
# (kind, label, elements per rank, root): sizes in float32 elements. Large enough to span many segments
# where it matters (gloo's ring all-reduce cuts > 1 MiB tensors into 1 MiB segments), small enough that
# every node's capture stays a few MB once gzipped.
OPERATIONS = (
    ("all_reduce", "small", 256, None),
    ("all_reduce", "odd", 1001, None),                  # segments of unequal length
    ("all_reduce", "medium", 262_144, None),            # 1 MiB
    ("all_reduce", "large", 2_752_512, None),           # 10.5 MiB (11,010,048 bytes)
    ("all_to_all", "single", 262_144, None),            # all_to_all_single, 1 MiB per rank
    ("all_to_all", "list", 16_384, None),               # all_to_all with lists: 4 x 16 Ki floats
    ("broadcast", "root1", 131_072, 1),                 # 512 KiB from rank 1
    ("all_gather", "list", 32_768, None),               # 128 KiB per rank
    ("all_gather", "single", 8_192, None),              # all_gather_into_tensor
    ("reduce_scatter", "list", 16_384, None),           # reduce_scatter: k inputs of 16 Ki floats
    ("reduce_scatter", "single", 16_384, None),         # reduce_scatter_tensor
    ("reduce", "root2", 65_536, 2),
    ("gather", "root0", 16_384, 0),
    ("scatter", "root3", 16_384, 3),
    ("barrier", "", 0, None),
    ("send_recv", "ring", 75_000, None),                # rank r sends to r+1, receives from r-1
    ("send_recv", "ring", 1_000, None),                 # again, same peers and tag
    ("all_reduce", "medium", 262_144, None),
    ("barrier", "", 0, None),
)


def write_record(path: Path, record: dict) -> None:
    """The record as JSON, one operation a line (a matrix job runs hundreds), replacing the file at once."""
    head = json.dumps({key: value for key, value in record.items() if key != "operations"}, indent=1)
    operations = ",\n".join(json.dumps(operation) for operation in record["operations"])
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(f'{head[:-2]},\n "operations": [\n{operations}\n]\n}}\n')
    partial.replace(path)


def filled(elements: int, value: float) -> torch.Tensor:
    return torch.full((elements,), value, dtype=torch.float32)


def run_collective(kind: str, label: str, elements: int, root: int | None, rank: int, world: int) -> dict:
    """Run one collective; return what it handed over (bytes) besides the timing."""
    size = elements * FLOAT32_BYTES
    value = float(rank + 1)
    if kind == "all_reduce":
        dist.all_reduce(filled(elements, value))
        return {"tensor_bytes": size, "input_bytes": size, "output_bytes": size}
    if kind == "all_to_all":
        if label == "single":
            dist.all_to_all_single(torch.empty(elements), filled(elements, value))
            return {"tensor_bytes": size, "input_bytes": size, "output_bytes": size}
        dist.all_to_all([torch.empty(elements) for _ in range(world)],
                        [filled(elements, value) for _ in range(world)])
        return {"tensor_bytes": size * world, "input_bytes": size * world, "output_bytes": size * world}
    if kind == "broadcast":
        dist.broadcast(filled(elements, value), src=root)
        return {"tensor_bytes": size, "input_bytes": size, "output_bytes": size, "root": root}
    if kind == "all_gather":
        if label == "single":
            dist.all_gather_into_tensor(torch.empty(elements * world), filled(elements, value))
        else:
            dist.all_gather([torch.empty(elements) for _ in range(world)], filled(elements, value))
        return {"tensor_bytes": size * world, "input_bytes": size, "output_bytes": size * world}
    if kind == "reduce_scatter":
        if label == "single":
            dist.reduce_scatter_tensor(torch.empty(elements), filled(elements * world, value))
        else:
            dist.reduce_scatter(torch.empty(elements), [filled(elements, value) for _ in range(world)])
        return {"tensor_bytes": size * world, "input_bytes": size * world, "output_bytes": size}
    if kind == "reduce":
        dist.reduce(filled(elements, value), dst=root)
        return {"tensor_bytes": size, "input_bytes": size, "output_bytes": size if rank == root else 0,
                "root": root}
    if kind == "gather":
        outputs = [torch.empty(elements) for _ in range(world)] if rank == root else None
        dist.gather(filled(elements, value), outputs, dst=root)
        return {"tensor_bytes": size * world, "input_bytes": size,
                "output_bytes": size * world if rank == root else 0, "root": root}
    if kind == "scatter":
        inputs = [filled(elements, value) for _ in range(world)] if rank == root else None
        dist.scatter(torch.empty(elements), inputs, src=root)
        return {"tensor_bytes": size * world, "input_bytes": size * world if rank == root else 0,
                "output_bytes": size, "root": root}
    if kind == "barrier":
        dist.barrier()
        return {"tensor_bytes": 0, "input_bytes": 0, "output_bytes": 0}
    raise ValueError(f"unknown collective {kind}")


def run_p2p(direction: str, peer: int, elements: int, rank: int) -> dict:
    size = elements * FLOAT32_BYTES
    if direction == "send":
        dist.send(filled(elements, float(rank + 1)), dst=peer, tag=P2P_TAG)
    else:
        dist.recv(torch.empty(elements), src=peer, tag=P2P_TAG)
    return {"peer": peer, "tag": P2P_TAG, "tensor_bytes": size, "input_bytes": size if direction == "send" else 0,
            "output_bytes": size if direction == "recv" else 0}


def profiled(call) -> tuple[dict, list[dict], int, int]:
    """Run call() under PyTorch's profiler: its result, the Gloo works it ran, and its start/end ns."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as profiler:
        start_ns = time.time_ns()
        result = call()
        end_ns = time.time_ns()
    works = [{"name": event.name.removeprefix(GLOO_WORK_PREFIX), "input_shapes": event.input_shapes}
             for event in sorted(profiler.events(), key=lambda event: event.time_range.start)
             if event.name.startswith(GLOO_WORK_PREFIX)]
    return result, works, start_ns, end_ns


class CollectiveFailed(Exception):
    """A training step's all_reduce raised (the others' timeout, a peer gone): recorded, the rank exits 1."""


def stop_process(seconds: float) -> None:
    """SIGSTOP this whole process for `seconds`: a helper process, started first, sends it SIGCONT."""
    waker = subprocess.Popen(["/bin/sh", "-c", f"sleep {seconds}; kill -CONT {os.getpid()}"])
    os.kill(os.getpid(), signal.SIGSTOP)
    waker.wait()


def train(steps: int, grad_elements: int, compute_matmuls: int, rank: int, record: dict,
          stall: tuple[int, float, str] | None = None) -> None:
    """The training loop (see the module doc): record["steps"] gets one entry per step, wall-clock ns;
    with `stall` (step, seconds, how: sleep or sigstop) the rank stalls before that step's all_reduce
    (record["fault"])."""
    generator = torch.Generator().manual_seed(rank)
    activations = torch.rand((256, 256), generator=generator)
    weights = torch.rand((256, 256), generator=generator) / 256
    gradient = torch.empty(grad_elements)
    record["steps"] = []
    for step in range(steps):
        start_ns = time.time_ns()
        for _ in range(compute_matmuls):
            activations = torch.tanh(activations @ weights)
        gradient.fill_(float(activations[0, 0]) + rank)
        seq = dist.group.WORLD._get_sequence_number_for_group()
        if stall is not None and stall[0] == step:
            record["fault"] = {"kind": "stall", "step": step, "seq": seq, "stall_s": stall[1], "how": stall[2],
                               "start_ns": time.time_ns()}
            (stop_process if stall[2] == "sigstop" else time.sleep)(stall[1])
            record["fault"]["end_ns"] = time.time_ns()
        call_ns = time.time_ns()
        try:
            dist.all_reduce(gradient)
        except RuntimeError as exc:
            record["error"] = {"step": step, "seq": seq, "call_ns": call_ns, "ts_ns": time.time_ns(),
                               "message": str(exc).splitlines()[0]}
            raise CollectiveFailed from exc
        record["steps"].append({"step": step, "seq": seq, "start_ns": start_ns, "all_reduce_ns": call_ns,
                                "end_ns": time.time_ns(), "tensor_bytes": grad_elements * FLOAT32_BYTES})


def rank_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every Gloo workload's rank takes (lab.record passes them)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--master-addr", required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--record", type=Path, required=True)
    return parser


def start_rank(args: argparse.Namespace, timeout: timedelta) -> dict:
    """Write the rank's record as it starts, join the process group through the TCPStore; the record."""
    record = {"rank": args.rank, "world_size": args.world_size, "pid": os.getpid(), "start_ns": time.time_ns(),
              "versions": {"torch": torch.__version__, "python": platform.python_version()},
              "master": f"{args.master_addr}:{args.master_port}", "operations": [], "finished": False}
    write_record(args.record, record)
    dist.init_process_group("gloo", init_method=f"tcp://{args.master_addr}:{args.master_port}",
                            rank=args.rank, world_size=args.world_size, timeout=timeout)
    record["init_done_ns"] = time.time_ns()
    return record


def finish_rank(args: argparse.Namespace, record: dict) -> None:
    """Leave the process group and write the rank's record as finished."""
    dist.destroy_process_group()
    record["end_ns"] = time.time_ns()
    record["finished"] = True
    write_record(args.record, record)


def main() -> None:
    parser = rank_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--train-steps", type=int, default=None)
    parser.add_argument("--grad-elements", type=int, default=2_621_440)
    parser.add_argument("--compute-matmuls", type=int, default=20)
    parser.add_argument("--stall-step", type=int, default=None, help="training: sleep before this step's all_reduce")
    parser.add_argument("--stall-s", type=float, default=1.5, help="training: seconds of that stall")
    parser.add_argument("--stall-by", choices=["sleep", "sigstop"], default="sleep",
                        help="training: the rank sleeps, or its process is stopped (SIGSTOP, then SIGCONT)")
    parser.add_argument("--timeout-s", type=float, default=TIMEOUT.total_seconds(),
                        help="the process group's timeout (a collective waiting longer fails)")
    args = parser.parse_args()
    rank, world = args.rank, args.world_size
    record = start_rank(args, timedelta(seconds=args.timeout_s))
    if args.train_steps:
        torch.set_num_threads(1)
        stall = None if args.stall_step is None else (args.stall_step, args.stall_s, args.stall_by)
        try:
            train(args.train_steps, args.grad_elements, args.compute_matmuls, rank, record, stall)
        except CollectiveFailed:
            record["end_ns"] = time.time_ns()
            write_record(args.record, record)
            raise SystemExit(1) from None
        finish_rank(args, record)
        return
    calls = []                    # (order, kind, label, call)
    for order, (kind, label, elements, root) in enumerate(OPERATIONS):
        if kind == "send_recv":
            # Even ranks send first, odd ranks receive first: no rank waits on a peer that is also sending.
            steps = [("send", (rank + 1) % world), ("recv", (rank - 1) % world)]
            for direction, peer in (steps if rank % 2 == 0 else steps[::-1]):
                calls.append((order, direction, label,
                              lambda d=direction, p=peer, n=elements: run_p2p(d, p, n, rank)))
        else:
            calls.append((order, kind, label,
                          lambda k=kind, lb=label, n=elements, r=root: run_collective(k, lb, n, r, rank, world)))
    next_tag = 0
    for order, kind, label, call in calls:
        sizes, works, start_ns, end_ns = profiled(call)
        collective_works = [work for work in works if work["name"] not in P2P_WORKS]
        tags = list(range(next_tag, next_tag + len(collective_works)))
        next_tag += len(collective_works)
        record["operations"].append({"kind": kind, "label": label, "order": order, "dtype": "float32", **sizes,
                                     "start_ns": start_ns, "end_ns": end_ns, "gloo_works": works,
                                     "gloo_tags": tags,
                                     "pg_sequence": dist.group.WORLD._get_sequence_number_for_group()})
    finish_rank(args, record)


if __name__ == "__main__":
    main()
