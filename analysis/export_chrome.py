"""Chrome trace event JSON of a decoded job: the whole job on one timeline in Perfetto or chrome://tracing.

- One process per ps-lite node (pid = its ps-lite id, named by role and rank: "worker rank 0", "server rank 1",
  "scheduler" (analysis.names); labelled with the capture it was seen in, by its file: "capture worker1.pcap.gz";
  sorted workers, servers, scheduler) and on it the tracks of each connection direction: "send → server rank 1",
  "recv ← server rank 1".
- A message is a slice from its first byte to its last on the job's clock: from the first byte sent to the last
  byte received when both ends' captures saw it (the earliest and latest of the two captures' times, should
  the clocks put a receipt before its send), else as the one capture saw it; at each end whose capture is that
  node's vantage point (the one the DLC trace uses: its own capture, else its peers'). Named by its kind and
  tensor as the report spells them ("push-pull request k3@s1": tensor key 3 on server rank 1), a SimpleApp or
  control command by its name.
- Slices on one track never overlap: messages of one direction that were on the wire at the same time go on
  lanes of their own, "send → server rank 1 (2)" and on (analysis.lanes: the fewest lanes, never touching), so
  that a viewer draws every slice and binds each flow to exactly one.
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

from dlcsniff.analysis.export_chrome_collectives import CollectivePart, collective_part, here_args, lane_name, shifted
from dlcsniff.analysis.iterations import worker_iterations
from dlcsniff.analysis.job_model import JobModel
from dlcsniff.analysis.load import AnalysisError, Dataset
from dlcsniff.analysis.outputs import claim_file
from dlcsniff.analysis.lanes import lanes_per_track
from dlcsniff.analysis.names import capture_label, node_labels
from dlcsniff.analysis.operations import Trace, dlc_ranks, pslite_trace
from dlcsniff.decoders.protocols.pslite.vantage import vantage_points
from dlcsniff.decoders.protocols.pslite.decoder import CONTROL_CMD_NAMES, PUSH_PULL

CHROME_GENERATOR = "dlcsniff export --format chrome"
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
    """"push-pull request k3@s1", "push response k0@s0", a SimpleApp command's name, a control command's name...:
    the report's spelling of kinds (push, pull, push-pull) and tensors (key@server rank)."""
    push = messages["push"].fillna(False).to_numpy(bool)
    pull = messages["pull"].fillna(False).to_numpy(bool) | ~push
    data = np.where(push & pull, PUSH_PULL, np.where(push, "push", "pull")).astype(object)
    way = np.where(messages["request"].fillna(False).to_numpy(bool), " request", " response")
    control = messages["control_cmd"].fillna(-1).to_numpy(np.int64)
    control_names = np.array(CONTROL_CMD_NAMES + ("control",), dtype=object)[
        np.where((control >= 0) & (control < len(CONTROL_CMD_NAMES)), control, len(CONTROL_CMD_NAMES))]
    command = messages["simple_app_cmd"].astype(object).fillna("command").to_numpy(object)
    key = " k" + messages["tensor_key"].astype("Int64").astype("string")
    # a frame without the servers' ranks (built by hand, not read from a decode output) names the tensor alone
    server_rank = messages["server_rank"] if "server_rank" in messages else pd.Series(pd.NA, index=messages.index)
    server = ("@s" + server_rank.astype("Int64").astype("string")).fillna("")
    tensor = (key + server).fillna("").to_numpy(object)
    is_data = ~((control >= 0) | messages["simple_app"].fillna(False).to_numpy(bool))
    return np.select([control >= 0, ~is_data], [control_names, command], data) + way + np.where(is_data, tensor, "")


def _sightings(messages: pd.DataFrame, nodes: pd.DataFrame) -> pd.DataFrame:
    """One row per (message row, end) whose capture is that end's vantage point."""
    vantage = pd.DataFrame(vantage_points(messages, nodes))
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
                 source: str = "", captures: dict[str, str] | None = None) -> ChromeTrace:
    """The job's trace events, with what they could not show: its ps-lite part (dataset and trace, None for
    a job without ps-lite messages) and its collectives' (analysis.export_chrome_collectives); `captures`:
    how to show each capture (analysis.names.capture_labels)."""
    messages = dataset.messages if dataset is not None else pd.DataFrame(columns=["sender_id", "recver_id"])
    named = messages["sender_id"].notna().to_numpy() & messages["recver_id"].notna().to_numpy()
    messages = messages[named].reset_index(drop=True)
    if len(messages) == 0 and collectives is None:
        raise AnalysisError(f"{source}: no ps-lite message with a known sender and receiver, and no collective "
                            "operation or message, to show")
    starts = ([int(messages["ts_first_ns"].min())] if len(messages) else []) + (
        [collectives.origin_ns] if collectives is not None and collectives.origin_ns is not None else [])
    origin_ns = min(starts)
    other = {"generator": CHROME_GENERATOR, "source": source, "origin_unix_ns": origin_ns}
    events, losses, found = [], {}, {"message_events": 0, "flows": 0, "iterations": 0}
    if len(messages):
        events, losses, found = _pslite_events(messages, dataset, trace, origin_ns, captures or {})
        other["kvstore_mode"] = trace.mode
        losses["messages_without_node"] = int((~named).sum())
    if collectives is not None:
        events += shifted(collectives, origin_ns, first_flow_id=found["flows"])
        losses.update(collectives.losses)
        found["message_events"] += collectives.message_events
        found["flows"] += collectives.flows
    # otherData first: its generator, in the file's first bytes, tells the file for what it is (write_chrome_trace)
    return ChromeTrace(document={"otherData": other, "displayTimeUnit": "ns", "traceEvents": events},
                       losses=losses, collective_operations=collectives.operations if collectives else 0, **found)


