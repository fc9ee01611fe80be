"""ps-lite across a job's captures: node ids, roles and ranks, the sender and receiver of every stream, each
message's tensor and its training iteration.

What one capture cannot tell: node ids come from the scheduler's ADD_NODE reply (seen in the scheduler's and
the nodes' captures), a stream's sender from its DEALER identity, its bytedance routing frames or its ADD_NODE
request, its receiver from the listening address in that reply; the server's key range then names the tensor
(MXNet or BytePS key layouts, decoders.protocols.pslite.tensors). Works on the column lists of the captures' results
(decoders.capture_decoder), in place. The iteration (`message_iterations`) needs every capture's view of a
worker's requests to a server, so it is numbered over the job's messages, once the tensors are known.
"""
from __future__ import annotations

import collections
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from dlcsniff.decoders.arrow_numpy import as_arrow, filled, valid
from dlcsniff.decoders.column_values import column_values
from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.protocols.pslite import decoder as pslite
from dlcsniff.decoders.protocols.job_step import SummaryTable
from dlcsniff.decoders.protocols.pslite.tensors import byteps, mxnet

if TYPE_CHECKING:
    from typing import Mapping

    from dlcsniff.decoders.protocols.job_step import JobColumns

ROLE_NAMES = {pslite.ROLE_SERVER: "server", pslite.ROLE_WORKER: "worker", pslite.ROLE_SCHEDULER: "scheduler"}


CAPTURE_TABLES = ("pslite_nodes", "pslite_announced", "pslite_routed")


def resolve_job(job: JobColumns) -> None:
    """The job step (decoders.protocols.job_step): nodes.parquet, every stream's and message's node ids and roles,
    every KV message's tensor and iteration; the summary's `unattributed_messages` (KV messages no tensor was
    found for)."""
    job.tables["nodes"], job.summary["unattributed_messages"] = resolve_pslite(
        job.streams, job.messages, *map(job.capture_table, CAPTURE_TABLES))
    job.messages["iteration"] = message_iterations(job.messages).to_pylist()


def event_summary(events: pa.Table) -> dict:
    """ps-lite messages whose sender or receiver no identity, routing frame, announcement or address named."""
    mine = np.array([protocol == "pslite" for protocol in column_values(events["protocol"])], dtype=bool)
    unnamed = ~valid(events["sender_id"]) | ~valid(events["recver_id"])
    return {"messages_without_node_ids": int(np.count_nonzero(mine & unnamed))}


def says(summary: dict) -> dict[str, str]:
    if "pslite" not in summary["messages_by_protocol"]:
        return {}
    return {"messages": f"; ps-lite: {summary['control_messages']:,} control, {summary['nodes']} nodes, "
                        f"{summary['messages_without_node_ids']:,} without a sender or receiver id"}


def says_tables(messages: pa.Table) -> list[SummaryTable]:
    """The KV traffic by sender role, receiver role and kind: messages, bytes, tensors."""
    columns = ("sender_role", "recver_role", "push", "pull", "request", "size_bytes", "tensor_key")
    groups: dict[tuple, list] = {}
    for protocol, control, keys, *row in zip(*(messages[name].to_pylist() for name in (
            "protocol", "control_cmd", "keys", *columns))):
        if protocol != "pslite" or control is not None or not keys:
            continue
        sender, recver, push, pull, request, size, tensor = row
        kind = (pslite.PUSH_PULL if push and pull else "push" if push else "pull" if pull else "other") + (
            " request" if request else " response" if request is not None else "")
        group = groups.setdefault((sender, recver, kind), [0, 0, set()])
        group[0] += 1
        group[1] += size or 0
        if tensor is not None:
            group[2].add(tensor)
    if not groups:
        return []
    # by sender role, receiver role and kind, a missing role last
    rows = [(str(snd), str(rcv), k, f"{n:,}", f"{total:,}", f"{len(tensors):,}") for (snd, rcv, k), (n, total, tensors)
            in sorted(groups.items(), key=lambda item: tuple((value is None, value or "") for value in item[0]))]
    columns = (("sender", True), ("recver", True), ("kind", True), ("messages", False), ("bytes", False),
               ("tensors", False))
    return [SummaryTable("ps-lite KV traffic (each message once)", columns, rows)]


