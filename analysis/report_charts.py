"""The report's interactive charts: each a JSON spec (from its frame in analysis.report_data, in the report's
units) that report_charts.js draws on a canvas in the page, with zoom, pan and hover. The script and the data
are inlined: the page needs no network.

Spec shapes (what report_charts.js reads):
- timeline: lanes (label, group, head) and layers of bars (columns x0, x1 in ms, lane, color = legend index,
  and the columns their tooltip shows);
- xy: series of points (x, y; mode step, line or points), linear or log axes;
- matrix: rows × cols cells with their values, colours and tooltip values.
Tooltip fields are {label, key, format}; `categories` turns a column's codes into names.
"""
from __future__ import annotations

import html
import json
import math
from importlib import resources

import numpy as np
import pandas as pd
from matplotlib import colormaps

from dlcsniff.analysis.collective_stats import CollectiveStats
from dlcsniff.analysis.operations import Trace
from dlcsniff.analysis.report_data import (
    REQUEST_KINDS, barrier_position, collective_matrices, collective_rank_spans, iteration_spans, kind_color,
    pslite_traffic_matrix, request_spans, size_cdf, timeline_lanes,
)
from dlcsniff.analysis.report_figures import CDF_LINE_WIDTH, REQUEST_COLORS, matrix_norm
from dlcsniff.analysis.summary import Stats

ITERATION_COLOR = "#cfc4e6"
IN_FLIGHT_COLOR = "#000000"
MATRIX_CELL_PX = 64
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")


def chart_script() -> str:
    return resources.files("dlcsniff.analysis").joinpath("report_charts.js").read_text(encoding="utf-8")


