"""The HTML report: one self-contained file over a job's statistics — its ps-lite trace's (SketchDLC's figures),
its collective operations', or both — that opens offline in any browser.

The figures people zoom (timelines, CDFs, scatter plots, traffic matrices) are interactive charts
(analysis.report_charts: JSON specs drawn by a small inlined script); the others are PNG images
(analysis.report_figures), embedded as data: URIs. `--figures DIR` writes every figure as a PNG. The page's
Content-Security-Policy forbids loading anything: every byte it shows is in the file. Its header says what
was decoded (manifest.json of the decode output: its inputs, each table with its rows and what a row is, the
decode's warnings), by which dlcsniff, which dlcsniff drew the report and when, and the one unit of each quantity
(analysis.report_data.REPORT_UNITS).
"""
from __future__ import annotations

import base64
import html
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from matplotlib.figure import Figure

from dlcsniff.decoders.output_dir import dlcsniff_version
from dlcsniff.decoders.schema import TABLES
from dlcsniff.analysis.collective_stats import KIND_TABLE_HEADER, CollectiveStats, collective_headline, collective_kind_rows
from dlcsniff.analysis.display import duration, human_bytes, number, percent, scale_of
from dlcsniff.analysis.load import AnalysisError
from dlcsniff.analysis.names import capture_label, capture_labels, node_label, rank_label
from dlcsniff.analysis.operations import CATEGORY_DATA, Trace
from dlcsniff.analysis.report_charts import (
    chart_html, chart_script, collective_bandwidth_chart, collective_matrix_charts, collective_time_chart,
    collective_timeline_chart, size_cdf_chart, timeline_chart, traffic_chart,
)
from dlcsniff.analysis.report_data import REPORT_UNITS, request_spans
from dlcsniff.analysis.report_diagnosis import arrival_lag_figure, diagnosis_section, network_section
from dlcsniff.analysis.report_figures import (
    collective_bandwidth_figure, collective_matrix_figure, collective_skew_figure, collective_time_figure,
    collective_timeline_figure, drawn_key_statistics, figure_png, iteration_figure, key_overhead_figure,
    size_cdf_figure, timeline_figure, traffic_figure,
)
from dlcsniff.analysis.report_whatif import WhatIfCurve, whatif_chart, whatif_figure
from dlcsniff.analysis.summary import ITERATION_STATISTICS, KEY_STATISTICS, Stats, job_rows

NOT_MEASURED = {
    "sync_overhead_us": "servers do not wait for every worker (async mode)",
    "update_overhead_us": "no push was answered in the capture",
    "search_overhead_us": "no explicit pull after initialisation (MXNet 1.9.1 push-pull fetches the values)",
}
NO_ITERATION = "no training iteration: every push was its tensor's first (initialisation)"
# what every statistic of the summary is (its unit on the page: analysis.display.scale_of)
STATISTIC_ROWS = {
    "phase1_s": "P1: previous iteration's last values → first push",
    "phase2_s": "P2: first → last push",
    "phase3_s": "P3: first push → last values",
    "computation_s": "computation, P1 + P2",
    "communication_s": "communication, P3",
    "iteration_s": "iteration, P1 + P3",
    "overlap_ratio": "overlap ratio, P2 / (P1 + P3)",
    "wait_s": "wait: first → last values",
    "sync_overhead_us": "server synchronisation overhead",
    "update_overhead_us": "server update overhead",
    "search_overhead_us": "server search overhead",
}
CONTENT_SECURITY_POLICY = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"
STYLE = """body{font-family:sans-serif;max-width:1280px;margin:1.5em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:0.8em 0}th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f4f4f4;text-align:left}td.text{text-align:left}figure{margin:2.5em 0}img{max-width:100%}
figcaption{color:#444;font-size:90%;margin:0.4em 0}figcaption b{color:#222}
nav{font-size:90%}nav a{margin-right:1em}code{font-size:90%}
.chart{position:relative;margin:0.4em 0}.chart canvas{display:block}.pair{display:flex;flex-wrap:wrap;gap:2em}
.pair .chart{flex:1 1 420px}.chart h4{margin:0.2em 0;font-weight:normal}
.chart-tools{font-size:80%;color:#666;margin-bottom:4px}.chart-tools button{margin-right:1em}
.chart-tip{position:absolute;display:none;pointer-events:none;background:#fff;border:1px solid #999;
padding:4px 8px;font-size:12px;box-shadow:2px 2px 6px rgba(0,0,0,.2);z-index:10;white-space:nowrap}
.chart-legend{font-size:12px;margin-top:4px}.chart-legend button{border:0;background:none;cursor:pointer;
margin-right:0.8em;padding:2px}.chart-legend button.off{opacity:0.35}
.chart-legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}"""


