"""A collective-library job (Gloo over TCP) as the replay's program, and its iterations.

The model is the job's own messages between ranks, as both ends captured them (the sender's first byte, the
receiver's last; matched by pair of ranks, process group, operation and size, in order), so every
collective keeps the algorithm, chunking and order the library used. A rank sends a message once it has
received what it had received from each peer before that message left in the capture, and has issued its
own previous message (happens-before, as trace replay of message-passing programs does); the time from the
latest of those to the message's issue is its computation (the reduction of a received chunk; between
collectives, the training step's computation). What a capture dates later than its rank issued it is not
computation, and takes the network's pace at another rate:
- a message that left while the one before it on its connection was still arriving waited in that queue, and
  one that left while its rank was sending another message waited behind it in the link's queue (a rank's
  notifications behind its own data; their packets' TCP timestamps show it): each is taken as issued as soon
  as it could be;
- a message that left while a message was arriving at its rank left once that share of it had arrived (the
  rank's progress while it receives goes at the receipt's pace: Gloo's pair holds its lock, the one the rank's
  sends and receive notifications on it need, while it reads; on a host whose cores the traffic saturates,
  its processing takes them). The arriving message is sent in parts, cut there, and the message waits for the
  part that ends where it left (recorded at 200 and 800 Mbit/s, such waits ended about 30 % into the arrival at
  both rates: taken as computation, they made most of a Gloo all-reduce's time at 200 Mbit/s a floor
  no faster link could lower).

Iterations: a data-parallel loop repeats the same collectives every step; the job's period is the shortest
repeating run of (kind, size) in the collectives' order (each collective when nothing repeats: a barrier, a
pause and an all-reduce are no loop, and the pause is no communication). Per rank and
iteration the phases are `stats`' (analysis.iterations) with a rank's sends as its pushes and its receipts as
its pulls: P1 from the last receipt of the previous iteration to the first send, P3 from the first send to the
last receipt, iteration = P1 + P3, overlap = (first → last send) / iteration.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow.compute as pc

from dlcsniff.analysis.job_model import JobModel
from dlcsniff.analysis.load import AnalysisError
from dlcsniff.analysis.operations import (
    CATEGORY_DATA, OPERATIONS, ROLE_WORKER, SLOT_PULL_RESPONSE, SLOT_PUSH_REQUEST, Topology, Trace,
)
from dlcsniff.analysis.simulate_replay import DELIVERED, ISSUED, Program
from dlcsniff.decoders.clocks import align

MESSAGE_COLUMNS = ("protocol", "capture", "pg", "collective", "seq", "src_rank", "dst_rank", "local_rank", "outgoing",
                   "size_bytes", "ts_first_ns", "ts_last_ns")
COLLECTIVE_COLUMNS = ("capture", "pg", "kind", "seq", "local_rank", "tensor_bytes")
QUEUE_TOLERANCE_NS = 200_000


@dataclass(frozen=True, slots=True)
class CollectiveModel:
    messages: pd.DataFrame      # src, dst, pg, kind, seq, iteration, size_bytes, send_ns, recv_ns, send_first/last,
                                # recv_first/last (one row per message seen at both ends, in send order)
    ranks: int
    period: int                 # collectives per iteration
    repeats: bool               # a run of collectives repeats (else each collective is a step)
    origin_ns: int
    unmatched: int              # message ends without their other end
    clock_error_ns: int = 0     # the largest error bound of the captures' clocks on the job's timeline
    before_sent: int = 0        # messages whose last byte arrived, on the aligned clocks, before the first left


def _aligned(frame: pd.DataFrame, clocks: pd.DataFrame | None) -> tuple[pd.DataFrame, dict[str, int]]:
    """The messages on the job's clock, and each aligned capture's error bound on it (ns)."""
    if clocks is None:
        return frame, {}
    frame = frame.copy()
    clocks = clocks[clocks["aligned"].fillna(False).astype(bool).to_numpy()]
    for column in ("ts_first_ns", "ts_last_ns"):
        frame[column] = align(frame[column], frame["capture"], clocks).to_numpy(np.int64)
    return frame, dict(zip(clocks["capture"].astype(str), clocks["error_bound_ns"].fillna(0).astype(np.int64)))


def _period(ops: pd.DataFrame) -> tuple[int, bool]:
    """The shortest run of (kind, size) that repeats through the whole sequence (its length), and whether one
    does; when none does (a barrier, a pause, one all-reduce), each collective is a step of its own: taken as one
    iteration, the pause between them counted as communication (10 s of 10.01 on a real NCCL capture)."""
    signature = list(zip(ops["kind"], ops["tensor_bytes"]))
    n = len(signature)
    for period in range(1, n + 1):
        if all(signature[i] == signature[i + period] for i in range(n - period)) and n // period >= 2:
            return period, True
    return 1, False


def collective_model(job: JobModel) -> CollectiveModel:
    raw = job.table("messages", MESSAGE_COLUMNS, where=pc.field("collective").is_valid()
                    & pc.field("src_rank").is_valid() & pc.field("dst_rank").is_valid())
    if len(raw) == 0:
        raise AnalysisError(f"{job.path}: no collective operation's messages between known ranks to simulate")
    raw, error_bound_ns = _aligned(raw, job.clocks)
    ops = job.table("collectives", COLLECTIVE_COLUMNS)
    own = raw[raw["local_rank"] == np.where(raw["outgoing"], raw["src_rank"], raw["dst_rank"])]
    # a message is the same at both ends by its pair, operation and size, and its rank among those
    key = ["pg", "src_rank", "dst_rank", "collective", "seq", "size_bytes"]
    sent = own[own["outgoing"]].sort_values("ts_first_ns", kind="stable")
    got = own[~own["outgoing"]].sort_values("ts_first_ns", kind="stable")
    sent = sent.assign(k=sent.groupby(key, dropna=False).cumcount())
    got = got.assign(k=got.groupby(key, dropna=False).cumcount())
    both = sent.merge(got[key + ["k", "ts_first_ns", "ts_last_ns", "capture"]], on=key + ["k"], suffixes=("", "_r"))
    # a capture that lost packets can pair a message with another: never one that arrived before it left, by more
    # than the two captures' clocks may be off on the job's timeline
    slack_ns = (both["capture"].astype(str).map(error_bound_ns).fillna(0)
                + both["capture_r"].astype(str).map(error_bound_ns).fillna(0)).to_numpy(np.int64)
    both = both[both["ts_last_ns_r"].to_numpy(np.int64) + slack_ns >= both["ts_first_ns"].to_numpy(np.int64)]
    unmatched = len(sent) + len(got) - 2 * len(both)
    rank0 = ops[ops["local_rank"] == ops["local_rank"].min()].sort_values("seq")
    rank0 = rank0[rank0["kind"].isin(["send", "recv"]) == False]  # noqa: E712 - p2p calls have their own seq
    period, repeats = _period(rank0)
    step = {(row.pg, row.seq): index // period for index, row in enumerate(rank0.itertuples())}
    kinds = {(row.pg, row.seq): row.kind for row in rank0.itertuples()}
    pair = list(zip(both["pg"], both["seq"]))
    messages = pd.DataFrame({
        "src": both["src_rank"].to_numpy(np.int64), "dst": both["dst_rank"].to_numpy(np.int64),
        "pg": both["pg"].to_numpy(), "kind": [kinds.get(p, str(c)) for p, c in zip(pair, both["collective"])],
        "seq": both["seq"].fillna(-1).to_numpy(np.int64),
        "iteration": np.array([step.get(p, -1) for p in pair], dtype=np.int64),
        "size_bytes": both["size_bytes"].to_numpy(np.int64),
        "send_ns": both["ts_first_ns"].to_numpy(np.int64), "send_last_ns": both["ts_last_ns"].to_numpy(np.int64),
        "recv_first_ns": both["ts_first_ns_r"].to_numpy(np.int64), "recv_ns": both["ts_last_ns_r"].to_numpy(np.int64),
    }).sort_values(["send_ns", "recv_ns"], ignore_index=True)
    ranks = int(max(messages["src"].max(), messages["dst"].max())) + 1
    before_sent = int((messages["recv_ns"] < messages["send_ns"]).sum())
    return CollectiveModel(messages, ranks, period, repeats, int(messages["send_ns"].min()), int(unmatched),
                           max(error_bound_ns.values(), default=0), before_sent)


# messages arriving before they left, on the aligned clocks, beyond which the replay's order is a guess
BEFORE_SENT_SHARE = 0.05


def clock_note(model: CollectiveModel) -> str | None:
    """Why a replay may not keep the job's order: its captures' clocks are aligned less closely than its
    messages take to arrive, so that many arrive before they left (the real Soft-RoCE all-reduce: 25 of 96,
    clocks ±91 µs, transits 98 µs at the median); which of two captures' messages came first, the order the
    replay keeps, is then a guess."""
    if model.before_sent <= BEFORE_SENT_SHARE * len(model.messages):
        return None
    return (f"{model.before_sent} of {len(model.messages)} messages arrive before they left on the aligned clocks "
            f"(±{model.clock_error_ns / 1e3:,.0f} µs): which messages came first across captures, the order the "
            f"replay keeps, is uncertain")


def build_program(model: CollectiveModel) -> Program:
    """Happens-before replay of the captured messages (see the module doc): row m of the program is model
    message m (its last part, when it is sent in parts; column `message` says whose part each row is)."""
    messages = model.messages
    n = len(messages)
    src, dst = messages["src"].to_numpy(), messages["dst"].to_numpy()
    send, recv = messages["send_ns"].to_numpy(np.int64), messages["recv_ns"].to_numpy(np.int64)
    send_last, recv_first = messages["send_last_ns"].to_numpy(np.int64), messages["recv_first_ns"].to_numpy(np.int64)
    size = messages["size_bytes"].to_numpy(np.int64)
    deps: list[tuple[int, int, int]] = []                    # (child, parent, kind)
    delay = np.zeros(n)
    # per rank: what it received from each peer in order of arrival
    received = {}
    for m in np.argsort(recv, kind="stable"):
        received.setdefault((int(dst[m]), int(src[m])), []).append(int(m))
    arrivals = {key: recv[np.array(ms)] for key, ms in received.items()}
    previous_send: dict[int, int] = {}
    previous_on_connection: dict[tuple[int, int], int] = {}
    on_the_wire: dict[int, int] = {}                         # per rank: its send that left last so far
    cuts: dict[int, list[tuple[float, int]]] = {}            # arriving message -> (share arrived, message sent)
    issue = np.zeros(n)
    for m in range(n):                                       # messages are in send order
        rank = int(src[m])
        reference = float(model.origin_ns)
        for (receiver, peer), ms in received.items():
            if receiver != rank:
                continue
            last = int(np.searchsorted(arrivals[(receiver, peer)], send[m], side="right")) - 1
            if last >= 0:
                deps.append((m, ms[last], DELIVERED))
                reference = max(reference, float(recv[ms[last]]))
            arriving = ms[last + 1] if last + 1 < len(ms) else None
            if arriving is not None and recv_first[arriving] < send[m] and size[arriving] > 1:
                share = (send[m] - recv_first[arriving]) / (recv[arriving] - recv_first[arriving])
                cuts.setdefault(arriving, []).append((share, m))
                reference = max(reference, float(send[m]))
        if rank in previous_send:
            before = previous_send[rank]
            deps.append((m, before, ISSUED))
            reference = max(reference, issue[before])
        connection = (rank, int(dst[m]))
        queued = connection in previous_on_connection and \
            send[m] < recv[previous_on_connection[connection]] + QUEUE_TOLERANCE_NS
        sending = on_the_wire.get(rank)
        queued = queued or (sending is not None and send_last[sending] > send[m])
        issue[m] = reference if queued else max(float(send[m]), reference)
        delay[m] = (issue[m] - reference) / 1e9
        previous_send[rank] = m
        previous_on_connection[connection] = m
        if sending is None or send_last[m] > send_last[sending]:
            on_the_wire[rank] = m
    return _sent_in_parts(messages, model.ranks, deps, delay, cuts)


def _sent_in_parts(messages: pd.DataFrame, ranks: int, deps: list[tuple[int, int, int]], delay: np.ndarray,
                   cuts: dict[int, list[tuple[float, int]]]) -> Program:
    """The program with every cut message sent in parts, one after the other on its connection: row m stays
    message m's last part (what waits for its delivery waits for all of it), its earlier parts are new rows, the
    first of which takes over what the message waited for and its computation; a message sent while another
    was arriving waits for the part of it that ends at its share."""
    n = len(messages)
    size = messages["size_bytes"].to_numpy(np.int64).copy()
    delay = delay.copy()
    first_part = np.arange(n)
    added: list[tuple[int, int, int]] = []
    parts: list[tuple[int, int]] = []                        # (message, size_bytes) of each new row
    for arriving, found in cuts.items():
        total, done, previous = int(size[arriving]), 0, None
        for share, child in sorted(found):
            upto = min(max(round(share * total), done + 1), total - 1)
            if upto > done:
                previous_part, previous = previous, n + len(parts)
                parts.append((arriving, upto - done))
                if previous_part is None:
                    first_part[arriving] = previous
                else:
                    added.append((previous, previous_part, ISSUED))
                done = upto
            added.append((child, previous if previous is not None else arriving, DELIVERED))
        if previous is not None:
            size[arriving] = total - done
            added.append((arriving, previous, ISSUED))
    part_delay = np.zeros(len(parts))
    for index, (message, _) in enumerate(parts):
        if first_part[message] == n + index:
            part_delay[index], delay[message] = delay[message], 0.0
    # what a cut message waited for, its first part waits for
    rows = [(first_part[child], parent, kind) for child, parent, kind in deps] + added
    owner = np.array([message for message, _ in parts], np.int64)
    src, dst = messages["src"].to_numpy(np.int64), messages["dst"].to_numpy(np.int64)
    program_messages = pd.DataFrame({
        "src": np.concatenate([src, src[owner]]), "dst": np.concatenate([dst, dst[owner]]),
        "size_bytes": np.concatenate([size, np.array([part for _, part in parts], np.int64)]),
        "delay_s": np.concatenate([delay, part_delay]), "message": np.concatenate([np.arange(n), owner]),
    })
    deps_frame = pd.DataFrame({"child": np.array([row[0] for row in rows], np.int64),
                               "parent": np.array([row[1] for row in rows], np.int64),
                               "kind": np.array([row[2] for row in rows], np.int8)})
    return Program(program_messages, deps_frame, ranks)


def rank_trace(messages: pd.DataFrame, ranks: int, send_ns: np.ndarray, recv_ns: np.ndarray) -> Trace:
    """Each rank's sends and receipts as a worker's pushes and pulls, for analysis.iterations."""
    n = len(messages)
    iteration = np.concatenate([messages["iteration"].to_numpy(), messages["iteration"].to_numpy()])
    slot = np.concatenate([np.full(n, SLOT_PUSH_REQUEST), np.full(n, SLOT_PULL_RESPONSE)]).astype(np.int8)
    rank = np.concatenate([messages["src"].to_numpy(), messages["dst"].to_numpy()])
    records = pd.DataFrame({
        "node_role": np.full(2 * n, ROLE_WORKER, np.int8), "category": np.full(2 * n, CATEGORY_DATA, np.int8),
        "iteration": iteration.astype(np.int32), "worker_rank": rank.astype(np.int32),
        "server_rank": np.full(2 * n, -1, np.int32), "is_send": slot == SLOT_PUSH_REQUEST, "slot": slot,
        "fused": np.zeros(2 * n, bool), "ts_ns": np.concatenate([send_ns, recv_ns]).astype(np.int64),
        "complete": np.ones(2 * n, bool), "length": np.tile(messages["size_bytes"].to_numpy(np.int64), 2),
        "operation": pd.Categorical.from_codes(np.where(slot == SLOT_PUSH_REQUEST, 0, 3), categories=list(OPERATIONS)),
    })
    nodes = pd.DataFrame({"node_id": np.arange(ranks), "name": [f"rank{r}" for r in range(ranks)],
                          "role": "worker", "rank": np.arange(ranks), "dlc_rank": np.arange(ranks),
                          "vantage": "own", "captures": ""})
    return Trace(records=records, nodes=nodes, topology=Topology(workers=ranks, servers=0), mode="collectives",
                 mode_evidence="collective operations")


def network_ends(model: CollectiveModel) -> pd.DataFrame:
    m = model.messages
    return pd.concat([
        pd.DataFrame({"node": m["src"], "sent": True, "first_ns": m["send_ns"], "last_ns": m["send_last_ns"],
                      "size_bytes": m["size_bytes"]}),
        pd.DataFrame({"node": m["dst"], "sent": False, "first_ns": m["recv_first_ns"], "last_ns": m["recv_ns"],
                      "size_bytes": m["size_bytes"]}),
    ], ignore_index=True)


def network_pairs(model: CollectiveModel) -> pd.DataFrame:
    m = model.messages
    return pd.DataFrame({"src": m["src"], "dst": m["dst"], "size_bytes": m["size_bytes"], "send_ns": m["send_ns"],
                         "recv_ns": m["recv_ns"]})
