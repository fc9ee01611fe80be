"""From decoded ps-lite messages to the records of the DLC trace: one row per message a node sent or received.

Each message of a capture becomes a record of the node that sent it and a record of the node that received
it, if that capture is the node's vantage point: its own capture (the capture in which the node is party to
every message), or, when the dataset has none, every capture it appears in (its peers'). A send is dated by
its first byte and a receipt by its last, both as seen at that vantage point.

Data messages map onto the paper's four worker-side and four server-side operations by a *slot*:

| slot | message | worker record | server record |
|---|---|---|---|
| 0 | push request (also MXNet 1.9.1's fused push-pull request) | Push_Send_Worker | Push_Recv_Server |
| 1 | push response without values | Push_Recv_Worker | Push_Send_Server |
| 2 | pull request | Pull_Send_Worker | Pull_Recv_Server |
| 3 | pull response (and the fused push-pull's: it carries the new values) | Pull_Recv_Worker | Pull_Send_Server |

Iterations are the decode's (messages.parquet `iteration`: decoders.pslite_job.message_iterations numbers
each worker's rounds per server and tensor over every capture of the job); a response without one takes its
matched request's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dlcsniff.analysis.load import AnalysisError, Dataset
from dlcsniff.decoders.protocols.pslite.decoder import CONTROL_CMD_NAMES
from dlcsniff.decoders.protocols.pslite.job import INIT_ITERATION, cumsum_within, message_iterations
from dlcsniff.decoders.protocols.pslite.vantage import vantage_points

SCHEDULER_ID = 1                   # ps-lite: scheduler 1, server rank r = 8 + 2r, worker rank r = 9 + 2r
ROLE_UNKNOWN, ROLE_SCHEDULER, ROLE_SERVER, ROLE_WORKER = range(4)
ROLE_NAMES = ("unknown", "scheduler", "server", "worker")
CATEGORY_DATA, CATEGORY_COMMAND, CATEGORY_CONTROL = range(3)
SLOT_PUSH_REQUEST, SLOT_PUSH_RESPONSE, SLOT_PULL_REQUEST, SLOT_PULL_RESPONSE = range(4)
NO_ITERATION = -2                  # a response whose request is not in the data; control records

WORKER_OPERATIONS = ("Push_Send_Worker", "Push_Recv_Worker", "Pull_Send_Worker", "Pull_Recv_Worker")
SERVER_OPERATIONS = ("Push_Recv_Server", "Push_Send_Server", "Pull_Recv_Server", "Pull_Send_Server")
DLC_OPERATIONS = WORKER_OPERATIONS + SERVER_OPERATIONS
# SimpleApp commands (MXNet: optimizer, sync mode, stop...): request, then response, by role
WORKER_COMMAND_OPERATIONS = ("SendCom_To_Servers", "RecvCom_From_Servers")
SERVER_COMMAND_OPERATIONS = ("RecvCom_From_Workers", "SendCom_To_Workers")
CONTROL_NAMES = tuple("_".join(part.capitalize() for part in name.split("_")) for name in CONTROL_CMD_NAMES)
SCHEDULER_OPERATIONS = tuple(f"{name}_{way}_Scheduler" for name in CONTROL_NAMES for way in ("Send", "Recv"))
OPERATIONS = DLC_OPERATIONS + WORKER_COMMAND_OPERATIONS + SERVER_COMMAND_OPERATIONS + SCHEDULER_OPERATIONS
# the paper's split: the four operations that carry tensors, and the four constant-size ones
LONG_OPERATIONS = ("Push_Send_Worker", "Pull_Recv_Worker", "Push_Recv_Server", "Pull_Send_Server")

# What each of a Trace's losses counts, and why: the stats summary's losses_explained, the CLI and the report say it
DROPPED_REASONS = ("records_dropped_control", "records_dropped_unknown_node", "records_dropped_outside_kv")
TRACE_LOSSES = {
    "messages": "ps-lite messages of the job the records are made from, each once (events.parquet)",
    "observations": "the captures' sightings of those messages (messages.parquet rows: a message seen at both "
                    "ends twice)",
    "records": "records of the trace: each message's send at its sender and its receipt at its receiver, where "
               "their own captures (or, lacking one, their peers') saw them",
    "records_seen_twice_dropped": "records of a node without a capture of its own, seen again in another of its "
                                  "peers' captures: the first sighting kept",
    "records_dropped": "records no trace file holds, for the reasons below",
    "records_dropped_control": "control messages at a worker or server with another worker or server or itself "
                               "(heartbeats, the TERMINATE each node sends itself at shutdown): a trace holds "
                               "control traffic in the scheduler's file only",
    "records_dropped_unknown_node": "records whose node or peer the decode could not name (no id from an "
                                    "identity, routing frame, announcement or address): no file to put them in",
    "records_dropped_outside_kv": "data or SimpleApp messages not between a worker and a server, or going the way "
                                  "its role never sends them: the trace's operations are a worker's and a server's",
    "responses_without_request": "responses whose request the captures did not hold (they started later, or lost "
                                 "it): no request time, so no overhead from them",
    "incomplete_records": "records of messages a capture did not see whole (holes): their lengths are short",
}

RECORD_COLUMNS = (
    "node_id", "peer_id", "node_role", "dlc_rank", "peer_dlc_rank", "worker_rank", "server_rank", "is_send",
    "category", "slot", "fused", "operation", "ts_ns", "length", "complete", "tensor_key", "ps_timestamp",
    "iteration", "op_num", "request_ts_ns", "req_type", "rows", "control_cmd", "capture", "record_id",
)


@dataclass(frozen=True, slots=True)
class Topology:
    """How many workers and servers the job has; DLC ranks are workers, then servers, then the scheduler."""

    workers: int
    servers: int

    @property
    def scheduler_dlc_rank(self) -> int:
        return self.workers + self.servers


@dataclass(frozen=True, slots=True)
class Trace:
    """Every node's records, with what the statistics need to know about the job."""

    records: pd.DataFrame          # RECORD_COLUMNS, in no particular order (record_id orders each node's)
    nodes: pd.DataFrame            # node_id, name, role, rank, dlc_rank, vantage ("own"/"peers"), captures
    topology: Topology
    mode: str                      # "sync" or "async"
    mode_evidence: str
    losses: dict[str, int] = field(default_factory=dict)


