"""analysis/: from a decoded job (`dlcsniff decode` output) to SketchDLC's DLC traces, statistics and report.

load (parse the decode output) → job_model (the job, loaded once: every analyzer is a function of it) →
operations (records: what each node sent and received, as which of the paper's operations, in which
iteration) → dlc / iterations / overheads / pattern / collective_stats / … (pure functions over DataFrames,
run as one graph: stats_graph) → report (plots, HTML). The functions below are what the CLI calls, each
with the model the CLI loaded.
"""
from __future__ import annotations

from pathlib import Path

from dlcsniff.analysis.collective_stats import CollectiveStats, collective_statistics, collective_statistics_of
from dlcsniff.analysis.dlc import DLC_HEADER, DlcFile, dlc_table, read_dlc, write_dlc
from dlcsniff.analysis.job_model import JobModel, load_job_model
from dlcsniff.analysis.latency import JobStats, job_statistics
from dlcsniff.analysis.load import (AnalysisError, CollectiveDataset, Dataset, decode_manifest, load_collectives,
                                    load_dataset, load_job_view)
from dlcsniff.decoders.timeline import JobView
from dlcsniff.analysis.operations import OPERATIONS, Trace, build_records, pslite_trace
from dlcsniff.analysis.outputs import claim, claim_file, label
from dlcsniff.analysis.stats_graph import STATISTICS, Statistic, run_statistics, statistics
from dlcsniff.analysis.summary import Stats, compute_stats, headline, summary_json, write_stats

__all__ = [
    "DLC_HEADER", "OPERATIONS", "STATISTICS", "AnalysisError", "CollectiveDataset", "CollectiveStats", "Dataset",
    "DlcFile", "JobModel", "JobStats", "JobView", "Statistic", "Stats", "Trace", "build_records",
    "collective_statistics", "collective_statistics_of", "compute_stats", "decode_manifest", "dlc_table",
    "headline", "job_statistics", "load_collectives", "load_dataset", "load_job_model", "load_job_view",
    "no_dlc_message", "pslite_trace", "read_dlc", "run_statistics", "statistics", "statistics_of", "summary_json",
    "write_dlc", "write_dlc_traces", "write_html_report", "write_statistics", "write_stats",
]


def write_dlc_traces(job: JobModel, out_dir: str | Path, *, force: bool = False) -> tuple[Trace, list[DlcFile]]:
    """`dlcsniff dlc`: one DLC trace file per node of the decoded job (and manifest.json)."""
    trace = pslite_trace(job.pslite)
    if trace is None:
        raise AnalysisError(no_dlc_message(job.path))
    out_dir = claim(out_dir, job.path, kind="dlc", force=force)
    written = write_dlc(trace, out_dir, job.captures)
    label(out_dir, "dlc", job, [file.path for file in written])
    return trace, written


def no_dlc_message(decode_dir: str | Path) -> str:
    """Why a job without ps-lite traffic has no DLC trace, and where its traffic is shown instead."""
    return (f"{decode_dir}: no ps-lite message was decoded — DLC traces (SketchDLC) describe parameter-server "
            "jobs; a collective job's operations are in `dlcsniff stats` (collective_*.parquet) and "
            "`dlcsniff export --format chrome|chakra`")


def write_statistics(job: JobModel, out_dir: str | Path, *, force: bool = False) -> Stats:
    """`dlcsniff stats`: the statistics tables (Parquet) and summary.json of the decoded job (and
    manifest.json)."""
    out_dir = claim(out_dir, job.path, kind="stats", force=force)
    stats = statistics_of(job)
    label(out_dir, "stats", job, write_stats(stats, out_dir))
    return stats


def statistics_of(job: JobModel) -> Stats:
    """Every statistic `dlcsniff stats` writes (analysis.stats_graph), computed here."""
    return statistics(job.source, job=job)


def write_html_report(job: JobModel, path: str | Path, figures_dir: str | Path | None = None, *,
                      force: bool = False) -> Path:
    """`dlcsniff report`: one self-contained HTML file with the figures (and them as PNG files in figures_dir,
    an output directory with its manifest). Both are claimed before any drawing (analysis.outputs); `force`
    replaces an earlier report and figures."""
    from dlcsniff.analysis.report import GENERATOR_META, write_report     # matplotlib: loaded only to draw
    from dlcsniff.analysis.report_whatif import whatif_curve
    job.pslite                                 # first: is it a decode output at all?
    path = claim_file(path, marker=GENERATOR_META.encode(), command="dlcsniff report", force=force)
    if figures_dir is not None:
        figures_dir = claim(figures_dir, job.path, kind="figures", force=force)
    # the report draws no merged-view table: those statistics are not computed for it
    results = run_statistics({"job": job}, without=("merged",))
    stats = compute_stats(results, source=job.source)
    written = write_report(results["trace"], stats, path, figures_dir, manifest=job.manifest,
                           whatif=whatif_curve(job))
    if figures_dir is not None:     # claimed empty of anything else: its figures are what the report drew
        label(figures_dir, "figures", job, sorted(figures_dir.glob("*.png")))
    return written
