"""`dlcsniff stats --engine dask`: the statistics graph (analysis.stats_graph.STATISTICS) as Dask tasks.

Each statistic is one task, of the same function the pandas engine calls and of the futures of what it needs;
a last task assembles the Stats, so both engines write the same tables by construction (tests/decoders/
test_dask.py holds them to it). Tasks are named after their function. The job model goes to the workers
unread (its path and manifest): each task reads the tables it needs where it runs, so the ps-lite records,
the merged view's and the collectives' statistics are built at the same time on different workers, and only
the statistics come back.

The cluster is the one at `scheduler`, else a local one (see `decoders.dask_cluster.dask_client`); workers
of a running cluster must see the decode output under the same absolute path.
"""
from __future__ import annotations

import uuid
from pathlib import Path

from dlcsniff.analysis.job_model import JobModel
from dlcsniff.analysis.outputs import claim, label
from dlcsniff.analysis import stats_graph
from dlcsniff.analysis.summary import Stats, write_stats
from dlcsniff.decoders.dask_cluster import cluster_failures, dask_client, worker_path

PARALLEL_TASKS = 3        # the ps-lite records, the merged view's statistics, the collectives'


def statistics_dask(job: JobModel, *, scheduler: str | None = None, workers: int | None = None) -> Stats:
    """What `analysis.write_statistics` computes, on the cluster at `scheduler` or a local one."""
    shipped = job.at(worker_path(job.path, scheduler))
    run = uuid.uuid4().hex          # after the name: Dask's task prefix is the function's name
    with dask_client(scheduler, workers, tasks=PARALLEL_TASKS) as client, cluster_failures():
        futures: dict[str, object] = {"job": shipped}
        for statistic in stats_graph.STATISTICS:
            futures[statistic.name] = client.submit(
                stats_graph.run_step, statistic, *(futures[name] for name in statistic.needs),
                key=f"{statistic.function.__name__}-{run}", pure=False)
        names = tuple(statistic.name for statistic in stats_graph.STATISTICS)
        stats = client.submit(stats_graph.assemble, job.source, names, *(futures[name] for name in names),
                              key=f"compute_stats-{run}", pure=False)
        # should several steps fail, the error to report is the pandas engine's: the first in its order
        for name in names:
            if futures[name].exception() is not None:
                futures[name].result()
        return stats.result()


def write_statistics_dask(job: JobModel, out_dir: str | Path, *, scheduler: str | None = None,
                          workers: int | None = None, force: bool = False) -> Stats:
    """`dlcsniff stats --engine dask`: `analysis.write_statistics` computed on a Dask cluster."""
    out_dir = claim(out_dir, job.path, kind="stats", force=force)
    stats = statistics_dask(job, scheduler=scheduler, workers=workers)
    label(out_dir, "stats", job, write_stats(stats, out_dir))
    return stats
