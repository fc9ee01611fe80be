"""Stragglers from the wire: the rank that entered a collective late, the worker whose push a sync round waited
for, the server slow to answer a round.

Judged against the job's own spread, never a fixed figure alone. A rank or worker is late at an operation when
both its lag and its idle lag (analysis/arrivals.py) exceed the job's lateness threshold: it came late, and not
because its previous operation kept it longer (a gather's root). The threshold is the larger of LATE_SIGMAS
robust standard deviations of the job's lags (1.4826 × their median absolute deviation: one straggler among
many operations does not move it) and LATE_FLOOR_NS. On the healthy jobs bundled here (pcaps/, the real NCCL
captures in pcaps/realcaps/) the largest lag that is also an idle lag is 88 ms (the Gloo matrix on 3 ranks, 19
of its standard deviations); the first operation of a group, where the ranks meet after starting up at their own
pace (their entries up to 0.9 s apart there), has no previous operation and so no idle lag: it is not judged.

A server is late at a round (sync: from the last push received to its first answer; async: push to answer)
when its longest update of the round exceeds the job's median update by more than the same threshold, computed
over the job's updates (healthy jobs here: up to 141 ms above the median, in mxnet_sync_large's 5 MB updates).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlcsniff.analysis.operations import Trace
from dlcsniff.analysis.spread import robust_sigma

LATE_FLOOR_NS = 250_000_000
LATE_SIGMAS = 20.0
ROLE_SERVER = "server"
UPDATE = "update"
STRAGGLER_COLUMNS = ("protocol", "pg", "kind", "seq", "role", "rank", "late_s", "threshold_s", "capture")


def late_threshold_ns(values: np.ndarray) -> float:
    """The job's lateness threshold for these values (lags, update times): see the module doc."""
    return max(float(LATE_FLOOR_NS), LATE_SIGMAS * robust_sigma(np.asarray(values, dtype=np.float64)))


def _ns(column: pd.Series) -> np.ndarray:
    return column.astype("Float64").to_numpy(np.float64, na_value=np.nan)


def arrival_stragglers(arrivals: pd.DataFrame) -> pd.DataFrame:
    """STRAGGLER_COLUMNS: every (operation, rank or worker) whose lag and idle lag both exceed the threshold of
    its group (collectives per protocol and process group; a ps-lite job's rounds), late_s being its lag."""
    found = []
    for _, group in arrivals.groupby(["protocol", "pg", "role"], sort=True):
        lag, idle_lag = _ns(group["lag_ns"]), _ns(group["idle_lag_ns"])
        threshold = late_threshold_ns(lag)
        with np.errstate(invalid="ignore"):
            late = (lag > threshold) & (idle_lag > threshold)
        found.append(group[late].assign(late_s=lag[late] / 1e9, threshold_s=threshold / 1e9))
    if not found:
        return pd.DataFrame(columns=list(STRAGGLER_COLUMNS))
    return pd.concat(found)[list(STRAGGLER_COLUMNS)]


def server_stragglers(keys: pd.DataFrame | None, trace: Trace | None) -> pd.DataFrame:
    """STRAGGLER_COLUMNS: every (server, round) whose longest update (analysis/overheads.py's keys table)
    exceeds the job's median update by more than the threshold, late_s being that excess."""
    if keys is None or trace is None or not len(keys):
        return pd.DataFrame(columns=list(STRAGGLER_COLUMNS))
    update_ns = keys["update_overhead_us"].to_numpy(np.float64) * 1e3
    per_round = pd.DataFrame({"rank": keys["server_rank"].to_numpy(np.int64),
                              "seq": keys["iteration"].to_numpy(np.int64), "update_ns": update_ns}
                             ).groupby(["rank", "seq"])["update_ns"].max().reset_index()
    typical = np.nanmedian(update_ns) if np.isfinite(update_ns).any() else np.nan
    excess = per_round["update_ns"].to_numpy() - typical
    threshold = late_threshold_ns(update_ns)
    with np.errstate(invalid="ignore"):
        late = per_round[excess > threshold].assign(late_s=excess[excess > threshold] / 1e9)
    servers = trace.nodes[trace.nodes["role"] == ROLE_SERVER].set_index("rank")["captures"]
    return late.assign(protocol="pslite", pg="", kind=UPDATE, role=ROLE_SERVER, threshold_s=threshold / 1e9,
                       capture=servers.reindex(late["rank"].to_numpy()).astype(object).to_numpy()
                       )[list(STRAGGLER_COLUMNS)]


def job_stragglers(arrivals: pd.DataFrame, keys: pd.DataFrame | None, trace: Trace | None) -> pd.DataFrame:
    """Every straggler of a job (STRAGGLER_COLUMNS), in operation order."""
    found = [part for part in (arrival_stragglers(arrivals), server_stragglers(keys, trace)) if len(part)]
    if not found:
        return pd.DataFrame(columns=list(STRAGGLER_COLUMNS))
    return pd.concat(found, ignore_index=True).sort_values(["protocol", "pg", "seq", "role", "rank"],
                                                             ignore_index=True)
