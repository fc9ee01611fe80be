"""Benchmark of the statistics: 10 million synthetic ps-lite messages through analysis/ (`make bench`).

`synthetic_messages` builds, vectorised, the messages.parquet a decode of a parameter-server job would give:
every node registers with the scheduler, worker 0 initialises every tensor (kv.init) and every worker pulls
it once, then every worker pushes every tensor once per iteration (MXNet 1.9.1's fused push-pull, or push
then pull); each message is seen in its sender's and its receiver's capture. The unit tests use it small,
with the timing parameters as ground truth.
"""
from __future__ import annotations

import time

import pandas as pd
from tests.support.synthetic import SyntheticJob, synthetic_messages

BENCH_MESSAGES = 10_000_000
BENCH_BUDGET_S = 30.0


def bench_job(messages: int = BENCH_MESSAGES) -> SyntheticJob:
    """A ResNet-50-like job (157 tensors, 16 workers, 4 servers) with about `messages` decoded messages."""
    workers, keys = 16, 157
    per_iteration = workers * keys * 4            # fused: request + response, each in two captures
    return SyntheticJob(workers=workers, servers=4, keys=keys, iterations=max(1, round(messages / per_iteration)))


def run() -> dict:
    """Time the statistics over ~10 million synthetic messages (the decoded tables are built untimed)."""
    from dlcsniff.analysis.load import Dataset
    from dlcsniff.analysis.operations import build_records
    from dlcsniff.analysis.stats_graph import statistics

    job = bench_job()
    messages = synthetic_messages(job)
    nodes = pd.DataFrame({"node_id": pd.Series(dtype="int32"), "role": pd.Series(dtype="str"),
                          "rank": pd.Series(dtype="int32"), "hostname": pd.Series(dtype="str"),
                          "port": pd.Series(dtype="int32")})
    dataset = Dataset(messages=messages, nodes=nodes, source="synthetic")
    began = time.perf_counter()
    trace = build_records(dataset)
    records_s = time.perf_counter() - began
    stats = statistics("synthetic", trace=trace)
    total_s = time.perf_counter() - began
    return {
        "name": "analysis: records + statistics",
        "messages": int(len(messages)), "records": int(len(trace.records)),
        "worker_iterations": int(len(stats.iterations)), "key_rows": int(len(stats.keys)),
        "records_s": round(records_s, 2), "seconds": round(total_s, 2),
        "messages_per_s": round(len(messages) / total_s), "budget_s": BENCH_BUDGET_S,
        "within_budget": total_s < BENCH_BUDGET_S,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
