"""The HTML report: one self-contained file (figures embedded as PNG data: URIs) over a job's statistics:
its ps-lite trace's (SketchDLC's figures), its collective operations', or both.

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
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from dlcsniff.analysis.collective_stats import (
    KIND_TABLE_HEADER, SEND_RECV, CollectiveStats, collective_headline, collective_kind_rows, volume_matrix,
)
from dlcsniff.analysis.load import AnalysisError
from dlcsniff.analysis.operations import (
    CATEGORY_DATA, DLC_OPERATIONS, LONG_OPERATIONS, ROLE_WORKER, SLOT_PULL_RESPONSE, SLOT_PUSH_REQUEST, Trace,
)
from dlcsniff.analysis.describe import human_bytes
from dlcsniff.analysis.summary import ITERATION_STATISTICS, KEY_STATISTICS, Stats, headline

CDF_POINTS = 512                  # quantiles drawn per operation: enough for a smooth curve at any size
MAX_TIMELINE_WORKERS = 8
MAX_BOX_KEYS = 60                 # the largest tensors, when a model has more
MAX_LABELLED_OPERATIONS = 60      # beyond, the skew figure's operations are numbered, not named
MAX_ANNOTATED_RANKS = 12          # heat maps print their values up to this many ranks
# one colour per collective kind in every figure (tab10 has ten)
KIND_COLORS = dict(zip(("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather",
                        "scatter", "barrier", SEND_RECV), (f"C{i}" for i in range(10))))
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


def _heat_map(figure: Figure, axis: Axes, matrix: np.ndarray, names: list[str], title: str, rank_kind: str) -> None:
    """Bytes sender (rows) × receiver (columns) on a log colour scale; empty cells blank."""
    masked = np.ma.masked_invalid(np.where(matrix > 0, matrix, np.nan))
    image = axis.imshow(masked, cmap="viridis", norm=LogNorm() if masked.count() else None)
    axis.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    axis.set_yticks(range(len(names)), names, fontsize=8)
    if len(names) <= MAX_ANNOTATED_RANKS and masked.count():
        for (row, column), value in np.ndenumerate(matrix):
            if value > 0:
                bright = image.norm(value) > 0.6          # viridis turns yellow: dark text there
                axis.text(column, row, human_bytes(value), ha="center", va="center", fontsize=7,
                          color="black" if bright else "white")
    if not masked.count():
        axis.text(0.5, 0.5, "no such traffic", transform=axis.transAxes, ha="center", va="center", color="gray")
    axis.set_xlabel(f"receiver ({rank_kind})")
    axis.set_ylabel(f"sender ({rank_kind})")
    axis.set_title(title)
    figure.colorbar(image, ax=axis, label="bytes", shrink=0.8)


def traffic_figure(stats: Stats, trace: Trace) -> Figure:
    nodes = trace.nodes.sort_values("dlc_rank")
    ranks = nodes["dlc_rank"].to_numpy()
    matrix = (stats.traffic.pivot_table(index="src_rank", columns="dst_rank", values="bytes", aggfunc="sum")
              .reindex(index=ranks, columns=ranks).to_numpy(dtype=np.float64))
    size = min(10, 3 + 0.5 * len(ranks))
    figure = Figure(figsize=(size + 1.5, size))
    _heat_map(figure, figure.subplots(), matrix, [f"{name} ({rank})" for name, rank in zip(nodes["name"], ranks)],
              "Traffic matrix: bytes sent, sender × receiver", "DLC rank")
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


def _percent(fraction: float) -> str:
    return f"{fraction * 100:.1f} %" if np.isfinite(fraction) else "n/a"


def _kind_legend(axis: Axes, kinds) -> None:
    if not len(kinds):
        return
    handles = [axis.scatter([], [], color=KIND_COLORS.get(kind, "gray"), label=kind) for kind in sorted(kinds)]
    axis.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), title="kind",
                title_fontsize=8)


def collective_time_figure(collectives: CollectiveStats) -> Figure:
    """Time per operation against its size, by kind: across ranks (first start → last end) and per rank."""
    operations, ranks = collectives.operations, collectives.ranks
    sizes = operations["size_bytes"].to_numpy(np.float64)
    smallest = sizes[sizes > 0].min() if (sizes > 0).any() else 1.0
    # a barrier moves 0 bytes: drawn left of the smallest size, at a tick of its own
    zero_at = smallest / 8
    figure = Figure(figsize=(10, 5))
    axis = figure.subplots()
    for kind, mine in operations.groupby("kind", sort=True):
        color = KIND_COLORS.get(kind, "gray")
        at_ranks = ranks[ranks["kind"] == kind]
        axis.scatter(np.maximum(at_ranks["size_bytes"], zero_at), at_ranks["time_ns"] / 1e6, s=10, color=color,
                     alpha=0.35, linewidths=0)
        axis.scatter(np.maximum(mine["size_bytes"], zero_at), mine["time_ns"] / 1e6, s=50, color=color,
                     edgecolors="black", linewidths=0.5)
    axis.set_xscale("log")
    axis.set_yscale("log")
    decades = np.arange(np.floor(np.log10(smallest)), np.floor(np.log10(max(sizes.max(), 1.0))) + 1)
    axis.set_xticks([zero_at, *10 ** decades], ["0", *(f"$10^{{{int(d)}}}$" for d in decades)])
    axis.set_xlabel("size S (bytes, nccl-tests' convention)")
    axis.set_ylabel("time (ms)")
    axis.set_title("Time per collective: large markers across ranks (first start → last end), dots per rank")
    axis.grid(True, which="both", alpha=0.3)
    _kind_legend(axis, operations["kind"].unique())
    figure.tight_layout()
    return figure


def collective_bandwidth_figure(collectives: CollectiveStats) -> Figure:
    """Bus bandwidth against size, by kind."""
    operations, ranks = collectives.operations, collectives.ranks
    figure = Figure(figsize=(10, 5))
    axis = figure.subplots()
    moved = operations[operations["busbw_gb_per_s"].notna()]
    for kind, mine in moved.groupby("kind", sort=True):
        color = KIND_COLORS.get(kind, "gray")
        at_ranks = ranks[(ranks["kind"] == kind) & ranks["busbw_gb_per_s"].notna()]
        axis.scatter(at_ranks["size_bytes"], at_ranks["busbw_gb_per_s"] * 1e3, s=10, color=color, alpha=0.35,
                     linewidths=0)
        axis.scatter(mine["size_bytes"], mine["busbw_gb_per_s"] * 1e3, s=50, color=color, edgecolors="black",
                     linewidths=0.5)
        trend = mine.groupby("size_bytes")["busbw_gb_per_s"].median()
        axis.plot(trend.index, trend.to_numpy() * 1e3, color=color, linewidth=1, alpha=0.8)
    if len(moved):
        axis.set_xscale("log")
        axis.set_yscale("log")
    else:
        axis.text(0.5, 0.5, "no collective moved data", transform=axis.transAxes, ha="center", color="gray")
    axis.set_xlabel("size S (bytes)")
    axis.set_ylabel("bus bandwidth (MB/s)")
    axis.set_title("Bus bandwidth (nccl-tests: S / t × factor): markers across ranks (line: median per size), "
                   "dots per rank", fontsize=10)
    axis.grid(True, which="both", alpha=0.3)
    _kind_legend(axis, moved["kind"].unique())
    figure.tight_layout()
    return figure


def collective_skew_figure(collectives: CollectiveStats) -> Figure:
    """Start and end skew across ranks of every operation seen at two ranks or more, in start order."""
    operations = collectives.operations
    skewed = operations[operations["start_skew_ns"].notna().to_numpy()]
    figure = Figure(figsize=(max(10, 0.22 * min(len(skewed), MAX_LABELLED_OPERATIONS) + 3), 5))
    axis = figure.subplots()
    positions = np.arange(len(skewed))
    for offset, name, label in ((-0.2, "start_skew_ns", "start skew"), (0.2, "end_skew_ns", "end skew")):
        # a skew below the captures' microsecond resolution is drawn at it (log scale)
        values = np.maximum(skewed[name].to_numpy(np.float64), 1000.0) / 1e6
        axis.bar(positions + offset, values, width=0.4, label=label,
                 color=[KIND_COLORS.get(kind, "gray") for kind in skewed["kind"]],
                 hatch="//" if name == "end_skew_ns" else None, edgecolor="black", linewidth=0.3)
    if len(skewed):
        axis.set_yscale("log")
    else:
        axis.text(0.5, 0.5, "no operation seen at two ranks or more: no skew", transform=axis.transAxes,
                  ha="center", va="center", color="gray")
    if len(skewed) <= MAX_LABELLED_OPERATIONS:
        axis.set_xticks(positions, skewed["op"], rotation=90, fontsize=7)
    else:
        axis.set_xlabel("operation, in start order")
    axis.set_ylabel("max − min over ranks (ms)")
    axis.set_title("Skew across ranks per operation: start (plain) and end (hatched)")
    axis.grid(True, axis="y", which="both", alpha=0.3)
    _kind_legend(axis, skewed["kind"].unique())
    figure.tight_layout()
    return figure


def collective_matrix_figure(collectives: CollectiveStats) -> Figure:
    """Rank × rank payload bytes: the all-to-alls (sparse embedding exchange) and every collective."""
    traffic = collectives.traffic
    ranks = sorted(set(traffic["src_rank"]) | set(traffic["dst_rank"]) | set(collectives.ranks["rank"]))
    size = min(9, 3 + 0.5 * len(ranks))
    figure = Figure(figsize=(2 * size + 3, size))
    names = [f"rank{rank}" for rank in ranks]
    for axis, kind, title in zip(figure.subplots(1, 2), ("all_to_all", None),
                                 ("All-to-all payload bytes", "Every collective's payload bytes")):
        _heat_map(figure, axis, volume_matrix(traffic, ranks, kind).to_numpy(np.float64), names, title, "rank")
    figure.tight_layout()
    return figure


def collective_timeline_figure(collectives: CollectiveStats) -> Figure:
    """Every rank's collectives over time, coloured by kind; where two or more overlap, a black bar under."""
    ranks, overlap, segments = collectives.ranks, collectives.overlap, collectives.concurrency
    lanes = overlap[["capture", "rank", "communication_fraction"]].reset_index(drop=True)
    lane_of = pd.Series(lanes.index, index=lanes["capture"])
    origin = int(ranks["start_ns"].min())
    figure = Figure(figsize=(13, 1.6 + 0.7 * len(lanes)))
    axis = figure.subplots()
    for kind, mine in ranks.groupby("kind", sort=True):
        lane = lane_of.reindex(mine["capture"]).to_numpy()
        axis.barh(lane, (mine["time_ns"] / 1e6).to_numpy(), left=((mine["start_ns"] - origin) / 1e6).to_numpy(),
                  height=0.6, color=KIND_COLORS.get(kind, "gray"), alpha=0.75, edgecolor="black", linewidth=0.3,
                  label=kind)
    crowded = segments[segments["in_flight"] > 1]
    axis.barh(lane_of.reindex(crowded["capture"]).to_numpy() + 0.38, ((crowded["end_ns"] - crowded["start_ns"])
              / 1e6).to_numpy(), left=((crowded["start_ns"] - origin) / 1e6).to_numpy(), height=0.1, color="black",
              label="2+ collectives in flight")
    axis.set_yticks(range(len(lanes)), [f"rank{row.rank} ({_percent(row.communication_fraction)} comm.)"
                                        for row in lanes.itertuples()], fontsize=8)
    axis.invert_yaxis()
    axis.set_xlabel("ms since the first collective started (gaps: no collective in flight)")
    axis.set_title(f"Collectives per rank over time; timeline: {collectives.summary['clock']['note']}", fontsize=10)
    axis.grid(True, axis="x", alpha=0.3)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    figure.tight_layout()
    return figure


