"""The HTML report: one self-contained file (figures embedded as PNG data: URIs) over a trace's statistics.

Plotting lives here only; the analyzers return DataFrames and know nothing of it. Figures are built with
matplotlib's object API (no pyplot, no global state): PNG rendering needs no display.
"""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from analysis.load import AnalysisError
from analysis.operations import (
    CATEGORY_DATA, DLC_OPERATIONS, LONG_OPERATIONS, ROLE_WORKER, SLOT_PULL_RESPONSE, SLOT_PUSH_REQUEST, Trace,
)
from analysis.summary import ITERATION_STATISTICS, KEY_STATISTICS, Stats, headline, human_bytes

CDF_POINTS = 512                  # quantiles drawn per operation: enough for a smooth curve at any size
MAX_TIMELINE_WORKERS = 8
MAX_BOX_KEYS = 60                 # the largest tensors, when a model has more
DPI = 110
NOT_MEASURED = {
    "sync_overhead_us": "n/a: servers do not wait for every worker (async mode)",
    "update_overhead_us": "n/a: no push was answered in the capture",
    "search_overhead_us": "n/a: no explicit pull after initialisation (MXNet 1.9.1 push-pull fetches the values)",
}


def size_cdf_figure(trace: Trace) -> Figure:
    records = trace.records
    figure = Figure(figsize=(8, 4.5))
    axis = figure.subplots()
    quantiles = np.linspace(0, 1, CDF_POINTS + 1)
    for operation in DLC_OPERATIONS:
        lengths = records.loc[records["operation"] == operation, "length"].to_numpy()
        if len(lengths) == 0:
            continue
        style = "-" if operation in LONG_OPERATIONS else "--"
        axis.step(np.quantile(lengths, quantiles), quantiles, where="post", linestyle=style,
                  label=f"{operation} ({len(lengths)})")
    axis.set_xscale("log")
    axis.set_xlabel("message length, meta + data (bytes)")
    axis.set_ylabel("fraction of messages")
    axis.set_title("Message size per operation (solid: long operations, dashed: short)")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    return figure