def chart_html(name: str, spec: dict) -> str:
    """The chart's element and its data; report_charts.js (once per page) draws it."""
    data = json.dumps(spec, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return (f"<div class='chart' id='{html.escape(name)}-chart' data-chart='{html.escape(name)}-data'></div>"
            f"<script type='application/json' id='{html.escape(name)}-data'>{data}</script>")


def _values(values, digits: int = 4) -> list:
    """A column for the page: floats rounded (ms to 100 ns), NaN as null."""
    array = np.asarray(values, dtype=np.float64)
    return [None if not math.isfinite(value) else round(value, digits) for value in array.tolist()]


def _codes(values: pd.Series, categories: list[str]) -> list[int]:
    return pd.Categorical(values.astype(str), categories=categories).codes.tolist()


def _field(label: str, key: str, format: str = "number") -> dict:
    return {"label": label, "key": key, "format": format}


def _padded(low: float, high: float, log: bool = False) -> list[float]:
    if log:
        return [low / 1.5, high * 1.5]
    margin = (high - low) * 0.01 or 1.0
    return [low - margin, high + margin]


# -- ps-lite -------------------------------------------------------------------------------------------------

def size_cdf_chart(trace: Trace) -> dict:
    cdf = size_cdf(trace)
    series, legend = [], []
    for index, (curve, mine) in enumerate(cdf.groupby("curve", sort=False)):
        legend.append({"label": f"{curve} ({mine['messages'].iloc[0]:,} messages)", "color": PALETTE[index % 10]})
        request = bool(mine["request"].iloc[0])
        series.append({"name": curve, "legend": index, "mode": "step", "dash": not request,
                       "width": CDF_LINE_WIDTH[request], "alpha": 0.7 if request else 1.0,
                       "x": _values(mine["length"]), "y": _values(mine["fraction"], 6), "radius": 2.5,
                       "tip": [_field("length", "x", "bytes"), _field("messages ≤ length", "y", "fraction")]})
    return {"type": "xy", "title": "message length CDF", "x_log": True,
            "x_range": _padded(float(cdf["length"].min()), float(cdf["length"].max()), log=True),
            "y_range": [0, 1.02], "x_format": "bytes", "y_format": "fraction",
            "x_label": "message length, meta + data", "y_label": "messages ≤ length",
            "series": series, "legend": legend, "height_px": 360}


def traffic_chart(stats: Stats, trace: Trace) -> dict:
    names, bytes_sent, messages = pslite_traffic_matrix(stats, trace)
    return _matrix_spec(names, bytes_sent, messages, "bytes sent, sender × receiver", "DLC rank")


def timeline_chart(trace: Trace, stats: Stats) -> dict:
    spans = request_spans(trace)
    lanes, lane_of = timeline_lanes(spans)
    origin = int(spans["start_ns"].min())
    heads = pd.Series(lanes.index[lanes["head"]], index=lanes.loc[lanes["head"], "group"])
    iterations = iteration_spans(stats)
    legend = [{"label": kind, "color": REQUEST_COLORS[kind]} for kind in REQUEST_KINDS]
    legend.append({"label": "iteration (last values of the previous → its own last values)", "color": ITERATION_COLOR})
    requests = {
        "name": "request", "height": 0.7,
        "columns": {"x0": _values((spans["start_ns"] - origin) * 1e-6), "x1": _values((spans["end_ns"] - origin) * 1e-6),
                    "lane": lane_of.tolist(), "color": spans["kind"].cat.codes.tolist(),
                    "kind": spans["kind"].cat.codes.tolist(), "worker": spans["worker_rank"].tolist(),
                    "key": spans["tensor_key"].tolist(), "server": spans["server_rank"].tolist(),
                    "iteration": spans["iteration"].tolist(),
                    "took": _values((spans["end_ns"] - spans["start_ns"]) * 1e-6),
                    "request_bytes": _values(spans["request_bytes"], 0), "answer_bytes": _values(spans["answer_bytes"], 0)},
        "categories": {"kind": list(REQUEST_KINDS)},
        "tip": [_field("kind", "kind"), _field("worker", "worker"), _field("tensor key", "key"),
                _field("server", "server"), _field("iteration (−1: initialisation)", "iteration"),
                _field("sent", "x0", "ms"), _field("answered", "x1", "ms"), _field("took", "took", "ms"),
                _field("request", "request_bytes", "bytes"), _field("answer", "answer_bytes", "bytes")],
    }
    steps = {
        "name": "iteration", "height": 0.8, "outline": True,
        "text": [f"iteration {n}" for n in iterations["iteration"]],
        "columns": {"x0": _values((iterations["start_ns"] - origin) * 1e-6),
                    "x1": _values((iterations["end_ns"] - origin) * 1e-6),
                    "lane": heads.reindex("worker" + iterations["worker_rank"].astype(str)).tolist(),
                    "color": [len(REQUEST_KINDS)] * len(iterations), "worker": iterations["worker_rank"].tolist(),
                    "iteration": iterations["iteration"].tolist(),
                    **{name: _values(iterations[name]) for name in ("phase1_ms", "phase2_ms", "phase3_ms",
                                                                     "computation_ms", "communication_ms",
                                                                     "overlap_percent", "wait_ms")}},
        "tip": [_field("worker", "worker"), _field("iteration", "iteration"), _field("from", "x0", "ms"),
                _field("to", "x1", "ms"), _field("P1", "phase1_ms", "ms"), _field("P2", "phase2_ms", "ms"),
                _field("P3", "phase3_ms", "ms"), _field("computation (P1 + P2)", "computation_ms", "ms"),
                _field("communication (P3)", "communication_ms", "ms"),
                _field("overlap ratio", "overlap_percent", "percent"), _field("wait", "wait_ms", "ms")],
    }
    end = float((spans["end_ns"].max() - origin) * 1e-6)
    return {"type": "timeline", "title": "timeline of every request", "x_range": _padded(0.0, end),
            "x_format": "ms", "x_label": "ms since the first request",
            "lanes": lanes.to_dict(orient="records"), "layers": [steps, requests], "legend": legend}


# -- collectives ---------------------------------------------------------------------------------------------

def collective_timeline_chart(collectives: CollectiveStats) -> dict:
    lanes, spans, origin = collective_rank_spans(collectives)
    kinds = sorted(spans["kind"].astype(str).unique())
    legend = [{"label": kind, "color": kind_color(kind)} for kind in kinds]
    legend.append({"label": "2+ collectives in flight", "color": IN_FLIGHT_COLOR})
    lane_of = pd.Series(lanes.index, index=lanes["capture"])
    crowded = collectives.concurrency[collectives.concurrency["in_flight"] > 1]
    operations = {
        "name": "collective", "height": 0.6, "outline": True,
        "columns": {"x0": _values((spans["start_ns"] - origin) * 1e-6), "x1": _values((spans["end_ns"] - origin) * 1e-6),
                    "lane": spans["lane"].tolist(), "color": _codes(spans["kind"], kinds),
                    "op": list(range(len(spans))), "rank": spans["rank"].tolist(),
                    "size": _values(spans["size_bytes"], 0), "took": _values(spans["time_ns"] * 1e-6),
                    "busbw": _values(spans["busbw_gb_per_s"], 6), "lag": _values(spans["start_lag_ns"] * 1e-6)},
        "categories": {"op": spans["op"].astype(str).tolist()},
        "tip": [_field("operation", "op"), _field("rank", "rank"), _field("size S", "size", "bytes"),
                _field("start", "x0", "ms"), _field("end", "x1", "ms"), _field("took", "took", "ms"),
                _field("bus bandwidth", "busbw", "gbps"), _field("start after the first rank", "lag", "ms")],
    }
    overlapping = {
        "name": "2+ collectives in flight", "height": 0.12, "offset": 0.4,
        "columns": {"x0": _values((crowded["start_ns"] - origin) * 1e-6), "x1": _values((crowded["end_ns"] - origin) * 1e-6),
                    "lane": lane_of.reindex(crowded["capture"]).tolist(), "color": [len(kinds)] * len(crowded),
                    "in_flight": crowded["in_flight"].tolist()},
        "tip": [_field("from", "x0", "ms"), _field("to", "x1", "ms"), _field("collectives in flight", "in_flight", "count")],
    }
    end = float((spans["end_ns"].max() - origin) * 1e-6)
    return {"type": "timeline", "title": "collectives per rank", "x_range": _padded(0.0, end), "x_format": "ms",
            "x_label": "ms since the first collective started",
            "lanes": [{"label": label, "group": "ranks", "head": False} for label in lanes["label"]],
            "lane_px": 30,
            "layers": [operations, overlapping], "legend": legend}


def _collective_scatter(collectives: CollectiveStats, value: str, scale: float, y_format: str, y_label: str,
                        title: str) -> dict:
    """Per kind: the operations across ranks (large) and each rank's view (small), size against `value`."""
    operations, ranks = collectives.operations, collectives.ranks
    zero_at = barrier_position(operations["size_bytes"].to_numpy(np.float64))
    kinds = sorted(operations["kind"].astype(str).unique())
    legend = [{"label": kind, "color": kind_color(kind)} for kind in kinds]
    series = []
    for index, kind in enumerate(kinds):
        for frame, where, radius in ((ranks, "at rank ", 2.5), (operations, "across ranks", 5)):
            mine = frame[(frame["kind"].astype(str) == kind).to_numpy() & frame[value].notna().to_numpy()]
            rank = mine["rank"].astype(str).radd(where).tolist() if where != "across ranks" else [where] * len(mine)
            series.append({
                "name": kind, "legend": index, "mode": "points", "radius": radius, "edge": radius > 3,
                "alpha": 1.0 if radius > 3 else 0.45,
                "x": _values(np.maximum(mine["size_bytes"].to_numpy(np.float64), zero_at), 2),
                "y": _values(mine[value].to_numpy(np.float64) * scale, 6),
                "columns": {"op": list(range(len(mine))), "where": list(range(len(mine))),
                            "size": _values(mine["size_bytes"], 0)},
                "categories": {"op": mine["op"].astype(str).tolist(), "where": rank},
                "tip": [_field("operation", "op"), _field("seen", "where"), _field("size S", "size", "bytes"),
                        _field(y_label, "y", y_format)]})
    values = np.concatenate([np.asarray(s["y"], dtype=np.float64) for s in series]) if series else np.array([])
    values = values[np.isfinite(values) & (values > 0)]
    sizes = np.maximum(operations["size_bytes"].to_numpy(np.float64), zero_at)
    return {"type": "xy", "title": title, "x_log": True, "y_log": True,
            "x_range": _padded(float(sizes.min()), float(sizes.max()), log=True),
            "y_range": _padded(float(values.min()), float(values.max()), log=True) if len(values) else [1e-3, 1],
            "x_format": "bytes", "y_format": y_format, "x_label": "size S (0-byte operations drawn left of the smallest)",
            "y_label": y_label, "series": series, "legend": legend, "height_px": 400}


def collective_time_chart(collectives: CollectiveStats) -> dict:
    return _collective_scatter(collectives, "time_ns", 1e-6, "ms", "time (ms)", "time per collective")


def collective_bandwidth_chart(collectives: CollectiveStats) -> dict:
    return _collective_scatter(collectives, "busbw_gb_per_s", 1.0, "gbps", "bus bandwidth (GB/s)",
                               "bus bandwidth per collective")


def collective_matrix_charts(collectives: CollectiveStats) -> dict[str, dict]:
    names, views = collective_matrices(collectives)
    return {title: _matrix_spec(names, payload, messages, f"payload bytes, {title}", "rank")
            for title, (payload, messages) in views.items()}


# -- matrices ------------------------------------------------------------------------------------------------

def _matrix_spec(names: list[str], values: np.ndarray, messages: np.ndarray, title: str, rank_kind: str) -> dict:
    """Cells coloured as the static heat map colours them (viridis, log scale); empty cells null."""
    norm = matrix_norm(values)
    filled = np.isfinite(values) & (values > 0)
    scaled = np.asarray(norm(np.where(filled, values, 1.0))) if norm is not None else np.zeros(values.shape)
    colors = colormaps["viridis"](scaled)
    hex_colors = [["#%02x%02x%02x" % tuple(int(round(c * 255)) for c in colors[r, c, :3]) if filled[r, c] else None
                   for c in range(values.shape[1])] for r in range(values.shape[0])]
    cells = [[float(values[r, c]) if filled[r, c] else None for c in range(values.shape[1])]
             for r in range(values.shape[0])]
    counts = [[int(messages[r, c]) if np.isfinite(messages[r, c]) and filled[r, c] else None
               for c in range(values.shape[1])] for r in range(values.shape[0])]
    return {"type": "matrix", "title": title, "rows": names, "cols": names, "values": cells, "messages": counts,
            "colors": hex_colors, "dark_text": (scaled > 0.6).tolist(), "cell_px": MATRIX_CELL_PX if len(names) <= 12
            else max(16, 768 // len(names)), "x_range": [0, 1], "x_label": f"receiver ({rank_kind})",
            "y_label": f"sender ({rank_kind})", "x_name": "receiver", "y_name": "sender",
            "tip": [_field("bytes", "values", "bytes"), _field("messages", "messages", "count")]}
