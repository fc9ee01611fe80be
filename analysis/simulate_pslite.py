"""A parameter-server job (ps-lite) as the replay's program: its model from the capture, what-ifs on it, and the
simulated trace back in the DLC records' shape, so that `stats`' own functions measure it.

The model (`pslite_model`) holds, per worker and training iteration, every request the worker sent (push or
pull, in its dispatch order) and the server's answer to it, with:
- sizes: each message's length (meta + data) as captured;
- the worker's computation: when the request was issued, counted from the receipt of the last value-bearing
  answer of the previous iteration (SketchDLC's Push_on_Pull: phase 1 and the backward gaps), or for a pull
  that follows its push's acknowledgement from that acknowledgement (Pull_on_Push); iteration 0 from the
  first training request of the job;
- the server's time: from the last push of the round (sync mode: every worker's push of that key in that
  iteration) or from the request itself (async mode; pulls) to the answer's first byte (update and search
  overheads);
- the key's placement (server rank; a large tensor split over every server).
A message's first byte leaves only once the one before it on its connection was delivered (ps-lite sends a
node's messages to a peer over one TCP connection): in a capture, a request or answer that left while the one
before it on its connection was still arriving waited in that queue, so it was issued no later than its first
byte, and the model takes it as issued with the request before it in the worker's order (a request) or as
the round's first unqueued answer (an answer; else the key's median over the rounds).

What-ifs (`build_program`): N workers (worker i copies worker i mod W's requests and computation; servers
wait for every one of them in sync mode), M servers (keys placed as MXNet's KVStoreDist places them: a tensor
of at least `bigarray_bound` elements split evenly over the servers, any other on server key * 9973 mod M; the
parts of a key are issued together, at the earliest of its captured parts, and each server takes the key's
median answer time).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dlcsniff.analysis.load import Dataset
from dlcsniff.analysis.operations import (
    CATEGORY_DATA, ROLE_SERVER, ROLE_WORKER, SLOT_PULL_REQUEST, SLOT_PULL_RESPONSE, SLOT_PUSH_REQUEST,
    SLOT_PUSH_RESPONSE, OPERATIONS, Topology, Trace, dlc_ranks,
)
from dlcsniff.analysis.simulate_replay import DELIVERED, Program
from dlcsniff.decoders.protocols.pslite.vantage import vantage_points

MXNET_BIGARRAY_BOUND = 1_000_000     # MXNET_KVSTORE_BIGARRAY_BOUND's default, in elements
ELEMENT_BYTES = 4                    # float32
KEY_SPREAD = 9973                    # MXNet: a small key goes to server (key * 9973) % servers
AFTER_START, AFTER_VALUES, AFTER_ACK = 0, 1, 2
QUEUE_TOLERANCE_NS = 200_000         # a first byte this close to the previous message's last counts as queued

MESSAGE_COLUMNS = ("worker_rank", "server_rank", "to_server", "slot", "fused", "tensor_key", "iteration",
                   "ps_timestamp", "length", "send_ns", "recv_ns")
REQUEST_COLUMNS = ("worker_rank", "iteration", "order", "server_rank", "tensor_key", "slot", "fused", "size_bytes",
                   "after", "delay_s", "response_slot", "response_size_bytes", "response_delay_s")


@dataclass(frozen=True, slots=True)
class PsliteModel:
    requests: pd.DataFrame          # REQUEST_COLUMNS
    topology: Topology
    mode: str                       # sync / async
    bigarray_bound: int             # elements
    origin_ns: int                  # the first training request's first byte: simulated time 0
    queued_requests: int
    queued_answers: int


def data_messages(trace: Trace) -> pd.DataFrame:
    """One row per training message between a worker and a server (MESSAGE_COLUMNS): its sender's record (first
    byte) paired with its receiver's (last byte); NaN where one end's record is missing."""
    records = trace.records
    kv = records[(records["category"] == CATEGORY_DATA) & (records["iteration"] >= 0)
                 & records["node_role"].isin([ROLE_WORKER, ROLE_SERVER])]
    to_server = (kv["node_role"] == ROLE_WORKER).to_numpy() == kv["is_send"].to_numpy()
    frame = pd.DataFrame({
        "worker_rank": kv["worker_rank"].to_numpy(np.int64), "server_rank": kv["server_rank"].to_numpy(np.int64),
        "to_server": to_server, "slot": kv["slot"].to_numpy(np.int64), "fused": kv["fused"].to_numpy(bool),
        "tensor_key": kv["tensor_key"].to_numpy(np.int64), "iteration": kv["iteration"].to_numpy(np.int64),
        "ps_timestamp": kv["ps_timestamp"].to_numpy(np.int64), "length": kv["length"].to_numpy(np.int64),
        "ts_ns": kv["ts_ns"].to_numpy(np.int64), "is_send": kv["is_send"].to_numpy(bool),
        "complete": kv["complete"].to_numpy(bool),
    })
    identity = ["worker_rank", "server_rank", "to_server", "slot", "tensor_key", "ps_timestamp"]
    frame["occurrence"] = frame.sort_values("ts_ns", kind="stable").groupby(identity + ["is_send"]).cumcount()
    key = identity + ["occurrence"]
    sent = frame[frame["is_send"]][key + ["fused", "iteration", "length", "ts_ns"]].rename(columns={"ts_ns": "send_ns"})
    got = frame[~frame["is_send"]][key + ["fused", "iteration", "length", "ts_ns", "complete"]].rename(
        columns={"ts_ns": "recv_ns", "fused": "fused_r", "iteration": "iteration_r", "length": "length_r"})
    got.loc[~got["complete"], "recv_ns"] = np.nan
    both = sent.merge(got.drop(columns="complete"), on=key, how="outer")
    both["fused"] = both["fused"].fillna(both["fused_r"]).astype(bool)
    both["iteration"] = both["iteration"].fillna(both["iteration_r"]).astype(np.int64)
    both["length"] = np.fmax(both["length"].to_numpy(np.float64),
                             both["length_r"].to_numpy(np.float64)).astype(np.int64)
    return both[list(MESSAGE_COLUMNS)].sort_values(["send_ns", "recv_ns"], ignore_index=True)


def network_ends(dataset: Dataset, topology: Topology) -> pd.DataFrame:
    """Every ps-lite message as its sender's and its receiver's own captures saw it (simulate_network's ends;
    nodes by DLC rank: workers, then servers)."""
    messages = dataset.messages
    own = pd.DataFrame(vantage_points(messages, dataset.nodes))
    own = own[own["own"]]
    ends = []
    for column in ("sender_id", "recver_id"):
        seen = messages[["capture", column, "ts_first_ns", "ts_last_ns", "size_bytes"]].dropna().merge(
            own, left_on=[column, "capture"], right_on=["node_id", "capture"])
        ends.append(pd.DataFrame({"node": dlc_ranks(seen["node_id"].to_numpy(np.int64), topology),
                                  "sent": column == "sender_id", "first_ns": seen["ts_first_ns"].to_numpy(np.int64),
                                  "last_ns": seen["ts_last_ns"].to_numpy(np.int64),
                                  "size_bytes": seen["size_bytes"].to_numpy(np.int64)}))
    return pd.concat(ends, ignore_index=True)


def network_pairs(messages: pd.DataFrame, topology: Topology) -> pd.DataFrame:
    """The training messages (data_messages) as simulate_network's pairs."""
    worker, server = messages["worker_rank"].to_numpy(), topology.workers + messages["server_rank"].to_numpy()
    to_server = messages["to_server"].to_numpy(bool)
    return pd.DataFrame({"src": np.where(to_server, worker, server), "dst": np.where(to_server, server, worker),
                         "size_bytes": messages["length"].to_numpy(), "send_ns": messages["send_ns"].to_numpy(),
                         "recv_ns": messages["recv_ns"].to_numpy()})