def iteration_figure(stats: Stats) -> Figure:
    iterations = stats.iterations
    figure = Figure(figsize=(11, 4.2))
    left, right = figure.subplots(1, 2)
    ratios = iterations["overlap_ratio"].replace([np.inf, -np.inf], np.nan).dropna()
    if len(ratios):
        left.hist(ratios * 100, bins=min(30, max(5, len(ratios) // 2)), color="tab:purple", alpha=0.8)
    left.set_xlabel("overlap ratio P2 / (P1 + P3) (%)")
    left.set_ylabel("iterations")
    left.set_title("Overlap ratio per iteration")
    for rank, mine in iterations.groupby("worker_rank"):
        right.plot(mine["iteration"], mine["computation_s"] * 1e3, marker="o", label=f"worker{rank} computation")
        right.plot(mine["iteration"], mine["communication_s"] * 1e3, marker="s", linestyle="--",
                   label=f"worker{rank} communication")
    right.set_xlabel("iteration")
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_ylabel("ms")
    right.set_title("Computation (P1 + P2) and communication (P3)")
    right.grid(True, alpha=0.3)
    right.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    return figure


def key_overhead_figure(stats: Stats) -> Figure:
    keys = stats.keys
    sizes = keys.groupby(["server_rank", "tensor_key"])["size_bytes"].max().dropna().sort_values()
    sizes = sizes.iloc[-MAX_BOX_KEYS:]
    figure = Figure(figsize=(max(8, 0.35 * len(sizes) + 3), 9))
    axes = figure.subplots(len(KEY_STATISTICS), 1, sharex=True)
    positions = np.arange(len(sizes))
    labels = [f"k{key}@s{server}\n{human_bytes(float(size))}" for (server, key), size in sizes.items()]
    grouped = keys.groupby(["server_rank", "tensor_key"])
    for axis, name in zip(axes, KEY_STATISTICS):
        samples = [grouped.get_group(index)[name].dropna().to_numpy() for index in sizes.index]
        shown = [(pos, sample) for pos, sample in zip(positions, samples) if len(sample)]
        if shown:
            axis.boxplot([sample for _, sample in shown], positions=[pos for pos, _ in shown], widths=0.6)
        else:
            axis.text(0.5, 0.5, NOT_MEASURED[name], transform=axis.transAxes, ha="center", va="center",
                      color="gray")
        axis.set_ylabel(f"{name.removesuffix('_us').replace('_', ' ')} (µs)")
        axis.grid(True, axis="y", alpha=0.3)
    axes[-1].set_xticks(positions, labels, fontsize=7)
    axes[-1].set_xlim(-0.7, len(sizes) - 0.3)
    axes[-1].set_xlabel("tensor key @ server, ordered by message size")
    axes[0].set_title("Per-key server overheads per iteration")
    figure.tight_layout()
    return figure


def traffic_figure(stats: Stats, trace: Trace) -> Figure:
    nodes = trace.nodes.sort_values("dlc_rank")
    ranks = nodes["dlc_rank"].to_numpy()
    matrix = (stats.traffic.pivot_table(index="src_rank", columns="dst_rank", values="bytes", aggfunc="sum")
              .reindex(index=ranks, columns=ranks).to_numpy(dtype=np.float64))
    size = min(10, 3 + 0.5 * len(ranks))
    figure = Figure(figsize=(size + 1.5, size))
    axis = figure.subplots()
    masked = np.ma.masked_invalid(np.where(matrix > 0, matrix, np.nan))
    image = axis.imshow(masked, cmap="viridis", norm=LogNorm() if masked.count() else None)
    names = [f"{name} ({rank})" for name, rank in zip(nodes["name"], ranks)]
    axis.set_xticks(range(len(ranks)), names, rotation=45, ha="right", fontsize=8)
    axis.set_yticks(range(len(ranks)), names, fontsize=8)
    if len(ranks) <= 12 and masked.count():
        for (row, column), value in np.ndenumerate(matrix):
            if value > 0:
                bright = image.norm(value) > 0.6          # viridis turns yellow: dark text there
                axis.text(column, row, human_bytes(value), ha="center", va="center", fontsize=7,
                          color="black" if bright else "white")
    axis.set_xlabel("receiver (DLC rank)")
    axis.set_ylabel("sender (DLC rank)")
    axis.set_title("Traffic matrix: bytes sent, sender × receiver")
    figure.colorbar(image, ax=axis, label="bytes")
    figure.tight_layout()
    return figure


def _timeline_iteration(stats: Stats, rank: int) -> int | None:
    """A representative iteration: the median one among those with all phases known."""
    mine = stats.iterations[(stats.iterations["worker_rank"] == rank)]
    known = mine.dropna(subset=["phase1_s", "phase3_s"])
    chosen = known if len(known) else mine
    return None if len(chosen) == 0 else int(chosen["iteration"].iloc[len(chosen) // 2])


def timeline_figure(trace: Trace, stats: Stats) -> Figure:
    records = trace.records
    workers = sorted(stats.iterations["worker_rank"].unique())[:MAX_TIMELINE_WORKERS]
    figure = Figure(figsize=(13, 2.2 + 1.6 * max(len(workers), 1)))
    axes = figure.subplots(max(len(workers), 1), 1, squeeze=False)
    for axis, rank in zip(axes[:, 0], workers):
        iteration = _timeline_iteration(stats, rank)
        row = stats.iterations[(stats.iterations["worker_rank"] == rank)
                               & (stats.iterations["iteration"] == iteration)].iloc[0]
        mine = records[(records["node_role"] == ROLE_WORKER) & (records["worker_rank"] == rank)
                       & (records["category"] == CATEGORY_DATA) & (records["iteration"] == iteration)]
        origin = int(row["start_ts_ns"])
        answers = mine[(mine["slot"] % 2 == 1) & (mine["request_ts_ns"] >= 0)]
        lane_names = answers["tensor_key"].astype(str) + "@s" + answers["server_rank"].astype(str)
        lanes = pd.Categorical(lane_names, categories=sorted(lane_names.unique()))
        begin = (answers["request_ts_ns"].to_numpy() - origin) / 1e6
        end = (answers["ts_ns"].to_numpy() - origin) / 1e6
        fused = answers["fused"].to_numpy()
        pull = (answers["slot"].to_numpy() == SLOT_PULL_RESPONSE) & ~fused
        for chosen, color, label in ((pull, "tab:orange", "pull request → values"),
                                     (fused, "tab:green", "push-pull request → updated values"),
                                     (~pull & ~fused, "tab:blue", "push → acknowledgement")):
            if chosen.any():
                axis.barh(lanes.codes[chosen], (end - begin)[chosen], left=begin[chosen], height=0.6,
                          color=color, label=label)
        pushes = mine.loc[mine["slot"] == SLOT_PUSH_REQUEST, "ts_ns"]
        marks = [("last values of t-1 (P1 starts)", 0.0, ":")]
        if len(pushes):
            marks += [("first push (P2, P3 start)", (pushes.min() - origin) / 1e6, "--"),
                      ("last push (P2 ends)", (pushes.max() - origin) / 1e6, "-.")]
        if np.isfinite(row["phase3_s"]) and len(pushes):
            marks.append(("last values (P3 ends)", (pushes.min() - origin) / 1e6 + row["phase3_s"] * 1e3, "-"))
        for label, x, style in marks:
            axis.axvline(x, color="gray", linestyle=style, linewidth=1, label=label)
        axis.set_yticks(range(len(lanes.categories)), [f"k{lane}" for lane in lanes.categories], fontsize=7)
        axis.set_title(f"worker{rank}, iteration {iteration}: P1 {row['phase1_s'] * 1e3:.2f} ms, "
                       f"P2 {row['phase2_s'] * 1e3:.2f} ms, P3 {row['phase3_s'] * 1e3:.2f} ms", fontsize=9)
        handles, labels = axis.get_legend_handles_labels()
        unique = dict(zip(labels, handles))
        axis.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        axis.grid(True, axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("ms since the iteration started (the previous iteration's last values arrived)")
    figure.tight_layout()
    return figure


def rendered_figures(trace: Trace, stats: Stats) -> dict[str, tuple[str, bytes]]:
    """name → (caption, PNG) of every figure in the report."""
    drawn = {
        "message_sizes": ("Distribution of message length per operation (the paper's long/short split; each "
                          "message counts once at its sender and once at its receiver).", size_cdf_figure(trace)),
        "iterations": ("Overlap ratio and computation/communication time per iteration (phases as defined in "
                       "SketchDLC; MXNet 1.9.1's fused push-pull counts as push and pull).",
                       iteration_figure(stats)),
        "key_overheads": ("Server-side overheads per tensor, one box per (tensor, server) over the iterations, "
                          "ordered by message size.", key_overhead_figure(stats)),
        "traffic": ("Bytes between nodes (ranks: workers, servers, scheduler).", traffic_figure(stats, trace)),
        "timeline": ("One iteration per worker: every request from its send to the receipt of its answer.",
                     timeline_figure(trace, stats)),
    }
    return {name: (caption, figure_png(figure)) for name, (caption, figure) in drawn.items()}


def figure_png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _table(rows: list[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def _statistics_table(summary: dict) -> str:
    header = "<tr><th>statistic</th>" + "".join(f"<th>{name}</th>" for name in
                                                ("count", "mean", "min", "p50", "p90", "p99", "max")) + "</tr>"
    rows = []
    for name in ITERATION_STATISTICS + KEY_STATISTICS:
        found = summary["statistics"].get(name)
        values = ["n/a"] * 7 if found is None else [str(found["count"])] + [
            f"{found[k]:.4g}" for k in ("mean", "min", "p50", "p90", "p99", "max")]
        rows.append(f"<tr><th>{name}</th>" + "".join(f"<td>{v}</td>" for v in values) + "</tr>")
    return f"<table>{header}{''.join(rows)}</table>"


STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f4f4f4;text-align:left}figure{margin:2em 0}img{max-width:100%}
figcaption{color:#555;font-size:90%}"""


def report_html(trace: Trace, stats: Stats, figures: dict[str, tuple[str, bytes]]) -> str:
    summary = stats.summary
    nodes = [(f"{row['name']} (DLC rank {row['dlc_rank']})", f"{row['vantage']} capture: {row['captures']}")
             for row in summary["nodes"]]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>dlcsniff report</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>dlcsniff report: {html.escape(str(summary.get('source') or 'trace'))}</h1>",
        f"<p>kvstore mode <b>{trace.mode}</b> ({html.escape(trace.mode_evidence)}).</p>",
        "<h2>The paper's figures for this job</h2>", _table(headline(summary)),
        "<h2>Statistics (per worker iteration; per server, tensor and iteration)</h2>", _statistics_table(summary),
        "<h2>Where each node was seen</h2>", _table(nodes),
        "<h2>What could not be measured</h2>",
        _table([(name.replace("_", " "), str(value)) for name, value in summary["losses"].items()]),
    ]
    for name, (caption, png) in figures.items():
        encoded = base64.b64encode(png).decode("ascii")
        parts.append(f"<figure id='{name}'><img alt='{name}' src='data:image/png;base64,{encoded}'>"
                     f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(trace: Trace, stats: Stats, path: str | Path, figures_dir: str | Path | None = None) -> Path:
    """The HTML report at `path`; with figures_dir, every figure also as figures_dir/<name>.png."""
    path = Path(path)
    if len(stats.iterations) == 0:
        raise AnalysisError("no worker iteration was found in the trace: nothing to report "
                            "(were the workers' push/pull messages captured?)")
    figures = rendered_figures(trace, stats)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(report_html(trace, stats, figures), encoding="utf-8")
        if figures_dir is not None:
            Path(figures_dir).mkdir(parents=True, exist_ok=True)
            for name, (_, png) in figures.items():
                (Path(figures_dir) / f"{name}.png").write_bytes(png)
    except OSError as exc:
        raise AnalysisError(f"cannot write {exc.filename or path}: {exc.strerror or exc}") from exc
    return path