def resolve_pslite(streams: dict[str, list], messages: dict[str, list], node_rows: dict[str, list],
                   announced_rows: dict[str, list], routed_rows: dict[str, list]) -> tuple[dict[str, list], int]:
    """Fill the job's streams and messages columns in place: stream node_id and protocol of ROUTER sides,
    message sender/recver ids and roles and their tensor attribution. `node_rows`, `announced_rows` and
    `routed_rows` are the captures' pslite_nodes, pslite_announced and pslite_routed tables
    (decoders.protocols.pslite.decoder), concatenated. Returns the nodes.parquet columns and how many KV messages
    could not be attributed to a tensor."""
    nodes = _node_table(node_rows)
    endpoints = _resolve_endpoints(streams, messages, announced_rows, routed_rows, nodes)
    streams["node_id"] = [endpoints.get(f, (None, None))[0] for f in streams["flow_id"]]
    role_of = {nid: role for nid, (role, _, _) in nodes.items()}
    role_of.setdefault(pslite.SCHEDULER_ID, "scheduler")
    sender_ids = [endpoints.get(f, (None, None))[0] for f in messages["flow_id"]]
    recver_ids = [endpoints.get(f, (None, None))[1] for f in messages["flow_id"]]
    messages["sender_id"] = sender_ids
    messages["recver_id"] = recver_ids
    messages["sender_role"] = [role_of.get(s, pslite.node_role(s)) for s in sender_ids]
    messages["recver_role"] = [role_of.get(r, pslite.node_role(r)) for r in recver_ids]
    server_ids = sorted(nid for nid, role in role_of.items() if role == "server")
    ranks_by_id = {nid: pslite.server_rank(nid) for nid in server_ids}
    for nid in set(sender_ids) | set(recver_ids):
        if nid is not None and pslite.node_role(nid) == "server":
            ranks_by_id.setdefault(nid, pslite.server_rank(nid))
    unattributed = _attribute(messages, list(zip(messages["sender_role"], messages["recver_role"])),
                              ranks_by_id, len(ranks_by_id))
    _attribute_responses(messages)
    _mark_router_sides(streams, endpoints)
    node_cols: dict[str, list] = collections.defaultdict(list)
    for nid in sorted(nodes):
        role, host, port = nodes[nid]
        node_cols["node_id"].append(nid)
        node_cols["role"].append(role)
        node_cols["rank"].append(pslite.rank_of_id(nid))
        node_cols["hostname"].append(host)
        node_cols["port"].append(port)
    return node_cols, unattributed


def _node_table(rows: dict[str, list]) -> dict[int, tuple[str, str, int]]:
    """node id → (role, hostname, port), from every ADD_NODE reply seen in any capture."""
    nodes: dict[int, tuple[str, str, int]] = {}
    for node_id, role, hostname, port in zip(*(rows.get(c, ()) for c in ("node_id", "role", "hostname", "port"))):
        nodes[node_id] = (ROLE_NAMES.get(role, str(role)), hostname, port)
    return nodes


