"""The collective libraries' part of the Chrome trace (analysis.export_chrome): a collective job in Perfetto.

- One process per rank (pid COLLECTIVE_PID_BASE + rank; named "rank <r>", with the process group when the job
  has several), sorted by rank after any ps-lite node.
- On it a track "collectives": each operation as the rank's capture saw it (collectives.parquet), a slice
  from the first to the last byte of its messages on that rank's wire, named by kind, with its sequence
  number, tensor bytes, wire bytes each way, algorithm and peers.
- One track per peer and direction ("send → rank 2", "recv ← rank 2"): each message of the job (events.parquet:
  one row per message, both ends' times on the job's one clock) as a slice at each end a capture saw,
  named "<kind> #<seq>", with its opcode and payload bytes; a flow from the send to the receipt of every
  message seen at both ends.
Messages whose ranks the decoder could not tell (TCPStore's, a connection set up before the capture) have no
track: they are counted in the losses.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from dlcsniff.analysis.load import load_collectives, read_columns

COLLECTIVE_PID_BASE = 1 << 20          # above any ps-lite node id
OPERATIONS_TID = 0
EVENT_READ_COLUMNS = ("protocol", "pg", "collective", "seq", "opcode", "src_rank", "dst_rank", "size_bytes",
                      "payload_bytes", "complete", "send_capture", "recv_capture", "send_first_aligned_ns",
                      "send_last_aligned_ns", "recv_first_aligned_ns", "recv_last_aligned_ns")
COLLECTIVE_PROTOCOLS = ("gloo", "nccl")


@dataclass(frozen=True, slots=True)
class CollectivePart:
    """The trace events of the collectives, and what the part could not show."""

    events: list[dict]
    origin_ns: int | None              # the earliest time it shows, on the job's clock
    operations: int                    # operation slices (one per rank that saw the operation)
    message_events: int                # message slices (a message seen at both ends has two)
    flows: int
    losses: dict[str, int] = field(default_factory=dict)


def _messages(decode_dir: Path) -> pd.DataFrame:
    events_path = decode_dir / "events.parquet"
    if not events_path.exists() or "protocol" not in pq.read_schema(events_path).names:
        # an output of a dlcsniff whose timeline held ps-lite messages only
        return pd.DataFrame(columns=list(EVENT_READ_COLUMNS))
    events = read_columns(events_path, EVENT_READ_COLUMNS)
    return events[events["protocol"].isin(COLLECTIVE_PROTOCOLS).to_numpy(bool)].reset_index(drop=True)


def _process_names(ranks: pd.DataFrame) -> dict[tuple[str, int], tuple[int, str]]:
    """(pg, rank) → (pid, name): the default group's ranks as "rank r", other groups' with their name."""
    groups = sorted(ranks["pg"].dropna().unique())
    out = {}
    for index, (pg, rank) in enumerate(sorted(set(zip(ranks["pg"], ranks["rank"])),
                                              key=lambda k: (groups.index(k[0]), k[1]))):
        name = f"rank {rank}" if len(groups) == 1 else f"rank {rank} ({pg})"
        out[(pg, int(rank))] = (COLLECTIVE_PID_BASE + index, name)
    return out


def _sightings(messages: pd.DataFrame) -> pd.DataFrame:
    """One row per message end a capture saw: the send end on its sender's track, the receipt on its
    receiver's, with the index of the message (for the flows)."""
    sides = []
    for side, rank, peer in (("send", "src_rank", "dst_rank"), ("recv", "dst_rank", "src_rank")):
        seen = messages[f"{side}_capture"].notna().to_numpy(bool)
        part = messages[seen]
        sides.append(pd.DataFrame({
            "message": np.flatnonzero(seen), "is_send": side == "send", "pg": part["pg"].to_numpy(object),
            "rank": part[rank].to_numpy(np.int64), "peer": part[peer].to_numpy(np.int64),
            "first_ns": part[f"{side}_first_aligned_ns"].to_numpy(np.int64),
            "last_ns": part[f"{side}_last_aligned_ns"].to_numpy(np.int64),
            "capture": part[f"{side}_capture"].astype(str).to_numpy(object)}))
    return pd.concat(sides, ignore_index=True).sort_values(["first_ns", "is_send"], ascending=[True, False],
                                                           kind="stable", ignore_index=True)


