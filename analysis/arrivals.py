"""When each rank entered and left each collective, and each worker each synchronous round, as the wire shows it.

A rank's entry into a collective is the first message it sent for it (Gloo: the notification or data a rank
posts as soon as it calls the collective; every rank of a Gloo collective sends one, even a broadcast's
receivers their NOTIFY_RECV_READY), on the job's one timeline: its first byte at the sender when the sender's
capture saw it, else at the receiver's (a transit later). Its exit is the last byte of the collective's
messages at the rank (sent or received; where the rank's capture is missing, the other end's view). Where the
messages do not name their collective (NCCL), entry and exit are the rank's first and last byte on its wire for
it (collectives.parquet), the entry an upper bound on the time it arrived. A worker's entry into a sync round of
a ps-lite job is its first push of the training iteration (a fused push-pull in MXNet 1.9.1), its exit its
last message of the iteration: the servers answer a round only once every worker's push is in, so the round
waits for the last.

Two measures of how late a rank came, each against the other ranks of the same operation (their median, so
that one late rank among four does not move its own reference; with two ranks, the other's):
- lag_ns: its entry minus the others' median entry;
- idle_lag_ns: its idle time (entry minus its exit from its previous operation in the group: its own
  computation, or a pause) minus the others' median idle time. A rank that entered late because its previous
  collective kept it longer (a gather's root) has a lag but no idle lag; a rank that stalled has both.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlcsniff.analysis.operations import CATEGORY_DATA, ROLE_WORKER, Trace
from dlcsniff.analysis.spread import others_median
from dlcsniff.analysis.stats_schema import ARRIVAL_SPREAD, ARRIVALS

ARRIVAL_COLUMNS = ARRIVALS.names
ARRIVAL_SPREAD_COLUMNS = ARRIVAL_SPREAD.names
OPERATION = ["protocol", "pg", "kind", "seq"]
GROUP = ["protocol", "pg", "role"]
P2P_KINDS = ("p2p", "send", "recv")
PUSH_ROUND = "push"          # the kind of a ps-lite sync round in the arrivals table
ROLE_RANK, ROLE_WORKER_NAME = "rank", "worker"
EVIDENCE_SENT, EVIDENCE_RECEIVED, EVIDENCE_FIRST_BYTE = "sent", "received", "first_byte"
PUSH_SEND = "Push_Send_Worker"
ENTRY_COLUMNS = [*OPERATION, "role", "rank", "world_size", "capture", "evidence", "entry_ts_ns", "exit_ts_ns"]


def _floats(column: pd.Series) -> np.ndarray:
    return column.astype("Float64").to_numpy(np.float64, na_value=np.nan)


def _named(events: pd.DataFrame) -> pd.DataFrame:
    """The messages that name their collective (Gloo), not send/recv."""
    named = events["collective"].notna().to_numpy() & events["src_rank"].notna().to_numpy()
    rows = events[named & ~events["collective"].astype(object).isin(P2P_KINDS).to_numpy()]
    return rows.assign(pg=rows["pg"].astype(object).fillna(""), kind=rows["collective"].astype(object),
                       protocol=rows["protocol"].astype(object), seq=rows["seq"].astype(np.int64))


def _message_entries(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (operation, sending rank): its first message, send side first."""
    sent = rows["send_ts_first_aligned_ns"].notna().to_numpy()
    entry = np.where(sent, _floats(rows["send_ts_first_aligned_ns"]), _floats(rows["recv_ts_first_aligned_ns"]))
    frame = pd.DataFrame({
        **{name: rows[name].to_numpy() for name in OPERATION}, "rank": rows["src_rank"].to_numpy(np.int64),
        "capture": np.where(sent, rows["send_capture"].astype(object), rows["recv_capture"].astype(object)),
        "entry_ts_ns": entry, "evidence": np.where(sent, EVIDENCE_SENT, EVIDENCE_RECEIVED),
    })
    frame = frame[~np.isnan(entry)].sort_values([*OPERATION, "rank", "entry_ts_ns"], kind="stable")
    return frame.drop_duplicates([*OPERATION, "rank"])


