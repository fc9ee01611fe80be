"""Where the time of every request goes, on the job's one timeline (the model: the IMC 2020 study of
parameter-server RPCs), and the other job-wide statistics of the merged view.

requests.parquet — one row per request/response pair (ps-lite push, pull, MXNet's fused push-pull, and
SimpleApp commands), REQUEST_COLUMNS. With W = the requester's (worker's) capture and S = the responder's
(server's), all times aligned to the reference clock:

| part | from | to |
|---|---|---|
| request_wire_ns | first request byte at W | last request byte at W (the request on the wire at the sender) |
| request_transit_ns | last request byte at W | last request byte at S |
| server_ns | last request byte at S | first response byte at S (server processing) |
| response_wire_ns | first response byte at S | last response byte at S |
| response_transit_ns | last response byte at S | last response byte at W |
| unsplit_ns | what the captured vantage points cannot split (below) | |

total_ns is first request byte at W → last response byte at W, and the parts that are not null add up to
it exactly (all are non-negative). Which parts are known depends on `view`:
- "both" (W and S captured): the five parts; unsplit_ns is null. The transits cross clocks: should the
  clocks' residual error put S's times outside W's window (a negative transit), S's times are moved by the
  least amount that restores causality; `clock_fix_us` says how far (it stays within the clocks' bound).
- "worker" (only W): request_wire_ns, and unsplit_ns = last request byte → last response byte at W (both
  transits, the server and the response's wire time together).
- "server" (only S): total_ns is S's view, first request byte → last response byte at S: unsplit_ns = first
  → last request byte arriving at S (the request's wire time and transit as the server sees them), then
  server_ns and response_wire_ns.
ts_first_ns is the first request byte, at W when W saw it, else at S.

Also (JobStats): requests in flight per connection over time (in_flight.parquet: the count after each change),
connection set-up costs (connections.parquet: handshake round trip, connect → first message, refused
attempts and reconnects), how unevenly ps keys are updated (key_updates.parquet; top-1 % share and Gini),
and for row-sparse pushes the rows per push and sparse vs dense bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dlcsniff.decoders.clocks import align
from dlcsniff.analysis.job_model import JobModel
from dlcsniff.decoders.timeline import JobView, connection_names
from dlcsniff.decoders.capture_hosts import capture_hosts
from dlcsniff.analysis.describe import describe
from dlcsniff.analysis.stats_schema import CONNECTIONS, IN_FLIGHT, KEY_UPDATES, REQUESTS

PART_COLUMNS = ("request_wire_ns", "request_transit_ns", "server_ns", "response_wire_ns", "response_transit_ns",
                "unsplit_ns")
REQUEST_COLUMNS = REQUESTS.names
IN_FLIGHT_COLUMNS = IN_FLIGHT.names
CONNECTION_COLUMNS = CONNECTIONS.names
KEY_UPDATE_COLUMNS = KEY_UPDATES.names
VIEWS = ("both", "worker", "server")
STREAM_COLUMNS = ("capture", "flow_id", "src_ip", "src_port", "dst_ip", "dst_port", "ts_first_ns", "ts_last_ns",
                  "bytes", "syn_seen", "rst_seen", "reverse_flow_id")
ZMTP_COLUMNS = ("flow_id", "ts_first_ns", "command")
TOP_SHARE = 0.01


@dataclass(frozen=True, slots=True)
class JobStats:
    """The merged view's statistics: four tables and their summary sections."""

    requests: pd.DataFrame
    in_flight: pd.DataFrame
    connections: pd.DataFrame
    key_updates: pd.DataFrame
    summary: dict
    pslite: bool = True         # the job has ps-lite events: requests, in flight and key updates are its

    def tables(self) -> dict[str, pd.DataFrame]:
        if not self.pslite:
            return {"connections": self.connections}
        return {"requests": self.requests, "in_flight": self.in_flight, "connections": self.connections,
                "key_updates": self.key_updates}


def _kind(events: pd.DataFrame) -> np.ndarray:
    push = events["push"].fillna(False).to_numpy(bool)
    # ps-lite without the pull field (and BytePS) marks a pull as "not a push"
    pull = events["pull"].fillna(False).to_numpy(bool) | ~push
    command = events["simple_app"].fillna(False).to_numpy(bool)
    return np.select([command, push & pull, push], ["command", "pushpull", "push"], "pull")


