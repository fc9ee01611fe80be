"""How each host's traffic is shaped in time: burstiness (peak-to-mean rate at 1, 5 and 10 ms) and its ON/OFF
periods against the job's iteration period, the measures network studies of training traffic report.

Every message of the job once (events.parquet), at the host's end when its capture saw it (a send at the
sender, a receipt at the receiver), else at the other end, on the job's one timeline; its bytes spread evenly
over its first to last byte (the capture saw the packets in between; a message's packets are not read here).
A host's rate in a bin is its bytes in the bin / the bin; the mean rate is its bytes over its span (first to
last byte of its traffic that way). ON: a 1 ms bin with traffic, OFF one without; periods are runs of them.
The iteration period is the median time between a rank's entries into consecutive operations of the job's most
frequent kind (analysis/arrivals.py: a training step's all-reduce, a ps-lite sync round): traffic that turns
ON and OFF once per iteration has one ON/OFF cycle per period.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlcsniff.analysis.link_health import RECV, SEND, connection_hosts, host_names
from dlcsniff.analysis.stats_schema import BURSTINESS, ON_OFF

BIN_WIDTHS_NS = (1_000_000, 5_000_000, 10_000_000)
ON_OFF_BIN_NS = 1_000_000
BURSTINESS_COLUMNS = BURSTINESS.names
ON_OFF_COLUMNS = ON_OFF.names


def _ns(frame: pd.DataFrame, name: str) -> np.ndarray:
    return frame[name].astype("Float64").to_numpy(np.float64, na_value=np.nan)


def host_messages(events: pd.DataFrame) -> pd.DataFrame:
    """Every message twice, as its sender's (direction send) and its receiver's (recv): ip, peer (the other
    end), direction, first_ns, last_ns (that end's view, else the other end's) and bytes."""
    src, dst = connection_hosts(events["connection"], events["protocol"])
    size = events["size_bytes"].astype("Float64").fillna(0).to_numpy(np.float64)
    parts = []
    for ip, peer, direction, own, other in ((src, dst, SEND, "send", "recv"), (dst, src, RECV, "recv", "send")):
        first = _ns(events, f"{own}_ts_first_aligned_ns")
        last = _ns(events, f"{own}_ts_last_aligned_ns")
        seen = ~np.isnan(first) & ~np.isnan(last)
        first = np.where(seen, first, _ns(events, f"{other}_ts_first_aligned_ns"))
        last = np.where(seen, last, _ns(events, f"{other}_ts_last_aligned_ns"))
        parts.append(pd.DataFrame({"ip": ip, "peer": peer, "direction": direction, "first_ns": first,
                                   "last_ns": last, "bytes": size}))
    both = pd.concat(parts, ignore_index=True)
    return both[~np.isnan(both["first_ns"].to_numpy()) & ~np.isnan(both["last_ns"].to_numpy())
                & (both["bytes"].to_numpy() > 0)]


def cumulative_bytes(first: np.ndarray, last: np.ndarray, size: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Bytes carried by time `at` (each message's bytes spread evenly over [first, last]; a message with no
    duration at its first byte)."""
    spread = last > first
    instants = np.sort(first[~spread])
    instant_bytes = np.concatenate([[0.0], np.cumsum(size[~spread][np.argsort(first[~spread], kind="stable")])])
    carried = instant_bytes[np.searchsorted(instants, at, side="right")]
    if not spread.any():
        return carried
    rate = size[spread] / (last[spread] - first[spread])
    change_ts = np.concatenate([first[spread], last[spread]])
    change = np.concatenate([rate, -rate])
    order = np.argsort(change_ts, kind="stable")
    change_ts, level = change_ts[order], np.cumsum(change[order])
    area = np.concatenate([[0.0], np.cumsum(level[:-1] * np.diff(change_ts))])
    j = np.searchsorted(change_ts, at, side="right") - 1
    inside = j >= 0
    jj = np.maximum(j, 0)
    return carried + np.where(inside, area[jj] + level[jj] * (at - change_ts[jj]), 0.0)


