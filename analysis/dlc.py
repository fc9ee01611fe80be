"""The DLC trace files of SketchDLC: one text file per node, one line per message it sent or received.

Columns (the paper's Table 1): ID src dst length Dep_PP Operation OP_ID dep_Type dTime time_sec time_usec
IDdep, separated by one space (no field contains one). Lines starting with "#" before the header say whose
trace it is and where its times were seen (the node's own capture, or its peers').

Dependencies, as in the paper's trace, with MXNet 1.9.1's fused push-pull mapped on them:
- worker: Push_Recv on its Push_Send (1 Push_on_Push); Pull_Send on the round's Push_Recv (2 Pull_on_Push);
  Pull_Recv on its Pull_Send (3 Pull_on_Pull), or on its Push_Send when the push fetched the values itself
  (2 Pull_on_Push); a training Push_Send on the previous round's Pull_Recv of the same tensor from every
  server holding a part of it (4 Push_on_Pull, a list).
- server: Push_Send, and the response to a fused push-pull, on the Push_Recv of every worker of that round
  in sync mode (a list) or on the one push it answers in async mode; Pull_Send on its Pull_Recv (3).
Everything else (Push_Recv_Server, Pull_Recv_Server, the first round's sends, commands, control) is 0.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from dlcsniff.analysis.load import AnalysisError
from dlcsniff.analysis.names import capture_label, node_label
from dlcsniff.analysis.operations import (
    CATEGORY_DATA, INIT_ITERATION, NO_ITERATION, ROLE_SCHEDULER, ROLE_SERVER, ROLE_WORKER, SLOT_PULL_REQUEST,
    SLOT_PULL_RESPONSE, SLOT_PUSH_REQUEST, SLOT_PUSH_RESPONSE, Trace, group_starts, node_role_rank,
)

DLC_HEADER = "ID src dst length Dep_PP Operation OP_ID dep_Type dTime time_sec time_usec IDdep"
DLC_COLUMNS = tuple(DLC_HEADER.split())
DEP_INDEPENDENT, DEP_PUSH_ON_PUSH, DEP_PULL_ON_PUSH, DEP_PULL_ON_PULL, DEP_PUSH_ON_PULL = range(5)
NUM_PP_INIT = -15                  # the paper's mark of initialisation records
NUM_PP_SETUP = 0                   # connection set-up, commands, and anything outside the push/pull rounds
NO_DEPENDENCY = "-1"


@dataclass(frozen=True, slots=True)
class DlcFile:
    path: Path
    node: str                      # by role and rank: "worker rank 1" (analysis.names)
    records: int
    vantage: str
    captures: str                  # the captures' names in the tables, ", "-separated


def _text(values: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(values), pa.string())


def _peer_labels(records: pd.DataFrame) -> pa.Array:
    """The node part of an op_id: the server ("s0") in a worker's trace, the worker ("w1") elsewhere."""
    peer_role, peer_rank = node_role_rank(records["peer_id"].to_numpy())
    prefix = np.select([peer_role == ROLE_SERVER, peer_role == ROLE_WORKER], ["s", "w"], "")
    labels = pc.binary_join_element_wise(_text(prefix), _text(peer_rank), "")
    return pc.if_else(pa.array(peer_role == ROLE_SCHEDULER), pa.scalar("scheduler"),
                      pc.if_else(pa.array(prefix == ""), pa.scalar("unknown"), labels))


def _op_ids(records: pd.DataFrame, op_num: np.ndarray, peer: pa.Array) -> np.ndarray:
    """key-operation_num-peer ("NA" without an operation number), as an object array of str."""
    key = np.where(records["category"].to_numpy() == CATEGORY_DATA, records["tensor_key"].to_numpy(), -1)
    ids = pc.binary_join_element_wise(_text(key), _text(op_num), peer, "-")
    return pc.if_else(pa.array(op_num >= 0), ids, pa.scalar("NA")).to_numpy(zero_copy_only=False)