@dataclass(frozen=True, slots=True)
class ReportFigure:
    """A figure of the report: its static drawing (always: `--figures`), and the interactive charts that
    stand for it in the page when it has some (title, spec)."""

    name: str
    title: str
    caption: str
    draw: Callable[[], Figure]
    charts: Callable[[], list[tuple[str, dict]]] | None = None


def report_figures(trace: Trace | None, stats: Stats, whatif: WhatIfCurve | None = None) -> list[ReportFigure]:
    """Every figure the job's data can fill: the ps-lite trace's when it has data messages, the
    collectives' when there are some; the what-if curve when `whatif` has one (analysis.report_whatif)."""
    figures = []
    if trace is not None and (trace.records["category"] == CATEGORY_DATA).any():
        figures += _pslite_figures(trace, stats)
    if stats.collectives is not None:
        figures += _collective_figures(stats.collectives)
    if stats.network is not None and len(stats.network.diagnosis.arrivals):
        figures.append(ReportFigure(
            "arrival_lags", "Arrival lags",
            "Each rank's entry into each collective (each worker's into each sync round) minus the other ranks' "
            "median entry; circled: the stragglers of the diagnosis (symmetric log scale beyond 1 ms).",
            lambda: arrival_lag_figure(stats.network)))
    if whatif is not None and whatif.curve is not None:
        figures.append(ReportFigure(
            "whatif", "What-if: iteration time against link rate",
            "The job's mean iteration time (stats' definition) if every node's link ran at each rate, each way, "
            f"predicted by `dlcsniff simulate`: {whatif.note}; the red point is the capture's measured mean at "
            "its network's calibrated link rate. Not modelled: CPU contention that changes with the rate, TCP "
            "losses and timeouts.", lambda: whatif_figure(whatif), lambda: [("", whatif_chart(whatif))]))
    return figures


def _pslite_figures(trace: Trace, stats: Stats) -> list[ReportFigure]:
    figures = [ReportFigure(
        "message_sizes", "Message sizes",
        "Each data message counted once, by kind (the paper's eight operations are each message's two ends: "
        "a push request is Push_Send_Worker at the worker and Push_Recv_Server at the server). Kinds whose "
        "sizes are all equal (MXNet's push-pull request and its response carry the same tensor) are one curve.",
        lambda: size_cdf_figure(trace), lambda: [("", size_cdf_chart(trace))])]
    if len(request_spans(trace)):
        figures.append(ReportFigure(
            "timeline", "Timeline of every request",
            "Every iteration of every worker: each request from its send to the receipt of its answer, one row "
            "per tensor@server (packed rows per server when a worker has many tensors); a worker's first row "
            "holds its iterations (hover: phases P1–P3). Grey: initialisation (kv.init, the broadcast pulls).",
            lambda: timeline_figure(trace, stats), lambda: [("", timeline_chart(trace, stats))]))
    if len(stats.iterations):
        figures.append(ReportFigure(
            "iterations", "Iterations",
            "Overlap ratio and computation / communication time per iteration (phases as defined in SketchDLC; "
            "MXNet 1.9.1's fused push-pull counts as push and pull).", lambda: iteration_figure(stats)))
    drawn = drawn_key_statistics(stats) if stats.keys is not None else []
    if drawn:
        not_drawn = [f"{STATISTIC_ROWS[name]}: " + (NOT_MEASURED[name] if stats.keys[name].isna().all()
                                                        else "0 for every tensor (one worker waits for no other)")
                     for name in KEY_STATISTICS if name not in drawn]
        figures.append(ReportFigure(
            "key_overheads", "Server overheads per tensor",
            "Server-side overheads per tensor, one box per (tensor, server) over the iterations, ordered by "
            "message size." + (f" No panel for the {'; the '.join(not_drawn)}." if not_drawn else ""),
            lambda: key_overhead_figure(stats)))
    figures.append(ReportFigure(
        "traffic", "Traffic matrix", "Bytes between nodes (DLC ranks: workers, servers, scheduler).",
        lambda: traffic_figure(stats, trace), lambda: [("", traffic_chart(stats, trace))]))
    return figures


