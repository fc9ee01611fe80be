"""The report's static figures (matplotlib; PNG for `report --figures` and for the figures the HTML page does
not draw interactively), each from its frame in analysis.report_data, in the report's units.

matplotlib's object API only (no pyplot, no global state): PNG rendering needs no display.
"""
from __future__ import annotations

import io

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from dlcsniff.analysis.collective_stats import CollectiveStats
from dlcsniff.analysis.display import human_bytes
from dlcsniff.analysis.report_data import (
    REQUEST_KINDS, barrier_position, collective_matrices, collective_rank_spans, iteration_spans, kind_color,
    pslite_traffic_matrix, request_spans, size_cdf, timeline_lanes,
)
from dlcsniff.analysis.summary import KEY_STATISTICS, Stats
from dlcsniff.analysis.operations import Trace

DPI = 110
MAX_BOX_KEYS = 60                 # the largest tensors, when a model has more
MAX_LABELLED_OPERATIONS = 60      # beyond, the skew figure's operations are numbered, not named
MAX_ANNOTATED_RANKS = 12          # heat maps print their values up to this many ranks
OVERLAP_BIN_PERCENT = 5
# requests wide and solid, answers thin and dashed on top: a push and its answer of the same size both show
CDF_LINE_WIDTH = {True: 3.5, False: 1.6}
REQUEST_COLORS = dict(zip(REQUEST_KINDS, ("#1f77b4", "#ff7f0e", "#2ca02c", "#b0b0b0")))
ITERATION_SHADES = ("#d9d2e9", "#b4a7d6")          # alternate iterations on a worker's head row
KEY_STATISTIC_NAMES = {"sync_overhead_us": "synchronisation", "update_overhead_us": "update",
                       "search_overhead_us": "search"}


def figure_png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _bytes_tick(value: float, _position=None) -> str:
    return human_bytes(value).replace(".00", "") if value >= 1 else ""


def _legend_outside(axis: Axes, **options) -> None:
    handles, labels = axis.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    if unique:
        axis.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), **options)


# -- ps-lite figures -----------------------------------------------------------------------------------------

def size_cdf_figure(trace: Trace) -> Figure:
    cdf = size_cdf(trace)
    figure = Figure(figsize=(10, 4.8))
    axis = figure.subplots()
    for index, (curve, mine) in enumerate(cdf.groupby("curve", sort=False)):
        request = bool(mine["request"].iloc[0])
        axis.step(mine["length"], mine["fraction"], where="post", color=f"C{index}",
                  linestyle="-" if request else "--", linewidth=CDF_LINE_WIDTH[request],
                  alpha=0.7 if request else 1.0, label=f"{curve} ({mine['messages'].iloc[0]:,} messages)")
    axis.set_xscale("log")
    axis.xaxis.set_major_formatter(FuncFormatter(_bytes_tick))
    axis.set_ylim(0, 1.02)
    axis.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value * 100:.0f} %"))
    axis.set_xlabel("message length, meta + data")
    axis.set_ylabel("messages ≤ length")
    axis.set_title("Message length per kind of message, each message once (solid: requests, dashed: answers)")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=1, frameon=False)
    figure.tight_layout()
    return figure