def _lists(members: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """One row per group: its op_ids as "(a,b,...)" (in peer order) and its latest time."""
    members = members.sort_values(by + ["peer_id"], kind="stable")
    starts = np.flatnonzero(group_starts(*(members[name].to_numpy() for name in by)))
    if len(starts) == 0:
        return pd.DataFrame(columns=by + ["list_ids", "list_ts"])
    # concatenating object arrays of str runs in C: no Python loop per group
    joined = np.add.reduceat(members["op_id"].to_numpy(dtype=object) + ",", starts)
    lists = members[by].iloc[starts].reset_index(drop=True)
    lists["list_ids"] = "(" + pd.Series(joined, dtype=object).str[:-1] + ")"
    lists["list_ts"] = np.maximum.reduceat(members["ts_ns"].to_numpy(), starts)
    return lists


def dlc_table(trace: Trace) -> pd.DataFrame:
    """Every record as a DLC line (DLC_COLUMNS), with node_id first, in file order."""
    records = trace.records
    data = (records["category"] == CATEGORY_DATA).to_numpy()
    iteration = records["iteration"].to_numpy().astype(np.int64)
    slot = records["slot"].to_numpy().astype(np.int64)
    fused = records["fused"].to_numpy()
    role = records["node_role"].to_numpy()
    op_num = records["op_num"].to_numpy()
    peer = _peer_labels(records)
    op_id = _op_ids(records, op_num, peer)
    ts = records["ts_ns"].to_numpy()

    num_pp = np.select([~data | (iteration == NO_ITERATION), iteration == INIT_ITERATION, slot < 2],
                       [NUM_PP_SETUP, NUM_PP_INIT, 2 * iteration + 1], 2 * iteration + 2)

    dep_type = np.full(len(records), DEP_INDEPENDENT, dtype=np.int64)
    dep_ts = np.full(len(records), -1, dtype=np.int64)
    id_dep = np.full(len(records), NO_DEPENDENCY, dtype=object)

    # one-to-one on the request a response answers: same key and peer, the request's slot in the same round
    answered = data & (records["request_ts_ns"].to_numpy() >= 0) & (op_num >= 0)
    request_slot = np.where((slot == SLOT_PULL_RESPONSE) & ~fused, SLOT_PULL_REQUEST, SLOT_PUSH_REQUEST)
    request_id = _op_ids(records, op_num - slot + request_slot, peer)
    worker, server = role == ROLE_WORKER, role == ROLE_SERVER
    sync_answer = server & answered & ((slot == SLOT_PUSH_RESPONSE) | fused) & (trace.mode == "sync")
    on_request = answered & ~sync_answer
    dep_type[on_request] = np.select([slot == SLOT_PUSH_RESPONSE, fused], [DEP_PUSH_ON_PUSH, DEP_PULL_ON_PUSH],
                                     DEP_PULL_ON_PULL)[on_request]
    dep_ts[on_request] = records["request_ts_ns"].to_numpy()[on_request]
    id_dep[on_request] = request_id[on_request]

    frame = pd.DataFrame({"node_id": records["node_id"].to_numpy(), "peer_id": records["peer_id"].to_numpy(),
                          "tensor_key": records["tensor_key"].to_numpy(), "iteration": iteration,
                          "op_id": op_id, "ts_ns": ts, "row": np.arange(len(records))})
    # worker Pull_Send on the round's Push_Recv (same server, key, iteration)
    pull_send = frame[worker & data & (slot == SLOT_PULL_REQUEST) & (iteration >= INIT_ITERATION)]
    push_recv = frame[worker & data & (slot == SLOT_PUSH_RESPONSE)].drop_duplicates(
        ["node_id", "peer_id", "tensor_key", "iteration"])
    found = pull_send.merge(push_recv, on=["node_id", "peer_id", "tensor_key", "iteration"], suffixes=("", "_dep"))
    rows = found["row"].to_numpy()
    dep_type[rows] = DEP_PULL_ON_PUSH
    dep_ts[rows], id_dep[rows] = found["ts_ns_dep"].to_numpy(), found["op_id_dep"].to_numpy()

    # one-to-many: a worker's training push on every Pull_Recv of that tensor in the previous round, and in
    # sync mode a server's answer to a push on every worker's push of that tensor in that round
    by = ["node_id", "tensor_key", "iteration"]
    previous_pulls = _lists(frame[worker & data & (slot == SLOT_PULL_RESPONSE) & (iteration >= INIT_ITERATION)], by)
    previous_pulls["iteration"] += 1
    pushes = frame[worker & data & (slot == SLOT_PUSH_REQUEST) & (iteration >= 0)]
    round_pushes = _lists(frame[server & data & (slot == SLOT_PUSH_REQUEST) & (iteration >= INIT_ITERATION)], by)
    answer_kind = np.where(fused, DEP_PULL_ON_PUSH, DEP_PUSH_ON_PUSH)
    for dependents, lists, kind in ((pushes, previous_pulls, np.full(len(records), DEP_PUSH_ON_PULL)),
                                    (frame[sync_answer], round_pushes, answer_kind)):
        found = dependents.merge(lists, on=by)
        rows = found["row"].to_numpy()
        dep_type[rows] = kind[rows]
        dep_ts[rows], id_dep[rows] = found["list_ts"].to_numpy(), found["list_ids"].to_numpy()

    d_time_us = np.where(dep_ts >= 0, np.round((ts - dep_ts) / 1000.0), 0).astype(np.int64)
    table = pd.DataFrame({
        "node_id": records["node_id"].to_numpy(), "ID": records["record_id"].to_numpy(),
        "src": np.where(records["is_send"], records["dlc_rank"], records["peer_dlc_rank"]),
        "dst": np.where(records["is_send"], records["peer_dlc_rank"], records["dlc_rank"]),
        "length": records["length"].to_numpy(), "Dep_PP": num_pp,
        "Operation": records["operation"].astype(str).to_numpy(), "OP_ID": op_id, "dep_Type": dep_type, "dTime": d_time_us, "time_sec": ts // 1_000_000_000,
        "time_usec": ts % 1_000_000_000 // 1000, "IDdep": id_dep,
    })
    return table.sort_values(["node_id", "ID"], ignore_index=True)


def _banner(node: pd.Series, trace: Trace, captures: dict[str, str]) -> str:
    topology = trace.topology
    seen = ", ".join(capture_label(capture, captures) for capture in node["captures"].split(", "))
    if node["vantage"] == "own":
        vantage = f"vantage: this node's own capture ({seen})"
    else:
        vantage = (f"vantage: its peers' captures ({seen}); the dataset has no capture of this node, "
                   "so times are when the peers saw each message")
    lines = [
        f"dlcsniff DLC trace of {node_label(node['role'], node['rank'])} (ps-lite node {node['node_id']}, DLC rank "
        f"{node['dlc_rank']}), "
        "SketchDLC record format",
        vantage,
        f"job: {topology.workers} workers (DLC ranks 0-{topology.workers - 1}), {topology.servers} servers "
        f"(DLC ranks {topology.workers}-{topology.scheduler_dlc_rank - 1}), scheduler DLC rank "
        f"{topology.scheduler_dlc_rank}; kvstore mode {trace.mode} ({trace.mode_evidence})",
        f"Dep_PP: 2*iteration+1 push, 2*iteration+2 pull, {NUM_PP_INIT} initialisation (kv.init push, first "
        f"pulls), {NUM_PP_SETUP} commands and set-up",
        "OP_ID: key-operation_num-peer, operation_num = 4*(iteration+1) + (0 push request, 1 push response, "
        "2 pull request, 3 pull response, the fused push-pull response included); NA: no iteration (a response of "
        "an unknown tensor whose request no capture saw)",
        "dep_Type: 0 independent, 1 Push_on_Push, 2 Pull_on_Push, 3 Pull_on_Pull, 4 Push_on_Pull; "
        "dTime: microseconds since the record depended on (the latest of a list)",
        "time: a send at its first byte, a receipt at its last byte, as captured",
    ]
    return "".join(f"# {line}\n" for line in lines)


def dlc_file_name(node: pd.Series) -> str:
    return "scheduler.txt" if node["role"] == "scheduler" else f"{node['role']}{node['rank']}.txt"


def write_dlc(trace: Trace, out_dir: str | Path, captures: dict[str, str] | None = None) -> list[DlcFile]:
    """Write one trace file per node into out_dir (created if needed); `captures`: how to show each capture
    (analysis.names.capture_labels)."""
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AnalysisError(f"cannot create {out_dir}: {exc.strerror or exc}") from exc
    table = pa.Table.from_pandas(dlc_table(trace), preserve_index=False)
    lines_only = pa_csv.WriteOptions(include_header=False, delimiter=" ", quoting_style="none")
    written = []
    for _, node in trace.nodes.iterrows():
        lines = table.filter(pc.equal(table["node_id"], node["node_id"])).select(list(DLC_COLUMNS))
        path = out_dir / dlc_file_name(node)
        try:
            with open(path, "wb") as trace_file:
                trace_file.write((_banner(node, trace, captures or {}) + DLC_HEADER + "\n").encode("utf-8"))
                pa_csv.write_csv(lines, trace_file, write_options=lines_only)
        except OSError as exc:
            raise AnalysisError(f"cannot write {path}: {exc.strerror or exc}") from exc
        written.append(DlcFile(path=path, node=node_label(node["role"], node["rank"]), records=lines.num_rows,
                               vantage=node["vantage"],
                               captures=node["captures"]))
    return written


def read_dlc(path: str | Path) -> pd.DataFrame:
    """Read a DLC trace file back (for checks and downstream tools)."""
    return pd.read_csv(path, sep=" ", comment="#", dtype={"OP_ID": str, "IDdep": str}, keep_default_na=False)