def node_role_rank(node_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ps-lite id → (role code, rank within the role); ids that name no single node get ROLE_UNKNOWN."""
    ids = np.asarray(node_ids)
    if ids.dtype.kind != "i":
        ids = ids.astype(np.int64)
    high = ids >= 8
    odd = (ids & 1).astype(bool)
    role = np.full(len(ids), ROLE_UNKNOWN, dtype=np.int8)
    role[ids == SCHEDULER_ID] = ROLE_SCHEDULER
    role[high & ~odd] = ROLE_SERVER
    role[high & odd] = ROLE_WORKER
    # server r = 8 + 2r, worker r = 9 + 2r: both (id - 8) // 2
    rank = np.where(high, (ids - 8) >> 1, 0).astype(np.int32)
    return role, rank


def dlc_ranks(node_ids: np.ndarray, topology: Topology) -> np.ndarray:
    role, rank = node_role_rank(node_ids)
    return np.select([role == ROLE_WORKER, role == ROLE_SERVER, role == ROLE_SCHEDULER],
                     [rank, topology.workers + rank, topology.scheduler_dlc_rank], -1).astype(np.int32)


def node_names(node_ids: np.ndarray) -> np.ndarray:
    role, rank = node_role_rank(node_ids)
    names = np.array(ROLE_NAMES, dtype=object)[role] + rank.astype(str).astype(object)
    return np.where(role == ROLE_SCHEDULER, "scheduler", np.where(role == ROLE_UNKNOWN, "unknown", names))


def job_topology(messages: pd.DataFrame, nodes: pd.DataFrame) -> Topology:
    """Workers and servers: what the scheduler announced, or else the highest ranks seen on the wire."""
    seen = pd.unique(np.concatenate([messages["sender_id"].dropna().to_numpy(np.int64),
                                     messages["recver_id"].dropna().to_numpy(np.int64),
                                     nodes["node_id"].dropna().to_numpy(np.int64)]))
    role, rank = node_role_rank(seen)
    workers = int(rank[role == ROLE_WORKER].max(initial=-1)) + 1
    servers = int(rank[role == ROLE_SERVER].max(initial=-1)) + 1
    announced = nodes["role"].value_counts()
    return Topology(workers=max(workers, int(announced.get("worker", 0))),
                    servers=max(servers, int(announced.get("server", 0))))


def _message_kind(messages: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(category, slot, fused) of every message; slot 0/1 = request/response for commands and control."""
    control = messages["control_cmd"].notna().to_numpy()
    command = ~control & messages["simple_app"].fillna(False).to_numpy(bool)
    request = messages["request"].fillna(False).to_numpy(bool)
    push = messages["push"].fillna(False).to_numpy(bool)
    # ps-lite without the pull field (and BytePS) marks a pull as "not a push"
    pull = messages["pull"].fillna(False).to_numpy(bool) | ~push
    fused = push & pull
    category = np.where(control, CATEGORY_CONTROL, np.where(command, CATEGORY_COMMAND, CATEGORY_DATA))
    data_slot = np.select([request & push, ~request & push & ~fused, request],
                          [SLOT_PUSH_REQUEST, SLOT_PUSH_RESPONSE, SLOT_PULL_REQUEST], SLOT_PULL_RESPONSE)
    slot = np.where(category == CATEGORY_DATA, data_slot, np.where(request, 0, 1))
    return category.astype(np.int8), slot.astype(np.int8), fused & (category == CATEGORY_DATA)


def _sides(messages: pd.DataFrame, vantage: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, int]]:
    """The sender's and the receiver's record of every message seen from their vantage points, for the
    records some trace file holds; and how many seen records none holds, by why (TRACE_LOSSES:
    records_dropped_control, _unknown_node, _outside_kv). A worker's or server's view of its control traffic
    with the scheduler is not counted: the scheduler's trace holds it."""
    capture = pd.Categorical(messages["capture"])
    n_captures = max(len(capture.categories), 1)
    vantage_code = vantage["node_id"].to_numpy(np.int64) * n_captures + pd.Categorical(
        vantage["capture"], categories=capture.categories).codes
    sender = messages["sender_id"].fillna(-1).to_numpy(np.int64)
    recver = messages["recver_id"].fillna(-1).to_numpy(np.int64)
    category, slot, fused = _message_kind(messages)
    control_cmd = messages["control_cmd"].fillna(-1).to_numpy(np.int16)
    req_type = pd.Categorical(messages["req_type"])
    columns = {
        "category": category, "slot": slot, "fused": fused,
        "request": messages["request"].fillna(False).to_numpy(bool),
        "length": messages["size_bytes"].to_numpy(np.int64),
        "complete": messages["complete"].fillna(False).to_numpy(bool),
        "tensor_key": messages["tensor_key"].fillna(-1).to_numpy(np.int64),
        "iteration": messages["iteration"].astype("Int64").fillna(NO_ITERATION).to_numpy(np.int64),
        "ps_timestamp": messages["ps_timestamp"].fillna(-1).to_numpy(np.int64),
        "customer_id": messages["customer_id"].fillna(-1).to_numpy(np.int32),
        "app_id": messages["app_id"].fillna(-1).to_numpy(np.int32),
        "control_cmd": control_cmd, "req_type": req_type.codes,
        "rows": messages["rows"].to_numpy(np.float64), "capture": capture.codes,
    }
    is_control = category == CATEGORY_CONTROL
    frames, dropped = [], dict.fromkeys(DROPPED_REASONS, 0)
    for node, peer, is_send, ts_column in ((sender, recver, True, "ts_first_ns"),
                                           (recver, sender, False, "ts_last_ns")):
        seen = np.isin(node * n_captures + capture.codes, vantage_code)
        node_role, _ = node_role_rank(node)
        peer_role, _ = node_role_rank(peer)
        operation = _operation_codes(node_role, category, slot, np.full(len(node), is_send), control_cmd)
        kv_pair = ((node_role == ROLE_WORKER) & (peer_role == ROLE_SERVER)) | (
            (node_role == ROLE_SERVER) & (peer_role == ROLE_WORKER))
        keep = seen & (operation >= 0) & (kv_pair | is_control)
        lost = seen & ~keep & ~(is_control & (peer_role == ROLE_SCHEDULER))
        unknown = (node_role == ROLE_UNKNOWN) | (peer_role == ROLE_UNKNOWN)
        for reason, why in zip(DROPPED_REASONS, (is_control & ~unknown, unknown, ~is_control & ~unknown)):
            dropped[reason] += int((lost & why).sum())
        rows = np.flatnonzero(keep)
        frames.append(pd.DataFrame({
            "node_id": node[rows].astype(np.int32), "peer_id": peer[rows].astype(np.int32),
            "node_role": node_role[rows], "is_send": np.full(len(rows), is_send),
            "operation": operation[rows].astype(np.int16), "ts_ns": messages[ts_column].to_numpy(np.int64)[rows],
            **{name: values[rows] for name, values in columns.items()}}))
    sides = pd.concat(frames, ignore_index=True)
    sides["req_type"] = pd.Categorical.from_codes(sides["req_type"], categories=req_type.categories)
    sides["capture"] = pd.Categorical.from_codes(sides["capture"], categories=capture.categories)
    return sides, dropped


