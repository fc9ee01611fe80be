"""Hangs from the wire: a rank that never joined a collective while the others had sent their part and waited,
and a ps-lite node that went silent while its peers waited on it.

A collective cannot finish without all its ranks, so a hang shows at a group's last operation: some ranks
entered it (analysis/arrivals.py), a rank did not, and nobody went on to a later one. The missing rank must have
been seen in an earlier operation of the group, and a waiting rank must have sent it a message in this one (a
Gloo rank posts its receive from a peer with a NOTIFY_RECV_READY, or sends it data): the rank was party to the
operation, and the capture that saw that message (or the rank's own) would have shown its answer. A synchronous
ps-lite round is the same with workers (their pushes of the round, none answered); when every worker pushed and a
server answered none of the round's requests to it, that server went silent.

A late rank is not yet hung: the captures must go on after the waiting began for longer than the job's lateness
threshold (analysis/stragglers.py): since_s, from the first waiting rank's entry to the last packet the captures
hold (any traffic: a pcap records no end of its own). When they do not, the captures ended mid-operation: the
missing rank is `unfinished` (late or hung, the captures cannot tell), and said so rather than dropped. waited_s
is how long the waiting ranks' own connections went on: to their last packet (their closing at a timeout, when
they gave up), from the same entry.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlcsniff.analysis.arrivals import P2P_KINDS, PUSH_ROUND, ROLE_RANK, ROLE_WORKER_NAME
from dlcsniff.analysis.operations import CATEGORY_DATA, ROLE_WORKER, SLOT_PULL_REQUEST, SLOT_PUSH_REQUEST, Trace
from dlcsniff.analysis.stragglers import ROLE_SERVER, UPDATE, late_threshold_ns
from dlcsniff.decoders.clocks import align

HANG_COLUMNS = ("protocol", "pg", "kind", "seq", "role", "rank", "waiting_ranks", "since_s", "waited_s",
                "threshold_s", "status")
HANG, UNFINISHED = "hang", "unfinished"
WORKER_ID_BASE = 9           # ps-lite: worker rank r is node 9 + 2r
STREAM_COLUMNS = ("capture", "protocol", "ts_last_ns", "rank", "node_id")


def _stream_ends_ns(streams: pd.DataFrame, clocks: pd.DataFrame | None) -> pd.Series:
    """Each stream's last packet on the job's one timeline."""
    if clocks is not None and len(clocks):
        return pd.Series(align(streams["ts_last_ns"], streams["capture"], clocks), index=streams.index)
    return streams["ts_last_ns"].astype("Int64")


def waited_ns(streams: pd.DataFrame, ends: pd.Series, protocol: str, waiting: set[int], since_ns: float) -> float:
    """From since_ns to the last packet of the waiting ranks' own connections (Gloo, NCCL: the sending rank;
    ps-lite: the workers' node ids)."""
    if protocol == "pslite":
        senders = streams["node_id"].astype("Float64").to_numpy(np.float64, na_value=np.nan)
        theirs = np.isin(senders, [WORKER_ID_BASE + 2 * rank for rank in waiting])
    else:
        theirs = (streams["protocol"].astype(object) == protocol).to_numpy() & np.isin(
            streams["rank"].astype("Float64").to_numpy(np.float64, na_value=np.nan), list(waiting))
    found = ends[theirs].dropna()
    return float(found.max()) - since_ns if len(found) else float("nan")


def _sent_to(events: pd.DataFrame, protocol: str, pg: str, seq: int) -> pd.DataFrame:
    """The messages of one collective (src_rank, dst_rank, send_capture, recv_capture)."""
    named = events[(events["protocol"].astype(object) == protocol).to_numpy()
                   & events["collective"].notna().to_numpy()
                   & ~events["collective"].astype(object).isin(P2P_KINDS).to_numpy()]
    named = named[(named["pg"].astype(object).fillna("") == pg).to_numpy() & (named["seq"] == seq).to_numpy()]
    return named[["src_rank", "dst_rank", "send_capture", "recv_capture"]]


def _rank_captures(events: pd.DataFrame) -> dict[int, set[str]]:
    """The captures of each rank's own host: the send side of its messages."""
    sent = events[events["src_rank"].notna().to_numpy() & events["send_capture"].notna().to_numpy()]
    captures = sent["send_capture"].astype(str).groupby(sent["src_rank"].astype(np.int64).to_numpy()).agg(set)
    return {int(rank): found for rank, found in captures.items()}


def _row(protocol, pg, kind, seq, role, rank, waiting, since_ns, waited, threshold_ns) -> dict:
    return {"protocol": protocol, "pg": pg, "kind": kind, "seq": int(seq), "role": role, "rank": int(rank),
            "waiting_ranks": sorted(int(r) for r in waiting), "since_s": since_ns / 1e9, "waited_s": waited / 1e9,
            "threshold_s": threshold_ns / 1e9, "status": HANG if since_ns > threshold_ns else UNFINISHED}