def _message_exits(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (operation, rank): the last byte of its messages at the rank (else at the other end)."""
    sent_end = _floats(rows["send_ts_last_aligned_ns"])
    recv_end = _floats(rows["recv_ts_last_aligned_ns"])
    as_sender = pd.DataFrame({**{name: rows[name].to_numpy() for name in OPERATION},
                              "rank": rows["src_rank"].to_numpy(np.int64),
                              "exit_ts_ns": np.where(np.isnan(sent_end), recv_end, sent_end)})
    known_dst = rows["dst_rank"].notna().to_numpy()
    as_receiver = pd.DataFrame({**{name: rows[name].to_numpy()[known_dst] for name in OPERATION},
                                "rank": rows["dst_rank"].to_numpy(np.float64)[known_dst].astype(np.int64),
                                "exit_ts_ns": np.where(np.isnan(recv_end), sent_end, recv_end)[known_dst]})
    return pd.concat([as_sender, as_receiver]).groupby([*OPERATION, "rank"])["exit_ts_ns"].max().reset_index()


def _operations(collectives: pd.DataFrame) -> dict[str, np.ndarray]:
    """collectives.parquet's rows named as OPERATION names them (no process group: "")."""
    return {"protocol": collectives["protocol"].astype(object).to_numpy(),
            "pg": collectives["pg"].astype(object).fillna("").to_numpy(),
            "kind": collectives["kind"].astype(object).to_numpy(), "seq": collectives["seq"].to_numpy(np.int64)}


def _wire_entries(collectives: pd.DataFrame, covered: pd.DataFrame) -> pd.DataFrame:
    """Per (operation, rank) that no message names: the rank's first and last byte on its wire
    (collectives.parquet), the earliest first and the latest last over the captures that saw its operation."""
    kind = collectives["kind"].astype(object)
    rows = collectives[collectives["local_rank"].notna().to_numpy() & ~kind.isin(P2P_KINDS).to_numpy()]
    frame = pd.DataFrame({**_operations(rows), "rank": rows["local_rank"].to_numpy(np.int64),
                          "capture": rows["capture"].astype(object).to_numpy(),
                          "entry_ts_ns": rows["ts_first_ns"].to_numpy(np.float64),
                          "exit_ts_ns": rows["ts_last_ns"].to_numpy(np.float64)})
    taken = frame.merge(covered[["protocol", "pg", "seq"]].drop_duplicates(), how="left", indicator=True)
    frame = frame[(taken["_merge"] == "left_only").to_numpy()].sort_values([*OPERATION, "rank", "entry_ts_ns"],
                                                                          kind="stable")
    return frame.groupby([*OPERATION, "rank"], sort=False).agg(
        capture=("capture", "first"), entry_ts_ns=("entry_ts_ns", "first"), exit_ts_ns=("exit_ts_ns", "max"),
    ).reset_index().assign(evidence=EVIDENCE_FIRST_BYTE)


def collective_entries(events: pd.DataFrame, collectives: pd.DataFrame | None) -> pd.DataFrame:
    """Every rank's entry into and exit from every collective (not send/recv), with its group's world size
    (ENTRY_COLUMNS)."""
    rows = _named(events)
    entries = _message_entries(rows).merge(_message_exits(rows), on=[*OPERATION, "rank"], how="left")
    if collectives is None or not len(collectives):
        return entries.assign(role=ROLE_RANK, world_size=np.nan)[ENTRY_COLUMNS]
    entries = pd.concat([entries, _wire_entries(collectives, entries)], ignore_index=True)
    world = pd.DataFrame({**_operations(collectives), "world_size": collectives["world_size"].astype("Int64")})
    world = world.groupby(OPERATION)["world_size"].max().reset_index()
    return entries.merge(world, on=OPERATION, how="left").assign(role=ROLE_RANK)[ENTRY_COLUMNS]


def round_entries(trace: Trace | None) -> pd.DataFrame:
    """Every worker's entry into and exit from every training round of a sync ps-lite job (its first push of the
    iteration, its last message of it; ENTRY_COLUMNS); empty for an async job, where no round waits."""
    if trace is None or trace.mode != "sync":
        return pd.DataFrame(columns=ENTRY_COLUMNS)
    records = trace.records
    mine = records[(records["node_role"] == ROLE_WORKER).to_numpy() & (records["iteration"] >= 0).to_numpy()
                   & (records["category"] == CATEGORY_DATA).to_numpy()]
    pushes = mine[(mine["operation"] == PUSH_SEND).to_numpy()].sort_values(["iteration", "worker_rank", "ts_ns"],
                                                                           kind="stable")
    first = pushes.drop_duplicates(["iteration", "worker_rank"])
    exits = mine.groupby(["iteration", "worker_rank"])["ts_ns"].max()
    return pd.DataFrame({
        "protocol": "pslite", "pg": "", "kind": PUSH_ROUND, "seq": first["iteration"].to_numpy(np.int64),
        "role": ROLE_WORKER_NAME, "rank": first["worker_rank"].to_numpy(np.int64),
        "world_size": trace.topology.workers, "capture": first["capture"].astype(object).to_numpy(),
        "evidence": EVIDENCE_SENT, "entry_ts_ns": first["ts_ns"].to_numpy(np.float64),
        "exit_ts_ns": exits.reindex(pd.MultiIndex.from_arrays([first["iteration"], first["worker_rank"]]))
        .to_numpy(np.float64),
    })


def _nullable_ns(values: np.ndarray) -> pd.arrays.IntegerArray:
    known = ~np.isnan(values)
    return pd.arrays.IntegerArray(np.where(known, values, 0).round().astype(np.int64), ~known)


def with_lags(entries: pd.DataFrame) -> pd.DataFrame:
    """ARRIVAL_COLUMNS: the entries with idle_ns (since the rank's exit from its previous operation of the
    group, by sequence number), lag_ns and idle_lag_ns (see the module doc), in time order."""
    entries = entries.sort_values([*GROUP, "rank", "seq"], ignore_index=True, kind="stable")
    entry, exit_ = _floats(entries["entry_ts_ns"]), _floats(entries["exit_ts_ns"])
    same_rank = np.zeros(len(entries), dtype=bool)
    if len(entries):
        keys = entries[[*GROUP, "rank"]].astype(str).to_numpy()
        same_rank[1:] = (keys[1:] == keys[:-1]).all(axis=1)
    previous_exit = np.where(same_rank, np.roll(exit_, 1), np.nan)
    idle = entry - previous_exit
    operation = entries.groupby(OPERATION, sort=False, dropna=False).ngroup().to_numpy()
    out = entries.assign(
        world_size=pd.array(entries["world_size"], dtype="Int64"),
        entry_ts_ns=entry.round().astype(np.int64), exit_ts_ns=_nullable_ns(exit_),
        lag_ns=_nullable_ns(entry - others_median(entry, operation)), idle_ns=_nullable_ns(idle),
        idle_lag_ns=_nullable_ns(idle - others_median(idle, operation)),
    )
    return out.sort_values(["entry_ts_ns", "rank"], ignore_index=True)[list(ARRIVAL_COLUMNS)]


def job_arrivals(events: pd.DataFrame, collectives: pd.DataFrame | None, trace: Trace | None) -> pd.DataFrame:
    """ARRIVAL_COLUMNS for a job: its collectives' ranks and its sync rounds' workers."""
    parts = [part for part in (collective_entries(events, collectives), round_entries(trace)) if len(part)]
    if not parts:
        return ARRIVALS.schema.empty_table().to_pandas()
    return with_lags(pd.concat(parts, ignore_index=True))


def operation_spread(arrivals: pd.DataFrame) -> pd.DataFrame:
    """ARRIVAL_SPREAD_COLUMNS: per operation, its ranks' arrival spread (first to last entry, and who came last)
    and its completion (from the last entry to the last exit: how long it took once every rank was in)."""
    if not len(arrivals):
        return ARRIVAL_SPREAD.schema.empty_table().to_pandas()
    ordered = arrivals.sort_values([*OPERATION, "role", "entry_ts_ns", "rank"], kind="stable")
    grouped = ordered.groupby([*OPERATION, "role"], sort=False)
    out = grouped.agg(world_size=("world_size", "max"), ranks=("rank", "nunique"),
                      first_entry_ts_ns=("entry_ts_ns", "min"), last_entry_ts_ns=("entry_ts_ns", "max"),
                      latest_rank=("rank", "last"), last_exit_ts_ns=("exit_ts_ns", "max")).reset_index()
    out["arrival_spread_ns"] = out["last_entry_ts_ns"] - out["first_entry_ts_ns"]
    last_exit = out["last_exit_ts_ns"].astype("Float64").to_numpy(np.float64, na_value=np.nan)
    out["completion_ns"] = _nullable_ns(last_exit - out["last_entry_ts_ns"].to_numpy(np.float64))
    out["span_ns"] = _nullable_ns(last_exit - out["first_entry_ts_ns"].to_numpy(np.float64))
    out["last_exit_ts_ns"] = _nullable_ns(last_exit)
    out["world_size"] = pd.array(out["world_size"], dtype="Int64")
    return out.sort_values(["first_entry_ts_ns", "kind"], ignore_index=True)[list(ARRIVAL_SPREAD_COLUMNS)]