def _requests(events: pd.DataFrame) -> np.ndarray:
    """Which events are requests of KV traffic or SimpleApp commands (not control)."""
    return events["request"].fillna(False).to_numpy(bool) & events["control_cmd"].isna().to_numpy()


def _pairs(events: pd.DataFrame) -> pd.DataFrame:
    """Requests joined with their responses (same two nodes the other way, customer, app and ps-lite
    timestamp; the n-th request with a key meets the n-th response with it)."""
    key = ["worker_id", "server_id", "customer_id", "app_id", "ps_timestamp"]
    asked, exchange = _requests(events), events["control_cmd"].isna().to_numpy()
    sides = []
    for rows, worker, server in ((asked, "sender_id", "recver_id"), (exchange & ~asked, "recver_id", "sender_id")):
        part = events[rows]
        part = part.assign(worker_id=part[worker], server_id=part[server]).sort_values("ts_first_ns", kind="stable")
        part = part.assign(**{name: part[name].fillna(-1) for name in key})
        part["occurrence"] = part.groupby(key).cumcount()
        sides.append(part)
    return sides[0].merge(sides[1], on=[*key, "occurrence"], suffixes=("", "_response"))


def request_latency(events: pd.DataFrame) -> pd.DataFrame:
    """requests.parquet (REQUEST_COLUMNS) from the job's events (see the module doc)."""
    pairs = _pairs(events)

    def times(column: str) -> tuple[np.ndarray, np.ndarray]:
        values = pd.array(pairs[column], dtype="Int64")
        return values.to_numpy(dtype=np.int64, na_value=0), ~values.isna()

    w_first, has_w_first = times("send_ts_first_aligned_ns")
    w_last, has_w_last = times("send_ts_last_aligned_ns")
    s_first, has_s_first = times("recv_ts_first_aligned_ns")
    s_last, has_s_last = times("recv_ts_last_aligned_ns")
    (s_reply, has_s_reply), (s_reply_last, has_s_reply_last) = (times("send_ts_first_aligned_ns_response"),
                                                              times("send_ts_last_aligned_ns_response"))
    w_reply_last, has_w_reply_last = times("recv_ts_last_aligned_ns_response")
    worker = has_w_first & has_w_last & has_w_reply_last & (w_reply_last >= w_last)
    server = (has_s_first & has_s_last & has_s_reply & has_s_reply_last
              & (s_reply >= s_last) & (s_reply_last >= s_reply))
    # least move of the server's times that puts them inside the worker's window
    earliest, latest = w_last - s_last, w_reply_last - s_reply_last
    fix = np.clip(0, earliest, latest)
    both = worker & server & (earliest <= latest)
    server_only = server & ~worker
    worker = worker & ~both

    def part(mask: np.ndarray, values: np.ndarray) -> pd.arrays.IntegerArray:
        return pd.arrays.IntegerArray(np.where(mask, values, 0), ~mask)

    shifted_last, shifted_reply_last = s_last + fix, s_reply_last + fix
    on_worker = both | worker
    table = pd.DataFrame({
        "worker_id": pairs["worker_id"].astype("Int32").to_numpy(),
        "server_id": pairs["server_id"].astype("Int32").to_numpy(),
        "kind": pd.Categorical(_kind(pairs), categories=["push", "pull", "pushpull", "command"]),
        "tensor_key": pairs["tensor_key"].astype("Int64").to_numpy(),
        "customer_id": pairs["customer_id"].astype("Int32").to_numpy(),
        "ps_timestamp": pairs["ps_timestamp"].astype("Int64").to_numpy(),
        "req_type": pairs["req_type"].astype("category").to_numpy(),
        "request_bytes": pairs["size_bytes"].to_numpy(np.int64),
        "response_bytes": pairs["size_bytes_response"].to_numpy(np.int64),
        "connection": pairs["connection"].astype(str).to_numpy(),
        # -1: neither end saw the pair whole (null; dropped below)
        "view": pd.Categorical.from_codes(np.select([both, worker, server_only],
                                                    [VIEWS.index(view) for view in ("both", "worker", "server")], -1),
                                          categories=list(VIEWS)),
        "ts_first_ns": part(on_worker | server_only, np.where(on_worker, w_first, s_first)),
        "total_ns": part(on_worker | server_only, np.where(on_worker, w_reply_last - w_first, s_reply_last - s_first)),
        "request_wire_ns": part(on_worker, w_last - w_first),
        "request_transit_ns": part(both, shifted_last - w_last),
        "server_ns": part(both | server_only, s_reply - s_last),
        "response_wire_ns": part(both | server_only, s_reply_last - s_reply),
        "response_transit_ns": part(both, w_reply_last - shifted_reply_last),
        "unsplit_ns": part(worker | server_only, np.where(worker, w_reply_last - w_last, s_last - s_first)),
        "clock_fix_us": np.where(both, fix / 1e3, np.nan),
    })
    # a pair neither end saw whole (only an observer's capture, say) has no breakdown
    return table[table["view"].notna()].sort_values("ts_first_ns", ignore_index=True)[list(REQUEST_COLUMNS)]


