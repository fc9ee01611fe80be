"""What the report's figures show, as DataFrames: each figure's static drawing (analysis.report_figures) and
interactive chart (analysis.report_charts) are made from the same frame, so the two never disagree.

Units, one per quantity, in every figure and table of the report (REPORT_UNITS): durations in milliseconds,
sizes in bytes (kB = 10^3 B, MB = 10^6 B), bandwidths in GB/s (10^9 B/s, nccl-tests' unit), ratios in %.
Times on a timeline are milliseconds since the first message drawn, on the decode's one timeline (every
capture's clock aligned to the reference capture's where clocks.parquet aligned it).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlcsniff.analysis.collective_stats import CollectiveStats, SEND_RECV, volume_matrix
from dlcsniff.analysis.lanes import packed_lanes
from dlcsniff.analysis.names import node_label, rank_label
from dlcsniff.analysis.operations import (
    CATEGORY_DATA, INIT_ITERATION, ROLE_WORKER, SLOT_PULL_REQUEST, SLOT_PULL_RESPONSE, SLOT_PUSH_REQUEST,
    SLOT_PUSH_RESPONSE, Trace,
)
from dlcsniff.analysis.summary import Stats
from dlcsniff.decoders.protocols.pslite.decoder import PUSH_PULL

REPORT_UNITS = (("durations", "ms"), ("sizes", "bytes: B, kB = 10³ B, MB = 10⁶ B"),
                ("bandwidth", "GB/s = 10⁹ B/s (nccl-tests' unit)"), ("ratios", "%"))
MS_PER_NS = 1e-6
# each ps-lite data message once, by what it is; the paper's two records of it (sender's, receiver's) named
MESSAGE_KINDS = {
    SLOT_PUSH_REQUEST: f"push / {PUSH_PULL} request (Push_Send_Worker = Push_Recv_Server)",
    SLOT_PUSH_RESPONSE: "push acknowledgement (Push_Send_Server = Push_Recv_Worker)",
    SLOT_PULL_REQUEST: "pull request (Pull_Send_Worker = Pull_Recv_Server)",
    SLOT_PULL_RESPONSE: f"pull / {PUSH_PULL} response (Pull_Send_Server = Pull_Recv_Worker)",
}
REQUEST_KINDS = ("push → acknowledgement", "pull → values", f"{PUSH_PULL} → updated values", "initialisation")
MAX_TENSOR_LANES = 32          # a worker's lanes per tensor@server up to this; beyond, packed lanes per server
# one colour per collective kind in every figure (tab10 has ten)
KIND_COLORS = dict(zip(("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather",
                        "scatter", "barrier", SEND_RECV),
                       ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                        "#bcbd22", "#17becf")))
OTHER_KIND_COLOR = "#999999"


def kind_color(kind: str) -> str:
    return KIND_COLORS.get(str(kind), OTHER_KIND_COLOR)


# -- message sizes -------------------------------------------------------------------------------------------

def message_lengths(trace: Trace) -> pd.DataFrame:
    """Every ps-lite data message once (slot, length in bytes: meta + data), wherever it was seen: its
    sender's and its receiver's records name the same message (sender, receiver, ps-lite timestamp, key)."""
    data = trace.records[trace.records["category"] == CATEGORY_DATA]
    sender = np.where(data["is_send"], data["node_id"], data["peer_id"])
    receiver = np.where(data["is_send"], data["peer_id"], data["node_id"])
    messages = pd.DataFrame({"sender": sender, "receiver": receiver, "slot": data["slot"].to_numpy(),
                             "ps_timestamp": data["ps_timestamp"].to_numpy(),
                             "tensor_key": data["tensor_key"].to_numpy(), "length": data["length"].to_numpy()})
    once = messages.sort_values("length", ascending=False).drop_duplicates(
        ["sender", "receiver", "slot", "ps_timestamp", "tensor_key"])
    return once[["slot", "length"]].reset_index(drop=True)


def size_cdf(trace: Trace) -> pd.DataFrame:
    """The empirical CDF of message length per kind of message (curve, request, length, fraction, messages):
    one row per distinct length, and a first row at fraction 0 so the curve rises at its first length. Kinds
    whose lengths are all the same (MXNet's push-pull request and response carry the same tensor) are one
    curve, named after both."""
    lengths = message_lengths(trace)
    per_slot = {int(slot): np.sort(mine["length"].to_numpy(np.int64)) for slot, mine in lengths.groupby("slot")}
    curves: dict[tuple, list[int]] = {}
    for slot, sorted_lengths in per_slot.items():
        curves.setdefault(tuple(sorted_lengths), []).append(slot)
    frames = []
    for sorted_lengths, slots in curves.items():
        values, counts = np.unique(np.asarray(sorted_lengths), return_counts=True)
        fraction = np.cumsum(counts) / counts.sum()
        name = " and ".join(MESSAGE_KINDS[slot] for slot in sorted(slots))
        frames.append(pd.DataFrame({
            "curve": name, "request": all(slot % 2 == 0 for slot in slots),
            "length": np.concatenate([values[:1], values]).astype(np.float64),
            "fraction": np.concatenate([[0.0], fraction]), "messages": len(sorted_lengths)}))
    columns = ["curve", "request", "length", "fraction", "messages"]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)


# -- the ps-lite timeline ------------------------------------------------------------------------------------

def request_spans(trace: Trace) -> pd.DataFrame:
    """Every answered request of every worker, from the worker's records: worker_rank, server_rank,
    tensor_key, iteration, kind (one of REQUEST_KINDS), start_ns (request sent), end_ns (answer received),
    request_bytes, answer_bytes."""
    records = trace.records
    mine = records[(records["node_role"] == ROLE_WORKER) & (records["category"] == CATEGORY_DATA)]
    answers = mine[(mine["slot"] % 2 == 1) & (mine["request_ts_ns"] >= 0)]
    requests = mine[mine["slot"] % 2 == 0]
    key = ["node_id", "peer_id", "ps_timestamp", "tensor_key"]
    # a ps-lite response carries its request's timestamp
    spans = answers.merge(requests[key + ["ts_ns", "length"]].drop_duplicates(key).rename(
        columns={"ts_ns": "sent_ns", "length": "request_bytes"}), on=key, how="left")
    fused = spans["fused"].to_numpy(bool)
    kind = np.where(fused, REQUEST_KINDS[2],
                    np.where(spans["slot"].to_numpy() == SLOT_PULL_RESPONSE, REQUEST_KINDS[1], REQUEST_KINDS[0]))
    kind = np.where(spans["iteration"].to_numpy() == INIT_ITERATION, REQUEST_KINDS[3], kind)
    return pd.DataFrame({
        "worker_rank": spans["worker_rank"].to_numpy(np.int64), "server_rank": spans["server_rank"].to_numpy(np.int64),
        "tensor_key": spans["tensor_key"].to_numpy(np.int64), "iteration": spans["iteration"].to_numpy(np.int64),
        "kind": pd.Categorical(kind, categories=REQUEST_KINDS),
        "start_ns": spans["request_ts_ns"].to_numpy(np.int64), "end_ns": spans["ts_ns"].to_numpy(np.int64),
        "request_bytes": spans["request_bytes"].to_numpy(np.float64),
        "answer_bytes": spans["length"].to_numpy(np.float64),
    }).sort_values(["worker_rank", "start_ns"], ignore_index=True)


def timeline_lanes(spans: pd.DataFrame) -> tuple[pd.DataFrame, pd.Series]:
    """The timeline's rows: per worker a head row (its iterations), then one row per tensor@server, or,
    when a worker has more than MAX_TENSOR_LANES of those, as few rows per server as hold its requests
    without overlap. Returns (lanes: label, group, head; the spans' lane numbers)."""
    rows, lane_of = [], pd.Series(0, index=spans.index, dtype=np.int64)
    for worker, mine in spans.groupby("worker_rank", sort=True):
        rows.append((node_label("worker", worker), f"worker{worker}", True))
        pairs = mine[["server_rank", "tensor_key"]].drop_duplicates().sort_values(["server_rank", "tensor_key"])
        if len(pairs) <= MAX_TENSOR_LANES:
            labels = [f"k{key}@s{server}" for server, key in pairs.itertuples(index=False)]
            index = pd.MultiIndex.from_frame(pairs)
            local = index.get_indexer(pd.MultiIndex.from_frame(mine[["server_rank", "tensor_key"]]))
        else:
            local = np.zeros(len(mine), dtype=np.int64)
            labels = []
            for server, at_server in mine.groupby("server_rank", sort=True):
                packed = packed_lanes(at_server["start_ns"].to_numpy(), at_server["end_ns"].to_numpy())
                local[mine.index.get_indexer(at_server.index)] = len(labels) + packed
                labels += [f"s{server} · {n + 1}" for n in range(packed.max() + 1)]
        lane_of[mine.index] = len(rows) + np.asarray(local)
        rows += [(label, f"worker{worker}", False) for label in labels]
    return pd.DataFrame(rows, columns=["label", "group", "head"]), lane_of


def iteration_spans(stats: Stats) -> pd.DataFrame:
    """Each worker iteration as a span (worker_rank, iteration, start_ns, end_ns and its phases in ms): from
    the previous iteration's last values (its first push for iteration 0) to its own last values."""
    iterations = stats.iterations
    start = iterations["start_ts_ns"].to_numpy(np.float64, na_value=np.nan)
    first_push = start + np.nan_to_num(iterations["phase1_s"].to_numpy() * 1e9)
    end = first_push + iterations["phase3_s"].to_numpy() * 1e9
    frame = pd.DataFrame({"worker_rank": iterations["worker_rank"].to_numpy(np.int64),
                          "iteration": iterations["iteration"].to_numpy(np.int64),
                          "start_ns": start, "end_ns": end})
    for name in ("phase1_s", "phase2_s", "phase3_s", "computation_s", "communication_s", "iteration_s", "wait_s"):
        frame[name.removesuffix("_s") + "_ms"] = iterations[name].to_numpy() * 1e3
    frame["overlap_percent"] = iterations["overlap_ratio"].replace([np.inf, -np.inf], np.nan).to_numpy() * 100
    return frame[np.isfinite(frame["end_ns"])].reset_index(drop=True)


# -- traffic matrices ----------------------------------------------------------------------------------------

def pslite_traffic_matrix(stats: Stats, trace: Trace) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Node names (in DLC rank order), and bytes and messages sent, sender (rows) × receiver (columns)."""
    nodes = trace.nodes.sort_values("dlc_rank")
    ranks = nodes["dlc_rank"].to_numpy()
    names = [node_label(role, rank) for role, rank in zip(nodes["role"], nodes["rank"])]

    def matrix(values: str) -> np.ndarray:
        return (stats.traffic.pivot_table(index="src_rank", columns="dst_rank", values=values, aggfunc="sum")
                .reindex(index=ranks, columns=ranks).to_numpy(dtype=np.float64))
    return names, matrix("bytes"), matrix("messages")


def collective_matrices(collectives: CollectiveStats) -> tuple[list[str], dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Rank names, and per view (all-to-all, where the job ran one; every collective) the payload bytes and
    messages, source rank (rows) × destination rank (columns)."""
    traffic = collectives.traffic
    ranks = sorted(set(traffic["src_rank"]) | set(traffic["dst_rank"]) | set(collectives.ranks["rank"]))
    views = {}
    for title, kind in (("all-to-all", "all_to_all"), ("every collective", None)):
        mine = traffic if kind is None else traffic[traffic["kind"] == kind]
        if kind is not None and not len(mine):
            continue
        messages = (mine.pivot_table(index="src_rank", columns="dst_rank", values="messages", aggfunc="sum")
                    .reindex(index=ranks, columns=ranks).to_numpy(dtype=np.float64))
        views[title] = (volume_matrix(traffic, ranks, kind).to_numpy(np.float64), messages)
    return [rank_label(rank) for rank in ranks], views


# -- collectives ---------------------------------------------------------------------------------------------

def collective_rank_spans(collectives: CollectiveStats) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """One timeline row per rank's capture (capture, rank, label), the operations' spans per rank on it (the
    ranks table with `lane`) and the time origin (ns): the first collective's start."""
    ranks, overlap = collectives.ranks, collectives.overlap
    lanes = overlap[["capture", "rank", "communication_fraction"]].reset_index(drop=True)
    fraction = lanes["communication_fraction"].to_numpy(np.float64) * 100
    lanes["label"] = [f"{rank_label(rank)} ({share:.1f} % comm.)" if np.isfinite(share) else rank_label(rank)
                      for rank, share in zip(lanes["rank"], fraction)]
    lane_of = pd.Series(lanes.index, index=lanes["capture"])
    spans = ranks.assign(lane=lane_of.reindex(ranks["capture"]).to_numpy())
    return lanes, spans, int(ranks["ts_first_ns"].min())


def barrier_position(sizes: np.ndarray) -> float:
    """Where a 0-byte operation (a barrier) sits on a log size axis: a decade-ish left of the smallest size."""
    positive = sizes[sizes > 0]
    return float(positive.min()) / 8 if len(positive) else 1.0