def _pslite_events(messages: pd.DataFrame, dataset: Dataset, trace: Trace, origin_ns: int, captures: dict[str, str]
                   ) -> tuple[list[dict], dict, dict]:
    """The ps-lite nodes' processes, message slices and flows, and the workers' iterations."""
    sightings = _sightings(messages, dataset.nodes)
    flows = _flows(messages, sightings)
    # a message seen at both ends: one span, from the first byte of either capture to the last of either
    start_ns = sightings["ts_first_ns"].to_numpy(np.int64, copy=True)
    end_ns = sightings["ts_last_ns"].to_numpy(np.int64, copy=True)
    send, recv = flows["sighting_send"].to_numpy(np.int64), flows["sighting_recv"].to_numpy(np.int64)
    pair_start, pair_end = np.minimum(start_ns[send], start_ns[recv]), np.maximum(end_ns[send], end_ns[recv])
    start_ns[send], start_ns[recv], end_ns[send], end_ns[recv] = pair_start, pair_start, pair_end, pair_end
    sightings = sightings.assign(start_ns=start_ns, end_ns=end_ns)
    sightings["lane"] = lanes_per_track(sightings, ["node_id", "peer_id", "is_send"])

    nodes = np.unique(np.concatenate([sightings["node_id"].to_numpy(), sightings["peer_id"].to_numpy()]))
    process_names = dict(zip(nodes, node_labels(nodes)))
    sort_index = dict(zip(nodes, dlc_ranks(nodes, trace.topology)))
    tracks = sightings[["node_id", "peer_id", "is_send", "lane"]].drop_duplicates().assign(
        peer_rank=lambda t: [sort_index[p] for p in t["peer_id"]]).sort_values(
        ["node_id", "peer_rank", "peer_id", "is_send", "lane"], ascending=[True, True, True, False, True],
        ignore_index=True)
    iterations, unplaced, iteration_events, iteration_tracks = _iteration_events(trace, origin_ns)
    # a node's message tracks come after its iteration tracks (tid 0 is kept for them on every node)
    tracks["tid"] = tracks.groupby("node_id").cumcount() + ITERATIONS_TID + tracks["node_id"].map(
        lambda node: iteration_tracks.get(int(node), 1))
    track_key = ["node_id", "peer_id", "is_send", "lane"]
    sightings = sightings.reset_index(names="sighting").merge(tracks[[*track_key, "tid"]], on=track_key).sort_values(
        "sighting", ignore_index=True)

    events: list[dict] = []
    labels = {}
    for row in trace.nodes.itertuples(index=False):
        seen = ", ".join(capture_label(capture, captures) for capture in row.captures.split(", "))
        labels[row.node_id] = f"capture {seen}" if row.vantage == "own" else f"no capture of its own, seen from {seen}"
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
        name = f"send → {peer}" if track.is_send else f"recv ← {peer}"
        events.append({"ph": "M", "name": "thread_name", "pid": int(track.node_id), "tid": int(track.tid),
                       "args": {"name": lane_name(name, int(track.lane))}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": int(track.node_id), "tid": int(track.tid),
                       "args": {"sort_index": int(track.tid)}})

    # each flow event right after the slice it binds to: a viewer that reads events at one instant in file
    # order then finds that slice open, even when it lasts no time
    flow_ends = {int(end): (flow_id, ph) for ph, column in (("s", "sighting_send"), ("f", "sighting_recv"))
                 for flow_id, end in enumerate(flows[column])}
    start_us = _us(sightings["start_ns"] - origin_ns)
    duration_us = _us(sightings["end_ns"] - sightings["start_ns"])
    for sighting, (row, ts, dur) in enumerate(zip(sightings.itertuples(index=False), start_us, duration_us)):
        args = {"size_bytes": int(row.size_bytes), "peer": process_names[row.peer_id],
                "capture": capture_label(row.capture, captures), "complete": bool(row.complete),
                **here_args(row.start_ns, row.ts_first_ns, row.ts_last_ns)}
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

    events.extend(iteration_events)
    losses = {"messages_seen_at_one_end": int(len(sightings) - 2 * len(flows)), **unplaced}
    return events, losses, {"message_events": len(sightings), "flows": len(flows), "iterations": iterations}