def _queued(messages: pd.DataFrame) -> np.ndarray:
    """True where a message's first byte left before the previous message on its connection had arrived."""
    ordered = messages.sort_values(["send_ns"], kind="stable")
    connection = ordered.groupby(["worker_rank", "server_rank", "to_server"], sort=False)
    previous_recv = connection["recv_ns"].shift(1)
    queued = (ordered["send_ns"] < previous_recv + QUEUE_TOLERANCE_NS).fillna(False).to_numpy(bool)
    out = np.zeros(len(messages), dtype=bool)
    out[messages.index.get_indexer(ordered.index)] = queued
    return out


def _answer_pairs(messages: pd.DataFrame) -> pd.DataFrame:
    """Requests with their answers: one row per request, the answer's columns prefixed `answer_`."""
    requests = messages[messages["to_server"] & messages["slot"].isin([SLOT_PUSH_REQUEST, SLOT_PULL_REQUEST])]
    answers = messages[~messages["to_server"]]
    key = ["worker_rank", "server_rank", "tensor_key", "ps_timestamp"]
    answers = answers[key + ["slot", "length", "send_ns", "recv_ns", "queued"]].rename(
        columns={c: f"answer_{c}" for c in ("slot", "length", "send_ns", "recv_ns", "queued")})
    return requests.merge(answers.drop_duplicates(key), on=key, how="left")