def _resolve_endpoints(streams: dict[str, list], messages: dict[str, list], announced_rows: dict[str, list],
                       routed_rows: dict[str, list], nodes: dict) -> dict[int, tuple[int | None, int | None]]:
    """flow_id → (sender node id, receiver node id) for every ps-lite stream.

    The sender is named by the DEALER's Identity ("ps<id>"); a node's first connection to the scheduler
    has none, so its ADD_NODE request's own (host, port) names it once the scheduler's reply is known.
    The receiver is the ROUTER's listening (ip, port) from the reply's node list (every node, the scheduler
    too, in both ps-lites); failing that address, a host that only one node lives on, or control requests
    (only the scheduler gets them), name it.
    A bytedance server or scheduler answers a worker's data requests through its ROUTER, on the connection
    the worker's DEALER opened (zmq_van.h NonWorkerSendMsg): that direction has no Identity, the routing
    frame "ps<id>" of its messages names the sender, and the receiver is the DEALER of the other direction.
    Where a server and a worker share a host (BytePS's usual deployment) nothing else names either.
    """
    addr_to_id = {(host, port): nid for nid, (_, host, port) in nodes.items()}
    announced: dict[int, list] = collections.defaultdict(list)
    for flow, host, port in zip(*(announced_rows.get(c, ()) for c in ("flow_id", "hostname", "port"))):
        announced[flow].append((host, port))
    routed = dict(zip(routed_rows.get("flow_id", ()), routed_rows.get("node_id", ())))
    flows = streams["flow_id"]
    row_of = {flow: i for i, flow in enumerate(flows)}
    sender: dict[int, int | None] = {}
    for i, flow in enumerate(flows):
        if streams["protocol"][i] != "pslite":
            continue
        nid = pslite.parse_identity(streams["identity"][i])
        if nid is None:
            nid = routed.get(flow)
        if nid is None:
            for host_port in announced.get(flow, ()):
                nid = addr_to_id.get(host_port)
                if nid is not None:
                    break
        sender[flow] = nid
    ip_ids: dict[str, set] = collections.defaultdict(set)
    for i, flow in enumerate(flows):
        if sender.get(flow) is not None:
            ip_ids[streams["src_ip"][i]].add(sender[flow])
    for nid, (_, host, _) in nodes.items():
        ip_ids[host].add(nid)
    control_request_flows = {
        f for f, cmd, req in zip(messages.get("flow_id", ()), messages.get("control_cmd", ()),
                                 messages.get("request", ()))
        if cmd is not None and req
    }
    resolved: dict[int, tuple[int | None, int | None]] = {}
    for i, flow in enumerate(flows):
        if flow not in sender:
            continue
        src_ip, dst_ip, dst_port = streams["src_ip"][i], streams["dst_ip"][i], streams["dst_port"][i]
        snd = sender[flow]
        if snd is None and len(ip_ids.get(src_ip, ())) == 1:
            snd = next(iter(ip_ids[src_ip]))
        rcv = addr_to_id.get((dst_ip, dst_port))
        reverse = row_of.get(streams["reverse_flow_id"][i])
        if rcv is None and flow in routed and reverse is not None:
            rcv = pslite.parse_identity(streams["identity"][reverse])
        if rcv is None:
            peers = ip_ids.get(dst_ip, set()) - ({snd} if snd is not None else set())
            if len(peers) == 1 and dst_ip != src_ip:
                rcv = next(iter(peers))
            elif flow in control_request_flows:
                rcv = pslite.SCHEDULER_ID
        resolved[flow] = (snd, rcv)
    return resolved


def _attribute(messages: dict[str, list], roles: list, ranks_by_id: dict, num_servers: int) -> int:
    """Fill tensor attribution columns in place (MXNet or BytePS, by the meta's flavor): what a KV message's
    head says (request type, dtype) and which tensor (and part) its keys name.

    Returns how many KV messages could not be attributed."""
    n = len(messages.get("flow_id", ()))
    unattributed = 0
    tensor_key, server_rank, req_type, dtype, part, rows, app_cmd = ([None] * n for _ in range(7))
    for i in range(n):
        head = messages["head"][i]
        if messages["control_cmd"][i] is not None or head is None:
            continue
        flavor = messages["flavor"][i]
        snd_role, rcv_role = roles[i]
        server_id = messages["sender_id"][i] if snd_role == "server" else (
            messages["recver_id"][i] if rcv_role == "server" else None)
        if server_id is not None:
            server_rank[i] = ranks_by_id[server_id]
        keys = messages["keys"][i]
        try:
            if messages["simple_app"][i]:
                if flavor == "dmlc":
                    app_cmd[i] = mxnet.simple_app_command(head)
                continue
            req_type[i], dtype[i] = (mxnet if flavor == "dmlc" else byteps).decode_head(head)
            if server_id is None or not keys or num_servers == 0:
                continue
            if flavor == "dmlc":
                attr = mxnet.attribute(keys, messages["lens"][i], server_rank[i], num_servers, req_type[i])
                tensor_key[i], part[i], rows[i] = attr.tensor_key, attr.part, attr.rows
            else:
                tensor_key[i], part[i] = byteps.attribute(keys[0], server_rank[i], num_servers)
        except DecodeError:
            unattributed += 1     # not the framework's head, or keys outside the server's range (servers missing?)
    messages.update(tensor_key=tensor_key, server_rank=server_rank, req_type=req_type, dtype=dtype,
                    part=part, rows=rows, simple_app_cmd=app_cmd)
    return unattributed