def iteration_figure(stats: Stats) -> Figure:
    iterations = stats.iterations
    figure = Figure(figsize=(12, 4.2))
    left, right = figure.subplots(1, 2, width_ratios=(1, 1.35))
    ratios = iterations["overlap_ratio"].replace([np.inf, -np.inf], np.nan).dropna() * 100
    if len(ratios):
        # fixed 5-point bins on multiples of 5: the same bins whatever the job
        edges = np.arange(np.floor(ratios.min() / OVERLAP_BIN_PERCENT),
                          np.floor(ratios.max() / OVERLAP_BIN_PERCENT) + 2) * OVERLAP_BIN_PERCENT
        left.hist(ratios, bins=edges, color="tab:purple", alpha=0.8, edgecolor="white")
        left.xaxis.set_major_locator(MaxNLocator(nbins=8, steps=[1, 2, 5, 10]))
    else:
        left.text(0.5, 0.5, "no iteration with all three phases", transform=left.transAxes, ha="center",
                  color="gray")
    left.yaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_xlabel("overlap ratio P2 / (P1 + P3) (%)")
    left.set_ylabel("iterations")
    left.set_title(f"Overlap ratio per iteration ({len(ratios)} iterations, {OVERLAP_BIN_PERCENT} % bins)")
    for index, (rank, mine) in enumerate(iterations.groupby("worker_rank")):
        right.plot(mine["iteration"], mine["computation_s"] * 1e3, marker="o", color=f"C{2 * index % 10}",
                   label=f"worker{rank} computation (P1 + P2)")
        right.plot(mine["iteration"], mine["communication_s"] * 1e3, marker="s", linestyle="--",
                   color=f"C{(2 * index + 1) % 10}", label=f"worker{rank} communication (P3)")
    right.set_xlabel("iteration")
    right.xaxis.set_major_locator(MaxNLocator(integer=True))
    right.set_ylabel("ms")
    right.set_ylim(bottom=0)
    right.set_title("Computation and communication per iteration")
    right.grid(True, alpha=0.3)
    _legend_outside(right)
    figure.tight_layout()
    return figure


def drawn_key_statistics(stats: Stats) -> list[str]:
    """The per-key overheads worth a panel: measured, and not 0 for every tensor (a job's only worker
    waits for no one: its synchronisation overhead is 0 throughout)."""
    return [name for name in KEY_STATISTICS if (stats.keys[name].fillna(0) > 0).any()]


def key_overhead_figure(stats: Stats) -> Figure:
    keys = stats.keys
    measured = drawn_key_statistics(stats)
    sizes = keys.groupby(["server_rank", "tensor_key"])["size_bytes"].max().dropna().sort_values()
    sizes = sizes.iloc[-MAX_BOX_KEYS:]
    figure = Figure(figsize=(max(8, 0.35 * len(sizes) + 3), 1.4 + 2.9 * len(measured)))
    axes = figure.subplots(len(measured), 1, sharex=True, squeeze=False)[:, 0]
    positions = np.arange(len(sizes))
    labels = [f"k{key}@s{server}\n{human_bytes(float(size))}" for (server, key), size in sizes.items()]
    grouped = keys.groupby(["server_rank", "tensor_key"])
    for axis, name in zip(axes, measured):
        samples = [grouped.get_group(index)[name].dropna().to_numpy() / 1e3 for index in sizes.index]
        shown = [(pos, sample) for pos, sample in zip(positions, samples) if len(sample)]
        axis.boxplot([sample for _, sample in shown], positions=[pos for pos, _ in shown], widths=0.6)
        axis.set_ylabel(f"{KEY_STATISTIC_NAMES[name]} (ms)")
        axis.set_ylim(bottom=0)
        axis.grid(True, axis="y", alpha=0.3)
    axes[-1].set_xticks(positions, labels, fontsize=7)
    axes[-1].set_xlim(-0.7, len(sizes) - 0.3)
    axes[-1].set_xlabel("tensor key @ server, ordered by message size")
    axes[0].set_title("Per-key server overheads per iteration")
    figure.tight_layout()
    return figure


def heat_map(figure: Figure, axis: Axes, matrix: np.ndarray, names: list[str], title: str, rank_kind: str) -> None:
    """Bytes sender (rows) × receiver (columns) on a log colour scale; empty cells blank."""
    masked = np.ma.masked_invalid(np.where(matrix > 0, matrix, np.nan))
    image = axis.imshow(masked, cmap="viridis", norm=matrix_norm(matrix))
    axis.set_xticks(range(len(names)), names, rotation=45, ha="right", fontsize=8)
    axis.set_yticks(range(len(names)), names, fontsize=8)
    if len(names) <= MAX_ANNOTATED_RANKS and masked.count():
        for (row, column), value in np.ndenumerate(matrix):
            if value > 0:
                axis.text(column, row, human_bytes(value), ha="center", va="center", fontsize=7,
                          color="black" if image.norm(value) > 0.6 else "white")   # viridis turns yellow
    if not masked.count():
        axis.text(0.5, 0.5, "no such traffic", transform=axis.transAxes, ha="center", va="center", color="gray")
    axis.set_xlabel(f"receiver ({rank_kind})")
    axis.set_ylabel(f"sender ({rank_kind})")
    axis.set_title(title)
    bar = figure.colorbar(image, ax=axis, label="bytes", shrink=0.8)
    bar.ax.yaxis.set_major_formatter(FuncFormatter(_bytes_tick))
    bar.ax.yaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))