def infer_bigarray_bound(requests: pd.DataFrame, servers: int) -> int:
    """MXNet's split threshold as the capture shows it: the smallest split tensor, when one was split; above
    every tensor when several servers split none; MXNet's default when one server cannot tell."""
    per_key = requests.groupby("tensor_key").agg(parts=("server_rank", "nunique"), size=("size_bytes", "sum"),
                                                 requests=("size_bytes", "size"))
    elements = (per_key["size"] / per_key["requests"] * per_key["parts"] / ELEMENT_BYTES)
    split = per_key["parts"] > 1
    if split.any():
        return int(elements[split].min())
    if servers > 1 and len(elements):
        return max(MXNET_BIGARRAY_BOUND, int(elements.max()) + 1)
    return MXNET_BIGARRAY_BOUND


def pslite_model(trace: Trace) -> PsliteModel:
    messages = data_messages(trace)
    if not len(messages):
        raise ValueError("no training messages between workers and servers")
    messages["queued"] = _queued(messages)
    pairs = _answer_pairs(messages)
    origin = int(pairs["send_ns"].min())
    # ready: the last value-bearing answer of the previous iteration, per worker
    values = messages[~messages["to_server"] & (messages["slot"] == SLOT_PULL_RESPONSE)]
    ready = values.groupby(["worker_rank", "iteration"])["recv_ns"].max()
    ready_index = pd.MultiIndex.from_arrays([pairs["worker_rank"], pairs["iteration"] - 1])
    ready_ns = ready.reindex(ready_index).to_numpy(np.float64)
    ready_ns = np.where(pairs["iteration"].to_numpy() == 0, origin, ready_ns)
    # a pull that follows its push's acknowledgement counts from it
    acks = messages[~messages["to_server"] & (messages["slot"] == SLOT_PUSH_RESPONSE)]
    ack = acks.groupby(["worker_rank", "server_rank", "tensor_key", "iteration"])["recv_ns"].max()
    ack_ns = ack.reindex(pd.MultiIndex.from_frame(pairs[["worker_rank", "server_rank", "tensor_key", "iteration"]])
                         ).to_numpy(np.float64)
    after = np.where(pairs["iteration"].to_numpy() == 0, AFTER_START, AFTER_VALUES)
    pull_after_ack = (pairs["slot"].to_numpy() == SLOT_PULL_REQUEST) & np.isfinite(ack_ns)
    after = np.where(pull_after_ack, AFTER_ACK, after)
    reference = np.where(pull_after_ack, ack_ns, ready_ns)
    pairs = pairs.assign(reference_ns=reference, after=after)
    # issue: the first byte, or for a request queued on its connection, with the worker's request before it
    pairs = pairs.sort_values(["worker_rank", "iteration", "ps_timestamp", "server_rank"], ignore_index=True)
    issue = pairs["send_ns"].astype(np.float64).where(~pairs["queued"])
    issue = issue.groupby([pairs["worker_rank"], pairs["iteration"]]).ffill()
    issue = issue.fillna(pairs["reference_ns"])
    delay = np.clip((issue - pairs["reference_ns"]).to_numpy(np.float64) / 1e9, 0.0, None)
    delay = np.where(np.isfinite(delay), delay, 0.0)
    answer_delay = _answer_delays(pairs, messages, trace.mode)
    requests = pd.DataFrame({
        "worker_rank": pairs["worker_rank"].to_numpy(np.int64), "iteration": pairs["iteration"].to_numpy(np.int64),
        "order": pairs.groupby(["worker_rank", "iteration"]).cumcount().to_numpy(np.int64),
        "server_rank": pairs["server_rank"].to_numpy(np.int64), "tensor_key": pairs["tensor_key"].to_numpy(np.int64),
        "slot": pairs["slot"].to_numpy(np.int64), "fused": pairs["fused"].to_numpy(bool),
        "size_bytes": pairs["length"].to_numpy(np.int64), "after": pairs["after"].to_numpy(np.int64),
        "delay_s": delay,
        "response_slot": pairs["answer_slot"].fillna(pd.Series(
            np.where(pairs["fused"] | (pairs["slot"] == SLOT_PULL_REQUEST), SLOT_PULL_RESPONSE, SLOT_PUSH_RESPONSE),
            index=pairs.index)).to_numpy(np.int64),
        "response_size_bytes": pairs["answer_length"].fillna(pairs["length"]).to_numpy(np.int64),
        "response_delay_s": answer_delay,
    })
    return PsliteModel(requests=requests, topology=trace.topology, mode=trace.mode,
                       bigarray_bound=infer_bigarray_bound(requests, trace.topology.servers), origin_ns=origin,
                       queued_requests=int(pairs["queued"].sum()),
                       queued_answers=int(pairs["answer_queued"].fillna(False).astype(bool).sum()))