def rendered_figures(trace: Trace | None, stats: Stats) -> dict[str, tuple[str, bytes]]:
    """name → (caption, PNG) of every figure in the report: the ps-lite trace's when there is one with
    worker iterations, the collectives' when there are some."""
    drawn = {}
    if trace is not None and len(stats.iterations):
        drawn.update(_pslite_figures(trace, stats))
    if stats.collectives is not None:
        drawn.update(_collective_figures(stats.collectives))
    return {name: (caption, figure_png(figure)) for name, (caption, figure) in drawn.items()}


def _collective_figures(collectives: CollectiveStats) -> dict[str, tuple[str, Figure]]:
    return {
        "collective_times": ("Time per collective by kind and size S; a rank's time runs from the first to the "
                             "last byte of the operation on its wire.", collective_time_figure(collectives)),
        "collective_bandwidth": ("Bus bandwidth against size, as nccl-tests define it (all-reduce 2(n−1)/n, "
                                 "all-gather, reduce-scatter, all-to-all, gather, scatter (n−1)/n, others 1).",
                                 collective_bandwidth_figure(collectives)),
        "collective_skew": ("How far apart the ranks started and ended each collective (log scale; below the "
                            "captures' 1 µs resolution drawn at 1 µs).", collective_skew_figure(collectives)),
        "collective_matrix": ("Payload bytes between ranks, each message counted once; a rank's own all-to-all "
                              "chunk never crosses the network (empty diagonal).",
                              collective_matrix_figure(collectives)),
        "collective_timeline": ("Each rank's collectives over time and the computation gaps between them.",
                                collective_timeline_figure(collectives)),
    }


