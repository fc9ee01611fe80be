"""The `dlcsniff stats` graph, defined once: each statistic a function of the job model ("job") or of earlier
results, and the name of its result. The pandas engine runs it here, in order; the Dask engine
(analysis.dask_stats) submits the same steps as tasks. A result that is a DataFrame is the table of that
name; one with `tables()` (the merged view's, the collectives', the network's) gives several; the trace is
what the ps-lite statistics are functions of. Adding a statistic is one function and one line below (and its
table's columns in analysis.stats_schema, the output contract).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from dlcsniff.analysis.collective_stats import collective_statistics_of
from dlcsniff.analysis.iterations import worker_iterations
from dlcsniff.analysis.job_model import JobModel
from dlcsniff.analysis.latency import job_statistics
from dlcsniff.analysis.network_behaviour import network_behaviour_of
from dlcsniff.analysis.operations import Trace, pslite_trace
from dlcsniff.analysis.overheads import key_overheads
from dlcsniff.analysis.pattern import message_sizes, traffic_matrix, volume_per_iteration, volume_per_key
from dlcsniff.analysis.summary import Stats, compute_stats


@dataclass(frozen=True, slots=True)
class Statistic:
    """One step: `function(*needs)` is the result called `name`; None when its first need is None (a ps-lite
    statistic of a job without ps-lite traffic)."""

    name: str
    function: Callable[..., object]
    needs: tuple[str, ...]


def pslite_trace_of(job: JobModel) -> Trace | None:
    """The job's ps-lite records (analysis.operations); None without ps-lite traffic."""
    return pslite_trace(job.pslite)


# in the order the pandas engine runs them: an error is the first step's that fails, on either engine
STATISTICS = (
    Statistic("trace", pslite_trace_of, ("job",)),
    Statistic("iterations", worker_iterations, ("trace",)),
    Statistic("keys", key_overheads, ("trace",)),
    Statistic("sizes", message_sizes, ("trace",)),
    Statistic("traffic", traffic_matrix, ("trace",)),
    Statistic("volume_iterations", volume_per_iteration, ("trace",)),
    Statistic("volume_keys", volume_per_key, ("trace",)),
    Statistic("merged", job_statistics, ("job",)),
    Statistic("collectives", collective_statistics_of, ("job",)),
    Statistic("network", network_behaviour_of, ("job", "trace")),
)


def run_step(statistic: Statistic, *needs: object) -> object:
    """One statistic of its needs' values (the function both engines call)."""
    return None if needs[0] is None else statistic.function(*needs)


def run_statistics(known: dict[str, object], *, without: tuple[str, ...] = ()) -> dict[str, object]:
    """`known` (the model as "job", or results given as they are: a trace) and every statistic whose needs are
    known, except those named in `without`."""
    results = dict(known)
    for statistic in STATISTICS:
        if statistic.name in results or statistic.name in without or any(n not in results for n in statistic.needs):
            continue
        results[statistic.name] = run_step(statistic, *(results[name] for name in statistic.needs))
    return results


def assemble(source: str | None, names: tuple[str, ...], *values: object) -> Stats:
    """The Stats of results given as names and values (the Dask engine's last task)."""
    return compute_stats(dict(zip(names, values)), source=source)


def statistics(source: str | None = None, *, without: tuple[str, ...] = (), **known: object) -> Stats:
    """Every statistic of what is known (`job=` a JobModel for all of them; `trace=` for the ps-lite ones)."""
    return compute_stats(run_statistics(known, without=without), source=source)