def _answer_delays(pairs: pd.DataFrame, messages: pd.DataFrame, mode: str) -> np.ndarray:
    """Seconds from what an answer waits for (sync push: the round's last push; else its request) to its first
    byte. A queued answer takes its round's first unqueued one, else its key's median over the rounds after the
    first, else its server's (else the key's first round; else 0): a server's first round of a key is no
    evidence of its later ones (captured with one server, the first round's small answers can leave a whole
    large transfer late, every later one queued behind a large answer)."""
    pushes = messages[messages["to_server"] & (messages["slot"] == SLOT_PUSH_REQUEST)]
    round_key = ["server_rank", "tensor_key", "iteration"]
    last_push = pushes.groupby(round_key)["recv_ns"].max()
    waited = pairs["recv_ns"].to_numpy(np.float64)
    if mode == "sync":
        round_last = last_push.reindex(pd.MultiIndex.from_frame(pairs[round_key])).to_numpy(np.float64)
        is_push = pairs["slot"].to_numpy() == SLOT_PUSH_REQUEST
        waited = np.where(is_push, round_last, waited)
    delay = (pairs["answer_send_ns"].to_numpy(np.float64) - waited) / 1e9
    queued = pairs["answer_queued"].fillna(True).astype(bool).to_numpy()
    known = pd.Series(np.where(queued | ~np.isfinite(delay), np.nan, np.clip(delay, 0, None)))
    by_round = known.groupby([pairs[c] for c in round_key]).transform("min")
    key = [pairs["server_rank"], pairs["tensor_key"]]
    later = known.where(pairs["iteration"].to_numpy() > pairs["iteration"].min())
    by_key = later.groupby(key).transform("median")
    by_server = later.groupby(pairs["server_rank"]).transform("median")
    first = known.groupby(key).transform("median")
    return known.fillna(by_round).fillna(by_key).fillna(by_server).fillna(first).fillna(0.0).to_numpy(np.float64)


