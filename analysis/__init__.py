"""analysis/: from a decoded job (`dlcsniff decode` output) to SketchDLC's DLC traces, statistics and report.

load (read the decode output) → operations (records: what each node sent and received, as which of the
paper's operations, in which iteration) → dlc / iterations / overheads / pattern / summary (pure functions
over DataFrames) → report (plots, HTML). Collective operations (collectives.parquet) take the same road
through analysis.collectives. The functions below are what the CLI calls.
"""
from __future__ import annotations

from pathlib import Path

from dlcsniff.analysis.collective_stats import CollectiveStats, collective_statistics, collective_statistics_of
from dlcsniff.analysis.dlc import DLC_HEADER, DlcFile, dlc_table, read_dlc, write_dlc
from dlcsniff.analysis.latency import JobStats, job_statistics
from dlcsniff.analysis.load import (AnalysisError, CollectiveDataset, Dataset, decode_manifest, load_collectives,
                                    load_dataset, load_job_view)
from dlcsniff.decoders.timeline import JobView
from dlcsniff.analysis.operations import OPERATIONS, Trace, build_records, pslite_trace
from dlcsniff.analysis.outputs import claim, label
from dlcsniff.analysis.summary import Stats, compute_stats, headline, summary_json, write_stats

__all__ = [
    "DLC_HEADER", "OPERATIONS", "AnalysisError", "CollectiveDataset", "CollectiveStats", "Dataset", "DlcFile",
    "JobStats", "JobView", "Stats", "Trace", "build_records", "collective_statistics", "collective_statistics_of",
    "compute_stats", "decode_manifest", "dlc_table", "headline", "job_statistics", "load_collectives",
    "load_dataset", "load_job_view", "no_dlc_message", "pslite_trace", "read_dlc", "statistics_of", "summary_json",
    "trace_of", "write_dlc", "write_dlc_traces", "write_html_report", "write_statistics", "write_stats",
]


def trace_of(decode_dir: str | Path) -> Trace:
    return build_records(load_dataset(decode_dir))


def write_dlc_traces(decode_dir: str | Path, out_dir: str | Path, *, force: bool = False
                     ) -> tuple[Trace, list[DlcFile]]:
    """`dlcsniff dlc`: one DLC trace file per node of the decoded job in decode_dir (and manifest.json)."""
    trace = pslite_trace(load_dataset(decode_dir))
    if trace is None:
        raise AnalysisError(no_dlc_message(decode_dir))
    out_dir = claim(out_dir, decode_dir, force=force)
    written = write_dlc(trace, out_dir)
    label(out_dir, "dlc", decode_dir, [file.path for file in written])
    return trace, written


def no_dlc_message(decode_dir: str | Path) -> str:
    """Why a job without ps-lite traffic has no DLC trace, and where its traffic is shown instead."""
    return (f"{decode_dir}: no ps-lite message was decoded — DLC traces (SketchDLC) describe parameter-server "
            "jobs; a collective job's operations are in `dlcsniff stats` (collective_*.parquet) and "
            "`dlcsniff export --format chrome|chakra`")


def write_statistics(decode_dir: str | Path, out_dir: str | Path, *, force: bool = False) -> Stats:
    """`dlcsniff stats`: the statistics tables (Parquet) and summary.json of the decoded job, with the
    merged view's (requests, in flight, connections, key updates; analysis.latency) and its collectives'
    (and manifest.json)."""
    out_dir = claim(out_dir, decode_dir, force=force)
    stats = statistics_of(decode_dir)
    label(out_dir, "stats", decode_dir, write_stats(stats, out_dir))
    return stats


def statistics_of(decode_dir: str | Path) -> Stats:
    """Every statistic `dlcsniff stats` writes, of the decode output in decode_dir."""
    return compute_stats(pslite_trace(load_dataset(decode_dir)), source=str(decode_dir),
                         job=job_statistics(decode_dir), collectives=collective_statistics_of(decode_dir))


def write_html_report(decode_dir: str | Path, path: str | Path, figures_dir: str | Path | None = None) -> Path:
    """`dlcsniff report`: one self-contained HTML file with the figures (and them as PNG files too)."""
    from dlcsniff.analysis.report import write_report     # matplotlib: loaded only by the command that draws
    trace = pslite_trace(load_dataset(decode_dir))
    stats = compute_stats(trace, source=str(decode_dir), collectives=collective_statistics_of(decode_dir))
    return write_report(trace, stats, path, figures_dir, manifest=decode_manifest(decode_dir))