def _iteration_events(trace: Trace, origin_ns: int) -> tuple[int, dict[str, int], list[dict], dict[int, int]]:
    """Each worker iteration, with phases 1 and 3 tiling it and phase 2 inside phase 3; how many were placed,
    what could not be (`iterations_without_a_start`: neither the previous iteration's last values nor a push
    seen; `iteration_spans_negative`: an iteration or phase whose end came before its start, as a capture that
    lost messages can make them), and how many tracks each worker's iterations take: an iteration whose phases
    reach into the next one's goes on a lane of its own, "iterations (2)", so that each track's slices nest."""
    found = worker_iterations(trace)
    iterations = found[found["start_ts_ns"].notna()].reset_index(drop=True)
    workers = trace.nodes[trace.nodes["role"] == "worker"].set_index("rank")["node_id"]
    # ns since origin_ns: float64 keeps nanoseconds there (not at 1.8e18 ns since the epoch)
    start_ns = (iterations["start_ts_ns"].to_numpy(np.int64) - origin_ns).astype(np.float64)
    first_push_ns = start_ns + np.nan_to_num(iterations["phase1_s"].to_numpy() * 1e9)
    # (name, begin, duration) of each iteration's slices
    # an iteration is phase 1 + phase 3: drawn only where phase 1 is, so that its phases nest in it
    spans = [(None, start_ns, np.where(iterations["phase1_s"].to_numpy() < 0, -1.0,
                                       iterations["iteration_s"].to_numpy() * 1e9)),
             ("phase 1", start_ns, iterations["phase1_s"].to_numpy() * 1e9),
             ("phase 3", first_push_ns, iterations["phase3_s"].to_numpy() * 1e9),
             ("phase 2", first_push_ns, iterations["phase2_s"].to_numpy() * 1e9)]
    negative = sum(int((duration < 0).sum()) for _, _, duration in spans)
    drawn = [(name, begin, np.where(duration >= 0, duration, np.nan)) for name, begin, duration in spans]
    extent = pd.DataFrame({"pid": workers.reindex(iterations["worker_rank"]).to_numpy(np.int64),
                           "start_ns": np.fmin.reduce([begin for _, begin, _ in drawn]),
                           "end_ns": np.fmax.reduce([start_ns] + [begin + duration for _, begin, duration in drawn])})
    extent["lane"] = lanes_per_track(extent, ["pid"], touching=True)      # no flows there: one may end as the next starts
    tracks = extent.groupby("pid")["lane"].max() + 1
    events = []
    for pid, count in tracks.items():
        for lane in range(count):
            events.append({"ph": "M", "name": "thread_name", "pid": int(pid), "tid": ITERATIONS_TID + lane,
                           "args": {"name": lane_name("iterations", lane)}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": int(pid), "tid": ITERATIONS_TID + lane,
                           "args": {"sort_index": ITERATIONS_TID + lane}})
    for index, (row, pid, lane) in enumerate(zip(iterations.itertuples(index=False), extent["pid"], extent["lane"])):
        common = {"pid": int(pid), "tid": ITERATIONS_TID + int(lane), "cat": "iteration"}
        args = {"iteration": int(row.iteration)}
        if np.isfinite(row.overlap_ratio):
            args["overlap_ratio"] = float(row.overlap_ratio)
        for name, begin, duration in drawn:
            ts = begin[index] / 1000.0
            if name is None and not np.isfinite(duration[index]):
                events.append({"ph": "i", "s": "t", "name": f"iteration {row.iteration}", "ts": ts, **common,
                               "args": args})
            elif np.isfinite(duration[index]):
                events.append({"ph": "X", "name": name or f"iteration {row.iteration}", "ts": ts,
                               "dur": duration[index] / 1000.0, **common, "args": {} if name else args})
    losses = {"iterations_without_a_start": len(found) - len(iterations), "iteration_spans_negative": negative}
    return len(iterations), {k: v for k, v in losses.items() if v}, events, {int(p): int(n) for p, n in tracks.items()}


def write_chrome_trace(job: JobModel, path: str | Path, *, force: bool = False) -> ChromeTrace:
    """`dlcsniff export --format chrome`: the job's Chrome trace event JSON in one file, claimed before any work
    (analysis.outputs: an existing file only when it is an earlier Chrome export and `force` is given)."""
    job.pslite                                  # first: is it a decode output at all? (claiming makes the folder)
    path = claim_file(path, marker=f'"generator":"{CHROME_GENERATOR}"'.encode(), command=CHROME_GENERATOR, force=force)
    trace = pslite_trace(job.pslite)
    found = chrome_trace(job.pslite if trace is not None else None, trace, collective_part(job, job.captures),
                         source=job.source, captures=job.captures)
    try:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(found.document, out, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except OSError as exc:
        raise AnalysisError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return found