def _attribute_responses(messages: dict[str, list]) -> None:
    """A response without keys (a plain push response) names its tensor through its request.

    ps-lite echoes the request's customer_id and timestamp in the response, which travels the other way
    between the same two nodes; within one capture that pair is unique."""
    cols = ("capture", "sender_id", "recver_id", "customer_id", "ps_timestamp")
    requests = {}
    for i, is_request in enumerate(messages.get("request", ())):
        if is_request and messages["tensor_key"][i] is not None:
            requests[tuple(messages[c][i] for c in cols)] = i
    for i, is_request in enumerate(messages.get("request", ())):
        if is_request or messages["tensor_key"][i] is not None or messages["control_cmd"][i] is not None:
            continue
        capture, snd, rcv, customer, ts = (messages[c][i] for c in cols)
        j = requests.get((capture, rcv, snd, customer, ts))
        if j is not None:
            for col in ("tensor_key", "part", "req_type", "dtype"):
                messages[col][i] = messages[col][j]


def _mark_router_sides(streams: dict[str, list], endpoints: dict) -> None:
    """The ROUTER side of a ps-lite connection (greeting and READY only) belongs to ps-lite too."""
    for i, reverse in enumerate(streams.get("reverse_flow_id", ())):      # none: a capture without TCP
        if reverse in endpoints and streams["protocol"][i] == "zmtp":
            streams["protocol"][i] = "pslite"
            streams["node_id"][i] = endpoints[reverse][1]



INIT_ITERATION = -1                # kv.init and the initial broadcast's pulls
# the messages' columns message_iterations reads
ITERATION_COLUMNS = ("sender_id", "recver_id", "request", "push", "pull", "simple_app", "control_cmd",
                     "ps_timestamp", "customer_id", "app_id", "tensor_key", "req_type")
# a request is one message however many captures saw it: its ends, its customer's request counter, what it is
_EXCHANGE = ["sender", "recver", "customer", "app", "stamp"]
_REQUEST = _EXCHANGE + ["key", "push", "pull"]


def message_iterations(messages: Mapping) -> pa.Array:
    """The training iteration of every ps-lite data message between a worker and a server (int64, null for
    anything else: commands, control, a response of an unknown tensor whose request no capture saw);
    `messages` has ITERATION_COLUMNS (a pyarrow table, a DataFrame or column lists by name), a row per capture
    that saw a message (its sightings get one number).

    Rounds: per (worker, server, tensor key), the requests in the worker's dispatch order (the ps-lite
    timestamp, a per-customer request counter, so every capture agrees whatever its timing) are numbered by
    their push: the n-th push opens round n (a request known only from its response counts too).
    Iteration = round - 1, except that the first push of a key is kv.init (INIT_ITERATION) when it asks for
    no values back (not MXNet 1.9.1's fused push-pull) and no pull of that key preceded it; pulls belong to
    the round of the latest push before them, so the pulls of the initial broadcast are INIT_ITERATION too, as
    is the first plain pull of a dense tensor that training push-pulls when it comes in the first training
    round (MXNet issues the broadcast asynchronously: its pull may leave after the first training push-pull).
    A response carries its request's."""
    frame = _exchange_columns(messages)
    data, request = frame["data"], frame["request"]
    sender, recver = frame["sender"], frame["recver"]
    requests = np.flatnonzero(data & request & _is_worker(sender) & _is_server(recver))
    responses = np.flatnonzero(data & ~request & _is_server(sender) & _is_worker(recver))
    rows = {name: values.tolist() for name, values in frame.items()}

    def exchange(row: int, answer: bool = False) -> tuple:
        ends = (rows["recver"][row], rows["sender"][row]) if answer else (rows["sender"][row], rows["recver"][row])
        return (*ends, rows["customer"][row], rows["app"][row], rows["stamp"][row])

    def request_of(row: int, answer: bool = False) -> tuple:
        return (*exchange(row, answer), rows["key"][row], rows["push"][row], rows["pull"][row])

    # the requests once each (the first sighting), then those known only from a response (of a known tensor):
    # ps-lite echoes the request's flags, customer and timestamp in its response, which travels the other way
    unique: dict[tuple, int] = {}
    made: list[tuple[int, bool]] = []
    for row in requests.tolist():
        if unique.setdefault(request_of(row), len(made)) == len(made):
            made.append((row, False))
    asked = {request[:5] for request in unique}
    for row in responses.tolist():
        if rows["key"][row] >= 0 and (made_by := exchange(row, answer=True)) not in asked:
            asked.add(made_by)
            unique[request_of(row, answer=True)] = len(made)
            made.append((row, True))
    source = np.array([row for row, _ in made], dtype=np.int64)
    answer = np.array([flipped for _, flipped in made], dtype=bool)
    rounds = _rounds({"sender": np.where(answer, recver[source], sender[source]),
                      "recver": np.where(answer, sender[source], recver[source]),
                      **{name: frame[name][source] for name in ("stamp", "key", "push", "pull", "dense")}})
    iteration = np.zeros(len(data), dtype=np.int64)
    known = np.zeros(len(data), dtype=bool)
    for row in requests.tolist():
        iteration[row], known[row] = rounds[unique[request_of(row)]], True
    first_of_exchange: dict[tuple, int] = {}
    for request, number in unique.items():
        first_of_exchange.setdefault(request[:5], number)
    for row in responses.tolist():
        number = first_of_exchange.get(exchange(row, answer=True))
        if number is not None:
            iteration[row], known[row] = rounds[number], True
    return as_arrow(iteration, pa.int64(), known)