def _pslite_figures(trace: Trace, stats: Stats) -> dict[str, tuple[str, Figure]]:
    return {
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


def figure_png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _table(rows: list[tuple[str, str]]) -> str:
    cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f"<table>{cells}</table>"


def _grid(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    """A table with a header row; each row's first cell is its name."""
    head = "<tr>" + "".join(f"<th>{html.escape(name)}</th>" for name in header) + "</tr>"
    body = "".join("<tr><th>" + html.escape(row[0]) + "</th>" + "".join(f"<td>{html.escape(v)}</td>" for v in row[1:])
                   + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def _statistics_table(summary: dict) -> str:
    rows = []
    for name in ITERATION_STATISTICS + KEY_STATISTICS:
        found = summary["statistics"].get(name)
        values = ["n/a"] * 7 if found is None else [str(found["count"])] + [
            f"{found[k]:.4g}" for k in ("mean", "min", "p50", "p90", "p99", "max")]
        rows.append((name, *values))
    return _grid(("statistic", "count", "mean", "min", "p50", "p90", "p99", "max"), rows)


STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f4f4f4;text-align:left}figure{margin:2em 0}img{max-width:100%}
figcaption{color:#555;font-size:90%}"""


def _pslite_sections(trace: Trace, summary: dict) -> list[str]:
    nodes = [(f"{row['name']} (DLC rank {row['dlc_rank']})", f"{row['vantage']} capture: {row['captures']}")
             for row in summary["nodes"]]
    return [
        f"<p>kvstore mode <b>{trace.mode}</b> ({html.escape(trace.mode_evidence)}).</p>",
        "<h2>The paper's figures for this job</h2>", _table(headline(summary)),
        "<h2>Statistics (per worker iteration; per server, tensor and iteration)</h2>", _statistics_table(summary),
        "<h2>Where each node was seen</h2>", _table(nodes),
    ]


def _collective_sections(collectives: CollectiveStats) -> list[str]:
    overlap = collectives.overlap
    per_rank = [(f"rank{row.rank}" + ("" if row.capture == f"rank{row.rank}" else f" ({row.capture})"),
                 f"{row.wall_ns / 1e6:,.3f}", f"{row.communication_ns / 1e6:,.3f}",
                 f"{row.gap_ns / 1e6:,.3f}", f"{row.gaps:,}", f"{row.longest_gap_ns / 1e6:,.3f}",
                 f"{row.concurrent_ns / 1e6:,.3f}", _percent(row.communication_fraction))
                for row in overlap.itertuples()]
    return [
        "<h2>Collective operations</h2>", _table(collective_headline(collectives.summary)),
        "<h3>Per kind (busbw as nccl-tests define it; skew: max − min over the ranks)</h3>",
        _grid(KIND_TABLE_HEADER, collective_kind_rows(collectives.summary)),
        "<h3>Per rank: communication and the gaps between (ms)</h3>",
        _grid(("rank", "wall", "communication", "gaps total", "gaps", "longest gap", "2+ in flight",
               "communication fraction"), per_rank),
    ]


def report_html(trace: Trace | None, stats: Stats, figures: dict[str, tuple[str, bytes]]) -> str:
    summary = stats.summary
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>dlcsniff report</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>dlcsniff report: {html.escape(str(summary.get('source') or 'trace'))}</h1>",
        *(_pslite_sections(trace, summary) if trace is not None else ()),
        *(_collective_sections(stats.collectives) if stats.collectives is not None else ()),
        "<h2>What could not be measured</h2>",
        _table([(name.replace("_", " "), str(value)) for name, value in summary["losses"].items()]),
    ]
    for name, (caption, png) in figures.items():
        encoded = base64.b64encode(png).decode("ascii")
        parts.append(f"<figure id='{name}'><img alt='{name}' src='data:image/png;base64,{encoded}'>"
                     f"<figcaption>{html.escape(caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(trace: Trace | None, stats: Stats, path: str | Path,
                 figures_dir: str | Path | None = None) -> Path:
    """The HTML report at `path`; with figures_dir, every figure also as figures_dir/<name>.png. A job
    without ps-lite traffic has trace None."""
    path = Path(path)
    if stats.collectives is None and (trace is None or len(stats.iterations) == 0):
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
