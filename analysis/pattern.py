"""The communication pattern: message sizes per operation, who sends how much to whom, volume per iteration
and per tensor."""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlcsniff.analysis.operations import (
    CATEGORY_CONTROL, CATEGORY_DATA, DLC_OPERATIONS, INIT_ITERATION, LONG_OPERATIONS, ROLE_WORKER,
    SLOT_PULL_RESPONSE, SLOT_PUSH_REQUEST, Trace, node_names,
)

SIZE_QUANTILES = (0.25, 0.5, 0.75, 0.99)


def operation_class(operations: pd.Series) -> np.ndarray:
    """The paper's split: "long" (tensor-carrying) and "short" (constant-size) operations; "other" for
    commands and control."""
    names = operations.astype(str).to_numpy()
    return np.where(np.isin(names, LONG_OPERATIONS), "long", np.where(np.isin(names, DLC_OPERATIONS), "short",
                                                                       "other"))


def message_sizes(trace: Trace) -> pd.DataFrame:
    """Length distribution (meta + data bytes) of every operation's records, with the long/short split."""
    records = trace.records
    grouped = records.groupby("operation", observed=True)["length"]
    table = grouped.agg(messages="size", bytes="sum", min_bytes="min", mean_bytes="mean", max_bytes="max")
    quantiles = grouped.quantile(list(SIZE_QUANTILES)).unstack()
    quantiles.columns = [f"p{round(q * 100)}_bytes" for q in SIZE_QUANTILES]
    table = table.join(quantiles).reset_index()
    table["operation"] = table["operation"].astype(str)
    table.insert(1, "class", operation_class(table["operation"]))
    return table


def traffic_matrix(trace: Trace) -> pd.DataFrame:
    """Messages and bytes from node to node, each message once (its sender's record; control messages
    from the scheduler's records, the only trace that holds them)."""
    records = trace.records
    once = records[records["is_send"] | (records["category"] == CATEGORY_CONTROL)]
    src_id = np.where(once["is_send"], once["node_id"], once["peer_id"])
    dst_id = np.where(once["is_send"], once["peer_id"], once["node_id"])
    src_rank = np.where(once["is_send"], once["dlc_rank"], once["peer_dlc_rank"])
    dst_rank = np.where(once["is_send"], once["peer_dlc_rank"], once["dlc_rank"])
    frame = pd.DataFrame({"src_rank": src_rank, "dst_rank": dst_rank, "src_id": src_id, "dst_id": dst_id,
                          "length": once["length"].to_numpy()})
    table = frame.groupby(["src_rank", "dst_rank", "src_id", "dst_id"]).agg(
        messages=("length", "size"), bytes=("length", "sum")).reset_index()
    table.insert(2, "src", node_names(table["src_id"].to_numpy()))
    table.insert(3, "dst", node_names(table["dst_id"].to_numpy()))
    return table.drop(columns=["src_id", "dst_id"])


def _worker_data(trace: Trace) -> pd.DataFrame:
    records = trace.records
    return records[(records["node_role"] == ROLE_WORKER) & (records["category"] == CATEGORY_DATA)
                   & (records["iteration"] >= INIT_ITERATION)]


def volume_per_iteration(trace: Trace) -> pd.DataFrame:
    """Bytes each worker pushed, pulled (values received) and exchanged in all per iteration; iteration -1
    is initialisation."""
    mine = _worker_data(trace)
    slot = mine["slot"].to_numpy()
    length = mine["length"].to_numpy()
    frame = pd.DataFrame({"worker_rank": mine["worker_rank"].to_numpy(), "iteration": mine["iteration"].to_numpy(),
                          "push_bytes": np.where(slot == SLOT_PUSH_REQUEST, length, 0),
                          "pull_bytes": np.where(slot == SLOT_PULL_RESPONSE, length, 0), "total_bytes": length})
    table = frame.groupby(["worker_rank", "iteration"]).agg(
        messages=("total_bytes", "size"), push_bytes=("push_bytes", "sum"), pull_bytes=("pull_bytes", "sum"),
        total_bytes=("total_bytes", "sum")).reset_index()
    table.insert(2, "phase", np.where(table["iteration"] == INIT_ITERATION, "init", "train"))
    return table


def volume_per_key(trace: Trace) -> pd.DataFrame:
    """Per tensor, over the training iterations, from the workers' records: bytes pushed and pulled, per
    iteration, and how sparse the pushes are (rows carried, row-sparse only)."""
    mine = _worker_data(trace)
    mine = mine[mine["iteration"] >= 0]
    slot = mine["slot"].to_numpy()
    length = mine["length"].to_numpy()
    push = slot == SLOT_PUSH_REQUEST
    frame = pd.DataFrame({
        "tensor_key": mine["tensor_key"].to_numpy(), "req_type": mine["req_type"].astype(str).to_numpy(),
        "server_rank": mine["server_rank"].to_numpy(), "iteration": mine["iteration"].to_numpy(),
        "worker_rank": mine["worker_rank"].to_numpy(),
        "push": push, "pull": slot == SLOT_PULL_RESPONSE,
        "push_bytes": np.where(push, length, 0), "pull_bytes": np.where(slot == SLOT_PULL_RESPONSE, length, 0),
        "push_rows": np.where(push, mine["rows"].to_numpy(), np.nan),
    })
    # a request's req_type is what the tensor is; responses without values say "default"
    kind = frame[frame["push"]].groupby("tensor_key")["req_type"].first()
    table = frame.groupby("tensor_key").agg(
        servers=("server_rank", "nunique"), pushes=("push", "sum"), pulls=("pull", "sum"),
        push_bytes=("push_bytes", "sum"), pull_bytes=("pull_bytes", "sum"),
        iterations=("iteration", "nunique"), workers=("worker_rank", "nunique"),
        rows_per_push=("push_rows", "mean")).reset_index()
    table.insert(1, "req_type", kind.reindex(table["tensor_key"]).fillna("unknown").to_numpy())
    rounds = (table["iterations"] * table["workers"]).where(lambda n: n > 0)
    table["push_bytes_per_iteration"] = table["push_bytes"] / rounds
    table["pull_bytes_per_iteration"] = table["pull_bytes"] / rounds
    return table
