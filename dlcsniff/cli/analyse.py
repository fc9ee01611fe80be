"""`dlcsniff dlc`, `stats` and `report`: a decode output's DLC traces, statistics and HTML report."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from dlcsniff.cli.app import (DecodeDir, Engine, Flag, Force, Json, SchedulerAddress, check_engine, command, fail,
                              out, print_losses, step, warn)


@command()
def dlc(
    decode_dir: DecodeDir,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Directory for the trace files.")],
    force: Force = False,
    as_json: Json = False,
) -> None:
    """Write every node's DLC trace (SketchDLC format): worker<rank>.txt, server<rank>.txt, scheduler.txt.

    Example: dlcsniff dlc out/mxnet_sync --out out/mxnet_sync/dlc
    """
    with step("loaded the analysis"):
        from dlcsniff.analysis import AnalysisError, load_job_model, write_dlc_traces
        from dlcsniff.analysis.names import capture_label

    try:
        with step("built and wrote the DLC traces", "building the DLC traces"):
            job = load_job_model(decode_dir)
            trace, files = write_dlc_traces(job, out_dir, force=force)
        captures = job.captures
    except AnalysisError as exc:
        fail(str(exc))
    if as_json:
        print(json.dumps({"out": str(out_dir), "mode": trace.mode, "files": [
            {"file": written.path.name, "node": written.node, "records": written.records, "vantage": written.vantage,
             "captures": written.captures} for written in files]}, indent=2))
        return
    table = Table(title=f"DLC traces in {out_dir} (kvstore {trace.mode})", title_justify="left")
    for col in ("file", "node", "records", "seen from"):
        table.add_column(col, justify="right" if col == "records" else "left")
    for written in files:
        shown = ", ".join(capture_label(capture, captures) for capture in written.captures.split(", "))
        seen = f"own capture {shown}" if written.vantage == "own" else f"peers' captures {shown}"
        table.add_row(written.path.name, written.node, f"{written.records:,}", seen)
    out.print(table)


@command(renamed={"--workers": "--processes"})
def stats(
    decode_dir: DecodeDir,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Directory for the statistics tables.")],
    force: Force = False,
    as_json: Annotated[bool, typer.Option("--json", **Flag, help="Print summary.json instead of the tables.")] = False,
    engine: Engine = "pandas",
    scheduler: SchedulerAddress = None,
    processes: Annotated[Optional[int], typer.Option(
        "--processes", min=1, metavar="N", help="Worker processes of the local Dask cluster (--engine dask; "
        "default: one per core, at most 3, the statistics' parallel branches).")] = None,
) -> None:
    """Per-iteration phases, per-key server overheads and the communication pattern (SketchDLC's statistics);
    time, bandwidth, skew, traffic matrices and overlap of collective operations; the network's behaviour
    (arrivals, burstiness, ON/OFF, incast, sizes, links, RoCE paths) and the diagnosis.

    Writes iterations.parquet, keys.parquet, sizes.parquet, traffic.parquet, volume_iterations.parquet,
    volume_keys.parquet, requests.parquet, in_flight.parquet, key_updates.parquet (ps-lite jobs),
    collective_stats.parquet, collective_ranks.parquet, collective_traffic.parquet,
    collective_concurrency.parquet, collective_overlap.parquet (collective jobs), connections.parquet,
    arrivals.parquet, arrival_spread.parquet, link_health.parquet, burstiness.parquet, on_off.parquet,
    incast.parquet, size_distributions.parquet, roce_paths.parquet, roce_collectives.parquet and
    summary.json (its "diagnosis" is what `dlcsniff diagnose --json` prints); `dlcsniff schema TABLE` says what
    each column holds. Examples: dlcsniff stats out/mxnet_sync --out out/mxnet_sync/stats;
    dlcsniff stats out/gloo --out out/gloo/stats; dlcsniff stats out/mxnet_sync --out out/mxnet_sync/stats --engine dask
    """
    check_engine(engine, scheduler)
    if processes is not None and engine != "dask":
        fail("--processes needs --engine dask (the pandas statistics run in this process)")
    with step("loaded the analysis"):
        from dlcsniff.analysis import AnalysisError, headline, load_job_model, summary_json, write_statistics
        from dlcsniff.analysis.collective_stats import KIND_TABLE_HEADER, collective_headline, collective_kind_rows
        from dlcsniff.analysis.dask_stats import write_statistics_dask
        from dlcsniff.analysis.display import number, scale_of
        from dlcsniff.decoders.errors import ClusterError
    try:
        with step(f"computed the statistics and wrote the tables ({engine})", "computing the statistics"):
            job = load_job_model(decode_dir)
            if engine == "dask":
                result = write_statistics_dask(job, out_dir, scheduler=scheduler, workers=processes, force=force)
            else:
                result = write_statistics(job, out_dir, force=force)
    except (AnalysisError, ClusterError) as exc:
        fail(str(exc))
    if mixed := job.jobs_mixed():
        warn(mixed)
    if as_json:
        print(summary_json(result))
        return
    if "statistics" in result.summary:
        figures = Table(title=f"SketchDLC figures of {decode_dir}", title_justify="left")
        figures.add_column("metric")
        figures.add_column("value", justify="right")
        for metric, value in headline(result.summary):
            figures.add_row(metric, value)
        out.print(figures)
        spread = Table(title="distribution", title_justify="left")
        for col in ("statistic", "unit", "count", "mean", "p50", "p99", "max"):
            spread.add_column(col, justify="left" if col in ("statistic", "unit") else "right")
        for name, found in result.summary["statistics"].items():
            scale, unit = scale_of(name)
            if found is None:
                spread.add_row(name, unit, "0", "n/a", "n/a", "n/a", "n/a")
            else:
                spread.add_row(name, unit, str(found["count"]),
                               *(number(found[k] * scale, unit) for k in ("mean", "p50", "p99", "max")))
        out.print(spread)
    if "collectives" in result.summary:
        collectives = Table(title=f"collectives of {decode_dir}", title_justify="left")
        collectives.add_column("metric")
        collectives.add_column("value", justify="right")
        for metric, value in collective_headline(result.summary["collectives"]):
            collectives.add_row(metric, value)
        out.print(collectives)
        kinds = Table(title="per kind (busbw as nccl-tests; skew across ranks)", title_justify="left")
        for col in KIND_TABLE_HEADER:
            kinds.add_column(col, justify="left" if col == "kind" else "right")
        for row in collective_kind_rows(result.summary["collectives"]):
            kinds.add_row(*row)
        out.print(kinds)
    if "diagnosis" in result.summary:
        out.print("diagnosis: " + "; ".join(result.summary["diagnosis"]["verdict"]), highlight=False, soft_wrap=True)
    print_losses(result.summary["losses"], result.summary["losses_explained"])
    out.print(f"wrote the tables and summary.json to {out_dir}")


@command()
def report(
    decode_dir: DecodeDir,
    out_path: Annotated[Path, typer.Option("--out", "-o", help="The HTML file to write.")],
    figures_dir: Annotated[Optional[Path], typer.Option("--figures", help="Also write every figure as "
                                                        "FIGURES/<name>.png (an output directory, with its "
                                                        "manifest.json).")] = None,
    force: Annotated[bool, typer.Option("--force", **Flag, help="Replace an earlier report (and figures) of "
                                        "`dlcsniff report` at --out and --figures (never another file).")] = False,
    as_json: Json = False,
) -> None:
    """One self-contained HTML report (figures embedded) of a decoded job.

    Example: dlcsniff report out/mxnet_sync --out out/mxnet_sync/report.html
    """
    with step("loaded the analysis"):
        from dlcsniff.analysis import AnalysisError, load_job_model, write_html_report

    try:
        with step("drew and wrote the report", "drawing the report"):
            written = write_html_report(load_job_model(decode_dir), out_path, figures_dir, force=force)
    except AnalysisError as exc:
        fail(str(exc))
    if as_json:
        print(json.dumps({"report": str(written), "bytes": written.stat().st_size,
                          "figures": str(figures_dir) if figures_dir is not None else None}, indent=2))
        return
    out.print(f"wrote {written}")
