"""`dlcsniff dlc`, `stats` and `report`: a decode output's DLC traces, statistics and HTML report."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from dlcsniff.cli.app import (DecodeDir, Engine, Flag, Force, Json, SchedulerAddress, check_engine, command, err,
                              fail, out)


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
    from dlcsniff.analysis import AnalysisError, write_dlc_traces

    try:
        with err.status("building the DLC traces"):
            trace, files = write_dlc_traces(decode_dir, out_dir, force=force)
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
        seen = f"own capture {written.captures}" if written.vantage == "own" else f"peers: {written.captures}"
        table.add_row(written.path.name, written.node, f"{written.records:,}", seen)
    out.print(table)


@command()
def stats(
    decode_dir: DecodeDir,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Directory for the statistics tables.")],
    force: Force = False,
    as_json: Annotated[bool, typer.Option("--json", **Flag, help="Print summary.json instead of the tables.")] = False,
    engine: Engine = "pandas",
    scheduler: SchedulerAddress = None,
    workers: Annotated[Optional[int], typer.Option(
        "--workers", min=1, metavar="N", help="Workers of the local Dask cluster (--engine dask; default: one per "
        "core, at most 3, the statistics' parallel branches).")] = None,
) -> None:
    """Per-iteration phases, per-key server overheads and the communication pattern (SketchDLC's statistics);
    time, bandwidth, skew, traffic matrices and overlap of collective operations.

    Writes iterations.parquet, keys.parquet, sizes.parquet, traffic.parquet, volume_iterations.parquet,
    volume_keys.parquet, requests.parquet, in_flight.parquet, key_updates.parquet (ps-lite jobs),
    collective_stats.parquet, collective_ranks.parquet, collective_traffic.parquet,
    collective_concurrency.parquet, collective_overlap.parquet (collective jobs), connections.parquet and
    summary.json; `dlcsniff schema TABLE` says what each column holds. Examples: dlcsniff stats out/mxnet_sync --out out/mxnet_sync/stats;
    dlcsniff stats out/gloo --out out/gloo/stats; dlcsniff stats out/mxnet_sync --out out/mxnet_sync/stats --engine dask
    """
    from dlcsniff.analysis import AnalysisError, headline, summary_json, write_statistics
    from dlcsniff.analysis.collective_stats import KIND_TABLE_HEADER, collective_headline, collective_kind_rows
    from dlcsniff.analysis.dask_stats import write_statistics_dask
    from dlcsniff.decoders.dask_cluster import ClusterError

    check_engine(engine, scheduler)
    if workers is not None and engine != "dask":
        fail("--workers needs --engine dask (the pandas statistics run in this process)")
    try:
        with err.status("computing the statistics"):
            if engine == "dask":
                result = write_statistics_dask(decode_dir, out_dir, scheduler=scheduler, workers=workers,
                                               force=force)
            else:
                result = write_statistics(decode_dir, out_dir, force=force)
    except (AnalysisError, ClusterError) as exc:
        fail(str(exc))
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
        for col in ("statistic", "count", "mean", "p50", "p99", "max"):
            spread.add_column(col, justify="left" if col == "statistic" else "right")
        for name, found in result.summary["statistics"].items():
            if found is None:
                spread.add_row(name, "0", "n/a", "n/a", "n/a", "n/a")
            else:
                spread.add_row(name, str(found["count"]), *(f"{found[k]:.4g}" for k in ("mean", "p50", "p99", "max")))
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
    losses = ", ".join(f"{name.replace('_', ' ')} {value:,}" for name, value in result.summary["losses"].items())
    out.print(f"{losses}\nwrote the tables and summary.json to {out_dir}")


@command()
def report(
    decode_dir: DecodeDir,
    out_path: Annotated[Path, typer.Option("--out", "-o", help="The HTML file to write.")],
    figures_dir: Annotated[Optional[Path], typer.Option("--figures", help="Also write every figure as "
                                                        "FIGURES/<name>.png.")] = None,
    as_json: Json = False,
) -> None:
    """One self-contained HTML report (figures embedded) of a decoded job.

    Example: dlcsniff report out/mxnet_sync --out out/mxnet_sync/report.html
    """
    from dlcsniff.analysis import AnalysisError, write_html_report

    try:
        with err.status("drawing the report"):
            written = write_html_report(decode_dir, out_path, figures_dir)
    except AnalysisError as exc:
        fail(str(exc))
    if as_json:
        print(json.dumps({"report": str(written), "bytes": written.stat().st_size,
                          "figures": str(figures_dir) if figures_dir is not None else None}, indent=2))
        return
    out.print(f"wrote {written}")