def _exchange_columns(messages: Mapping) -> dict[str, np.ndarray]:
    """What message_iterations reads, as plain int64 and bool (-1 for a missing number)."""
    def number(name: str) -> np.ndarray:
        return filled(messages[name], -1).astype(np.int64)

    def flag(name: str) -> np.ndarray:
        return filled(messages[name], False).astype(bool)

    push = flag("push")
    # ps-lite without the pull field (and BytePS) marks a pull as "not a push"
    pull = flag("pull") | ~push
    return {
        "sender": number("sender_id"), "recver": number("recver_id"), "customer": number("customer_id"),
        "app": number("app_id"), "stamp": number("ps_timestamp"), "key": number("tensor_key"),
        "request": flag("request"), "push": push, "pull": pull,
        "data": ~valid(messages["control_cmd"]) & ~flag("simple_app"),
        "dense": np.array([req_type != "row_sparse" for req_type in column_values(messages["req_type"])], dtype=bool),
    }


def _is_worker(ids: np.ndarray) -> np.ndarray:
    return (ids >= 8) & (ids % 2 == 1)       # ps-lite: worker rank r = 9 + 2r


def _is_server(ids: np.ndarray) -> np.ndarray:
    return (ids >= 8) & (ids % 2 == 0)       # server rank r = 8 + 2r


def _rounds(requests: dict[str, np.ndarray]) -> np.ndarray:
    """Iteration of each request (one row per request, see message_iterations), in their order."""
    order = np.lexsort([requests[name] for name in ("stamp", "key", "recver", "sender")])
    sender, recver, key = (requests[name][order] for name in ("sender", "recver", "key"))
    starts = np.ones(len(order), dtype=bool)
    starts[1:] = (sender[1:] != sender[:-1]) | (recver[1:] != recver[:-1]) | (key[1:] != key[:-1])
    push, pull = requests["push"][order], requests["pull"][order]
    fused = push & pull
    is_push, is_pull = push.astype(np.int64), (~push).astype(np.int64)
    pushes = cumsum_within(is_push, starts)
    pulls_before = cumsum_within(is_pull, starts) - is_pull
    # kv.init pushes without asking for values back; a fused push-pull is always training
    init_push = push & ~fused & (pushes == 1) & (pulls_before == 0)
    channel = np.cumsum(starts) - 1
    channels = int(channel[-1]) + 1 if len(channel) else 0
    has_init, has_fused = np.zeros(channels, dtype=np.int64), np.zeros(channels, dtype=np.int64)
    np.maximum.at(has_init, channel, init_push.astype(np.int64))
    np.maximum.at(has_fused, channel, fused.astype(np.int64))
    round_ = np.maximum(pushes - has_init[channel] - 1, INIT_ITERATION)
    dense = requests["dense"][order]
    broadcast = (is_pull == 1) & (pulls_before == 0) & (has_fused[channel] == 1) & dense & (round_ <= 0)
    iteration = np.empty(len(order), dtype=np.int64)
    iteration[order] = np.where(broadcast, INIT_ITERATION, round_)
    return iteration


def cumsum_within(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Inclusive running sum of non-negative `values`, restarting at each group start."""
    total = np.cumsum(values, dtype=np.int64)
    return total - np.maximum.accumulate(np.where(starts, total - values, 0))
