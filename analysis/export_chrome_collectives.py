"""The collective libraries' part of the Chrome trace (analysis.export_chrome): a collective job in Perfetto.

- One process per rank (pid COLLECTIVE_PID_BASE + rank; named "rank <r>", with the process group when the job
  has several), labelled with the capture its operations were seen in, by its file ("capture rank0.pcap.gz";
  the capture's name and the rank need not agree), sorted by rank after any ps-lite node.
- On it the tracks "collectives": each operation as the rank's capture saw it (collectives.parquet), a slice
  from the first to the last byte of its messages on that rank's wire, named as `stats` and the report name
  operations ("all_reduce#3", "send_recv 0→1#0"), with its tensor bytes, wire bytes each way, algorithm and
  peers. Operations that ran at the same time (a job's concurrent collectives) go on lanes of their own,
  "collectives (2)" and on (analysis.lanes), so that no two slices of a track overlap.
- The tracks of each peer and direction ("send → rank 2", "recv ← rank 2"): each message of the job
  (events.parquet: one row per message, both ends' times on the job's one clock) as a slice from its first
  byte to its last (the first sent to the last received when both ends were captured: the earliest and the
  latest of their times) at each end a capture saw, named by its operation ("all_reduce#3"; "send_recv" for
  point-to-point, "<protocol> message" for what names none), with its opcode and payload bytes; lanes as
  above; a flow from the send to the receipt of every message seen at both ends.
An end whose rank the message does not name (NCCL over RoCE names the sender in data writes, the receiver in
CTS writes) is the rank of the capture that saw it. Messages whose ranks stay unknown (TCPStore's, a
connection set up before the capture) have no track: they are counted in the losses.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dlcsniff.analysis.collective_stats import SEND_RECV, operation_names
from dlcsniff.analysis.lanes import lanes_per_track
from dlcsniff.analysis.job_model import JobModel
from dlcsniff.analysis.names import capture_label

COLLECTIVE_PID_BASE = 1 << 20          # above any ps-lite node id
OPERATIONS_TID = 0
EVENT_READ_COLUMNS = ("protocol", "pg", "collective", "seq", "opcode", "src_rank", "dst_rank", "size_bytes",
                      "payload_bytes", "complete", "send_capture", "recv_capture", "send_ts_first_aligned_ns",
                      "send_ts_last_aligned_ns", "recv_ts_first_aligned_ns", "recv_ts_last_aligned_ns")
COLLECTIVE_PROTOCOLS = ("gloo", "nccl_socket", "roce")


@dataclass(frozen=True, slots=True)
class CollectivePart:
    """The trace events of the collectives, and what the part could not show."""

    events: list[dict]
    origin_ns: int | None              # the earliest time it shows, on the job's clock
    operations: int                    # operation slices (one per rank that saw the operation)
    message_events: int                # message slices (a message seen at both ends has two)
    flows: int
    losses: dict[str, int] = field(default_factory=dict)


def _messages(job: JobModel) -> pd.DataFrame:
    if not job.has_table("events") or "protocol" not in job.columns_of("events"):
        # an output of a dlcsniff whose timeline held ps-lite messages only
        return pd.DataFrame(columns=list(EVENT_READ_COLUMNS))
    events = job.table("events", EVENT_READ_COLUMNS)
    return events[events["protocol"].isin(COLLECTIVE_PROTOCOLS).to_numpy(bool)].reset_index(drop=True)


def _process_names(ranks: pd.DataFrame) -> dict[tuple[str, int], tuple[int, str]]:
    """(pg, rank) → (pid, name): the default group's ranks as "rank r", other groups' with their name."""
    groups = sorted(ranks["pg"].unique())
    out = {}
    for index, (pg, rank) in enumerate(sorted(set(zip(ranks["pg"], ranks["rank"])),
                                              key=lambda k: (groups.index(k[0]), k[1]))):
        name = f"rank {rank}" if len(groups) == 1 else f"rank {rank} ({pg or 'no group named'})"
        out[(pg, int(rank))] = (COLLECTIVE_PID_BASE + index, name)
    return out


def _sightings(messages: pd.DataFrame) -> pd.DataFrame:
    """One row per message end a capture saw: the send end on its sender's track, the receipt on its
    receiver's, with the index of the message (for the flows) and the message's span (start_ns, end_ns: from the
    earliest first byte either end saw to the latest last byte)."""
    times = messages[[f"{side}_ts_{edge}_aligned_ns" for side in ("send", "recv") for edge in ("first", "last")]]
    first = times[["send_ts_first_aligned_ns", "recv_ts_first_aligned_ns"]].min(axis=1).to_numpy(np.int64)
    last = times[["send_ts_last_aligned_ns", "recv_ts_last_aligned_ns"]].max(axis=1).to_numpy(np.int64)
    sides = []
    for side, rank, peer in (("send", "src_rank", "dst_rank"), ("recv", "dst_rank", "src_rank")):
        seen = messages[f"{side}_capture"].notna().to_numpy(bool)
        part = messages[seen]
        sides.append(pd.DataFrame({
            "message": np.flatnonzero(seen), "is_send": side == "send", "pg": part["pg"].to_numpy(object),
            "rank": part[rank].to_numpy(np.int64), "peer": part[peer].to_numpy(np.int64),
            "first_ns": part[f"{side}_ts_first_aligned_ns"].to_numpy(np.int64),
            "last_ns": part[f"{side}_ts_last_aligned_ns"].to_numpy(np.int64),
            "start_ns": first[seen], "end_ns": last[seen],
            "capture": part[f"{side}_capture"].astype(str).to_numpy(object)}))
    sightings = pd.concat(sides, ignore_index=True).sort_values(["start_ns", "is_send"], ascending=[True, False],
                                                                kind="stable", ignore_index=True)
    return sightings.assign(lane=lanes_per_track(sightings, ["pg", "rank", "peer", "is_send"]))


def _message_names(messages: pd.DataFrame) -> np.ndarray:
    """Each message by its operation as `stats` names it ("all_reduce#3"), "send_recv" for point-to-point (whose
    messages carry no sequence number), "<protocol> message" where the library names no collective."""
    kind = messages["collective"].astype(object)
    seq = messages["seq"].astype("Int64").astype(str).radd("#").where(messages["seq"].notna(), "")
    named = np.where(kind == "p2p", SEND_RECV, kind.astype(str) + seq)
    return np.where(kind.notna().to_numpy(bool), named, messages["protocol"].astype(str) + " message")


def lane_name(name: str, lane: int) -> str:
    """A track's name on its lane: the first keeps the name, the others are numbered from 2."""
    return name + (f" ({lane + 1})" if lane else "")