def _with_workers(requests: pd.DataFrame, workers: int) -> pd.DataFrame:
    captured = np.sort(requests["worker_rank"].unique())
    copies = [requests[requests["worker_rank"] == captured[w % len(captured)]].assign(worker_rank=w)
              for w in range(workers)]
    return pd.concat(copies, ignore_index=True)


def _part_bytes(total_bytes: np.ndarray, servers: int) -> np.ndarray:
    """Bytes of each of `servers` parts of each tensor, as MXNet splits its elements (rows: tensors)."""
    elements = total_bytes / ELEMENT_BYTES
    edges = np.round(elements[:, None] / servers * np.arange(servers + 1)[None, :])
    return np.diff(edges, axis=1) * ELEMENT_BYTES


def place_keys(requests: pd.DataFrame, servers: int, bound: int) -> pd.DataFrame:
    """The requests with their keys placed on `servers` servers as MXNet places them."""
    group = ["worker_rank", "iteration", "tensor_key", "slot"]
    keys = requests.groupby(group, sort=False).agg(
        order=("order", "min"), fused=("fused", "first"), after=("after", "first"), delay_s=("delay_s", "min"),
        size_bytes=("size_bytes", "sum"), response_slot=("response_slot", "first"),
        response_size_bytes=("response_size_bytes", "sum"), response_part_bytes=("response_size_bytes", "min"),
        response_delay_s=("response_delay_s", "median")).reset_index()
    split = keys["size_bytes"].to_numpy() / ELEMENT_BYTES >= bound
    whole = keys[~split].assign(server_rank=(keys.loc[~split, "tensor_key"] * KEY_SPREAD) % servers)
    parts = keys[split]
    if len(parts):
        size = _part_bytes(parts["size_bytes"].to_numpy(np.float64), servers)
        carries_values = (parts["response_slot"] == SLOT_PULL_RESPONSE).to_numpy()
        response = np.where(carries_values[:, None],
                            _part_bytes(parts["response_size_bytes"].to_numpy(np.float64), servers),
                            parts["response_part_bytes"].to_numpy(np.float64)[:, None])
        parts = parts.loc[parts.index.repeat(servers)].assign(
            server_rank=np.tile(np.arange(servers), len(parts)), size_bytes=size.ravel(),
            response_size_bytes=response.ravel())
    placed = pd.concat([whole, parts], ignore_index=True).drop(columns="response_part_bytes")
    placed["size_bytes"] = placed["size_bytes"].astype(np.int64)
    placed["response_size_bytes"] = placed["response_size_bytes"].astype(np.int64)
    return placed.sort_values(["worker_rank", "iteration", "order", "server_rank"], ignore_index=True)[
        list(REQUEST_COLUMNS)]


@dataclass(frozen=True, slots=True)
class PsliteProgram:
    program: Program
    messages: pd.DataFrame          # per program message: worker_rank, server_rank, to_server, slot, fused,
                                    # tensor_key, iteration, size_bytes, request (its request's message id)
    topology: Topology