def _drop_seen_twice(sides: pd.DataFrame, multi_nodes: np.ndarray) -> tuple[pd.DataFrame, int]:
    """A node seen through several captures may see one message in more than one: keep the first."""
    several = sides["node_id"].isin(multi_nodes).to_numpy()
    if not several.any():
        return sides, 0
    identity = ["node_id", "peer_id", "is_send", "category", "request", "slot", "customer_id", "app_id",
                "ps_timestamp", "control_cmd", "tensor_key"]
    subset = sides[several].sort_values("ts_ns", kind="stable")
    kept = subset[~subset.duplicated(identity)]
    out = pd.concat([sides[~several], kept], ignore_index=True)
    return out, int(len(subset) - len(kept))


def group_starts(*sorted_keys: np.ndarray) -> np.ndarray:
    """True where any key differs from the previous row (the keys are already sorted)."""
    n = len(sorted_keys[0])
    start = np.zeros(n, dtype=bool)
    if n:
        start[0] = True
        for key in sorted_keys:
            start[1:] |= key[1:] != key[:-1]
    return start


def _match_responses(records: pd.DataFrame) -> np.ndarray:
    """For every record, the row of the request it answers within the same node's records (-1: none).

    Request and response share (peer, customer, app, ps timestamp): sorted so, a response follows its
    request directly."""
    exchange = records["category"].to_numpy() != CATEGORY_CONTROL
    keys = [records[name].to_numpy() for name in ("node_id", "peer_id", "category", "customer_id", "app_id",
                                                   "ps_timestamp")]
    is_response = ~records["request"].to_numpy()
    order = np.lexsort([is_response] + keys[::-1] + [~exchange])
    starts = group_starts(*(key[order] for key in keys), exchange[order])
    matched = np.full(len(records), -1, dtype=np.int64)
    follows_request = ~starts[1:] & ~is_response[order][:-1] & is_response[order][1:] & exchange[order][1:]
    matched[order[1:][follows_request]] = order[:-1][follows_request]
    return matched


