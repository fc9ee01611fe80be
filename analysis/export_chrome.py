"""Chrome trace event JSON of a decoded job: the whole job on one timeline in Perfetto or chrome://tracing.

- One process per ps-lite node (pid = its ps-lite id, named "worker0", "server1", "scheduler"; sorted workers,
  servers, scheduler) and on it one track per connection direction: "send → server1", "recv ← server1".
- An X (complete) event per message at each end whose capture is that node's vantage point (the one the DLC
  trace uses: its own capture, else its peers'), from the message's first to its last byte there. Messages
  of one TCP direction follow each other, so a track's events never overlap.
- A flow (s → f, the f bound to its enclosing slice, each written right after its slice) from the send to the
  receipt of every message seen at both ends: the k-th message with the same ps-lite identity (sender,
  receiver, request/push/pull, app, customer, timestamp, command, key) at the sender is the k-th at the
  receiver.
- Worker iterations on a track "iterations" of each worker: the iteration (phase 1 + phase 3) with its
  phases nested in it (analysis.iterations), or an instant event where its end is unknown.
- The collective libraries' operations and messages: a process per rank (analysis.export_chrome_collectives).
Times are µs since the first message (`otherData.origin_unix_ns`), so float64 keeps nanoseconds.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dlcsniff.analysis.export_chrome_collectives import CollectivePart, collective_part, shifted
from dlcsniff.analysis.iterations import worker_iterations
from dlcsniff.analysis.load import AnalysisError, Dataset, load_dataset
from dlcsniff.analysis.operations import Trace, dlc_ranks, node_names, pslite_trace
from dlcsniff.decoders.vantage import vantage_points
from dlcsniff.decoders.protocols.pslite import CONTROL_CMD_NAMES

ITERATIONS_TID = 0
IDENTITY = ("sender_id", "recver_id", "request", "push", "pull", "simple_app", "app_id", "customer_id",
            "ps_timestamp", "control_cmd", "tensor_key")


@dataclass(frozen=True, slots=True)
class ChromeTrace:
    document: dict                 # {"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}
    message_events: int            # X events of messages (a message seen at both ends has two)
    flows: int
    iterations: int
    losses: dict[str, int] = field(default_factory=dict)
    collective_operations: int = 0  # X events of collective operations (one per rank that saw one)


def _us(ns: np.ndarray | pd.Series) -> np.ndarray:
    return np.asarray(ns, dtype=np.int64) / 1000.0


def _message_names(messages: pd.DataFrame) -> np.ndarray:
    """"push request", "pushpull response", a SimpleApp command's name, a control command's name..."""
    push = messages["push"].fillna(False).to_numpy(bool)
    pull = messages["pull"].fillna(False).to_numpy(bool) | ~push
    data = np.where(push & pull, "pushpull", np.where(push, "push", "pull")).astype(object)
    way = np.where(messages["request"].fillna(False).to_numpy(bool), " request", " response")
    control = messages["control_cmd"].fillna(-1).to_numpy(np.int64)
    control_names = np.array(CONTROL_CMD_NAMES + ("control",), dtype=object)[
        np.where((control >= 0) & (control < len(CONTROL_CMD_NAMES)), control, len(CONTROL_CMD_NAMES))]
    command = messages["simple_app_cmd"].astype(object).fillna("command").to_numpy(object)
    return np.select([control >= 0, messages["simple_app"].fillna(False).to_numpy(bool)],
                     [control_names, command], data) + way


def _sightings(messages: pd.DataFrame, nodes: pd.DataFrame) -> pd.DataFrame:
    """One row per (message row, end) whose capture is that end's vantage point."""
    vantage = vantage_points(messages, nodes)
    seen = pd.MultiIndex.from_frame(vantage[["node_id", "capture"]])
    captures = messages["capture"].astype(str).to_numpy()
    names = _message_names(messages)
    sides = []
    for is_send, node, peer in ((True, "sender_id", "recver_id"), (False, "recver_id", "sender_id")):
        node_ids = messages[node].to_numpy(np.int64)
        keep = pd.MultiIndex.from_arrays([node_ids, captures]).isin(seen)
        rows = messages[keep]
        sides.append(pd.DataFrame({
            "row": np.flatnonzero(keep), "node_id": node_ids[keep], "peer_id": rows[peer].to_numpy(np.int64),
            "is_send": is_send, "name": names[keep], "ts_first_ns": rows["ts_first_ns"].to_numpy(np.int64),
            "ts_last_ns": rows["ts_last_ns"].to_numpy(np.int64), "size_bytes": rows["size_bytes"].to_numpy(),
            "tensor_key": rows["tensor_key"].to_numpy(), "ps_timestamp": rows["ps_timestamp"].to_numpy(),
            "complete": rows["complete"].to_numpy(), "capture": captures[keep]}))
    return pd.concat(sides, ignore_index=True)


