"""Per (server, tensor key, iteration): the paper's server-side overheads, from the server's own records.

- synchronisation (sync mode): first → last Push_Recv_Server of the key in the round;
- update: sync mode, last Push_Recv_Server → the server's first answer to those pushes (a Push_Send_Server,
  or in MXNet 1.9.1 the response to the fused push-pull, which carries the updated values); async mode, the
  mean over the round's pushes of push receipt → its answer (the d_time of the answer);
- search: the mean over explicit pulls of Pull_Recv_Server → Pull_Send_Server. A job whose workers only
  push-pull has none: the value lookup is folded into the update (NaN).

A push's receipt is dated by its last byte at the server. A push the server's capture missed, or saw with a
hole (its "last byte" is then the edge of the hole, any time later: 100 ms after the answer in
mxnet_lossy), leaves the round's arrivals unknown: its synchronisation and update overheads are NaN, and
`push_times_known` false, rather than a figure (such as a negative update) that only the capture's loss made.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlcsniff.analysis.stats_schema import KEYS
from dlcsniff.analysis.operations import (
    CATEGORY_DATA, ROLE_SERVER, SLOT_PULL_RESPONSE, SLOT_PUSH_REQUEST, SLOT_PUSH_RESPONSE, Trace,
)

KEY_COLUMNS = KEYS.names
# what the summary's count of rounds without overheads means (summary.json's losses_explained)
KEY_LOSSES = {
    "key_rounds_without_push_times": "server rounds (keys.parquet rows) whose synchronisation and update overheads "
                                     "are not given (push_times_known false): the server's capture missed a push "
                                     "of the round or saw it with a hole, so when the pushes arrived is unknown",
}


def key_overheads(trace: Trace) -> pd.DataFrame:
    """One row per (server, tensor key, training iteration) (KEY_COLUMNS). size_bytes is the largest push
    of the round (meta + data), the message size the overheads belong to."""
    records = trace.records
    mine = records[(records["node_role"] == ROLE_SERVER) & (records["category"] == CATEGORY_DATA)
                   & (records["iteration"] >= 0)]
    origin = int(mine["ts_ns"].min()) if len(mine) else 0
    ts = (mine["ts_ns"] - origin).to_numpy(np.float64)
    request_ts = mine["request_ts_ns"].to_numpy()
    answered = request_ts >= 0
    since_request = np.where(answered, ts - (request_ts - origin), np.nan)
    slot, fused = mine["slot"].to_numpy(), mine["fused"].to_numpy()
    push = slot == SLOT_PUSH_REQUEST
    answer = (slot == SLOT_PUSH_RESPONSE) | ((slot == SLOT_PULL_RESPONSE) & fused)
    pull_answer = (slot == SLOT_PULL_RESPONSE) & ~fused
    frame = pd.DataFrame({
        "server_rank": mine["server_rank"].to_numpy(), "tensor_key": mine["tensor_key"].to_numpy(),
        "iteration": mine["iteration"].to_numpy(),
        "push_ts": np.where(push, ts, np.nan), "push_bytes": np.where(push, mine["length"].to_numpy(), np.nan),
        "partial_push": push & ~mine["complete"].to_numpy(bool),
        "answer_ts": np.where(answer, ts, np.nan), "update_ns": np.where(answer, since_request, np.nan),
        "search_ns": np.where(pull_answer, since_request, np.nan), "push": push, "pull": pull_answer,
    })
    per = frame.groupby(["server_rank", "tensor_key", "iteration"]).agg(
        first_push=("push_ts", "min"), last_push=("push_ts", "max"), size_bytes=("push_bytes", "max"),
        first_answer=("answer_ts", "min"), update_ns=("update_ns", "mean"), search_ns=("search_ns", "mean"),
        pushes=("push", "sum"), pulls=("pull", "sum"), partial_pushes=("partial_push", "sum")).reset_index()
    sync = trace.mode == "sync"
    # sync mode: every worker pushes each of its tensors once a round
    known = (per["partial_pushes"] == 0) & (per["pushes"] >= (trace.topology.workers if sync else 1))
    per[["first_push", "last_push", "update_ns"]] = per[["first_push", "last_push", "update_ns"]].where(known)
    servers = trace.nodes[trace.nodes["role"] == "server"].set_index("rank")["vantage"]
    return pd.DataFrame({
        "server_rank": per["server_rank"].to_numpy(np.int32), "tensor_key": per["tensor_key"].to_numpy(np.int64),
        "iteration": per["iteration"].to_numpy(np.int32),
        "size_bytes": per["size_bytes"].astype("Int64"),
        "sync_overhead_us": ((per["last_push"] - per["first_push"]) / 1e3).to_numpy() if sync
        else np.full(len(per), np.nan),
        "update_overhead_us": ((per["first_answer"] - per["last_push"]) / 1e3).to_numpy() if sync
        else (per["update_ns"] / 1e3).to_numpy(),
        "search_overhead_us": (per["search_ns"] / 1e3).to_numpy(),
        "pushes": per["pushes"].to_numpy(np.int64), "pulls": per["pulls"].to_numpy(np.int64),
        "vantage": servers.reindex(per["server_rank"].to_numpy()).to_numpy(),
        "push_times_known": known.to_numpy(bool),
    })