def _command_numbers(records: pd.DataFrame, matched: np.ndarray) -> np.ndarray:
    """Operation numbers of SimpleApp commands (2k request, 2k+1 response, k per node and peer) and of
    control messages (their order per node and peer)."""
    number = np.full(len(records), -1, dtype=np.int64)
    category = records["category"].to_numpy()
    request = records["request"].to_numpy()
    for rows, step in ((np.flatnonzero((category == CATEGORY_COMMAND) & request), 2),
                       (np.flatnonzero(category == CATEGORY_CONTROL), 1)):
        node, peer, ts = (records[name].to_numpy()[rows] for name in ("node_id", "peer_id", "ts_ns"))
        order = np.lexsort([ts, peer, node])
        starts = group_starts(node[order], peer[order])
        number[rows[order]] = (cumsum_within(np.ones(len(rows), dtype=np.int64), starts) - 1) * step
    responses = np.flatnonzero((category == CATEGORY_COMMAND) & ~request & (matched >= 0))
    number[responses] = number[matched[responses]] + 1
    return number


def _operation_codes(node_role: np.ndarray, category: np.ndarray, slot: np.ndarray, is_send: np.ndarray,
                     control_cmd: np.ndarray) -> np.ndarray:
    """Index into OPERATIONS, or -1 for a record no trace file holds (e.g. a worker's view of a barrier)."""
    worker, server = node_role == ROLE_WORKER, node_role == ROLE_SERVER
    data, command = category == CATEGORY_DATA, category == CATEGORY_COMMAND
    # a worker sends requests and receives responses; a server the other way round
    worker_ok = worker & (is_send == (slot % 2 == 0))
    server_ok = server & (is_send == (slot % 2 == 1))
    n_dlc, n_cmd = len(DLC_OPERATIONS), len(WORKER_COMMAND_OPERATIONS)
    control = (node_role == ROLE_SCHEDULER) & (category == CATEGORY_CONTROL) & (control_cmd >= 0) & (
        control_cmd < len(CONTROL_NAMES))
    return np.select(
        [data & worker_ok, data & server_ok, command & worker_ok, command & server_ok, control],
        [slot, len(WORKER_OPERATIONS) + slot, n_dlc + slot, n_dlc + n_cmd + slot,
         n_dlc + 2 * n_cmd + 2 * control_cmd.astype(np.int64) + np.where(is_send, 0, 1)],
        -1).astype(np.int64)


