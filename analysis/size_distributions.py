"""Flow and message size distributions per protocol, as network studies of training traffic report them
(a few huge flows carrying the tensors beside many small ones for control).

Messages: every message of the job once (events.parquet), its size as its protocol frames it. Flows: every TCP
direction (and RoCE queue-pair stream) once, its payload bytes as the capture that saw most of it counted them
(a direction captured at both ends is one flow).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlcsniff.analysis.stats_schema import SIZE_DISTRIBUTIONS

SIZE_COLUMNS = SIZE_DISTRIBUTIONS.names
QUANTILES = {"p50_bytes": 0.5, "p90_bytes": 0.9, "p99_bytes": 0.99}
FLOW_KEY = ["src_ip", "src_port", "dst_ip", "dst_port", "dest_qp", "protocol"]


def _distribution(sizes: pd.Series, protocol: pd.Series, kind: str) -> pd.DataFrame:
    frame = pd.DataFrame({"protocol": protocol.astype(object).fillna("tcp").to_numpy(),
                          "size": sizes.astype("Float64").to_numpy(np.float64, na_value=np.nan)})
    frame = frame[np.isfinite(frame["size"].to_numpy())]
    grouped = frame.groupby("protocol")["size"]
    out = grouped.agg(count="size", bytes="sum", min_bytes="min", mean_bytes="mean", max_bytes="max")
    for name, q in QUANTILES.items():
        out[name] = grouped.quantile(q)
    out = out.reset_index().assign(kind=kind)
    return out.astype({"count": np.int64, "bytes": np.int64, "min_bytes": np.int64, "max_bytes": np.int64})


def size_distributions(events: pd.DataFrame, streams: pd.DataFrame) -> pd.DataFrame:
    """SIZE_COLUMNS: per kind (message, flow) and protocol."""
    parts = []
    if len(events):
        parts.append(_distribution(events["size_bytes"], events["protocol"], "message"))
    if len(streams):
        keyed = streams.assign(**{name: streams[name].astype("Float64").fillna(-1) for name in
                                  ("src_port", "dst_port", "dest_qp")},
                               protocol=streams["protocol"].astype(object).fillna("tcp"))
        flows = keyed.groupby(FLOW_KEY, dropna=False)["bytes"].max().reset_index()
        parts.append(_distribution(flows["bytes"], flows["protocol"], "flow"))
    if not parts:
        return SIZE_DISTRIBUTIONS.schema.empty_table().to_pandas()
    return pd.concat(parts, ignore_index=True).sort_values(["kind", "protocol"], ignore_index=True)[list(SIZE_COLUMNS)]