def collective_part(decode_dir: str | Path) -> CollectivePart | None:
    """The collectives' trace events of the decode output in decode_dir, times in ns on the job's clock (the
    caller shifts them to its origin: `shifted`); None when it has no collective operation or message."""
    decode_dir = Path(decode_dir)
    collectives = load_collectives(decode_dir)
    operations = collectives.collectives if collectives is not None else None
    messages = _messages(decode_dir)
    ranked = messages["src_rank"].notna().to_numpy(bool) & messages["dst_rank"].notna().to_numpy(bool)
    losses = {"collective_messages_without_ranks": int((~ranked).sum())}
    messages = messages[ranked].reset_index(drop=True)
    if (operations is None or len(operations) == 0) and len(messages) == 0:
        return None
    operations = operations if operations is not None else pd.DataFrame(columns=["pg", "local_rank"])
    operations = operations[operations["local_rank"].notna().to_numpy(bool)]
    sightings = _sightings(messages)
    ranks = pd.concat([pd.DataFrame({"pg": operations["pg"].to_numpy(object),
                                     "rank": operations["local_rank"].to_numpy(np.int64)}),
                       sightings[["pg", "rank"]], sightings[["pg", "peer"]].rename(columns={"peer": "rank"})])
    processes = _process_names(ranks)
    events: list[dict] = []
    for (pg, rank), (pid, name) in processes.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": OPERATIONS_TID,
                       "args": {"name": "collectives"}})
    for row in operations.itertuples(index=False):
        pid = processes[(row.pg, int(row.local_rank))][0]
        args = {"seq": int(row.seq), "tensor_bytes": int(row.tensor_bytes), "wire_bytes_sent": int(row.wire_bytes_sent),
                "wire_bytes_received": int(row.wire_bytes_received), "messages": int(row.messages),
                "capture": row.capture, "complete": bool(row.complete), "protocol": row.protocol}
        if isinstance(row.algorithm, str):
            args["algorithm"] = row.algorithm
        if row.peers is not None and len(row.peers):
            args["peers"] = [int(peer) for peer in row.peers]
        events.append({"ph": "X", "name": str(row.kind), "cat": "collective", "ts_ns": int(row.ts_first_ns),
                       "dur_ns": int(row.ts_last_ns) - int(row.ts_first_ns), "pid": pid, "tid": OPERATIONS_TID,
                       "args": args})

    tracks = sightings[["pg", "rank", "peer", "is_send"]].drop_duplicates().sort_values(
        ["pg", "rank", "peer", "is_send"], ascending=[True, True, True, False], ignore_index=True)
    tracks["tid"] = tracks.groupby(["pg", "rank"]).cumcount() + OPERATIONS_TID + 1
    tid_of = {(t.pg, t.rank, t.peer, t.is_send): t.tid for t in tracks.itertuples(index=False)}
    for track in tracks.itertuples(index=False):
        pid = processes[(track.pg, int(track.rank))][0]
        peer = processes[(track.pg, int(track.peer))][1]
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": int(track.tid),
                       "args": {"name": f"send → {peer}" if track.is_send else f"recv ← {peer}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": int(track.tid),
                       "args": {"sort_index": int(track.tid)}})
    both = messages["send_capture"].notna().to_numpy(bool) & messages["recv_capture"].notna().to_numpy(bool)
    records = messages.to_dict("records")
    for row in sightings.itertuples(index=False):
        message = records[row.message]
        kind = message["collective"] if isinstance(message["collective"], str) else "message"
        seq = f" #{int(message['seq'])}" if pd.notna(message["seq"]) else ""
        args = {"size_bytes": int(message["size_bytes"]), "capture": row.capture,
                "complete": bool(message["complete"]), "protocol": str(message["protocol"])}
        for name in ("opcode", "payload_bytes", "seq"):
            if pd.notna(message[name]):
                args[name] = message[name] if isinstance(message[name], str) else int(message[name])
        track = {"pid": processes[(row.pg, int(row.rank))][0], "tid": int(tid_of[(row.pg, row.rank, row.peer,
                                                                                   row.is_send)])}
        events.append({"ph": "X", "name": f"{kind}{seq}", "cat": "send" if row.is_send else "recv",
                       "ts_ns": int(row.first_ns), "dur_ns": int(row.last_ns) - int(row.first_ns), **track,
                       "args": args})
        if both[row.message]:
            # each flow event right after the slice it binds to (see analysis.export_chrome)
            events.append({"ph": "s" if row.is_send else "f", "name": "message", "cat": "message",
                           "id_message": int(row.message), "ts_ns": int(row.first_ns), **track,
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
