"""Incast: per receiving host, how many senders' messages arrive together (the fan-in of a parameter server's
pushes, a gather's root).

Every message of the job once, at the receiver when its capture saw it, else at the sender (analysis/
traffic_shape.py's view), on the job's one timeline. A sender is arriving from its message's first byte until
INCAST_WINDOW_NS after its last (senders within that window of each other count together); the fan-in at an
instant is the number of distinct senders arriving then (HTA's interval logic: each sender's intervals merged,
their starts and ends melted into +1/−1 events, a cumulative sum per receiver). Incast is fan-in 2 or more.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlcsniff.analysis.link_health import RECV, host_names
from dlcsniff.analysis.stats_schema import INCAST
from dlcsniff.analysis.traffic_shape import host_messages

INCAST_WINDOW_NS = 1_000_000
INCAST_COLUMNS = INCAST.names


def _merged(intervals: pd.DataFrame) -> pd.DataFrame:
    """Per (receiver, sender), its intervals [first_ns, last_ns) merged where they overlap."""
    ordered = intervals.sort_values(["ip", "sender", "first_ns"], kind="stable", ignore_index=True)
    reach = ordered.groupby(["ip", "sender"], sort=False)["last_ns"].cummax()
    before = reach.groupby([ordered["ip"], ordered["sender"]], sort=False).shift(1)
    block = (before.isna() | (ordered["first_ns"] > before)).cumsum()
    return ordered.groupby(block).agg(ip=("ip", "first"), sender=("sender", "first"), first_ns=("first_ns", "min"),
                                      last_ns=("last_ns", "max")).reset_index(drop=True)


def fan_in_segments(intervals: pd.DataFrame) -> pd.DataFrame:
    """Per receiver (ip), its time cut into segments of constant fan-in: ip, first_ns, last_ns, fan_in."""
    merged = _merged(intervals)
    events = pd.DataFrame({"ip": np.concatenate([merged["ip"].to_numpy(object)] * 2),
                           "ts_ns": np.concatenate([merged["first_ns"], merged["last_ns"]]),
                           "change": np.repeat([1, -1], len(merged))})
    events = events.sort_values(["ip", "ts_ns", "change"], ignore_index=True)   # ends before starts
    events["fan_in"] = events.groupby("ip", sort=False)["change"].cumsum()
    ip, ts = events["ip"].to_numpy(object), events["ts_ns"].to_numpy(np.float64)
    follows = np.append(ip[1:] == ip[:-1], False)
    ends = np.append(ts[1:], np.nan)
    segments = events.assign(last_ns=ends)[follows & (ends > ts)]
    return segments.rename(columns={"ts_ns": "first_ns"})[["ip", "first_ns", "last_ns", "fan_in"]]


def incast(events: pd.DataFrame, streams: pd.DataFrame) -> pd.DataFrame:
    """INCAST_COLUMNS: one row per receiving host."""
    messages = host_messages(events)
    received = messages[(messages["direction"] == RECV).to_numpy()]
    if not len(received):
        return INCAST.schema.empty_table().to_pandas()
    intervals = pd.DataFrame({"ip": received["ip"].to_numpy(object), "sender": received["peer"].to_numpy(object),
                              "first_ns": received["first_ns"].to_numpy(),
                              "last_ns": received["last_ns"].to_numpy() + INCAST_WINDOW_NS})
    segments = fan_in_segments(intervals)
    length = (segments["last_ns"] - segments["first_ns"]).to_numpy()
    fan_in = segments["fan_in"].to_numpy()
    parts = pd.DataFrame({"ip": segments["ip"].to_numpy(object), "busy_ns": np.where(fan_in > 0, length, 0),
                          "incast_ns": np.where(fan_in > 1, length, 0), "weighted": fan_in * length,
                          "fan_in": fan_in})
    parts["episode"] = (fan_in > 1) & ~np.append(False, (fan_in[:-1] > 1) & (parts["ip"].to_numpy()[:-1]
                                                                               == parts["ip"].to_numpy()[1:]))
    per = parts.groupby("ip").agg(busy_ns=("busy_ns", "sum"), incast_ns=("incast_ns", "sum"),
                                  weighted=("weighted", "sum"), max_fan_in=("fan_in", "max"),
                                  incast_episodes=("episode", "sum"))
    senders = intervals.groupby("ip")["sender"].nunique()
    names = host_names(streams) if len(streams) else pd.Series(dtype=object)
    out = pd.DataFrame({
        "node": [names.get(ip, ip) for ip in per.index], "ip": per.index.to_numpy(object),
        "senders": senders.reindex(per.index).to_numpy(np.int64), "max_fan_in": per["max_fan_in"].to_numpy(np.int64),
        "busy_ns": per["busy_ns"].round().to_numpy(np.int64), "incast_ns": per["incast_ns"].round().to_numpy(np.int64),
        "incast_fraction": np.where(per["busy_ns"] > 0, per["incast_ns"] / per["busy_ns"].where(per["busy_ns"] > 0),
                                    np.nan),
        "mean_fan_in": np.where(per["busy_ns"] > 0, per["weighted"] / per["busy_ns"].where(per["busy_ns"] > 0), np.nan),
        "incast_episodes": per["incast_episodes"].to_numpy(np.int64), "window_ns": INCAST_WINDOW_NS,
    })
    return out.sort_values("node", ignore_index=True)[list(INCAST_COLUMNS)]
