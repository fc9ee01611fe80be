"""All statistics of a job, their summary (means and percentiles), and the files `dlcsniff stats` writes.

A job has a ps-lite trace (the SketchDLC statistics), collective operations (analysis.collective_stats), or both;
the tables and summary sections of the part it lacks are absent.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from dlcsniff.analysis.collective_stats import COLLECTIVE_LOSSES, CollectiveStats
from dlcsniff.analysis.describe import describe
from dlcsniff.analysis.display import human_bytes, number, scale_of
from dlcsniff.analysis.latency import JobStats
from dlcsniff.analysis.load import AnalysisError
from dlcsniff.analysis.network_behaviour import NetworkBehaviour
from dlcsniff.analysis.operations import CATEGORY_DATA, DLC_OPERATIONS, ROLE_WORKER, TRACE_LOSSES, Trace
from dlcsniff.analysis.overheads import KEY_LOSSES
from dlcsniff.analysis.stats_schema import STATS_TABLES


ITERATION_STATISTICS = ("phase1_s", "phase2_s", "phase3_s", "computation_s", "communication_s", "iteration_s",
                        "overlap_ratio", "wait_s")
KEY_STATISTICS = ("sync_overhead_us", "update_overhead_us", "search_overhead_us")
# what each count of the summary's "losses" is, and why it was lost (summary.json's "losses_explained")
LOSSES_EXPLAINED = {**TRACE_LOSSES, **KEY_LOSSES, **COLLECTIVE_LOSSES}


PSLITE_TABLES = ("iterations", "keys", "sizes", "traffic", "volume_iterations", "volume_keys")


def _result(name: str) -> property:
    return property(lambda stats: stats.results.get(name))


@dataclass(frozen=True, slots=True)
class Stats:
    """The summary, and the statistics' results by name (analysis.stats_graph): each a table (a DataFrame) or
    a part of several tables (the merged view's, the collectives', the network's). The ps-lite tables are
    None when the job has no ps-lite traffic; `collectives` is None when it has no collective operation."""

    summary: dict
    results: dict[str, object] = field(default_factory=dict)

    def tables(self) -> dict[str, pd.DataFrame]:
        found = {}
        for name, result in self.results.items():
            if isinstance(result, pd.DataFrame):
                found[name] = result
            elif result is not None:
                found.update(result.tables())
        return found

    # the results the report and scripts read by name (None: the job has not that part)
    iterations = _result("iterations")
    keys = _result("keys")
    sizes = _result("sizes")
    traffic = _result("traffic")
    volume_iterations = _result("volume_iterations")
    volume_keys = _result("volume_keys")
    collectives = _result("collectives")        # CollectiveStats
    network = _result("network")                # NetworkBehaviour (analysis/network_behaviour.py), with the diagnosis


def _summary(trace: Trace, iterations: pd.DataFrame, keys: pd.DataFrame, sizes: pd.DataFrame,
             traffic: pd.DataFrame, volume_iterations: pd.DataFrame, volume_keys: pd.DataFrame) -> dict:
    records = trace.records
    data = records[records["category"] == CATEGORY_DATA]
    train = data[(data["node_role"] == ROLE_WORKER) & (data["iteration"] >= 0)]
    per_worker_iteration = train.groupby(["worker_rank", "iteration"]).size()
    dlc_sizes = data[data["operation"].isin(DLC_OPERATIONS)]["length"]
    statistics = {name: describe(iterations[name]) for name in ITERATION_STATISTICS}
    statistics.update({name: describe(keys[name]) for name in KEY_STATISTICS})
    train_volume = volume_iterations[volume_iterations["phase"] == "train"]
    sparse = volume_keys["req_type"].eq("row_sparse")
    return {
        "source": None,
        "workers": trace.topology.workers, "servers": trace.topology.servers,
        "mode": trace.mode, "mode_evidence": trace.mode_evidence,
        "nodes": trace.nodes.to_dict(orient="records"),
        "iterations": {"per_worker": {str(rank): int(n) for rank, n in
                                     iterations.groupby("worker_rank").size().items()},
                       "total": int(len(iterations))},
        "tensor_keys": int(data.loc[data["tensor_key"] >= 0, "tensor_key"].nunique()),
        "records": {"total": int(len(records)),
                    "per_operation": {str(op): int(n) for op, n in
                                      records["operation"].value_counts(sort=False).items() if n},
                    "per_iteration_per_worker": describe(per_worker_iteration.to_numpy())},
        "messages": {"shortest_bytes": int(dlc_sizes.min()) if len(dlc_sizes) else None,
                     "longest_bytes": int(dlc_sizes.max()) if len(dlc_sizes) else None,
                     "per_operation": {row["operation"]: {k: v for k, v in row.items() if k != "operation"}
                                       for row in sizes.to_dict(orient="records")}},
        "statistics": statistics,
        "traffic": {"messages": int(traffic["messages"].sum()), "bytes": int(traffic["bytes"].sum())},
        "volume": {"bytes_per_worker_iteration": describe(train_volume["total_bytes"]),
                   "push_bytes_per_worker_iteration": describe(train_volume["push_bytes"]),
                   "pull_bytes_per_worker_iteration": describe(train_volume["pull_bytes"]),
                   "row_sparse_push_bytes": int(volume_keys.loc[sparse, "push_bytes"].sum()),
                   "dense_push_bytes": int(volume_keys.loc[~sparse, "push_bytes"].sum()),
                   "rows_per_row_sparse_push": describe(volume_keys.loc[sparse, "rows_per_push"])},
        "losses": {**trace.losses, "key_rounds_without_push_times": int((~keys["push_times_known"]).sum())},
    }


def compute_stats(results: dict[str, object], source: str | None = None) -> Stats:
    """The Stats of the statistics' results (analysis.stats_graph.run_statistics): the summary of the ps-lite
    tables (the "trace" and PSLITE_TABLES, None without ps-lite traffic); with "merged"
    (analysis.latency.job_statistics), its summary sections too; with "collectives"
    (analysis.collective_stats), theirs: section "collectives", and their losses among the job's; with
    "network" (analysis.network_behaviour), the sections "network" and "diagnosis" (what `dlcsniff diagnose
    --json` prints, and its verdict)."""
    trace: Trace | None = results.get("trace")
    job: JobStats | None = results.get("merged")
    collectives: CollectiveStats | None = results.get("collectives")
    network: NetworkBehaviour | None = results.get("network")
    if trace is None and collectives is None:
        raise AnalysisError(f"{source or 'the job'}: no ps-lite message and no collective operation was "
                            "decoded — nothing to analyse per tensor or collective (`dlcsniff diagnose` still "
                            "judges its links)")
    summary = {"source": source, "losses": {}}
    if trace is not None:
        summary = _summary(trace, **{name: results[name] for name in PSLITE_TABLES})
        summary["source"] = source
    if job is not None:
        summary.update(job.summary)
    if collectives is not None:
        summary["collectives"] = {name: value for name, value in collectives.summary.items() if name != "losses"}
        summary["losses"] = {**summary["losses"], **collectives.summary["losses"]}
    if network is not None:
        summary["network"] = network.summary()
        summary["diagnosis"] = {**network.diagnosis.as_json(), "verdict": network.diagnosis.verdict()}
    summary["losses_explained"] = {name: LOSSES_EXPLAINED[name] for name in summary["losses"]}
    # what is written: the tables and the parts of several (not the trace they come from)
    kept = {name: result for name, result in results.items()
            if isinstance(result, pd.DataFrame) or callable(getattr(result, "tables", None))}
    return Stats(summary=summary, results=kept)


def json_value(value):
    """NaN → null, numpy scalars → Python (summary.json must be strict JSON)."""
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def summary_json(stats: Stats) -> str:
    return json.dumps(json_value(stats.summary), indent=2, allow_nan=False)


def write_stats(stats: Stats, out_dir: str | Path) -> list[Path]:
    """STATSDIR/<table>.parquet for every table (in its schema: analysis.stats_schema), and
    STATSDIR/summary.json."""
    out_dir = Path(out_dir)
    written = []
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, table in stats.tables().items():
            path = out_dir / f"{name}.parquet"
            pq.write_table(STATS_TABLES[name].from_frame(table), path)
            written.append(path)
        path = out_dir / "summary.json"
        path.write_text(summary_json(stats) + "\n")
        written.append(path)
    except OSError as exc:
        raise AnalysisError(f"cannot write to {out_dir}: {exc.strerror or exc}") from exc
    return written


def _mean(summary: dict, name: str) -> str:
    found = summary["statistics"].get(name)
    scale, unit = scale_of(name)
    return "n/a" if found is None else f"{number(found['mean'] * scale, unit)} {unit}"


def job_rows(summary: dict) -> list[tuple[str, str]]:
    """What the job is: its shape, iterations, message sizes and records (the report shows these beside its
    own table of every statistic)."""
    messages = summary["messages"]
    per_iteration = summary["records"]["per_iteration_per_worker"]
    return [
        ("workers / servers / mode", f"{summary['workers']} / {summary['servers']} / {summary['mode']}"),
        ("iterations per worker", ", ".join(f"w{rank}: {n}" for rank, n in summary["iterations"]["per_worker"].items())
         or "none"),
        ("shortest / longest message", f"{human_bytes(messages['shortest_bytes'])} / "
                                       f"{human_bytes(messages['longest_bytes'])}"),
        ("records per iteration per worker", "n/a" if per_iteration is None else
         f"{per_iteration['mean']:.1f} ({summary['tensor_keys']} tensors)"),
    ]


def headline(summary: dict) -> list[tuple[str, str]]:
    """The paper's table (SketchDLC, Table 4 of the first version) for this job."""
    shape, iterations, sizes, records = job_rows(summary)
    return [
        shape, iterations, sizes,
        ("mean computation overhead", _mean(summary, "computation_s")),
        ("mean communication overhead", _mean(summary, "communication_s")),
        ("mean overlap ratio", _mean(summary, "overlap_ratio")),
        ("mean wait overhead", _mean(summary, "wait_s")),
        ("mean update overhead", _mean(summary, "update_overhead_us")),
        ("mean search overhead", _mean(summary, "search_overhead_us")),
        ("mean synchronization overhead", _mean(summary, "sync_overhead_us")),
        records,
    ]