def matrix_norm(matrix: np.ndarray) -> LogNorm | None:
    """The log colour scale of a traffic matrix (shared with the interactive matrices). Cells within a decade of
    each other get a decade either side of their geometric middle, so that nearly equal cells (a ring's links,
    a few bytes apart) share a colour instead of spanning the whole scale."""
    positive = matrix[np.isfinite(matrix) & (matrix > 0)]
    if not len(positive):
        return None
    low, high = float(positive.min()), float(positive.max())
    if high < 10 * low:
        middle = float(np.sqrt(low * high))
        return LogNorm(middle / 10, middle * 10)
    return LogNorm(low, high)


def traffic_figure(stats: Stats, trace: Trace) -> Figure:
    names, bytes_sent, _ = pslite_traffic_matrix(stats, trace)
    size = min(10, 3 + 0.5 * len(names))
    figure = Figure(figsize=(size + 1.5, size))
    heat_map(figure, figure.subplots(), bytes_sent, names, "Traffic matrix: bytes sent, sender × receiver", "DLC rank")
    figure.tight_layout()
    return figure


def timeline_figure(trace: Trace, stats: Stats) -> Figure:
    """The whole job, every worker: each request from its send to its answer's receipt, one row per
    tensor@server (or packed rows per server), the worker's iterations on its head row."""
    spans = request_spans(trace)
    lanes, lane_of = timeline_lanes(spans)
    origin = spans["start_ns"].min()
    figure = Figure(figsize=(13, 1.4 + 0.2 * len(lanes)))
    axis = figure.subplots()
    for kind, mine in spans.groupby("kind", observed=True):
        axis.barh(lane_of[mine.index], (mine["end_ns"] - mine["start_ns"]) / 1e6,
                  left=(mine["start_ns"] - origin) / 1e6, height=0.7, color=REQUEST_COLORS[kind], label=kind)
    heads = pd.Series(lanes.index[lanes["head"]], index=lanes.loc[lanes["head"], "group"])
    iterations = iteration_spans(stats) if stats.iterations is not None else pd.DataFrame()
    for row in iterations.itertuples():
        axis.barh(heads[f"worker{row.worker_rank}"], (row.end_ns - row.start_ns) / 1e6,
                  left=(row.start_ns - origin) / 1e6, height=0.8, color=ITERATION_SHADES[row.iteration % 2],
                  label="iterations (alternate shades)")
    axis.set_yticks(range(len(lanes)), lanes["label"], fontsize=7)
    for tick, head in zip(axis.get_yticklabels(), lanes["head"]):
        tick.set_fontweight("bold" if head else "normal")
    for boundary in lanes.index[lanes["head"]][1:]:
        axis.axhline(boundary - 0.5, color="gray", linewidth=0.8)
    axis.set_ylim(len(lanes) - 0.5, -0.5)
    axis.set_xlabel("ms since the first request")
    axis.set_title("Every request of every worker, from its send to the receipt of its answer", fontsize=10)
    axis.grid(True, axis="x", alpha=0.3)
    _legend_outside(axis)
    figure.tight_layout()
    return figure


# -- collective figures --------------------------------------------------------------------------------------

def _kind_legend(axis: Axes, kinds) -> None:
    if not len(kinds):
        return
    handles = [axis.scatter([], [], color=kind_color(kind), label=kind) for kind in sorted(kinds)]
    axis.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), title="kind",
                title_fontsize=8)