def _collective_figures(collectives: CollectiveStats) -> list[ReportFigure]:
    return [
        ReportFigure("collective_timeline", "Collectives over time",
                     "Each rank's collectives over time and the computation gaps between them; a black strip where "
                     "two or more are in flight.", lambda: collective_timeline_figure(collectives),
                     lambda: [("", collective_timeline_chart(collectives))]),
        ReportFigure("collective_times", "Time per collective",
                     "Time per collective by kind and size S; a rank's time runs from the first to the last byte "
                     "of the operation on its wire. Large markers: across ranks (first start → last end); small: "
                     "each rank's.", lambda: collective_time_figure(collectives),
                     lambda: [("", collective_time_chart(collectives))]),
        ReportFigure("collective_bandwidth", "Bus bandwidth",
                     "Bus bandwidth against size, as nccl-tests define it (all-reduce 2(n−1)/n; all-gather, "
                     "reduce-scatter, all-to-all, gather, scatter (n−1)/n; others 1).",
                     lambda: collective_bandwidth_figure(collectives),
                     lambda: [("", collective_bandwidth_chart(collectives))]),
        ReportFigure("collective_skew", "Skew across ranks",
                     "How far apart the ranks started and ended each collective (log scale; below the captures' "
                     "1 µs resolution drawn at 1 µs).", lambda: collective_skew_figure(collectives)),
        ReportFigure("collective_matrix", "Traffic between ranks",
                     "Payload bytes between ranks, each message counted once; a rank's own all-to-all chunk never "
                     "crosses the network (empty diagonal).", lambda: collective_matrix_figure(collectives),
                     lambda: [(f"Payload bytes, {title}", spec)
                              for title, spec in collective_matrix_charts(collectives).items()]),
    ]


# -- tables --------------------------------------------------------------------------------------------------