def here_args(start_ns: int, first_ns: int, last_ns: int) -> dict:
    """What one end's capture saw of a message, against its slice (which spans both ends): its first and last
    byte there, in µs after the slice's start."""
    return {"first_byte_here_after_us": (int(first_ns) - int(start_ns)) / 1000.0,
            "last_byte_here_after_us": (int(last_ns) - int(start_ns)) / 1000.0}


def collective_part(job: JobModel, captures: dict[str, str] | None = None) -> CollectivePart | None:
    """The collectives' trace events of a job, times in ns on the job's clock (the
    caller shifts them to its origin: `shifted`); None when it has no collective operation or message.
    `captures`: how to show each capture (analysis.names.capture_labels)."""
    captures = captures or {}
    collectives = job.collectives
    operations = collectives.collectives if collectives is not None else None
    messages = _messages(job)
    if operations is not None and len(operations):
        # an end the message does not name a rank for is the rank of the capture that saw it (NCCL over RoCE
        # names the sender in its data writes and the receiver in its CTS writes only)
        rank_of = operations.dropna(subset=["local_rank"]).drop_duplicates("capture").set_index("capture")[
            "local_rank"]
        for side, column in (("send", "src_rank"), ("recv", "dst_rank")):
            seen = messages[f"{side}_capture"].astype(object).map(rank_of)
            messages[column] = messages[column].astype("Float64").fillna(seen.astype("Float64"))
    ranked = messages["src_rank"].notna().to_numpy(bool) & messages["dst_rank"].notna().to_numpy(bool)
    losses = {"collective_messages_without_ranks": int((~ranked).sum())}
    messages = messages[ranked].reset_index(drop=True)
    if (operations is None or len(operations) == 0) and len(messages) == 0:
        return None
    operations = operations if operations is not None else pd.DataFrame(columns=["pg", "local_rank", "capture"])
    operations = operations[operations["local_rank"].notna().to_numpy(bool)]
    # NCCL names no process group: its ranks are the job's, under one name ""
    operations = operations.assign(pg=operations["pg"].astype(object).where(operations["pg"].notna(), ""))
    messages = messages.assign(pg=messages["pg"].astype(object).where(messages["pg"].notna(), ""))
    sightings = _sightings(messages)
    ranks = pd.concat([pd.DataFrame({"pg": operations["pg"].to_numpy(object),
                                     "rank": operations["local_rank"].to_numpy(np.int64)}),
                       sightings[["pg", "rank"]], sightings[["pg", "peer"]].rename(columns={"peer": "rank"})])
    processes = _process_names(ranks)
    seen_in = operations.groupby(["pg", "local_rank"])["capture"].agg(lambda c: sorted(set(map(str, c))))
    events: list[dict] = []
    for (pg, rank), (pid, name) in processes.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        if (pg, rank) in seen_in.index:
            labels = ", ".join(capture_label(capture, captures) for capture in seen_in[(pg, rank)])
            events.append({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0,
                           "args": {"labels": f"capture {labels}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    operations = operations.assign(op_name=operation_names(operations).to_numpy(object),
                                   start_ns=operations["ts_first_ns"].to_numpy(np.int64),
                                   end_ns=operations["ts_last_ns"].to_numpy(np.int64))
    operations["lane"] = lanes_per_track(operations, ["pg", "local_rank"]) if len(operations) else 0
    lanes_in_use = operations.groupby(["pg", "local_rank"])["lane"].max() if len(operations) else pd.Series()
    for (pg, rank), (pid, _) in processes.items():
        for lane in range(int(lanes_in_use.get((pg, rank), 0)) + 1):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": OPERATIONS_TID + lane,
                           "args": {"name": lane_name("collectives", lane)}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": OPERATIONS_TID + lane,
                           "args": {"sort_index": OPERATIONS_TID + lane}})
    for row in operations.itertuples(index=False):
        pid = processes[(row.pg, int(row.local_rank))][0]
        args = {"kind": str(row.kind), "seq": int(row.seq), "tensor_bytes": int(row.tensor_bytes),
                "wire_bytes_sent": int(row.wire_bytes_sent), "wire_bytes_received": int(row.wire_bytes_received),
                "messages": int(row.messages), "capture": capture_label(str(row.capture), captures),
                "complete": bool(row.complete), "protocol": row.protocol}
        if isinstance(row.algorithm, str):
            args["algorithm"] = row.algorithm
        if row.peers is not None and len(row.peers):
            args["peers"] = [int(peer) for peer in row.peers]
        events.append({"ph": "X", "name": row.op_name, "cat": "collective", "ts_ns": int(row.start_ns),
                       "dur_ns": int(row.end_ns) - int(row.start_ns), "pid": pid, "tid": OPERATIONS_TID + int(row.lane),
                       "args": args})

    # message tracks after every rank's operation lanes
    first_tid = int(lanes_in_use.max()) + 1 + OPERATIONS_TID if len(lanes_in_use) else OPERATIONS_TID + 1
    tracks = sightings[["pg", "rank", "peer", "is_send", "lane"]].drop_duplicates().sort_values(
        ["pg", "rank", "peer", "is_send", "lane"], ascending=[True, True, True, False, True], ignore_index=True)
    tracks["tid"] = tracks.groupby(["pg", "rank"]).cumcount() + first_tid
    tid_of = {(t.pg, t.rank, t.peer, t.is_send, t.lane): t.tid for t in tracks.itertuples(index=False)}
    for track in tracks.itertuples(index=False):
        pid = processes[(track.pg, int(track.rank))][0]
        peer = processes[(track.pg, int(track.peer))][1]
        name = f"send → {peer}" if track.is_send else f"recv ← {peer}"
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": int(track.tid),
                       "args": {"name": lane_name(name, int(track.lane))}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": int(track.tid),
                       "args": {"sort_index": int(track.tid)}})
    both = messages["send_capture"].notna().to_numpy(bool) & messages["recv_capture"].notna().to_numpy(bool)
    names = _message_names(messages)
    records = messages.to_dict("records")
    for row in sightings.itertuples(index=False):
        message = records[row.message]
        args = {"size_bytes": int(message["size_bytes"]), "capture": capture_label(row.capture, captures),
                "complete": bool(message["complete"]), "protocol": str(message["protocol"]),
                **here_args(row.start_ns, row.first_ns, row.last_ns)}
        for name in ("opcode", "payload_bytes", "seq"):
            if pd.notna(message[name]):
                args[name] = message[name] if isinstance(message[name], str) else int(message[name])
        track = {"pid": processes[(row.pg, int(row.rank))][0],
                 "tid": int(tid_of[(row.pg, row.rank, row.peer, row.is_send, row.lane)])}
        events.append({"ph": "X", "name": str(names[row.message]), "cat": "send" if row.is_send else "recv",
                       "ts_ns": int(row.start_ns), "dur_ns": int(row.end_ns) - int(row.start_ns), **track,
                       "args": args})
        if both[row.message]:
            # each flow event right after the slice it binds to (see analysis.export_chrome)
            events.append({"ph": "s" if row.is_send else "f", "name": "message", "cat": "message",
                           "id_message": int(row.message), "ts_ns": int(row.start_ns), **track,
                           **({} if row.is_send else {"bp": "e"})})
    times = [e["ts_ns"] for e in events if "ts_ns" in e]
    losses["collective_messages_seen_at_one_end"] = int((~both).sum())
    return CollectivePart(events=events, origin_ns=min(times) if times else None, operations=len(operations),
                          message_events=len(sightings), flows=int(both.sum()), losses=losses)


def shifted(part: CollectivePart, origin_ns: int, first_flow_id: int) -> list[dict]:
    """The part's events with times in µs since origin_ns and flow ids from first_flow_id on."""
    out = []
    for event in part.events:
        event = dict(event)
        if "ts_ns" in event:
            event["ts"] = (event.pop("ts_ns") - origin_ns) / 1000.0
        if "dur_ns" in event:
            event["dur"] = event.pop("dur_ns") / 1000.0
        if "id_message" in event:
            event["id"] = first_flow_id + event.pop("id_message")
        out.append(event)
    return out