def collective_time_figure(collectives: CollectiveStats) -> Figure:
    """Time per operation against its size, by kind: across ranks (first start → last end) and per rank."""
    operations, ranks = collectives.operations, collectives.ranks
    sizes = operations["size_bytes"].to_numpy(np.float64)
    zero_at = barrier_position(sizes)
    figure = Figure(figsize=(10, 5))
    axis = figure.subplots()
    for kind, mine in operations.groupby("kind", sort=True):
        at_ranks = ranks[ranks["kind"] == kind]
        axis.scatter(np.maximum(at_ranks["size_bytes"], zero_at), at_ranks["time_ns"] / 1e6, s=10,
                     color=kind_color(kind), alpha=0.35, linewidths=0)
        axis.scatter(np.maximum(mine["size_bytes"], zero_at), mine["time_ns"] / 1e6, s=50, color=kind_color(kind),
                     edgecolors="black", linewidths=0.5)
    axis.set_xscale("log")
    axis.set_yscale("log")
    decades = np.arange(np.ceil(np.log10(zero_at * 8)), np.floor(np.log10(max(sizes.max(), 1.0))) + 1)
    axis.set_xticks([zero_at, *10 ** decades], ["0 B", *(_bytes_tick(10 ** d) for d in decades)])
    axis.set_xlabel("size S (nccl-tests' convention)")
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
        at_ranks = ranks[(ranks["kind"] == kind) & ranks["busbw_gb_per_s"].notna()]
        axis.scatter(at_ranks["size_bytes"], at_ranks["busbw_gb_per_s"], s=10, color=kind_color(kind), alpha=0.35,
                     linewidths=0)
        axis.scatter(mine["size_bytes"], mine["busbw_gb_per_s"], s=50, color=kind_color(kind), edgecolors="black",
                     linewidths=0.5)
        trend = mine.groupby("size_bytes")["busbw_gb_per_s"].median()
        axis.plot(trend.index, trend.to_numpy(), color=kind_color(kind), linewidth=1, alpha=0.8)
    if len(moved):
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.xaxis.set_major_formatter(FuncFormatter(_bytes_tick))
    else:
        axis.text(0.5, 0.5, "no collective moved data", transform=axis.transAxes, ha="center", color="gray")
    axis.set_xlabel("size S")
    axis.set_ylabel("bus bandwidth (GB/s)")
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
                 color=[kind_color(kind) for kind in skewed["kind"]],
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
    """Rank × rank payload bytes: the all-to-alls (sparse embedding exchange), where the job ran one, and every
    collective."""
    names, views = collective_matrices(collectives)
    size = min(9, 3 + 0.5 * len(names))
    figure = Figure(figsize=(len(views) * (size + 1.5), size))
    for axis, (title, (payload, _)) in zip(figure.subplots(1, len(views), squeeze=False)[0], views.items()):
        heat_map(figure, axis, payload, names, f"Payload bytes, {title}", "rank")
    figure.tight_layout()
    return figure


def collective_timeline_figure(collectives: CollectiveStats) -> Figure:
    """Every rank's collectives over time, coloured by kind; where two or more overlap, a black bar under."""
    lanes, spans, origin = collective_rank_spans(collectives)
    segments = collectives.concurrency
    lane_of = pd.Series(lanes.index, index=lanes["capture"])
    figure = Figure(figsize=(13, 1.6 + 0.7 * len(lanes)))
    axis = figure.subplots()
    for kind, mine in spans.groupby("kind", sort=True):
        axis.barh(mine["lane"], (mine["time_ns"] / 1e6).to_numpy(),
                  left=((mine["ts_first_ns"] - origin) / 1e6).to_numpy(),
                  height=0.6, color=kind_color(kind), alpha=0.75, edgecolor="black", linewidth=0.3, label=kind)
    crowded = segments[segments["in_flight"] > 1]
    axis.barh(lane_of.reindex(crowded["capture"]).to_numpy() + 0.38, ((crowded["ts_last_ns"] - crowded["ts_first_ns"])
              / 1e6).to_numpy(), left=((crowded["ts_first_ns"] - origin) / 1e6).to_numpy(), height=0.1, color="black",
              label="2+ collectives in flight")
    axis.set_yticks(range(len(lanes)), lanes["label"], fontsize=8)
    axis.invert_yaxis()
    axis.set_xlabel("ms since the first collective started (gaps: no collective in flight)")
    axis.set_title(f"Collectives per rank over time; timeline: {collectives.summary['clock']['note']}", fontsize=10)
    axis.grid(True, axis="x", alpha=0.3)
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    figure.tight_layout()
    return figure
