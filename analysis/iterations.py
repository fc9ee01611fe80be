"""Per worker iteration: the paper's three phases, from the worker's own records.

For worker w and iteration t (Push_Send = slot 0 records, Pull_Recv = slot 3 records, so in MXNet 1.9.1 the
fused push-pull request and its response that brings the updated values back):
- phase 1: last Pull_Recv of t-1 → first Push_Send of t; none for t = 0: what precedes it is initialisation
  (the broadcast of the initial values, whose last pull MXNet 1.9.1 may even answer after iteration 0's
  first pushes left);
- phase 2: first → last Push_Send of t (gradients leave while backward still runs: the overlap);
- phase 3: first Push_Send → last Pull_Recv of t;
- computation = P1 + P2, communication = P3, iteration = P1 + P3, overlap ratio = P2 / (P1 + P3);
- wait: first → last Pull_Recv of t.
A Pull_Recv the capture did not see (or not to its end) has no known time: when an iteration has fewer
complete Pull_Recv than requests that ask for values (pulls and fused push-pulls), its P3 and wait, and the
next iteration's P1, are NaN.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlcsniff.analysis.stats_schema import ITERATIONS
from dlcsniff.analysis.operations import (
    CATEGORY_DATA, ROLE_WORKER, SLOT_PULL_REQUEST, SLOT_PULL_RESPONSE, SLOT_PUSH_REQUEST, Trace,
)

ITERATION_COLUMNS = ITERATIONS.names


def worker_iterations(trace: Trace) -> pd.DataFrame:
    """One row per worker iteration (ITERATION_COLUMNS), iterations counted from 0 after initialisation."""
    records = trace.records
    mine = records[(records["node_role"] == ROLE_WORKER) & (records["category"] == CATEGORY_DATA)
                   & (records["iteration"] >= 0)]
    # relative to the first record, nanoseconds are exact in float64 (which carries the NaNs) for 104 days
    origin = int(mine["ts_ns"].min()) if len(mine) else 0
    ts = (mine["ts_ns"] - origin).astype("float64")
    slot = mine["slot"].to_numpy()
    push = slot == SLOT_PUSH_REQUEST
    pull = (slot == SLOT_PULL_RESPONSE) & mine["complete"].to_numpy()
    frame = pd.DataFrame({
        "worker_rank": mine["worker_rank"].to_numpy(), "iteration": mine["iteration"].to_numpy(),
        "push_ts": ts.where(push).to_numpy(), "pull_ts": ts.where(pull).to_numpy(), "pulls": pull,
        "asked": (slot == SLOT_PULL_REQUEST) | (push & mine["fused"].to_numpy()),
    })
    per = frame.groupby(["worker_rank", "iteration"]).agg(
        first_push=("push_ts", "min"), last_push=("push_ts", "max"), first_pull=("pull_ts", "min"),
        last_pull=("pull_ts", "max"), pulls=("pulls", "sum"), asked=("asked", "sum")).reset_index()
    per.loc[per["pulls"] < per["asked"], ["first_pull", "last_pull"]] = np.nan
    previous = per[["worker_rank", "iteration", "last_pull"]].assign(iteration=per["iteration"] + 1)
    per = per.merge(previous.rename(columns={"last_pull": "previous_last_pull"}),
                    on=["worker_rank", "iteration"], how="left")
    phase1 = (per["first_push"] - per["previous_last_pull"]) / 1e9
    phase2 = (per["last_push"] - per["first_push"]) / 1e9
    phase3 = (per["last_pull"] - per["first_push"]) / 1e9
    start = per["previous_last_pull"].fillna(per["first_push"]).to_numpy()
    # unknown (neither the previous iteration's last values nor a push seen): null, not a cast NaN
    known = ~np.isnan(start)
    start_ts_ns = pd.arrays.IntegerArray(np.where(known, start, 0).astype(np.int64) + origin, ~known)
    workers = trace.nodes[trace.nodes["role"] == "worker"].set_index("rank")["vantage"]
    out = pd.DataFrame({
        "worker_rank": per["worker_rank"].to_numpy(np.int32),
        "iteration": per["iteration"].to_numpy(np.int32),
        "start_ts_ns": start_ts_ns,
        "phase1_s": phase1.to_numpy(), "phase2_s": phase2.to_numpy(), "phase3_s": phase3.to_numpy(),
        "computation_s": (phase1 + phase2).to_numpy(), "communication_s": phase3.to_numpy(),
        "iteration_s": (phase1 + phase3).to_numpy(),
        "overlap_ratio": (phase2 / (phase1 + phase3)).to_numpy(),
        "wait_s": ((per["last_pull"] - per["first_pull"]) / 1e9).to_numpy(),
        "vantage": workers.reindex(per["worker_rank"].to_numpy()).to_numpy(),
    })
    return out.sort_values(["worker_rank", "iteration"], ignore_index=True)
