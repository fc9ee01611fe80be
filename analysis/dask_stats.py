"""`dlcsniff stats --engine dask`: the statistics of a decoded job as a Dask task graph.

    load_dataset(DIR) ──▶ pslite_trace ──┐
    job_statistics(DIR) ─────────────────┼──▶ compute_stats ──▶ write_stats (here)
    collective_statistics_of(DIR) ───────┘

The graph calls the functions `analysis.write_statistics` calls, with the same arguments, so both engines
write the same tables by construction (tests/test_dask_engine.py holds them to it). Its three branches run
at the same time on different workers, each reading the decode output's Parquet files itself; the ps-lite
records stay on their worker, where compute_stats runs, and only the statistics come back.

The records are not built capture by capture: which captures a node's records come from (its vantage
points), the job's topology and its kvstore mode are job-wide decisions of `build_records`, so splitting
them would need that function to take them as arguments.

The cluster is the one at `scheduler`, else a local one (see `decoders.dask_engine.dask_client`); workers
of a running cluster must see the decode output under the same absolute path.
"""
from __future__ import annotations

from pathlib import Path

from dlcsniff.analysis.collective_stats import collective_statistics_of
from dlcsniff.analysis.latency import job_statistics
from dlcsniff.analysis.load import load_dataset
from dlcsniff.analysis.operations import pslite_trace
from dlcsniff.analysis.outputs import claim, label
from dlcsniff.analysis.summary import Stats, compute_stats, write_stats
from dlcsniff.decoders.dask_cluster import cluster_failures, dask_client, worker_path

PARALLEL_TASKS = 3        # the ps-lite records, the merged view's statistics, the collectives'


def statistics_dask(decode_dir: str | Path, *, scheduler: str | None = None, workers: int | None = None) -> Stats:
    """What `analysis.write_statistics` computes, on the cluster at `scheduler` or a local one."""
    decode_dir = Path(decode_dir)
    where = worker_path(decode_dir, scheduler)
    with dask_client(scheduler, workers, tasks=PARALLEL_TASKS) as client, cluster_failures():
        dataset = client.submit(load_dataset, where, pure=False)
        branches = (client.submit(pslite_trace, dataset, pure=False),
                    client.submit(job_statistics, where, pure=False),
                    client.submit(collective_statistics_of, where, pure=False))
        trace, job, collectives = branches
        stats = client.submit(compute_stats, trace, source=str(decode_dir), job=job, collectives=collectives,
                              pure=False)
        # should several branches fail, the error to report is the pandas engine's: the first in its order
        for branch in branches:
            if branch.exception() is not None:
                branch.result()
        return stats.result()


def write_statistics_dask(decode_dir: str | Path, out_dir: str | Path, *, scheduler: str | None = None,
                          workers: int | None = None, force: bool = False) -> Stats:
    """`dlcsniff stats --engine dask`: `analysis.write_statistics` computed on a Dask cluster."""
    out_dir = claim(out_dir, decode_dir, force=force)
    stats = statistics_dask(decode_dir, scheduler=scheduler, workers=workers)
    label(out_dir, "stats", decode_dir, write_stats(stats, out_dir))
    return stats
