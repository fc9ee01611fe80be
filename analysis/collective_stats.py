"""Statistics of collective operations: time, bandwidth, skew across ranks, traffic matrices, and how much of
each rank's time its collectives take.

Inputs are a decoded job's collectives.parquet (one row per operation per capture, each capture being one
rank's vantage point) and the collective libraries' messages (JobModel.collectives, analysis.job_model). A rank's
`ts_first_ns` / `ts_last_ns` for an operation are the first and last byte of that operation's messages on its wire
(sent or received): a peer's early message can open it before the rank called the library, and its own last
send can still be leaving after the call returned. A point-to-point send and its receive, seen at both ends,
are one operation of kind "send_recv".

Bandwidths follow nccl-tests (NVIDIA/nccl-tests, doc/PERFORMANCE.md and src/<collective>.cu GetBw):

    algbw = S / t                busbw = algbw * factor(kind, n)

| kind | S (nccl-tests' size) | factor |
|---|---|---|
| all_reduce | the buffer | 2(n-1)/n |
| all_gather | the gathered output (n chunks) | (n-1)/n |
| reduce_scatter | the input (n chunks) | (n-1)/n |
| all_to_all | one rank's send buffer (n chunks) | (n-1)/n |
| gather, scatter | the gathered / scattered buffer (n chunks) | (n-1)/n |
| broadcast, reduce | the buffer | 1 |
| send_recv | the message | 1 |

with n the group's world size. S is the collective's tensor_bytes, which the decoder recovers from the
traffic in these conventions (decoders/protocols/gloo/collectives.py); across ranks the median of the ranks' estimates.
t is a rank's own time for its per-rank bandwidth, and the operation's span (first start → last end over
the ranks) for the operation's (nccl-tests by default reports the mean of the ranks' own times: that mean is
rank_time_mean_ns). A barrier moves no data: no bandwidth. Bandwidths are in GB/s (1e9 bytes/s, bytes/ns).

Skew is max − min over the ranks of their start times (start_skew_ns), and of their end times
(end_skew_ns), on the job's one timeline when clocks.parquet aligned the captures; otherwise on each
capture's own clock (`clock` in the summary says which), which is only comparable when the hosts' clocks
agree (one host, or PTP-synchronised).

Traffic matrices: payload bytes from each source rank to each destination rank per operation, counted once
even when both ends were captured (the fuller of the sender's and the receiver's view). A rank's own chunk of
an all-to-all never crosses the network: the diagonal is empty. The sparse-embedding view (EmbRace, Li et
al., PPoPP 2022: embeddings exchanged by all-to-all, dense gradients by all-reduce) compares the two volumes.

Communication vs the gaps between (HTA's interval logic: starts and ends melted into +1/−1 events, a cumulative
sum per rank): per rank, the segments of its wall time with 0, 1, 2… collectives in flight. Time with none
is the computation gaps (or idle); time with two or more is communication overlapping communication.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from dlcsniff.analysis.job_model import JobModel
from dlcsniff.analysis.load import CollectiveDataset
from dlcsniff.analysis.describe import describe
from dlcsniff.analysis.display import duration, human_bytes, percent
from dlcsniff.analysis.stats_schema import (COLLECTIVE_CONCURRENCY, COLLECTIVE_OVERLAP, COLLECTIVE_RANKS,
                                            COLLECTIVE_STATS, COLLECTIVE_TRAFFIC)

P2P_KINDS = ("send", "recv")
SEND_RECV = "send_recv"
RING_FACTOR_KINDS = ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")
UNIT_FACTOR_KINDS = ("broadcast", "reduce", SEND_RECV)
NO_RANK = -1
OPERATION_KEY = ["protocol", "pg", "kind", "seq", "src_rank", "dst_rank"]
OPERATION_COLUMNS = COLLECTIVE_STATS.names
RANK_COLUMNS = COLLECTIVE_RANKS.names
TRAFFIC_COLUMNS = COLLECTIVE_TRAFFIC.names
CONCURRENCY_COLUMNS = COLLECTIVE_CONCURRENCY.names
OVERLAP_COLUMNS = COLLECTIVE_OVERLAP.names


@dataclass(frozen=True, slots=True)
class CollectiveStats:
    """The collective statistics of a job: five tables and the summary section "collectives"."""

    operations: pd.DataFrame       # OPERATION_COLUMNS, one row per operation across ranks, in start order
    ranks: pd.DataFrame            # RANK_COLUMNS, one row per operation per rank
    traffic: pd.DataFrame          # TRAFFIC_COLUMNS, bytes per operation, source rank and destination rank
    concurrency: pd.DataFrame      # CONCURRENCY_COLUMNS, per rank: how many collectives are in flight when
    overlap: pd.DataFrame          # OVERLAP_COLUMNS, one row per rank
    summary: dict

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"collective_stats": self.operations, "collective_ranks": self.ranks,
                "collective_traffic": self.traffic, "collective_concurrency": self.concurrency,
                "collective_overlap": self.overlap}


def bus_factor(kind: np.ndarray, world_size: np.ndarray) -> np.ndarray:
    """nccl-tests' busbw / algbw per kind for n ranks (NaN for a kind without one: barrier)."""
    n = np.asarray(world_size, dtype=np.float64)
    ring = (n - 1) / n
    kind = np.asarray(kind, dtype=object)
    return np.select([kind == "all_reduce", np.isin(kind, RING_FACTOR_KINDS), np.isin(kind, UNIT_FACTOR_KINDS)],
                     [2 * ring, ring, np.ones_like(n)], np.nan)


