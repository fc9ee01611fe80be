"""The statistics on synthetic jobs whose timing is set by parameters: the expected phases and overheads
follow from those parameters in closed form (see SyntheticJob), not from the analysis code."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest

from dlcsniff.analysis import statistics, summary_json
from dlcsniff.analysis.iterations import ITERATION_COLUMNS, worker_iterations
from dlcsniff.analysis.load import NODE_COLUMNS, Dataset
from dlcsniff.analysis.operations import ROLE_WORKER, SLOT_PULL_RESPONSE, SLOT_PUSH_REQUEST, build_records
from dlcsniff.analysis.overheads import KEY_COLUMNS
from dlcsniff.analysis.describe import describe
from dlcsniff.analysis.export_chrome import chrome_trace
from tests.bench.analysis import SyntheticJob, synthetic_messages

JOBS = {
    "fused": SyntheticJob(workers=3, servers=2, keys=5, iterations=6, fused=True),
    "push_then_pull": SyntheticJob(workers=2, servers=3, keys=4, iterations=5, fused=False),
}


def stats_of(job: SyntheticJob):
    dataset = Dataset(synthetic_messages(job), pd.DataFrame(columns=list(NODE_COLUMNS)), "synthetic")
    trace = build_records(dataset)
    return trace, statistics(trace=trace)


@pytest.fixture(scope="module", params=list(JOBS))
def job_stats(request):
    job = JOBS[request.param]
    return job, *stats_of(job)


def test_every_worker_iteration_is_found(job_stats):
    job, _, stats = job_stats
    iterations = stats.iterations
    assert tuple(iterations.columns) == ITERATION_COLUMNS
    assert len(iterations) == job.workers * job.iterations
    assert (iterations.groupby("worker_rank")["iteration"].apply(list)
            == [list(range(job.iterations))] * job.workers).all()


def test_phases_match_the_job_timing(job_stats):
    job, _, stats = job_stats
    iterations = stats.iterations
    last = job.keys - 1
    phase2 = last * job.push_gap_ns / 1e9                        # first → last push
    phase3 = (last * (job.push_gap_ns + job.rtt_step_ns) + job.rtt_ns) / 1e9   # first push → last values
    phase1 = job.period_ns / 1e9 - phase3                        # last values of t-1 → first push of t
    np.testing.assert_allclose(iterations["phase2_s"], phase2, rtol=0, atol=1e-12)
    np.testing.assert_allclose(iterations["phase3_s"], phase3, rtol=0, atol=1e-12)
    np.testing.assert_allclose(iterations["wait_s"], last * (job.push_gap_ns + job.rtt_step_ns) / 1e9, atol=1e-12)
    later = iterations[iterations["iteration"] > 0]
    assert iterations.loc[iterations["iteration"] == 0, "phase1_s"].isna().all()   # initialisation precedes it
    np.testing.assert_allclose(later["phase1_s"], phase1, atol=1e-12)
    np.testing.assert_allclose(later["overlap_ratio"], phase2 / (phase1 + phase3), atol=1e-12)
    np.testing.assert_allclose(later["computation_s"], phase1 + phase2, atol=1e-12)
    np.testing.assert_allclose(later["iteration_s"], job.period_ns / 1e9, atol=1e-12)
    first_push = (job.origin_ns + job.compute_ns + later["iteration"].astype("int64") * job.period_ns
                  + later["worker_rank"].astype("int64") * job.worker_skew_ns)
    assert (later["start_ts_ns"] == first_push - round(phase1 * 1e9)).all()


def test_server_overheads_match_the_job_timing(job_stats):
    job, trace, stats = job_stats
    keys = stats.keys
    assert tuple(keys.columns) == KEY_COLUMNS
    assert trace.mode == "sync"
    assert len(keys) == job.keys * job.iterations
    key = keys["tensor_key"].to_numpy()
    skew = (job.workers - 1) * job.worker_skew_ns
    np.testing.assert_allclose(keys["sync_overhead_us"], skew / 1e3)
    if job.fused:
        update = job.rtt_ns + key * job.rtt_step_ns - 2 * job.wire_ns - skew
        assert keys["search_overhead_us"].isna().all()
    else:
        update = np.full(len(keys), job.ack_ns - 2 * job.wire_ns - skew)
        search = job.rtt_ns + key * job.rtt_step_ns - 2 * job.ack_ns - 2 * job.wire_ns
        np.testing.assert_allclose(keys["search_overhead_us"], search / 1e3)
    np.testing.assert_allclose(keys["update_overhead_us"], update / 1e3)
    assert (keys["size_bytes"].to_numpy() == job.key_bytes(key)).all()
    assert (keys["server_rank"].to_numpy() == job.server_of(key)).all()
    assert (keys["pushes"] == job.workers).all()


def test_async_update_overhead_is_each_push_to_its_answer():
    job = SyntheticJob(workers=2, servers=1, keys=3, iterations=4, fused=True, worker_skew_ns=5_000_000)
    trace, stats = stats_of(job)
    assert trace.mode == "async"        # worker 0's pushes were answered before worker 1's arrived
    key = stats.keys["tensor_key"].to_numpy()
    np.testing.assert_allclose(stats.keys["update_overhead_us"],
                               (job.rtt_ns + key * job.rtt_step_ns - 2 * job.wire_ns) / 1e3)
    assert stats.keys["sync_overhead_us"].isna().all()


def test_pattern_tables(job_stats):
    job, _, stats = job_stats
    sizes = stats.sizes.set_index("operation")
    all_keys = np.arange(job.keys)
    # every training push, and worker 0's kv.init of every tensor
    rounds = job.workers * job.iterations + 1
    assert sizes.loc["Push_Send_Worker", "messages"] == rounds * job.keys
    assert sizes.loc["Push_Send_Worker", "bytes"] == rounds * job.key_bytes(all_keys).sum()
    assert sizes.loc["Push_Send_Worker", "class"] == "long"
    assert sizes.loc["Push_Send_Worker", "max_bytes"] == job.key_bytes(job.keys - 1)
    if not job.fused:
        assert sizes.loc["Push_Recv_Worker", "class"] == "short"
        assert sizes.loc["Pull_Send_Worker", "max_bytes"] == 30
    traffic = stats.traffic.set_index(["src", "dst"])
    for worker in range(job.workers):
        for server in range(job.servers):
            mine = all_keys[job.server_of(all_keys) == server]
            requests = job.key_bytes(mine).sum() + (0 if job.fused else 30 * len(mine))
            initialisation = 30 * len(mine) + (job.key_bytes(mine).sum() if worker == 0 else 0)
            assert traffic.loc[(f"worker{worker}", f"server{server}"), "bytes"] == (
                job.iterations * requests + initialisation)
        assert traffic.loc[(f"worker{worker}", "scheduler"), "bytes"] == 57
    volume = stats.volume_iterations
    train = volume[volume["phase"] == "train"]
    assert (train["push_bytes"] == job.key_bytes(all_keys).sum()).all()
    assert (train["pull_bytes"] == job.key_bytes(all_keys).sum()).all()
    init = volume[volume["phase"] == "init"].set_index("worker_rank")
    assert list(init["iteration"]) == [-1] * job.workers
    assert init.loc[0, "push_bytes"] == job.key_bytes(all_keys).sum()       # worker 0's kv.init
    assert (init.drop(index=0)["push_bytes"] == 0).all()
    per_key = stats.volume_keys.set_index("tensor_key")
    assert (per_key["push_bytes_per_iteration"] == job.key_bytes(per_key.index.to_numpy())).all()
    assert (per_key["pushes"] == job.workers * job.iterations).all()


def test_summary_is_strict_json_with_every_statistic(job_stats):
    job, _, stats = job_stats
    summary = json.loads(summary_json(stats))          # allow_nan=False inside: NaN would raise
    assert summary["iterations"]["per_worker"] == {str(rank): job.iterations for rank in range(job.workers)}
    assert summary["records"]["per_iteration_per_worker"]["mean"] == job.keys * (2 if job.fused else 4)
    for name in ("phase1_s", "phase2_s", "phase3_s", "computation_s", "communication_s", "iteration_s",
                 "overlap_ratio", "wait_s", "sync_overhead_us", "update_overhead_us"):
        assert set(summary["statistics"][name]) == {"count", "mean", "min", "p50", "p90", "p99", "max"}
    assert (summary["statistics"]["search_overhead_us"] is None) == job.fused
    assert summary["messages"]["longest_bytes"] == job.key_bytes(job.keys - 1)


def test_describe():
    found = describe(pd.Series([1.0, np.nan, 3.0, np.inf, 2.0]))
    assert found == {"count": 3, "mean": 2.0, "min": 1.0, "p50": 2.0, "p90": 2.8, "p99": pytest.approx(2.98),
                     "max": 3.0}
    assert describe(pd.Series([np.nan])) is None


def test_a_lost_receipt_makes_its_iteration_unknown_not_wrong():
    job = SyntheticJob(workers=1, servers=1, keys=3, iterations=3)
    messages = synthetic_messages(job)
    # the worker's capture never saw the last values of iteration 1; the capture cut another one short
    answers = messages[(messages["capture"] == "worker0") & ~messages["request"]]
    stamp = answers["ps_timestamp"] - 2 * job.keys        # after kv.init and the first pulls
    lost = answers.index[stamp == 1 * job.keys + 2]
    cut = answers.index[stamp == 2 * job.keys + 1]
    messages = messages.drop(lost)
    messages.loc[cut, "complete"] = False
    trace = build_records(Dataset(messages, pd.DataFrame(columns=list(NODE_COLUMNS)), "synthetic"))
    iterations = statistics(trace=trace).iterations.set_index("iteration")
    assert iterations["phase3_s"].isna().tolist() == [False, True, True]
    assert iterations["phase1_s"].isna().tolist() == [True, False, True]     # 1 follows the known 0
    assert iterations["phase2_s"].notna().all()


def test_an_iteration_without_a_known_start_has_a_null_start_not_a_made_up_one():
    job = SyntheticJob(workers=1, servers=1, keys=3, iterations=3, fused=False)
    dataset = Dataset(synthetic_messages(job), pd.DataFrame(columns=list(NODE_COLUMNS)), "synthetic")
    trace = build_records(dataset)
    # the worker's records hold one of iteration 1's values cut short and none of iteration 2's pushes, only
    # its pulls: nothing says when iteration 2 started
    records = trace.records.copy()
    worker = records["node_role"] == ROLE_WORKER
    cut = records.index[worker & (records["slot"] == SLOT_PULL_RESPONSE) & (records["iteration"] == 1)][:1]
    lost = worker & (records["slot"] == SLOT_PUSH_REQUEST) & (records["iteration"] == 2)
    assert len(cut) and lost.any()
    records.loc[cut, "complete"] = False
    trace = dataclasses.replace(trace, records=records[~lost])
    iterations = worker_iterations(trace).set_index("iteration")
    assert iterations["start_ts_ns"].isna().tolist() == [False, False, True]
    assert iterations.loc[1, "start_ts_ns"] > iterations.loc[0, "start_ts_ns"] > 0
    assert iterations.loc[2, ["phase1_s", "iteration_s"]].isna().all()
    # the Perfetto export places the two it can and says it could not place the third
    exported = chrome_trace(dataset, trace)
    assert exported.iterations == 2 and exported.losses["iterations_without_a_start"] == 1
    placed = [event["name"] for event in exported.document["traceEvents"] if event.get("cat") == "iteration"]
    assert "iteration 1" in placed and "iteration 2" not in placed