def requests_in_flight(requests: pd.DataFrame) -> pd.DataFrame:
    """Per request connection, the number of requests in flight after each change (IN_FLIGHT_COLUMNS): a
    request is in flight from its first byte to its response's last (ts_first_ns + total_ns). At equal
    times answers count before new requests."""
    timed = requests[requests["ts_first_ns"].notna()]
    start = timed["ts_first_ns"].to_numpy(np.int64)
    end = start + timed["total_ns"].to_numpy(np.int64)
    ids = {name: np.tile(timed[name].to_numpy(), 2) for name in ("connection", "worker_id", "server_id")}
    steps = pd.DataFrame({**ids, "ts_ns": np.concatenate([start, end]),
                          "change": np.concatenate([np.ones(len(timed), np.int64), -np.ones(len(timed), np.int64)])})
    steps = steps.sort_values(["connection", "ts_ns", "change"], kind="stable", ignore_index=True)
    steps["in_flight"] = steps.groupby("connection", sort=False)["change"].cumsum()
    return steps[list(IN_FLIGHT_COLUMNS)]


def in_flight_summary(in_flight: pd.DataFrame) -> pd.DataFrame:
    """Per connection: the most requests in flight, and the time-weighted mean over its busy span."""
    following = in_flight.groupby("connection", sort=False)["ts_ns"].shift(-1)
    held = (following - in_flight["ts_ns"]).fillna(0).to_numpy(np.float64)
    frame = in_flight.assign(weighted=held * in_flight["in_flight"].to_numpy(np.float64))
    per = frame.groupby("connection", sort=False).agg(max_in_flight=("in_flight", "max"), weighted=("weighted", "sum"),
                                                      first=("ts_ns", "min"), last=("ts_ns", "max"))
    per["mean_in_flight"] = per["weighted"] / (per["last"] - per["first"]).where(lambda span: span > 0)
    return per[["max_in_flight", "mean_in_flight"]].reset_index()