def bandwidth_gb_per_s(size_bytes: np.ndarray, time_ns: np.ndarray) -> np.ndarray:
    """S / t in GB/s (bytes per nanosecond); NaN where nothing moved or no time passed."""
    size = np.asarray(size_bytes, dtype=np.float64)
    time = np.asarray(time_ns, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((size > 0) & (time > 0), size / time, np.nan)


def _with_operation_key(collectives: pd.DataFrame) -> pd.DataFrame:
    """The rows with the key of the operation they belong to: collectives by (protocol, group, kind,
    sequence number); a send and its receive as one send_recv by (…, sequence number, source, destination)."""
    kind = collectives["kind"].astype(object).to_numpy()
    p2p = np.isin(kind, P2P_KINDS)
    rank = pd.array(collectives["local_rank"], dtype="Int64").to_numpy(dtype=np.int64, na_value=NO_RANK)
    peer = pd.array(collectives["peers"].str[0], dtype="Int64").to_numpy(dtype=np.int64, na_value=NO_RANK)
    send = kind == "send"
    return collectives.assign(
        kind=np.where(p2p, SEND_RECV, kind),
        pg=collectives["pg"].astype(object).fillna(""),
        rank=rank,
        src_rank=np.where(p2p, np.where(send, rank, peer), NO_RANK),
        dst_rank=np.where(p2p, np.where(send, peer, rank), NO_RANK),
    )


def _operation_names(operations: pd.DataFrame) -> pd.Series:
    """all_reduce#3, send_recv 0→1#0 (? for a rank not known): what figures and tables call an operation."""
    src, dst = (operations[name].astype(str).where(operations[name] != NO_RANK, "?") for name in ("src_rank",
                                                                                                   "dst_rank"))
    pair = np.where(operations["kind"] == SEND_RECV, " " + src + "→" + dst, "")
    return operations["kind"].astype(str) + pair + "#" + operations["seq"].astype(str)


def operation_names(collectives: pd.DataFrame) -> pd.Series:
    """What `stats` and the report call the operation each row of collectives.parquet (one rank's view) is part
    of: all_reduce#3, send_recv 0→1#0."""
    return _operation_names(_with_operation_key(collectives))


def operation_statistics(collectives: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(operations, ranks): every operation across its ranks (OPERATION_COLUMNS) and at each rank
    (RANK_COLUMNS), from collectives.parquet rows (see the module doc for the definitions)."""
    rows = _with_operation_key(collectives)
    rows = rows.assign(time_ns=rows["ts_last_ns"] - rows["ts_first_ns"])
    grouped = rows.groupby(OPERATION_KEY, sort=True, dropna=False)
    operations = grouped.agg(
        world_size=("world_size", "max"), ranks_seen=("capture", "nunique"), algorithm=("algorithm", "first"),
        size_bytes=("tensor_bytes", "median"), ts_first_ns=("ts_first_ns", "min"), ts_last_ns=("ts_last_ns", "max"),
        last_start_ns=("ts_first_ns", "max"), first_end_ns=("ts_last_ns", "min"),
        rank_time_mean_ns=("time_ns", "mean"), wire_bytes=("wire_bytes_sent", "sum"), complete=("complete", "all"),
    ).reset_index()
    operations["size_bytes"] = operations["size_bytes"].round().astype("Int64")     # null: size unknown
    size = operations["size_bytes"].to_numpy(np.float64, na_value=np.nan)
    operations["op"] = _operation_names(operations)
    operations["time_ns"] = operations["ts_last_ns"] - operations["ts_first_ns"]
    # a send_recv's group is its two ends, whatever the process group's size
    group_size = np.where(operations["kind"] == SEND_RECV, 2,
                          operations["world_size"].to_numpy(np.float64, na_value=np.nan))
    operations["bus_factor"] = bus_factor(operations["kind"], group_size)
    operations["algbw_gb_per_s"] = bandwidth_gb_per_s(size, operations["time_ns"])
    operations["busbw_gb_per_s"] = operations["algbw_gb_per_s"] * operations["bus_factor"]
    # skew needs two ranks at least
    alone = operations["ranks_seen"].to_numpy() < 2
    operations["start_skew_ns"] = pd.arrays.IntegerArray(
        (operations["last_start_ns"] - operations["ts_first_ns"]).to_numpy(np.int64), alone)
    operations["end_skew_ns"] = pd.arrays.IntegerArray(
        (operations["ts_last_ns"] - operations["first_end_ns"]).to_numpy(np.int64), alone.copy())

    which = grouped.ngroup().to_numpy()
    taken = lambda column: operations[column].to_numpy()[which]  # noqa: E731
    ranks = pd.DataFrame({
        "op": taken("op"), **{name: rows[name].to_numpy() for name in ("protocol", "pg", "kind", "seq", "capture",
                                                                          "rank", "algorithm")},
        "size_bytes": operations["size_bytes"].array.take(which), "ts_first_ns": rows["ts_first_ns"].to_numpy(),
        "ts_last_ns": rows["ts_last_ns"].to_numpy(), "time_ns": rows["time_ns"].to_numpy(),
        "algbw_gb_per_s": bandwidth_gb_per_s(size[which], rows["time_ns"]),
        "start_lag_ns": rows["ts_first_ns"].to_numpy() - taken("ts_first_ns"),
        "end_lag_ns": rows["ts_last_ns"].to_numpy() - taken("first_end_ns"),
        **{name: rows[name].to_numpy() for name in ("wire_bytes_sent", "wire_bytes_received", "messages",
                                                    "complete")},
    })
    ranks.insert(ranks.columns.get_loc("start_lag_ns"), "busbw_gb_per_s",
                 ranks["algbw_gb_per_s"] * taken("bus_factor"))
    operations = operations.sort_values(["ts_first_ns", "op"], ignore_index=True)
    ranks = ranks.sort_values(["ts_first_ns", "capture"], ignore_index=True)
    return operations[list(OPERATION_COLUMNS)], ranks[list(RANK_COLUMNS)]


def collective_traffic(messages: pd.DataFrame) -> pd.DataFrame:
    """TRAFFIC_COLUMNS: payload and wire bytes per operation, source rank and destination rank, from the
    collective libraries' messages with both ranks known. A message captured at both ends counts once: per
    (operation, source, destination) the view with more payload — the sender's (its outgoing rows) or the
    receiver's (incoming rows) — so that a capture missing at one end or losing bytes costs nothing."""
    known = messages["src_rank"].notna() & messages["dst_rank"].notna() & messages["outgoing"].notna()
    rows = messages[known.to_numpy()]
    kind = rows["collective"].astype(object).to_numpy()
    rows = rows.assign(kind=np.where(kind == "p2p", SEND_RECV, kind), pg=rows["pg"].astype(object).fillna(""),
                       seq=pd.array(rows["seq"], dtype="Int64"),
                       src_rank=rows["src_rank"].astype(np.int64), dst_rank=rows["dst_rank"].astype(np.int64),
                       sender_view=rows["outgoing"].astype(bool))
    views = rows.groupby([*OPERATION_KEY, "sender_view"], sort=True, dropna=False).agg(
        payload_bytes=("payload_bytes", "sum"), wire_bytes=("size_bytes", "sum"),
        messages=("size_bytes", "size")).reset_index()
    views["payload_bytes"] = views["payload_bytes"].astype(np.int64)
    # the fuller view first (the sender's on ties), then one row per (operation, source, destination)
    views = views.sort_values([*OPERATION_KEY, "payload_bytes", "wire_bytes", "sender_view"],
                              ascending=[True] * len(OPERATION_KEY) + [False, False, False], kind="stable")
    per_pair = views.groupby(OPERATION_KEY, sort=False, dropna=False)
    both = per_pair["sender_view"].transform("nunique").to_numpy() == 2
    best = views.assign(seen_at=np.where(both, "both", np.where(views["sender_view"], "sender", "receiver")))
    best = best[~best.duplicated(OPERATION_KEY)]
    return best[list(TRAFFIC_COLUMNS)].sort_values(OPERATION_KEY, ignore_index=True)


def volume_matrix(traffic: pd.DataFrame, ranks: list[int], kind: str | None = None) -> pd.DataFrame:
    """Payload bytes, source rank (rows) × destination rank (columns), over `ranks`; only `kind` when given.
    Pairs that exchanged nothing are 0."""
    chosen = traffic if kind is None else traffic[traffic["kind"] == kind]
    matrix = chosen.pivot_table(index="src_rank", columns="dst_rank", values="payload_bytes", aggfunc="sum")
    return matrix.reindex(index=ranks, columns=ranks).fillna(0).astype(np.int64)


def concurrency(ranks: pd.DataFrame) -> pd.DataFrame:
    """CONCURRENCY_COLUMNS: each rank's time from its first collective's start to its last's end, cut into
    segments with a constant number of collectives in flight (consecutive segments differ in it)."""
    events = pd.DataFrame({
        "capture": np.concatenate([ranks["capture"].to_numpy(object)] * 2),
        "rank": np.tile(ranks["rank"].to_numpy(np.int64), 2),
        "ts_ns": np.concatenate([ranks["ts_first_ns"].to_numpy(np.int64), ranks["ts_last_ns"].to_numpy(np.int64)]),
        "change": np.repeat(np.array([1, -1], dtype=np.int64), len(ranks)),
    })
    # at one instant, ends before starts: back-to-back collectives do not overlap
    events = events.sort_values(["capture", "ts_ns", "change"], ignore_index=True)
    events["in_flight"] = events.groupby("capture", sort=False)["change"].cumsum()
    # a segment runs from an event to the next of the same rank
    capture, ts = events["capture"].to_numpy(object), events["ts_ns"].to_numpy(np.int64)
    events["ts_last_ns"] = np.append(ts[1:], 0)
    followed = np.append(capture[1:] == capture[:-1], False)
    segments = events[followed & (events["ts_last_ns"].to_numpy() > ts)].rename(columns={"ts_ns": "ts_first_ns"})
    # one row per run of equal in_flight (a collective ending as another starts leaves the count unchanged)
    capture, in_flight = segments["capture"].to_numpy(object), segments["in_flight"].to_numpy()
    new_run = np.ones(len(segments), dtype=bool)
    new_run[1:] = (capture[1:] != capture[:-1]) | (in_flight[1:] != in_flight[:-1])
    runs = segments.groupby(np.cumsum(new_run), sort=False).agg(
        capture=("capture", "first"), rank=("rank", "first"), ts_first_ns=("ts_first_ns", "first"),
        ts_last_ns=("ts_last_ns", "last"), in_flight=("in_flight", "first"))
    return runs.reset_index(drop=True)[list(CONCURRENCY_COLUMNS)]


def communication_overlap(ranks: pd.DataFrame, segments: pd.DataFrame) -> pd.DataFrame:
    """OVERLAP_COLUMNS per rank: wall time (first collective start → last end), the time with at least one
    collective in flight (communication_ns, the union of its collectives), the gaps between (none in
    flight: computation or idle), the time with two or more (concurrent_ns), and the summed durations."""
    length = (segments["ts_last_ns"] - segments["ts_first_ns"]).to_numpy(np.int64)
    in_flight = segments["in_flight"].to_numpy()
    parts = pd.DataFrame({
        "capture": segments["capture"].to_numpy(object),
        "communication_ns": np.where(in_flight > 0, length, 0), "gap_ns": np.where(in_flight == 0, length, 0),
        "gaps": (in_flight == 0).astype(np.int64), "longest_gap_ns": np.where(in_flight == 0, length, 0),
        "concurrent_ns": np.where(in_flight > 1, length, 0),
    }).groupby("capture").agg(communication_ns=("communication_ns", "sum"), gap_ns=("gap_ns", "sum"),
                              gaps=("gaps", "sum"), longest_gap_ns=("longest_gap_ns", "max"),
                              concurrent_ns=("concurrent_ns", "sum"))
    per_rank = ranks.groupby("capture").agg(rank=("rank", "first"), ts_first_ns=("ts_first_ns", "min"),
                                            ts_last_ns=("ts_last_ns", "max"), collective_ns=("time_ns", "sum"))
    overlap = per_rank.join(parts).fillna(0).reset_index()
    overlap = overlap.astype({name: np.int64 for name in ("communication_ns", "gap_ns", "gaps", "longest_gap_ns",
                                                          "concurrent_ns")})
    overlap["wall_ns"] = overlap["ts_last_ns"] - overlap["ts_first_ns"]
    overlap["communication_fraction"] = _ratio(overlap["communication_ns"], overlap["wall_ns"])
    overlap["concurrent_fraction"] = _ratio(overlap["concurrent_ns"], overlap["communication_ns"])
    return overlap.sort_values(["rank", "capture"], ignore_index=True)[list(OVERLAP_COLUMNS)]


def _ratio(part: pd.Series, whole: pd.Series) -> np.ndarray:
    whole = whole.to_numpy(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(whole > 0, part.to_numpy(np.float64) / whole, np.nan)


def _clock(data: CollectiveDataset) -> dict:
    """Which timeline the collectives' times are on."""
    captures = sorted(data.collectives["capture"].astype(str).unique())
    if data.clocks is None:
        return {"aligned": [], "raw": captures, "reference": None,
                "note": "each capture's own clock (the decode output aligns none)"}
    aligned = sorted(set(captures) & set(data.clocks["capture"].astype(str)))
    raw = sorted(set(captures) - set(aligned))
    return {"aligned": aligned, "raw": raw, "reference": str(data.clocks["reference"].iloc[0]),
            "note": f"aligned to the clock of capture {data.clocks['reference'].iloc[0]}" + (
                f"; captures on their own clock: {', '.join(raw)}" if raw else "")}


def _floats(values: pd.Series) -> np.ndarray:
    """A nullable column as float64 with NaN for null (what `describe` takes)."""
    return values.astype("Float64").to_numpy(np.float64, na_value=np.nan)


def _summary(data: CollectiveDataset, operations: pd.DataFrame, traffic: pd.DataFrame,
             overlap: pd.DataFrame) -> dict:
    by_kind = {}
    for kind, mine in operations.groupby("kind", sort=True):
        by_kind[str(kind)] = {"operations": int(len(mine))} | {
            name: describe(_floats(mine[name]))
            for name in ("size_bytes", "time_ns", "busbw_gb_per_s", "start_skew_ns", "end_skew_ns")}
    payload = traffic.groupby("kind")["payload_bytes"].sum()
    all_to_all, all_reduce = int(payload.get("all_to_all", 0)), int(payload.get("all_reduce", 0))
    collectives = data.collectives
    return {
        "clock": _clock(data),
        "operations": int(len(operations)),
        "ranks": sorted(int(r) for r in collectives["local_rank"].dropna().unique()),
        "captures": sorted(collectives["capture"].astype(str).unique()),
        "protocols": sorted(collectives["protocol"].astype(str).unique()),
        "by_kind": by_kind,
        "per_rank": {str(row["capture"]): {name: row[name] for name in (
            "rank", "wall_ns", "communication_ns", "gap_ns", "gaps", "longest_gap_ns", "concurrent_ns",
            "communication_fraction", "concurrent_fraction")} for row in overlap.to_dict(orient="records")},
        "volume": {"payload_bytes_per_kind": {str(k): int(v) for k, v in payload.items()},
                   "all_to_all_bytes": all_to_all, "all_reduce_bytes": all_reduce,
                   "all_to_all_share": all_to_all / (all_to_all + all_reduce) if all_to_all + all_reduce else None},
    }


# What each of the collective losses counts, and why (the stats summary's losses_explained)
COLLECTIVE_LOSSES = {
    "incomplete_collectives": "collective operations a capture did not see whole (holes): their sizes are short",
    "collectives_not_seen_at_every_rank": "collective operations some rank's capture lacks (not every rank was "
                                          "captured, or a capture started late or ended early): their times and "
                                          "skew are those of the ranks seen",
    "collective_messages_without_ranks": "collective library messages whose sender, receiver or direction the "
                                         "decode could not place (no rendezvous seen): left out of the rank "
                                         "matrices",
}


def _losses(data: CollectiveDataset, operations: pd.DataFrame) -> dict:
    messages = data.messages
    expected = np.where(operations["kind"] == SEND_RECV, 2, operations["world_size"])
    return {
        "incomplete_collectives": int((~operations["complete"].astype(bool)).sum()),
        "collectives_not_seen_at_every_rank": int((operations["ranks_seen"].to_numpy() < expected).sum()),
        "collective_messages_without_ranks": int((messages["src_rank"].isna() | messages["dst_rank"].isna()
                                                  | messages["outgoing"].isna()).sum()),
    }


def collective_statistics(data: CollectiveDataset) -> CollectiveStats:
    """Every collective statistic of a job (see the module doc); the summary's "losses" are the counts of
    what could not be measured, to be merged into the job's."""
    operations, ranks = operation_statistics(data.collectives)
    traffic = collective_traffic(data.messages)
    segments = concurrency(ranks)
    overlap = communication_overlap(ranks, segments)
    summary = _summary(data, operations, traffic, overlap)
    summary["losses"] = _losses(data, operations)
    return CollectiveStats(operations=operations, ranks=ranks, traffic=traffic, concurrency=segments,
                           overlap=overlap, summary=summary)


def collective_statistics_of(job: JobModel) -> CollectiveStats | None:
    """The collective statistics of a job; None when it has no collective operation."""
    data = job.collectives
    return None if data is None else collective_statistics(data)


def collective_headline(summary: dict) -> list[tuple[str, str]]:
    """The job's collective figures in a few lines (the "collectives" section of summary.json)."""
    volume = summary["volume"]
    share = volume["all_to_all_share"]
    per_rank = summary["per_rank"].values()
    return [
        ("collective operations", f"{summary['operations']:,} over ranks "
                                  f"{', '.join(str(r) for r in summary['ranks']) or 'unknown'} "
                                  f"({', '.join(summary['protocols'])})"),
        ("timeline", summary["clock"]["note"]),
        ("communication fraction per rank", ", ".join(
            f"r{row['rank']}: {percent(row['communication_fraction'])}" for row in per_rank
            if row["communication_fraction"] is not None and np.isfinite(row["communication_fraction"])) or "n/a"),
        ("time with 2+ collectives in flight", ", ".join(f"r{row['rank']}: {duration(row['concurrent_ns'], 'ns')}"
                                                         for row in per_rank) or "n/a"),
        ("all-to-all / all-reduce bytes", f"{human_bytes(volume['all_to_all_bytes'])} / "
                                          f"{human_bytes(volume['all_reduce_bytes'])}"
                                          + ("" if share is None else f" (all-to-all {percent(share)})")),
    ]


KIND_TABLE_HEADER = ("kind", "ops", "size p50", "time p50 ms", "busbw p50 GB/s", "start skew max ms",
                     "end skew max ms")


def _duration_ms(ns: float | None) -> str:
    return duration(ns, "ns", with_unit=False)


def collective_kind_rows(summary: dict) -> list[tuple[str, ...]]:
    """One row per kind under KIND_TABLE_HEADER (the terminal's and the report's table)."""
    def pick(found: dict | None, name: str) -> float | None:
        return None if found is None else found[name]

    rows = []
    for kind, found in summary["by_kind"].items():
        busbw = pick(found["busbw_gb_per_s"], "p50")
        rows.append((kind, f"{found['operations']:,}", human_bytes(pick(found["size_bytes"], "p50")),
                     _duration_ms(pick(found["time_ns"], "p50")), "n/a" if busbw is None else f"{busbw:.4g}",
                     _duration_ms(pick(found["start_skew_ns"], "max")),
                     _duration_ms(pick(found["end_skew_ns"], "max"))))
    return rows