def _flows(messages: pd.DataFrame, sightings: pd.DataFrame) -> pd.DataFrame:
    """(send sighting, receive sighting) of every message seen at both ends."""
    identity = messages.loc[:, list(IDENTITY)].astype("float64").fillna(-1.0).reset_index(drop=True)
    ends = pd.concat([sightings[["is_send", "ts_first_ns"]], identity.iloc[sightings["row"]].reset_index(drop=True)],
                     axis=1)
    ends["sighting"] = np.arange(len(ends))
    ends = ends.sort_values("ts_first_ns", kind="stable")
    ends["occurrence"] = ends.groupby(list(IDENTITY) + ["is_send"]).cumcount()
    key = list(IDENTITY) + ["occurrence"]
    sends = ends[ends["is_send"]][key + ["sighting"]]
    recvs = ends[~ends["is_send"]][key + ["sighting"]]
    return sends.merge(recvs, on=key, suffixes=("_send", "_recv"))[["sighting_send", "sighting_recv"]]


def chrome_trace(dataset: Dataset | None, trace: Trace | None, collectives: CollectivePart | None = None,
                 source: str = "") -> ChromeTrace:
    """The job's trace events, with what they could not show: its ps-lite part (dataset and trace, None for
    a job without ps-lite messages) and its collectives' (analysis.export_chrome_collectives)."""
    messages = dataset.messages if dataset is not None else pd.DataFrame(columns=["sender_id", "recver_id"])
    named = messages["sender_id"].notna().to_numpy() & messages["recver_id"].notna().to_numpy()
    messages = messages[named].reset_index(drop=True)
    if len(messages) == 0 and collectives is None:
        raise AnalysisError(f"{source}: no ps-lite message with a known sender and receiver, and no collective "
                            "operation or message, to show")
    starts = ([int(messages["ts_first_ns"].min())] if len(messages) else []) + (
        [collectives.origin_ns] if collectives is not None and collectives.origin_ns is not None else [])
    origin_ns = min(starts)
    other = {"source": source, "origin_unix_ns": origin_ns, "generator": "dlcsniff export --format chrome"}
    events, losses, found = [], {}, {"message_events": 0, "flows": 0, "iterations": 0}
    if len(messages):
        events, losses, found = _pslite_events(messages, dataset, trace, origin_ns)
        other["kvstore_mode"] = trace.mode
        losses["messages_without_node"] = int((~named).sum())
    if collectives is not None:
        events += shifted(collectives, origin_ns, first_flow_id=found["flows"])
        losses.update(collectives.losses)
        found["message_events"] += collectives.message_events
        found["flows"] += collectives.flows
    return ChromeTrace(document={"traceEvents": events, "displayTimeUnit": "ns", "otherData": other},
                       losses=losses, collective_operations=collectives.operations if collectives else 0, **found)