def build_program(model: PsliteModel, workers: int | None = None, servers: int | None = None) -> PsliteProgram:
    """The replay program of the model, with `workers` workers and `servers` servers (default: the captured)."""
    workers = workers or model.topology.workers
    servers = servers or model.topology.servers
    requests = model.requests
    if workers != model.topology.workers:
        requests = _with_workers(requests, workers)
    if servers != model.topology.servers:
        requests = place_keys(requests, servers, model.bigarray_bound)
    requests = requests.sort_values(["worker_rank", "iteration", "order", "server_rank"], ignore_index=True)
    n = len(requests)
    request_id = 2 * np.arange(n)
    answer_id = request_id + 1
    worker = requests["worker_rank"].to_numpy(np.int64)
    server = requests["server_rank"].to_numpy(np.int64) + workers
    messages = pd.DataFrame({
        "src": np.ravel(np.column_stack([worker, server])), "dst": np.ravel(np.column_stack([server, worker])),
        "size_bytes": np.ravel(requests[["size_bytes", "response_size_bytes"]].to_numpy(np.int64)),
        "delay_s": np.ravel(requests[["delay_s", "response_delay_s"]].to_numpy(np.float64)),
    })
    info = pd.DataFrame({
        "worker_rank": np.repeat(worker, 2), "server_rank": np.repeat(server - workers, 2),
        "to_server": np.tile([True, False], n),
        "slot": np.ravel(requests[["slot", "response_slot"]].to_numpy(np.int64)),
        "fused": np.repeat(requests["fused"].to_numpy(bool), 2),
        "tensor_key": np.repeat(requests["tensor_key"].to_numpy(np.int64), 2),
        "iteration": np.repeat(requests["iteration"].to_numpy(np.int64), 2),
        "size_bytes": messages["size_bytes"].to_numpy(), "request": np.repeat(request_id, 2),
    })
    frame = requests.assign(request_id=request_id, answer_id=answer_id)
    deps = [_request_deps(frame), _answer_deps(frame, model.mode)]
    return PsliteProgram(Program(messages, pd.concat(deps, ignore_index=True), workers + servers), info,
                         Topology(workers=workers, servers=servers))


def _request_deps(frame: pd.DataFrame) -> pd.DataFrame:
    """A request after the values of its worker's previous iteration, or after its push's acknowledgement."""
    values = frame[frame["response_slot"] == SLOT_PULL_RESPONSE][["worker_rank", "iteration", "answer_id"]]
    after_values = frame[frame["after"] == AFTER_VALUES][["worker_rank", "iteration", "request_id"]]
    on_values = after_values.assign(iteration=after_values["iteration"] - 1).merge(values,
                                                                                   on=["worker_rank", "iteration"])
    acks = frame[(frame["slot"] == SLOT_PUSH_REQUEST) & (frame["response_slot"] == SLOT_PUSH_RESPONSE)]
    key = ["worker_rank", "server_rank", "tensor_key", "iteration"]
    after_ack = frame[frame["after"] == AFTER_ACK][key + ["request_id"]]
    on_acks = after_ack.merge(acks[key + ["answer_id"]], on=key)
    both = pd.concat([on_values, on_acks], ignore_index=True)
    return pd.DataFrame({"child": both["request_id"].to_numpy(np.int64), "parent": both["answer_id"].to_numpy(np.int64),
                         "kind": np.full(len(both), DELIVERED, np.int8)})


def _answer_deps(frame: pd.DataFrame, mode: str) -> pd.DataFrame:
    """An answer after its request; in sync mode a push's after every worker's push of that key and round."""
    own = frame[["answer_id", "request_id"]]
    if mode == "sync":
        key = ["server_rank", "tensor_key", "iteration"]
        pushes = frame[frame["slot"] == SLOT_PUSH_REQUEST]
        rounds = pushes[key + ["answer_id"]].merge(pushes[key + ["request_id"]], on=key)
        own = pd.concat([own[frame["slot"] != SLOT_PUSH_REQUEST], rounds[["answer_id", "request_id"]]],
                        ignore_index=True)
    return pd.DataFrame({"child": own["answer_id"].to_numpy(np.int64), "parent": own["request_id"].to_numpy(np.int64),
                         "kind": np.full(len(own), DELIVERED, np.int8)})


