"""All statistics of a job, their summary (means and percentiles), and the files `dlcsniff stats` writes.

A job has a ps-lite trace (the SketchDLC statistics), collective operations (analysis.collectives), or both;
the tables and summary sections of the part it lacks are absent.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dlcsniff.analysis.collective_stats import CollectiveStats
from dlcsniff.analysis.describe import describe, human_bytes
from dlcsniff.analysis.iterations import worker_iterations
from dlcsniff.analysis.latency import JobStats
from dlcsniff.analysis.load import AnalysisError
from dlcsniff.analysis.operations import CATEGORY_DATA, DLC_OPERATIONS, ROLE_WORKER, Trace
from dlcsniff.analysis.overheads import key_overheads
from dlcsniff.analysis.pattern import message_sizes, traffic_matrix, volume_per_iteration, volume_per_key


ITERATION_STATISTICS = ("phase1_s", "phase2_s", "phase3_s", "computation_s", "communication_s", "iteration_s",
                        "overlap_ratio", "wait_s")
KEY_STATISTICS = ("sync_overhead_us", "update_overhead_us", "search_overhead_us")


@dataclass(frozen=True, slots=True)
class Stats:
    """The SketchDLC tables are None when the job has no ps-lite traffic; `collectives` is None when it has
    no collective operation."""

    iterations: pd.DataFrame | None
    keys: pd.DataFrame | None
    sizes: pd.DataFrame | None
    traffic: pd.DataFrame | None
    volume_iterations: pd.DataFrame | None
    volume_keys: pd.DataFrame | None
    summary: dict
    job_tables: dict[str, pd.DataFrame] = field(default_factory=dict)   # the merged view's (analysis.latency)
    collectives: CollectiveStats | None = None

    def tables(self) -> dict[str, pd.DataFrame]:
        pslite = {"iterations": self.iterations, "keys": self.keys, "sizes": self.sizes, "traffic": self.traffic,
                  "volume_iterations": self.volume_iterations, "volume_keys": self.volume_keys}
        return {**{name: table for name, table in pslite.items() if table is not None}, **self.job_tables,
                **(self.collectives.tables() if self.collectives is not None else {})}


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
        "losses": dict(trace.losses),
    }


def compute_stats(trace: Trace | None, source: str | None = None, job: JobStats | None = None,
                  collectives: CollectiveStats | None = None) -> Stats:
    """Every statistic of the issue (iterations, per-key overheads, the pattern) and their summary; with
    `job` (analysis.latency.job_statistics), the merged view's tables and summary sections too; with
    `collectives` (analysis.collectives.collective_statistics), theirs: summary section "collectives", and
    their losses among the job's. A job without ps-lite traffic has trace None."""
    if trace is None and collectives is None:
        raise AnalysisError(f"{source or 'the job'}: no ps-lite message and no collective operation was "
                            "decoded — nothing to analyse")
    pslite = dict.fromkeys(("iterations", "keys", "sizes", "traffic", "volume_iterations", "volume_keys"))
    summary = {"source": source, "losses": {}}
    if trace is not None:
        pslite = {"iterations": worker_iterations(trace), "keys": key_overheads(trace),
                  "sizes": message_sizes(trace), "traffic": traffic_matrix(trace),
                  "volume_iterations": volume_per_iteration(trace), "volume_keys": volume_per_key(trace)}
        summary = _summary(trace, **pslite)
        summary["source"] = source
    if job is not None:
        summary.update(job.summary)
    if collectives is not None:
        summary["collectives"] = {name: value for name, value in collectives.summary.items() if name != "losses"}
        summary["losses"] = {**summary["losses"], **collectives.summary["losses"]}
    return Stats(**pslite, summary=summary, job_tables=job.tables() if job is not None else {},
                 collectives=collectives)


def _json_value(value):
    """NaN → null, numpy scalars → Python (summary.json must be strict JSON)."""
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def summary_json(stats: Stats) -> str:
    return json.dumps(_json_value(stats.summary), indent=2, allow_nan=False)


def write_stats(stats: Stats, out_dir: str | Path) -> list[Path]:
    """STATSDIR/<table>.parquet for every table, and STATSDIR/summary.json."""
    out_dir = Path(out_dir)
    written = []
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, table in stats.tables().items():
            path = out_dir / f"{name}.parquet"
            table.to_parquet(path, index=False)
            written.append(path)
        path = out_dir / "summary.json"
        path.write_text(summary_json(stats) + "\n")
        written.append(path)
    except OSError as exc:
        raise AnalysisError(f"cannot write to {out_dir}: {exc.strerror or exc}") from exc
    return written


def _mean(summary: dict, name: str, scale: float, unit: str) -> str:
    found = summary["statistics"].get(name)
    return "n/a" if found is None else f"{found['mean'] * scale:,.2f} {unit}"


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
        ("mean computation overhead", _mean(summary, "computation_s", 1e3, "ms")),
        ("mean communication overhead", _mean(summary, "communication_s", 1e3, "ms")),
        ("mean overlap ratio", _mean(summary, "overlap_ratio", 100, "%")),
        ("mean wait overhead", _mean(summary, "wait_s", 1e3, "ms")),
        ("mean update overhead", _mean(summary, "update_overhead_us", 1, "µs")),
        ("mean search overhead", _mean(summary, "search_overhead_us", 1, "µs")),
        ("mean synchronization overhead", _mean(summary, "sync_overhead_us", 1, "µs")),
        records,
    ]