def _table(rows: list[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td class='text'>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def _grid(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """A table with a header row; each row's first cell is its name."""
    head = "<tr>" + "".join(f"<th>{html.escape(name)}</th>" for name in header) + "</tr>"
    body = "".join("<tr><th>" + html.escape(row[0]) + "</th>" + "".join(f"<td>{html.escape(v)}</td>" for v in row[1:])
                   + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def _losses_table(summary: dict) -> str:
    """Each count of what could not be measured, with what it is and why (the summary's losses_explained)."""
    rows = "".join(f"<tr><th>{html.escape(name.replace('_', ' '))}</th><td>{value:,}</td>"
                   f"<td class='text'>{html.escape(summary['losses_explained'][name])}</td></tr>"
                   for name, value in summary["losses"].items())
    return f"<table>{rows}</table>"


def _statistics_table(summary: dict) -> str:
    header = ("statistic", "unit", "count", "mean", "min", "p50", "p90", "p99", "max")
    head = "<tr>" + "".join(f"<th>{name}</th>" for name in header) + "</tr>"
    rows = []
    for name in ITERATION_STATISTICS + KEY_STATISTICS:
        label, (scale, unit) = STATISTIC_ROWS[name], scale_of(name)
        found = summary["statistics"].get(name)
        if found is None:
            why = (NO_ITERATION if not summary["iterations"]["total"]
                   else NOT_MEASURED.get(name, "no iteration with all three phases"))
            cells = f"<td>0</td><td class='text' colspan='6'>n/a: {html.escape(why)}</td>"
        else:
            cells = f"<td>{found['count']:,}</td>" + "".join(
                f"<td>{number(found[k] * scale, unit)}</td>" for k in ("mean", "min", "p50", "p90", "p99", "max"))
        rows.append(f"<tr><th>{html.escape(label)}</th><td class='text'>{unit}</td>{cells}</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


# -- the page ------------------------------------------------------------------------------------------------

def _inputs(manifest: dict) -> list[str]:
    described = []
    for found in manifest.get("inputs") or ():
        size = found.get("size_bytes")
        digest = found.get("sha256")
        described.append(found.get("path", "?") + ("" if size is None else f" ({human_bytes(size)})")
                         + ("" if not digest else f", sha256 {digest}"))
    return described


def header_rows(source: str, manifest: dict | None, drawn_at: datetime) -> list[tuple[str, str]]:
    """What the report is of, made by what, and when; its units."""
    rows = [("decode output", source)]
    if manifest is None:
        rows.append(("decoded by", "unknown: the decode output has no manifest.json (written before dlcsniff "
                                   "recorded one)"))
    else:
        command = manifest.get("command")
        rows.append(("decoded by", f"dlcsniff {manifest.get('dlcsniff', '?')}"
                                   + (f": {shlex.join(command)}" if command else "")))
        rows.append(("decode inputs", "; ".join(_inputs(manifest)) or "not recorded"))
        for name, found in (manifest.get("files") or {}).items():
            table = TABLES.get(name.removesuffix(".parquet"))
            rows.append((name, f"{found.get('rows', 0):,} rows" + (f", one per {table.description}" if table else "")))
        if "warnings" in manifest:
            rows += [("decode warning", warning) for warning in manifest["warnings"]] or [("decode warnings", "none")]
    rows.append(("report drawn by", f"dlcsniff {dlcsniff_version()} on {drawn_at.isoformat(timespec='seconds')}"))
    rows.append(("units", "; ".join(f"{quantity}: {unit}" for quantity, unit in REPORT_UNITS)))
    return rows


def _pslite_sections(trace: Trace, summary: dict, captures: dict[str, str]) -> list[str]:
    nodes = [(f"{node_label(row['role'], row['rank'])} (DLC rank {row['dlc_rank']})",
              f"{row['vantage']} capture: " + ", ".join(capture_label(c, captures) for c in row["captures"].split(", ")))
             for row in summary["nodes"]]
    return [
        "<h2 id='pslite'>ps-lite job</h2>",
        f"<p>kvstore mode <b>{trace.mode}</b> ({html.escape(trace.mode_evidence)}).</p>", _table(job_rows(summary)),
        "<h3>Statistics (per worker iteration; per server, tensor and iteration)</h3>", _statistics_table(summary),
        "<h3>Where each node was seen</h3>", _table(nodes),
    ]


def _collective_sections(collectives: CollectiveStats, captures: dict[str, str]) -> list[str]:
    def ms(ns: float) -> str:
        return duration(ns, "ns", with_unit=False)

    per_rank = [(f"{rank_label(row.rank)} (capture {capture_label(row.capture, captures)})",
                 ms(row.wall_ns), ms(row.communication_ns), ms(row.gap_ns), f"{row.gaps:,}", ms(row.longest_gap_ns),
                 ms(row.concurrent_ns), percent(row.communication_fraction, with_unit=False))
                for row in collectives.overlap.itertuples()]
    return [
        "<h2 id='collectives'>Collective operations</h2>", _table(collective_headline(collectives.summary)),
        "<h3>Per kind (busbw as nccl-tests define it; skew: max − min over the ranks)</h3>",
        _grid(KIND_TABLE_HEADER, collective_kind_rows(collectives.summary)),
        "<h3>Per rank: communication and the gaps between</h3>",
        _grid(("rank", "wall ms", "communication ms", "gaps total ms", "gaps", "longest gap ms", "2+ in flight ms",
               "communication %"), per_rank),
    ]


def _figure_html(figure: ReportFigure, png: Callable[[ReportFigure], bytes]) -> str:
    caption = f"<figcaption><b>{html.escape(figure.title)}.</b> {html.escape(figure.caption)}</figcaption>"
    if figure.charts is None:
        encoded = base64.b64encode(png(figure)).decode("ascii")
        body = f"<img alt='{html.escape(figure.title)}' src='data:image/png;base64,{encoded}'>"
    else:
        charts = figure.charts()
        parts = [(f"<div><h4>{html.escape(title)}</h4>" if title else "<div>") + chart_html(f"{figure.name}-{index}", spec)
                 + "</div>" for index, (title, spec) in enumerate(charts)]
        body = f"<div class='pair'>{''.join(parts)}</div>" if len(parts) > 1 else parts[0]
    return f"<figure id='{figure.name}'>{caption}{body}</figure>"


def report_html(trace: Trace | None, stats: Stats, figures: list[ReportFigure], png: Callable[[ReportFigure], bytes],
                manifest: dict | None, drawn_at: datetime) -> str:
    summary = stats.summary
    captures = capture_labels(manifest)
    source = str(summary.get("source") or "trace")
    network = stats.network
    contents = ([("diagnosis", "Diagnosis")] if network is not None else []) + [("about", "About")] + (
        [("pslite", "ps-lite job")] if trace is not None else []) + (
        [("collectives", "Collectives")] if stats.collectives is not None else []) + (
        [("network", "Network behaviour")] if network is not None else []) + [
        ("losses", "Not measured")] + [(figure.name, figure.title) for figure in figures]
    parts = [
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>{GENERATOR_META}",
        f"<meta http-equiv='Content-Security-Policy' content=\"{CONTENT_SECURITY_POLICY}\">",
        f"<title>dlcsniff report: {html.escape(source)}</title><style>{STYLE}</style></head><body>",
        f"<h1>dlcsniff report: {html.escape(source)}</h1>",
        "<nav>" + "".join(f"<a href='#{name}'>{html.escape(title)}</a>" for name, title in contents) + "</nav>",
        *(diagnosis_section(network) if network is not None else ()),
        "<section id='about'>", _table(header_rows(source, manifest, drawn_at)), "</section>",
        *(_pslite_sections(trace, summary, captures) if trace is not None else ()),
        *(_collective_sections(stats.collectives, captures) if stats.collectives is not None else ()),
        *(network_section(network) if network is not None else ()),
        "<h2 id='losses'>What could not be measured</h2>",
        _losses_table(summary),
        "<h2>Figures</h2>",
        *(_figure_html(figure, png) for figure in figures),
        f"<script>{chart_script()}</script>" if any(figure.charts for figure in figures) else "",
        "</body></html>",
    ]
    return "\n".join(parts)


# in the page's first bytes: what tells a report dlcsniff wrote (decoders.output_dir.claim_output_file)
GENERATOR_META = "<meta name='generator' content='dlcsniff report'>"


def write_report(trace: Trace | None, stats: Stats, path: str | Path, figures_dir: str | Path | None = None,
                 manifest: dict | None = None, drawn_at: datetime | None = None,
                 whatif: WhatIfCurve | None = None) -> Path:
    """The HTML report at `path`; with figures_dir, every figure also as figures_dir/<name>.png. A job
    without ps-lite traffic has trace None; `manifest` is the decode output's manifest.json; `whatif` the
    what-if curve (analysis.report_whatif)."""
    path = Path(path)
    figures = report_figures(trace, stats, whatif)
    if not figures:
        raise AnalysisError("no ps-lite data message and no collective operation was decoded: nothing to report "
                            "(were the workers' push/pull messages captured?)")
    drawn = {}

    def png(figure: ReportFigure) -> bytes:
        if figure.name not in drawn:
            drawn[figure.name] = figure_png(figure.draw())
        return drawn[figure.name]

    page = report_html(trace, stats, figures, png, manifest, drawn_at or datetime.now(timezone.utc))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page, encoding="utf-8")
        if figures_dir is not None:
            Path(figures_dir).mkdir(parents=True, exist_ok=True)
            for figure in figures:
                (Path(figures_dir) / f"{figure.name}.png").write_bytes(png(figure))
    except OSError as exc:
        raise AnalysisError(f"cannot write {exc.filename or path}: {exc.strerror or exc}") from exc
    return path
