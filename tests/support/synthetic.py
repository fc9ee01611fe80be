"""Synthetic ps-lite jobs of any size, for the analysis tests and the analysis benchmark."""
from __future__ import annotations

from dataclasses import dataclass
import numpy as np
import pandas as pd


@dataclass(frozen=True)
class SyntheticJob:
    workers: int = 2
    servers: int = 2
    keys: int = 4
    iterations: int = 5
    fused: bool = True                 # MXNet 1.9.1 push-pull; False: push, ack, pull request, values
    period_ns: int = 10_000_000        # worker w's iteration t starts at t*period + w*worker_skew
    worker_skew_ns: int = 100_000
    compute_ns: int = 3_000_000        # iteration start → first push (phase 1)
    push_gap_ns: int = 200_000         # between consecutive keys' pushes (phase 2 = (keys-1) * gap)
    rtt_ns: int = 1_000_000            # request sent → its answer received, + key * rtt_step
    rtt_step_ns: int = 100_000
    ack_ns: int = 300_000              # push → ack, ack → pull request (and initialisation's answers)
    wire_ns: int = 50_000              # a message is seen this much later in the receiver's capture
    origin_ns: int = 1_700_000_000_000_000_000

    def key_bytes(self, key: np.ndarray) -> np.ndarray:
        return 100 + 1000 * key

    def server_of(self, key: np.ndarray) -> np.ndarray:
        return key % self.servers


def _messages_of(job: SyntheticJob, sender, recver, sent_ts, *, request, push=False, pull=False, stamp=-1,
                 size=18, key=None, control_cmd=np.nan) -> dict[str, np.ndarray]:
    """One message per element of the (broadcast) arguments."""
    sent_ts = np.asarray(sent_ts, dtype=np.int64)
    n = len(sent_ts)
    full = lambda value, dtype=None: np.broadcast_to(np.asarray(value, dtype=dtype), n)  # noqa: E731
    size = full(size, np.int64)
    return {"sender_id": full(sender, np.int64), "recver_id": full(recver, np.int64), "sent_ts": sent_ts,
            "request": full(request), "push": full(push), "pull": full(pull), "ps_timestamp": full(stamp, np.int64),
            "size_bytes": size, "tensor_key": np.where(size > 18, full(np.nan if key is None else key, float), np.nan),
            "control_cmd": full(control_cmd, float)}