def simulated_trace(built: PsliteProgram, times: pd.DataFrame, mode: str, origin_ns: int) -> Trace:
    """The replay as the DLC records of its workers and servers (both ends of every message), on the capture's
    clock from `origin_ns`: what analysis.iterations and analysis.overheads measure."""
    info = built.messages
    workers = built.topology.workers
    start = origin_ns + np.round(times["start_s"].to_numpy() * 1e9).astype(np.int64)
    end = origin_ns + np.round(times["end_s"].to_numpy() * 1e9).astype(np.int64)
    request = info["request"].to_numpy()
    to_server = info["to_server"].to_numpy(bool)
    frames = []
    for is_send in (True, False):
        worker_side = to_server == is_send
        ts = start if is_send else end
        # what an answer answers: its request as this end saw it (sent by the worker, received by the server)
        request_ts = np.where(is_send, end[request], start[request])
        frames.append(pd.DataFrame({
            "node_role": np.where(worker_side, ROLE_WORKER, ROLE_SERVER).astype(np.int8),
            "is_send": np.full(len(info), is_send), "ts_ns": ts,
            "request_ts_ns": np.where(to_server, -1, request_ts),
            "peer_dlc_rank": np.where(worker_side, workers + info["server_rank"], info["worker_rank"]),
            "dlc_rank": np.where(worker_side, info["worker_rank"], workers + info["server_rank"]),
        }))
    sides = pd.concat(frames, ignore_index=True)
    both = pd.concat([info, info], ignore_index=True)
    slot = both["slot"].to_numpy(np.int64)
    worker_side = sides["node_role"].to_numpy() == ROLE_WORKER
    operation = np.where(worker_side, slot, 4 + slot)
    records = pd.DataFrame({
        "node_id": np.where(worker_side, 9 + 2 * both["worker_rank"], 8 + 2 * both["server_rank"]),
        "peer_id": np.where(worker_side, 8 + 2 * both["server_rank"], 9 + 2 * both["worker_rank"]),
        "node_role": sides["node_role"], "dlc_rank": sides["dlc_rank"], "peer_dlc_rank": sides["peer_dlc_rank"],
        "worker_rank": both["worker_rank"].to_numpy(np.int32), "server_rank": both["server_rank"].to_numpy(np.int32),
        "is_send": sides["is_send"], "category": np.full(len(both), CATEGORY_DATA, np.int8),
        "slot": slot.astype(np.int8), "fused": both["fused"].to_numpy(bool),
        "operation": pd.Categorical.from_codes(operation, categories=list(OPERATIONS)),
        "ts_ns": sides["ts_ns"], "length": both["size_bytes"].to_numpy(np.int64),
        "complete": np.ones(len(both), bool), "tensor_key": both["tensor_key"].to_numpy(np.int64),
        "ps_timestamp": both["request"].to_numpy(np.int64) // 2,
        "iteration": both["iteration"].to_numpy(np.int32),
        "op_num": 4 * (both["iteration"].to_numpy(np.int64) + 1) + slot,
        "request_ts_ns": sides["request_ts_ns"],
    })
    nodes = pd.DataFrame({
        "node_id": np.concatenate([9 + 2 * np.arange(workers), 8 + 2 * np.arange(built.topology.servers)]),
        "name": [f"worker{w}" for w in range(workers)] + [f"server{s}" for s in range(built.topology.servers)],
        "role": ["worker"] * workers + ["server"] * built.topology.servers,
        "rank": np.concatenate([np.arange(workers), np.arange(built.topology.servers)]),
        "dlc_rank": np.arange(workers + built.topology.servers), "vantage": "simulated", "captures": "",
    })
    return Trace(records=records, nodes=nodes, topology=built.topology, mode=mode,
                 mode_evidence="the simulated job keeps the captured mode")