def _bins(messages: pd.DataFrame, width_ns: int) -> tuple[np.ndarray, float, float]:
    """(bytes per bin from the first byte, span_ns, total bytes) of one host direction."""
    first, last = messages["first_ns"].to_numpy(), messages["last_ns"].to_numpy()
    size = messages["bytes"].to_numpy()
    start, end = first.min(), max(last.max(), first.max())
    edges = start + width_ns * np.arange(int(np.ceil(max(end - start, 1) / width_ns)) + 1, dtype=np.float64)
    carried = cumulative_bytes(first, last, size, edges)
    carried[-1] = size.sum()
    return np.diff(carried), float(end - start), float(size.sum())


def iteration_period_ns(arrivals: pd.DataFrame) -> float:
    """The median time between a rank's entries into consecutive operations of the job's most frequent kind
    (NaN when no rank entered two)."""
    if not len(arrivals):
        return float("nan")
    kind = arrivals.groupby(["protocol", "pg", "kind"]).size().idxmax()
    mine = arrivals[(arrivals["protocol"] == kind[0]).to_numpy() & (arrivals["pg"] == kind[1]).to_numpy()
                    & (arrivals["kind"] == kind[2]).to_numpy()].sort_values(["role", "rank", "seq"])
    gaps = mine.groupby(["role", "rank"])["entry_ts_ns"].diff().to_numpy(np.float64)
    gaps = gaps[np.isfinite(gaps)]
    return float(np.median(gaps)) if len(gaps) else float("nan")


def _runs(on: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lengths (in bins) of the ON runs and of the OFF runs between them."""
    change = np.flatnonzero(np.diff(on.astype(np.int8))) + 1
    bounds = np.concatenate([[0], change, [len(on)]])
    lengths = np.diff(bounds)
    is_on = on[bounds[:-1]]
    return lengths[is_on], lengths[~is_on]


def traffic_shape(events: pd.DataFrame, streams: pd.DataFrame, arrivals: pd.DataFrame
                  ) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(BURSTINESS_COLUMNS: per host, direction and bin width; ON_OFF_COLUMNS: per host and direction)."""
    messages = host_messages(events)
    if not len(messages):
        return (BURSTINESS.schema.empty_table().to_pandas(), ON_OFF.schema.empty_table().to_pandas())
    names = host_names(streams) if len(streams) else pd.Series(dtype=object)
    period = iteration_period_ns(arrivals)
    bursts, periods = [], []
    for (ip, direction), mine in messages.groupby(["ip", "direction"], sort=True):
        node = names.get(ip, ip)
        for width in BIN_WIDTHS_NS:
            per_bin, span, total = _bins(mine, width)
            mean = total / max(span, width)
            peak = per_bin.max() / width
            bursts.append({"node": node, "ip": ip, "direction": direction, "bin_ns": width, "bins": len(per_bin),
                           "bytes": int(total), "span_ns": int(span), "mean_rate_gb_per_s": mean,
                           "peak_rate_gb_per_s": peak, "peak_to_mean": peak / mean if mean > 0 else np.nan})
        per_bin, span, _ = _bins(mine, ON_OFF_BIN_NS)
        on_runs, off_runs = _runs(per_bin > 0)
        cycle = (np.median(on_runs) + (np.median(off_runs) if len(off_runs) else 0)) * ON_OFF_BIN_NS
        periods.append({
            "node": node, "ip": ip, "direction": direction, "bin_ns": ON_OFF_BIN_NS,
            "on_fraction": float((per_bin > 0).mean()), "on_periods": int(len(on_runs)),
            "on_median_ns": int(np.median(on_runs) * ON_OFF_BIN_NS),
            "off_median_ns": pd.NA if not len(off_runs) else int(np.median(off_runs) * ON_OFF_BIN_NS),
            "longest_off_ns": pd.NA if not len(off_runs) else int(off_runs.max() * ON_OFF_BIN_NS),
            "iteration_period_ns": pd.NA if not np.isfinite(period) else int(round(period)),
            "cycles_per_iteration": period / cycle if np.isfinite(period) and cycle > 0 else np.nan,
        })
    return (pd.DataFrame(bursts, columns=list(BURSTINESS_COLUMNS)),
            pd.DataFrame(periods, columns=list(ON_OFF_COLUMNS)))
