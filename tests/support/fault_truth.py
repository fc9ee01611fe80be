"""What the fault jobs' own records say was injected (lab/record.py FAULT_JOBS): the truth `dlcsniff diagnose`
is judged by. Every figure comes from the workloads' records (wall-clock ns taken by the programs around their
calls: lab/workloads/gloo_job.py, mxnet_job.py, stalling_sgd.py) and job.json, none from a capture."""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Fault:
    role: str                         # rank, worker, server
    rank: int                         # the rank (ps-lite: the node's rank among its role)
    seq: int                          # the collective's sequence number; ps-lite: the training iteration
    late_s: float | None              # straggler: its call that late after the others' median call
    waiting: tuple[int, ...] = ()     # hang: the ranks that entered and waited
    waited_s: float | None = None     # hang: from their call to their failure (their timeout)


def _records(job_dir: Path) -> tuple[dict, dict[str, dict]]:
    """job.json and the nodes' records (a node killed before it wrote one has none)."""
    job = json.loads((job_dir / "job.json").read_text())
    return job, {node["name"]: json.loads((job_dir / node["record"]).read_text()) for node in job["nodes"]
                 if node.get("record")}


def gloo_fault(job_dir: Path) -> Fault:
    """The stalled rank of a Gloo training job, from the ranks' records: its all-reduce's seq, how much later
    than the others' median call it called it; for a hang, the ranks whose same all-reduce failed and after how
    long."""
    job, records = _records(job_dir)
    stalled = [record for record in records.values() if "fault" in record]
    assert len(stalled) == 1, [name for name, record in records.items() if "fault" in record]
    fault = stalled[0]["fault"]
    rank, seq = stalled[0]["rank"], fault["seq"]
    others = [record for record in records.values() if record is not stalled[0]]
    if job["fault"]["kind"] == "hang":
        failed = [record for record in others if record.get("error", {}).get("seq") == seq]
        waited = statistics.median(record["error"]["ts_ns"] - record["error"]["call_ns"] for record in failed)
        return Fault("rank", rank, seq, None, tuple(sorted(record["rank"] for record in failed)), waited / 1e9)
    calls = {record["rank"]: next(step["all_reduce_ns"] for step in record["steps"] if step["seq"] == seq)
             for record in records.values()}
    late = calls[rank] - statistics.median(call for other, call in calls.items() if other != rank)
    return Fault("rank", rank, seq, late / 1e9)


def _first_push_ns(record: dict, batch: int) -> int:
    """A worker's first kvstore push (MXNet 1.9.1's Trainer: pushpull) of a batch."""
    found = record["batches"][batch]
    return min(op["call_ns"] for op in record["operations"] if op["op"] in ("push", "pushpull")
               and found["start_ns"] <= op["call_ns"] <= found["end_ns"])


def mxnet_fault(job_dir: Path) -> Fault:
    """The stalled node of an MXNet job: a worker (its ps-lite rank, the batch = training iteration, how much
    later than the other workers' median first push its first push was called) or a server (its rank, the
    iteration of the stalled update, how long the update slept). For the hung job the recorder killed, the other
    workers waited from the stall's start (they push a round within ms of each other) to the kill."""
    job, records = _records(job_dir)
    stalled = [name for name, record in records.items() if "fault" in record]
    assert len(stalled) == 1, stalled
    node = next(entry for entry in job["nodes"] if entry["name"] == stalled[0])
    fault = records[stalled[0]]["fault"]
    if node["role"] == "server":
        return Fault("server", node["rank"], fault["iteration"], (fault["end_ns"] - fault["start_ns"]) / 1e9)
    batch = fault["batch"]
    if job["fault"]["kind"] == "hang":
        others = tuple(sorted(entry["rank"] for entry in job["nodes"] if entry["role"] == "worker"
                              and entry["name"] != node["name"]))
        return Fault("worker", node["rank"], batch, None, others,
                     (job["fault"]["given_up_ns"] - fault["start_ns"]) / 1e9)
    workers = {entry["rank"]: records[entry["name"]] for entry in job["nodes"] if entry["role"] == "worker"}
    pushes = {rank: _first_push_ns(record, batch) for rank, record in workers.items()}
    late = pushes[node["rank"]] - statistics.median(ns for rank, ns in pushes.items() if rank != node["rank"])
    return Fault("worker", node["rank"], batch, late / 1e9)


def stall_window_ns(job_dir: Path) -> tuple[int, int]:
    """When the stalled node slept (wall clock, the node's own record)."""
    _, records = _records(job_dir)
    fault = next(record["fault"] for record in records.values() if "fault" in record)
    return fault["start_ns"], fault["end_ns"]