def _pslite_events(messages: pd.DataFrame, dataset: Dataset, trace: Trace, origin_ns: int
                   ) -> tuple[list[dict], dict, dict]:
    """The ps-lite nodes' processes, message slices and flows, and the workers' iterations."""
    sightings = _sightings(messages, dataset.nodes)

    nodes = np.unique(np.concatenate([sightings["node_id"].to_numpy(), sightings["peer_id"].to_numpy()]))
    process_names = dict(zip(nodes, node_names(nodes)))
    sort_index = dict(zip(nodes, dlc_ranks(nodes, trace.topology)))
    tracks = sightings[["node_id", "peer_id", "is_send"]].drop_duplicates().assign(
        peer_rank=lambda t: [sort_index[p] for p in t["peer_id"]]).sort_values(
        ["node_id", "peer_rank", "peer_id", "is_send"], ascending=[True, True, True, False], ignore_index=True)
    tracks["tid"] = tracks.groupby("node_id").cumcount() + ITERATIONS_TID + 1
    sightings = sightings.merge(tracks[["node_id", "peer_id", "is_send", "tid"]], on=["node_id", "peer_id", "is_send"])

    events: list[dict] = []
    labels = {row.node_id: f"capture {row.captures}" if row.vantage == "own" else
              f"no capture of its own, seen from {row.captures}" for row in trace.nodes.itertuples(index=False)}
    for node in nodes:
        events.append({"ph": "M", "name": "process_name", "pid": int(node), "tid": 0,
                       "args": {"name": process_names[node]}})
        if node in labels:
            events.append({"ph": "M", "name": "process_labels", "pid": int(node), "tid": 0,
                           "args": {"labels": labels[node]}})
        # workers, servers, the scheduler, then ids that name no single node
        rank = int(sort_index[node])
        events.append({"ph": "M", "name": "process_sort_index", "pid": int(node), "tid": 0,
                       "args": {"sort_index": rank if rank >= 0 else trace.topology.scheduler_dlc_rank + 1}})
    for track in tracks.itertuples(index=False):
        peer = process_names[track.peer_id]
        events.append({"ph": "M", "name": "thread_name", "pid": int(track.node_id), "tid": int(track.tid),
                       "args": {"name": f"send → {peer}" if track.is_send else f"recv ← {peer}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": int(track.node_id), "tid": int(track.tid),
                       "args": {"sort_index": int(track.tid)}})

    # each flow event right after the slice it binds to: a viewer that reads events at one instant in file
    # order then finds that slice open, even when it lasts no time
    flows = _flows(messages, sightings)
    flow_ends = {int(end): (flow_id, ph) for ph, column in (("s", "sighting_send"), ("f", "sighting_recv"))
                 for flow_id, end in enumerate(flows[column])}
    start_us = _us(sightings["ts_first_ns"] - origin_ns)
    duration_us = _us(sightings["ts_last_ns"] - sightings["ts_first_ns"])
    for sighting, (row, ts, dur) in enumerate(zip(sightings.itertuples(index=False), start_us, duration_us)):
        args = {"size_bytes": int(row.size_bytes), "peer": process_names[row.peer_id], "capture": row.capture,
                "complete": bool(row.complete)}
        if row.tensor_key == row.tensor_key:
            args["tensor_key"] = int(row.tensor_key)
        if row.ps_timestamp == row.ps_timestamp:
            args["ps_timestamp"] = int(row.ps_timestamp)
        track = {"pid": int(row.node_id), "tid": int(row.tid)}
        events.append({"ph": "X", "name": row.name, "cat": "send" if row.is_send else "recv", "ts": ts, "dur": dur,
                       **track, "args": args})
        if sighting in flow_ends:
            flow_id, ph = flow_ends[sighting]
            events.append({"ph": ph, "name": "message", "cat": "message", "id": flow_id, "ts": ts, **track,
                           **({"bp": "e"} if ph == "f" else {})})

    iterations, unplaced, iteration_events = _iteration_events(trace, origin_ns)
    events.extend(iteration_events)
    losses = {"messages_seen_at_one_end": int(len(sightings) - 2 * len(flows)),
              **({"iterations_without_a_start": unplaced} if unplaced else {})}
    return events, losses, {"message_events": len(sightings), "flows": len(flows), "iterations": iterations}


def _iteration_events(trace: Trace, origin_ns: int) -> tuple[int, int, list[dict]]:
    """Each worker iteration, with phases 1 and 3 tiling it and phase 2 inside phase 3; how many were placed,
    how many could not be (their start unknown: neither the previous iteration's last values nor a push seen)."""
    found = worker_iterations(trace)
    iterations = found[found["start_ts_ns"].notna()]
    workers = trace.nodes[trace.nodes["role"] == "worker"].set_index("rank")["node_id"]
    events = []
    for rank in iterations["worker_rank"].unique():
        pid = int(workers[rank])
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": ITERATIONS_TID,
                       "args": {"name": "iterations"}})
    for row in iterations.itertuples(index=False):
        pid = int(workers[row.worker_rank])
        start_us = (row.start_ts_ns - origin_ns) / 1000.0
        name = f"iteration {row.iteration}"
        common = {"pid": pid, "tid": ITERATIONS_TID, "cat": "iteration"}
        args = {"iteration": int(row.iteration)}
        if np.isfinite(row.overlap_ratio):
            args["overlap_ratio"] = float(row.overlap_ratio)
        if np.isfinite(row.iteration_s):
            events.append({"ph": "X", "name": name, "ts": start_us, "dur": row.iteration_s * 1e6, **common,
                           "args": args})
        else:
            events.append({"ph": "i", "s": "t", "name": name, "ts": start_us, **common, "args": args})
        first_push_us = start_us + (row.phase1_s * 1e6 if np.isfinite(row.phase1_s) else 0.0)
        for phase, begin_us, seconds in (("phase 1", start_us, row.phase1_s), ("phase 3", first_push_us, row.phase3_s),
                                         ("phase 2", first_push_us, row.phase2_s)):
            if np.isfinite(seconds):
                events.append({"ph": "X", "name": phase, "ts": begin_us, "dur": seconds * 1e6, **common, "args": {}})
    return len(iterations), len(found) - len(iterations), events


def write_chrome_trace(decode_dir: str | Path, path: str | Path) -> ChromeTrace:
    """`dlcsniff export --format chrome`: the job's Chrome trace event JSON in one file."""
    dataset = load_dataset(decode_dir)
    trace = pslite_trace(dataset)
    found = chrome_trace(dataset if trace is not None else None, trace, collective_part(decode_dir),
                         source=str(decode_dir))
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w", encoding="utf-8") as out:
            json.dump(found.document, out, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except OSError as exc:
        raise AnalysisError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return found