def connection_setup(streams: pd.DataFrame, zmtp: pd.DataFrame, clocks: pd.DataFrame) -> pd.DataFrame:
    """One row per TCP connection attempt whose SYN a capture saw (CONNECTION_COLUMNS), measured at the
    connector's capture when there is one (at_connector), else at the acceptor's:
    - handshake_rtt_ns: SYN → the answer, SYN-ACK or, refused, RST (at the acceptor: its turnaround only);
    - setup_ns: SYN → first byte of the first ZMTP message (not command) either way on the connection;
    - attempt: 0, 1, ... per (source address, destination address and port), in SYN order; refused: the
      acceptor answered with a reset and no byte flowed; since_previous_ns: previous attempt's last packet
      → this SYN, on the one timeline (what a reconnect cost; negative: the previous one was still open,
      as ps-lite's first connection to the scheduler is when a node connects again with its id).
    The capture a connector's SYN leaves from is found by address: its host is the one address every
    connection in it involves (`capture_hosts`)."""
    streams = streams.assign(capture=streams["capture"].astype(str))
    forward = streams.merge(streams, left_on=["capture", "reverse_flow_id"], right_on=["capture", "flow_id"],
                            suffixes=("", "_reverse"))
    # the direction whose first packet (the SYN) precedes the other's (the SYN-ACK or RST)
    forward = forward[forward["syn_seen"].fillna(False).to_numpy(bool)
                      & (forward["ts_first_ns"] < forward["ts_first_ns_reverse"])].copy()
    forward["connection"] = connection_names(forward).to_numpy()
    hosts = capture_hosts(streams)
    forward["at_connector"] = forward["capture"].map(hosts).eq(forward["src_ip"]).to_numpy(bool)
    messages = zmtp[zmtp["command"].isna()].groupby("flow_id")["ts_first_ns"].min().astype("Int64")
    first_message = pd.concat([messages.reindex(forward["flow_id"]).reset_index(drop=True),
                               messages.reindex(forward["flow_id_reverse"]).reset_index(drop=True)], axis=1).min(axis=1)
    forward["setup_ns"] = (first_message - forward["ts_first_ns"].to_numpy(np.int64)).to_numpy()
    forward = forward.sort_values(["connection", "at_connector", "ts_first_ns"], ascending=[True, False, True])
    one = forward.drop_duplicates("connection").copy()
    one["syn_ts_ns"] = align(one["ts_first_ns"], one["capture"], clocks)
    one["last_ts_aligned"] = align(np.maximum(one["ts_last_ns"], one["ts_last_ns_reverse"]), one["capture"], clocks)
    one = one.sort_values(["src_ip", "dst_ip", "dst_port", "syn_ts_ns"], ignore_index=True)
    peer = ["src_ip", "dst_ip", "dst_port"]
    one["attempt"] = one.groupby(peer).cumcount()
    previous_end = one.groupby(peer)["last_ts_aligned"].shift(1)
    return pd.DataFrame({
        "connection": one["connection"], "src_ip": one["src_ip"], "src_port": one["src_port"],
        "dst_ip": one["dst_ip"], "dst_port": one["dst_port"], "capture": one["capture"],
        "at_connector": one["at_connector"], "syn_ts_ns": one["syn_ts_ns"],
        "handshake_rtt_ns": (one["ts_first_ns_reverse"] - one["ts_first_ns"]).astype("Int64"),
        "setup_ns": one["setup_ns"].astype("Int64"),
        "attempt": one["attempt"].astype(np.int32),
        "refused": (one["rst_seen_reverse"].fillna(False) & (one["bytes"] + one["bytes_reverse"]).eq(0)).to_numpy(bool),
        "since_previous_ns": (one["syn_ts_ns"] - previous_end).astype("Int64"),
    })[list(CONNECTION_COLUMNS)]


def key_updates(keys: pa.ListArray, lens: pa.ListArray, req_type: np.ndarray, tensor_key: np.ndarray
                ) -> pd.DataFrame:
    """Updates per ps key (KEY_UPDATE_COLUMNS) from push requests' key and lens lists, request types and
    tensors (one entry per push request event). A key whose lens entry is 0 carries no values (a row-sparse
    push's master key, a compressed push's dummy key) and is not an update. A row-sparse tensor's ps keys
    are its rows: one tensor_key, many ps keys."""
    flat_keys = pc.list_flatten(keys).to_numpy(zero_copy_only=False)
    owner = pc.list_parent_indices(keys).to_numpy(zero_copy_only=False)
    lens_per_push = pc.list_value_length(lens).fill_null(0).to_numpy(zero_copy_only=False)
    keys_per_push = pc.list_value_length(keys).fill_null(0).to_numpy(zero_copy_only=False)
    with_lens = lens_per_push == keys_per_push
    carries = np.ones(len(flat_keys), dtype=bool)
    if with_lens.any():
        lens_flat = pc.list_flatten(lens).to_numpy(zero_copy_only=False)
        lens_owner = pc.list_parent_indices(lens).to_numpy(zero_copy_only=False)
        # lens lists that match their keys list entry for entry, in the same flattened order
        matched = with_lens[lens_owner]
        carries[with_lens[owner]] = lens_flat[matched] > 0
    pushes = owner[carries]
    frame = pd.DataFrame({"ps_key": flat_keys[carries], "req_type": np.asarray(req_type, dtype=object)[pushes],
                          "tensor_key": pd.array(tensor_key, dtype="Int64")[pushes]})
    table = frame.groupby(["ps_key", "req_type"], dropna=False).agg(
        tensor_key=("tensor_key", "first"), updates=("tensor_key", "size")).reset_index()
    return table.sort_values("updates", ascending=False, kind="stable", ignore_index=True)[list(KEY_UPDATE_COLUMNS)]


def update_skew(updates: pd.Series | np.ndarray) -> dict | None:
    """keys, updates, the share of updates that go to the top 1 % of keys (at least one key), and the
    Gini coefficient of updates per key (0: all keys equally often; → 1: one key takes them all)."""
    counts = np.sort(np.asarray(updates, dtype=np.float64))
    if len(counts) == 0 or counts.sum() == 0:
        return None
    n, total = len(counts), counts.sum()
    top = max(1, math.ceil(TOP_SHARE * n))
    rank = np.arange(1, n + 1)
    gini = float((2 * (rank * counts).sum()) / (n * total) - (n + 1) / n)
    return {"keys": int(n), "updates": int(total), "top_keys": int(top),
            "top1pct_share": float(counts[-top:].sum() / total), "gini": gini}