def kvstore_mode(messages: pd.DataFrame, records: pd.DataFrame) -> tuple[str, str]:
    """("sync" | "async", why). MXNet announces sync mode with a SimpleApp command; without it (a capture
    that missed the start), a server that ever answered a push before every worker's push of that round
    arrived is asynchronous."""
    if messages["simple_app_cmd"].eq("sync_mode").any():
        return "sync", "the workers sent the sync_mode command"
    if messages["flavor"].eq("byteps").any():
        return "sync", "BytePS servers aggregate every worker's push"
    group = ["node_id", "tensor_key", "iteration"]
    server = records[["slot", "fused", "ts_ns"] + group][
        ((records["node_role"] == ROLE_SERVER) & (records["category"] == CATEGORY_DATA)
         & (records["iteration"] >= 0)).to_numpy()]
    pushes = server[server["slot"] == SLOT_PUSH_REQUEST].groupby(group)["ts_ns"].agg(["max", "size"])
    answers = server[(server["slot"] == SLOT_PUSH_RESPONSE) | server["fused"] & (server["slot"] == SLOT_PULL_RESPONSE)]
    first_answer = answers.groupby(group)["ts_ns"].min()
    both = pushes.join(first_answer.rename("first_answer"), how="inner")
    both = both[both["size"] > 1]
    if len(both) == 0:
        return "async", "no sync_mode command and no round with several workers' pushes to tell"
    if (both["first_answer"] < both["max"]).any():
        return "async", "no sync_mode command, and servers answered pushes before all workers had pushed"
    return "sync", "no sync_mode command, but servers always answered after every worker's push"