def _job_messages(job: SyntheticJob) -> list[dict[str, np.ndarray]]:
    """Registration, initialisation (worker 0's kv.init push, everyone's first pull), then training."""
    keys = np.arange(job.keys)
    workers = np.arange(job.workers)
    worker_ids, server_ids = 9 + 2 * workers, 8 + 2 * np.arange(job.servers)
    server_of_key = 8 + 2 * job.server_of(keys)
    origin = job.origin_ns
    parts = [_messages_of(job, np.concatenate([worker_ids, server_ids]), 1,
                          origin - 3 * job.period_ns + np.arange(job.workers + job.servers),
                          request=True, control_cmd=2, size=57)]
    init_ts = origin - 2 * job.period_ns + keys * job.push_gap_ns
    parts.append(_messages_of(job, 9, server_of_key, init_ts, request=True, push=True, stamp=keys,
                              size=job.key_bytes(keys), key=keys))
    parts.append(_messages_of(job, server_of_key, 9, init_ts + job.ack_ns, request=False, push=True, stamp=keys))
    w, k = (a.ravel() for a in np.meshgrid(workers, keys, indexing="ij"))
    first_stamp = np.where(w == 0, job.keys, 0)            # worker 0's requests began with kv.init
    pull_ts = origin - job.period_ns + w * job.worker_skew_ns + k * job.push_gap_ns
    parts.append(_messages_of(job, 9 + 2 * w, server_of_key[k], pull_ts, request=True, pull=True,
                              stamp=first_stamp + k, size=30, key=k))
    parts.append(_messages_of(job, server_of_key[k], 9 + 2 * w, pull_ts + job.ack_ns, request=False, pull=True,
                              stamp=first_stamp + k, size=job.key_bytes(k), key=k))

    w, t, k = (a.ravel() for a in np.meshgrid(workers, np.arange(job.iterations), keys, indexing="ij"))
    start = origin + t * job.period_ns + w * job.worker_skew_ns
    push_ts = start + job.compute_ns + k * job.push_gap_ns
    answer_ts = push_ts + job.rtt_ns + k * job.rtt_step_ns          # when the worker has the values
    steps = 1 if job.fused else 2
    stamp = np.where(w == 0, 2 * job.keys, job.keys) + (t * job.keys + k) * steps
    worker, server, size = 9 + 2 * w, server_of_key[k], job.key_bytes(k)
    if job.fused:
        parts.append(_messages_of(job, worker, server, push_ts, request=True, push=True, pull=True, stamp=stamp,
                                  size=size, key=k))
    else:
        pull_ts = push_ts + 2 * job.ack_ns
        parts.append(_messages_of(job, worker, server, push_ts, request=True, push=True, stamp=stamp, size=size,
                                  key=k))
        parts.append(_messages_of(job, server, worker, push_ts + job.ack_ns - job.wire_ns, request=False,
                                  push=True, stamp=stamp))
        parts.append(_messages_of(job, worker, server, pull_ts, request=True, pull=True, stamp=stamp + 1,
                                  size=30, key=k))
    parts.append(_messages_of(job, server, worker, answer_ts - job.wire_ns, request=False, push=job.fused,
                              pull=True, stamp=stamp + steps - 1, size=size, key=k))
    return parts


def synthetic_messages(job: SyntheticJob) -> pd.DataFrame:
    """messages.parquet columns the analysis reads, for `job` (worker ids 9 + 2r, server ids 8 + 2r,
    scheduler 1): each message in its sender's capture when sent and its receiver's `wire_ns` later."""
    flat = {name: np.concatenate([part[name] for part in _job_messages(job)])
            for name in _messages_of(job, 1, 1, [0], request=True)}
    seen = []
    for node_column, delay in (("sender_id", 0), ("recver_id", job.wire_ns)):
        seen.append({**flat, "capture_node": flat[node_column], "ts": flat["sent_ts"] + delay})
    flat = {name: np.concatenate([side[name] for side in seen]) for name in seen[0]}
    n = len(flat["ts"])
    node = flat["capture_node"]
    capture_code = np.select([node == 1, node % 2 == 1], [job.workers + job.servers, (node - 9) // 2],
                             job.workers + (node - 8) // 2)
    categories = ([f"worker{r}" for r in range(job.workers)] + [f"server{r}" for r in range(job.servers)]
                  + ["scheduler"])
    return pd.DataFrame({
        "capture": pd.Categorical.from_codes(capture_code, categories=categories),
        "ts_first_ns": flat["ts"], "ts_last_ns": flat["ts"],
        "sender_id": flat["sender_id"].astype(np.int32), "recver_id": flat["recver_id"].astype(np.int32),
        "request": flat["request"], "push": flat["push"], "pull": flat["pull"], "simple_app": np.zeros(n, bool),
        "ps_timestamp": flat["ps_timestamp"].astype(np.int32), "app_id": np.zeros(n, np.int32),
        "customer_id": np.zeros(n, np.int32), "control_cmd": flat["control_cmd"],
        "size_bytes": flat["size_bytes"], "tensor_key": flat["tensor_key"],
        "req_type": pd.Categorical.from_codes(np.zeros(n, np.int8), categories=["default"]),
        "rows": np.full(n, np.nan), "simple_app_cmd": pd.Categorical.from_codes(
            np.full(n, -1, np.int8), categories=["sync_mode"]),
        "complete": np.ones(n, bool), "flavor": pd.Categorical.from_codes(np.zeros(n, np.int8), categories=["dmlc"]),
    })