def collective_hangs(arrivals: pd.DataFrame, events: pd.DataFrame, streams: pd.DataFrame, ends: pd.Series
                     ) -> list[dict]:
    """A row (HANG_COLUMNS) per rank missing from its group's last collective (see the module doc)."""
    found = []
    collectives = arrivals[arrivals["role"] != ROLE_WORKER_NAME]
    own_captures = _rank_captures(events)
    for (protocol, pg), group in collectives.groupby(["protocol", "pg"], sort=True):
        last_seq = int(group["seq"].max())
        last = group[group["seq"] == last_seq]
        world = last["world_size"].dropna()
        if not len(world):
            continue
        entered = set(last["rank"].astype(int))
        seen_before = set(group.loc[group["seq"] < last_seq, "rank"].astype(int))
        threshold = late_threshold_ns(group["lag_ns"].astype("Float64").to_numpy(np.float64, na_value=np.nan))
        waited_since = float(last["entry_ts_ns"].min())
        since = float(ends.max()) - waited_since
        waited = waited_ns(streams, ends, protocol, entered, waited_since)
        messages = _sent_to(events, protocol, pg, last_seq)
        for rank in sorted((set(range(int(world.max()))) - entered) & seen_before):
            to_rank = messages[(messages["dst_rank"] == rank).to_numpy()]
            visible = set(to_rank["send_capture"].dropna().astype(str)) | own_captures.get(rank, set())
            if len(to_rank) and visible:
                found.append(_row(protocol, pg, str(last["kind"].iloc[0]), last_seq, ROLE_RANK, rank, entered,
                                  since, waited, threshold))
    return found


def _round_requests(trace: Trace) -> pd.DataFrame:
    """Per (iteration, worker, server): the worker's data requests and the answers it got, from the workers'
    records."""
    records = trace.records
    mine = records[(records["node_role"] == ROLE_WORKER).to_numpy() & (records["iteration"] >= 0).to_numpy()
                   & (records["category"] == CATEGORY_DATA).to_numpy()]
    slot = mine["slot"].to_numpy()
    request = np.isin(slot, (SLOT_PUSH_REQUEST, SLOT_PULL_REQUEST))
    return pd.DataFrame({"iteration": mine["iteration"].to_numpy(np.int64),
                         "worker": mine["worker_rank"].to_numpy(np.int64),
                         "server": mine["server_rank"].to_numpy(np.int64),
                         "requests": request.astype(np.int64), "answers": (~request).astype(np.int64)}
                        ).groupby(["iteration", "worker", "server"]).sum().reset_index()


def round_hangs(arrivals: pd.DataFrame, trace: Trace | None, streams: pd.DataFrame, ends: pd.Series) -> list[dict]:
    """Rows (HANG_COLUMNS) for a ps-lite job's last round left unanswered: a worker that never pushed in it
    (sync), else the servers that answered none of its requests to them."""
    if trace is None or not len(trace.records):
        return []
    requests = _round_requests(trace)
    if not len(requests):
        return []
    last_round = int(requests["iteration"].max())
    last = requests[requests["iteration"] == last_round]
    waiting = last[last["requests"] > last["answers"]]
    if not len(waiting):
        return []
    rounds = arrivals[arrivals["role"] == ROLE_WORKER_NAME]
    lags = rounds["lag_ns"].astype("Float64").to_numpy(np.float64, na_value=np.nan)
    threshold = late_threshold_ns(lags)
    pushes = rounds[rounds["seq"] == last_round]
    records = trace.records
    round_records = records[(records["iteration"] == last_round).to_numpy()
                            & (records["node_role"] == ROLE_WORKER).to_numpy()]
    waited_since = float(pushes["entry_ts_ns"].min()) if len(pushes) else float(round_records["ts_ns"].min())
    since = float(ends.max()) - waited_since
    waiting_workers = set(waiting["worker"].astype(int))
    waited = waited_ns(streams, ends, "pslite", waiting_workers, waited_since)
    missing = set(rounds.loc[rounds["seq"] < last_round, "rank"].astype(int)) - set(pushes["rank"].astype(int))
    if trace.mode == "sync" and missing:
        return [_row("pslite", "", PUSH_ROUND, last_round, ROLE_WORKER_NAME, rank, waiting_workers, since, waited,
                     threshold) for rank in sorted(missing)]
    answered = last.groupby("server")["answers"].sum()
    silent = answered[answered == 0].index
    return [_row("pslite", "", UPDATE, last_round, ROLE_SERVER, server,
                 set(waiting.loc[waiting["server"] == server, "worker"].astype(int)), since, waited, threshold)
            for server in silent]


def job_hangs(arrivals: pd.DataFrame, events: pd.DataFrame, trace: Trace | None, streams: pd.DataFrame,
              clocks: pd.DataFrame | None) -> pd.DataFrame:
    """Every hang of a job, and every rank missing from an operation the captures ended in (HANG_COLUMNS, status
    hang or unfinished)."""
    if not len(streams):
        return pd.DataFrame(columns=list(HANG_COLUMNS))
    ends = _stream_ends_ns(streams, clocks)
    rows = collective_hangs(arrivals, events, streams, ends) + round_hangs(arrivals, trace, streams, ends)
    return pd.DataFrame(rows, columns=list(HANG_COLUMNS))