def build_records(dataset: Dataset) -> Trace:
    """Every node's records (RECORD_COLUMNS) from a decoded job; record_id numbers each node's records in
    time order (the frame itself is in no particular order)."""
    messages = dataset.messages
    if len(messages) == 0:
        raise AnalysisError(f"{dataset.source}: no ps-lite messages were decoded — nothing to analyse")
    if "iteration" not in messages:      # an output older than the column, or rows made by hand
        messages = messages.assign(iteration=pd.array(message_iterations(messages).to_pylist(), dtype="Int64"))
    topology = job_topology(messages, dataset.nodes)
    vantage = pd.DataFrame(vantage_points(messages, dataset.nodes))
    multi = vantage.groupby("node_id").size()
    sides, dropped = _sides(messages, vantage)
    sides, seen_twice = _drop_seen_twice(sides, multi[multi > 1].index.to_numpy())

    matched = _match_responses(sides)
    answered = matched >= 0
    iteration = sides["iteration"].to_numpy()
    tensor_key = sides["tensor_key"].to_numpy().copy()
    tensor_key[answered] = tensor_key[matched[answered]]
    ts = sides["ts_ns"].to_numpy()
    request_ts = np.full(len(sides), -1, dtype=np.int64)
    request_ts[answered] = ts[matched[answered]]
    category, slot = sides["category"].to_numpy(), sides["slot"].to_numpy()
    data = category == CATEGORY_DATA
    op_num = np.where(data, 4 * (iteration + 1) + slot, _command_numbers(sides, matched))
    op_num = np.where(data & (iteration == NO_ITERATION), -1, op_num)

    node_id, peer_id = sides["node_id"].to_numpy(), sides["peer_id"].to_numpy()
    node_role = sides["node_role"].to_numpy()
    kv = (node_role == ROLE_WORKER) | (node_role == ROLE_SERVER)
    worker_side = node_role == ROLE_WORKER
    _, worker_rank = node_role_rank(np.where(worker_side, node_id, peer_id))
    _, server_rank = node_role_rank(np.where(worker_side, peer_id, node_id))
    order = np.lexsort([slot, ts, node_id])
    record_id = np.empty(len(sides), dtype=np.int64)
    record_id[order] = cumsum_within(np.ones(len(sides), dtype=np.int64), group_starts(node_id[order])) - 1
    records = pd.DataFrame({
        "node_id": node_id, "peer_id": peer_id, "node_role": node_role,
        "dlc_rank": dlc_ranks(node_id, topology), "peer_dlc_rank": dlc_ranks(peer_id, topology),
        "worker_rank": np.where(kv, worker_rank, -1).astype(np.int32),
        "server_rank": np.where(kv, server_rank, -1).astype(np.int32),
        "is_send": sides["is_send"].to_numpy(), "category": category, "slot": slot,
        "fused": sides["fused"].to_numpy(),
        "operation": pd.Categorical.from_codes(sides["operation"].to_numpy(), categories=list(OPERATIONS)),
        "ts_ns": ts, "length": sides["length"].to_numpy(), "complete": sides["complete"].to_numpy(),
        "tensor_key": tensor_key, "ps_timestamp": sides["ps_timestamp"].to_numpy(),
        "iteration": iteration.astype(np.int32), "op_num": op_num, "request_ts_ns": request_ts,
        "req_type": sides["req_type"].array, "rows": sides["rows"].to_numpy(),
        "control_cmd": sides["control_cmd"].to_numpy(), "capture": sides["capture"].array, "record_id": record_id,
    })
    mode, evidence = kvstore_mode(messages, records)
    unanswered = ~sides["request"].to_numpy() & ~answered & (category != CATEGORY_CONTROL)
    losses = {
        # a decode output older than the messages' event ids counts sightings only
        **({"messages": int(messages["event_id"].nunique())} if "event_id" in messages else {}),
        "observations": int(len(messages)),
        "records": int(len(records)),
        "records_seen_twice_dropped": seen_twice,
        "records_dropped": sum(dropped.values()),
        **dropped,
        "responses_without_request": int(unanswered.sum()),
        "incomplete_records": int((~records["complete"]).sum()),
    }
    return Trace(records=records, nodes=_node_table(vantage, topology), topology=topology,
                 mode=mode, mode_evidence=evidence, losses=losses)


def _node_table(vantage: pd.DataFrame, topology: Topology) -> pd.DataFrame:
    per_node = vantage.groupby("node_id").agg(own=("own", "any"),
                                              captures=("capture", lambda c: ", ".join(sorted(c))))
    ids = per_node.index.to_numpy(np.int64)
    role, rank = node_role_rank(ids)
    table = pd.DataFrame({
        "node_id": ids, "name": node_names(ids), "role": np.array(ROLE_NAMES)[role], "rank": rank,
        "dlc_rank": dlc_ranks(ids, topology),
        "vantage": np.where(per_node["own"].to_numpy(), "own", "peers"), "captures": per_node["captures"].to_numpy(),
    })
    return table[table["role"] != "unknown"].sort_values("dlc_rank", ignore_index=True)


def pslite_trace(dataset: Dataset) -> Trace | None:
    """The job's ps-lite trace; None when it has no ps-lite message (a collective-library job)."""
    return build_records(dataset) if len(dataset.messages) else None