def job_summary(view: JobView, requests: pd.DataFrame, in_flight: pd.DataFrame, connections: pd.DataFrame,
                keys: pd.DataFrame) -> dict:
    """The summary.json sections of the merged view."""
    events = view.events
    latency = {}
    for kind, group in requests.groupby("kind", observed=True):
        latency[str(kind)] = {"requests": int(len(group)),
                              "views": {str(v): int(n) for v, n in group["view"].value_counts(sort=False).items() if n},
                              **{name: describe(group[name].astype("Float64").to_numpy(np.float64, na_value=np.nan))
                                 for name in ("total_ns", *PART_COLUMNS)}}
    fixed = requests["clock_fix_us"].fillna(0).to_numpy() != 0
    asked = _requests(events)
    push = events[asked & events["push"].fillna(False).to_numpy(bool)]
    sparse = push["req_type"].eq("row_sparse").to_numpy()
    per_connection = in_flight_summary(in_flight)
    return {
        "merge": dict(view.losses),
        "clocks": view.clocks.astype(object).where(view.clocks.notna(), None).to_dict(orient="records"),
        "latency": {"requests": int(len(requests)), "without_breakdown": int(asked.sum() - len(requests)),
                    "per_kind": latency,
                    "clock_fixed_requests": int(fixed.sum()),
                    "largest_clock_fix_us": float(requests["clock_fix_us"].abs().max()) if fixed.any() else 0.0},
        "in_flight": {"connections": int(len(per_connection)),
                      "max_per_connection": describe(per_connection["max_in_flight"]),
                      "mean_per_connection": describe(per_connection["mean_in_flight"])},
        "connections": {"attempts": int(len(connections)), "refused": int(connections["refused"].sum()),
                        "reconnects": int((connections["attempt"] > 0).sum()),
                        "handshake_rtt_ns": describe(connections.loc[connections["at_connector"]
                                                                     & ~connections["refused"], "handshake_rtt_ns"]
                                                     .astype("Float64").to_numpy(np.float64, na_value=np.nan)),
                        "setup_ns": describe(connections["setup_ns"].astype("Float64")
                                              .to_numpy(np.float64, na_value=np.nan))},
        "key_updates": {"all": update_skew(keys["updates"]),
                        **{str(t): update_skew(g["updates"]) for t, g in keys.groupby("req_type", dropna=True)}},
        "row_sparse": {"pushes": int(sparse.sum()),
                       "rows_per_push": describe(push.loc[sparse, "rows"].to_numpy(np.float64)),
                       "sparse_push_bytes": int(push.loc[sparse, "size_bytes"].sum()),
                       "dense_push_bytes": int(push.loc[~sparse, "size_bytes"].sum())},
    }


def job_statistics(job: JobModel) -> JobStats:
    """The merged view's statistics of a job (events and clocks as its model's view gives them)."""
    view = job.view
    # requests, key updates and sparse pushes are ps-lite's; the other protocols' events take part in the
    # clocks and the losses only
    view = JobView(events=view.events[(view.events["protocol"] == "pslite").to_numpy(bool)], clocks=view.clocks,
                   losses=view.losses)
    requests = request_latency(view.events)
    in_flight = requests_in_flight(requests)
    streams = job.table("streams", STREAM_COLUMNS)
    zmtp = job.table("zmtp", ZMTP_COLUMNS)
    connections = connection_setup(streams, zmtp, view.clocks)
    events = view.events
    push = events[_requests(events) & events["push"].fillna(False).to_numpy(bool)]
    lists = job.arrow("messages", ("keys", "lens")).take(pa.array(push["message_row"].to_numpy(np.int64)))
    keys = key_updates(lists.column("keys").combine_chunks(), lists.column("lens").combine_chunks(),
                       push["req_type"].to_numpy(object), push["tensor_key"].to_numpy())
    summary = job_summary(view, requests, in_flight, connections, keys)
    pslite = len(view.events) > 0
    if not pslite:
        summary = {name: summary[name] for name in ("merge", "clocks", "connections")}
    return JobStats(requests=requests, in_flight=in_flight, connections=connections, key_updates=keys,
                    summary=summary, pslite=pslite)
