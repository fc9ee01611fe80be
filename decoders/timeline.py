"""One timeline for a job: every message once, with what each capture saw of it, on the reference clock.

`dlcsniff decode` of several captures of one job lists a message once per capture that saw it: at its
sender's and at its receiver's. Here the observations of one message become one event:

- Observations are the same message when they travel on the same connection (its address 4-tuple is the
  same at both ends; a RoCE queue pair's addresses and destination QP) with the same identity, none of it
  read from a clock: its protocol; where it starts on the connection as the wire numbers it, the same at
  both ends whatever either capture missed or however late it started (TCP: the sequence number, a Gloo or
  TCPStore message's stream offset from its direction's seq_base; RoCE: the PSN); for ps-lite the
  request/push/pull/simple_app flags, timestamp, app, customer, control command and head; for Gloo the
  opcode; for TCPStore the query. Of the messages of one identity on a connection, the n-th in each capture
  are the same (the tie-break where nothing gives a position: ps-lite's, NCCL's). Every protocol's messages
  take part: ps-lite's, the collective libraries' (Gloo, TCPStore, NCCL) and RoCE's.
- An observation is the send side when its capture is the sender's own capture, the receive side when it is
  the receiver's (a message within one host, such as a node's to itself: both), and an observer's otherwise.
  A ps-lite node's own capture is the capture of the host it runs on (`protocols.pslite.vantage.vantage_points`);
  for other protocols the decoder's `outgoing` says, where it knows, and otherwise the capture's host
  address (`decoders.capture_hosts`) against the connection's ends. Should a side be seen twice, its
  first sighting counts.
- Clocks (decoders.clocks) are estimated from the events seen at both ends: the first byte of every such
  message, and its last byte when both ends saw it whole. The reference is the ps-lite scheduler's own
  capture, else the capture rank 0 sends from, else the first capture by name.

events.parquet (EVENT_COLUMNS), one row per message of the job:
- its protocol and fields, from an observation that saw it whole if there is one (a capture hole may have
  cut it short in one capture and not in its peer's), and of those from the send side's, else the receive
  side's, else an observer's (message_row: that observation's row in messages.parquet); `complete`: every
  capture that saw it saw it whole;
- send_capture, send_ts_first_ns, send_ts_last_ns and recv_capture, recv_ts_first_ns, recv_ts_last_ns: where
  and when each end saw it, in that capture's own clock; observer_capture; observations (how many captures
  saw it);
- the same four times on the reference clock (`*_aligned_ns`); ts_first_ns (first byte sent, else first
  byte seen) and ts_last_ns (last byte received, else last byte seen), aligned; transit_ns = last byte
  received - last byte sent, aligned, when both ends saw it whole and both their clocks are aligned. A
  capture that could not be aligned (clocks.parquet: `reason`) keeps its own clock in the aligned times.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from dlcsniff.decoders.arrow_without_pandas import pandas
from dlcsniff.decoders.clocks import (CLOCK_COLUMNS, SAMPLE_COLUMNS, align, clock_table, estimate_clocks,
                                      linked_groups, unaligned_row)
from dlcsniff.decoders import connections
from dlcsniff.decoders.capture_hosts import capture_hosts
from dlcsniff.decoders.schema import EVENT_ATTRIBUTES as ATTRIBUTES, EVENTS
from dlcsniff.decoders.protocols import job_hooks

pd = pandas()

IDENTITY = ("protocol", "request", "push", "pull", "simple_app", "ps_timestamp", "app_id", "customer_id",
            "control_cmd", "head", "opcode", "store_query", "psn", "tcp_seq")
MESSAGE_READ_COLUMNS = ("capture", "flow_id", "ts_first_ns", "ts_last_ns", "outgoing", "stream_offset_bytes",
                        "psn") + ATTRIBUTES
STREAM_READ_COLUMNS = ("capture", "flow_id", "src_ip", "src_port", "dst_ip", "dst_port", "dest_qp", "seq_base")
TCP_SEQ_SPACE = 1 << 32
NODE_READ_COLUMNS = ("node_id", "hostname")
SIDES = ("send", "recv")
EVENT_COLUMNS = EVENTS.names


@dataclass(frozen=True, slots=True)
class JobView:
    """The job's messages, each once (EVENT_COLUMNS), and the clocks that put them on one timeline."""

    events: pd.DataFrame
    clocks: pd.DataFrame
    losses: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)   # what the decode summary says of the clocks
    # the event_id of each row of the messages given to job_view (None: read from a decode output)
    message_events: np.ndarray | None = None


def connection_names(streams: pd.DataFrame) -> pd.Series:
    """decoders.connections.connection_names of every stream, as text on the frame's index (NaN: no name)."""
    return pd.Series(connections.connection_names(streams).to_pylist(), index=streams.index, dtype="str")


def observations(messages: pd.DataFrame, streams: pd.DataFrame, nodes: pd.DataFrame) -> pd.DataFrame:
    """The messages (one row per capture that saw each), sorted by time, with `connection`, the `event_id`
    shared by the observations of one message, and whether each is the send / receive side's (`nodes`: which
    nodes share a host, see decoders.protocols.pslite.vantage)."""
    names = pd.DataFrame({"capture": streams["capture"].astype(str).to_numpy(),
                          "flow_id": streams["flow_id"].to_numpy(np.int64),
                          "connection": connection_names(streams).to_numpy(),
                          "src_ip": streams["src_ip"].astype(object).to_numpy(),
                          "dst_ip": streams["dst_ip"].astype(object).to_numpy(),
                          "seq_base": streams["seq_base"].astype("Int64").array})
    obs = messages.assign(capture=messages["capture"].astype(str), message_row=np.arange(len(messages))).merge(
        names, on=["capture", "flow_id"], how="left")
    # where the message starts in its TCP direction, numbered as the wire numbers it: the same at both ends,
    # however late either capture started and whatever it lost
    obs["tcp_seq"] = (obs["seq_base"] + obs["stream_offset_bytes"].astype("Int64")) % TCP_SEQ_SPACE
    # a stream the streams table does not list is its own connection (never merged with another capture's)
    obs["connection"] = obs["connection"].fillna(obs["capture"] + "#" + obs["flow_id"].astype(str))
    obs = obs.sort_values(["ts_first_ns", "ts_last_ns"], kind="stable", ignore_index=True)
    # nullable from here on: reindexing a plain int64 column would go through float64 and lose nanoseconds
    obs[["ts_first_ns", "ts_last_ns"]] = obs[["ts_first_ns", "ts_last_ns"]].astype("Int64")
    identity = ["connection", *IDENTITY]
    obs["occurrence"] = obs.groupby(["capture", *identity], dropna=False, sort=False).cumcount()
    # numbered in key order, not time order: the same message gets the same id whatever the clocks say
    obs["event_id"] = obs.groupby([*identity, "occurrence"], dropna=False, sort=True).ngroup().astype(np.int64)
    # the decoder's word where it has one, else the capture's host address; a protocol that knows its messages'
    # sides better says so (its `message_sides` hook: ps-lite's nodes' own captures)
    host = obs["capture"].map(capture_hosts(streams)).to_numpy(object)
    outgoing = obs["outgoing"].astype("boolean")
    known = outgoing.notna().to_numpy(bool)
    outgoing = outgoing.fillna(False).to_numpy(bool)
    for side, address in (("send", "src_ip"), ("recv", "dst_ip")):
        by_address = obs[address].to_numpy(object) == host
        by_decoder = outgoing if side == "send" else ~outgoing
        obs[f"{side}_side"] = np.where(known, by_decoder, by_address)
    for message_sides in job_hooks("message_sides"):
        mine, send_side, recv_side = message_sides(obs, messages, nodes)
        obs["send_side"] = np.where(mine, send_side, obs["send_side"].to_numpy(bool))
        obs["recv_side"] = np.where(mine, recv_side, obs["recv_side"].to_numpy(bool))
    return obs


def delay_samples(events: pd.DataFrame) -> pd.DataFrame:
    """One-way delay samples (clocks.SAMPLE_COLUMNS) of the events seen at both ends in two captures: the
    first byte always, the last byte when both ends saw the whole message."""
    both = events[events["send_capture"].notna() & events["recv_capture"].notna()
                  & (events["send_capture"].astype(str) != events["recv_capture"].astype(str))]
    whole = both[both["complete"].to_numpy(bool)]
    frames = [pd.DataFrame({"send_capture": part["send_capture"].astype(str).to_numpy(),
                            "send_ts_ns": part[f"send_ts_{edge}_ns"].to_numpy(np.int64),
                            "recv_capture": part["recv_capture"].astype(str).to_numpy(),
                            "recv_ts_ns": part[f"recv_ts_{edge}_ns"].to_numpy(np.int64)})
              for part, edge in ((both, "first"), (whole, "last"))]
    return pd.concat(frames, ignore_index=True)[list(SAMPLE_COLUMNS)]


def _reference_capture(obs: pd.DataFrame, captures: list[str]) -> str:
    """The capture a protocol prefers (its `reference_captures` hook: ps-lite's scheduler's own), else the one rank
    0 sends from, else the first by name."""
    sent = obs[obs["send_side"].to_numpy(bool)]
    for chosen in [hook(sent) for hook in job_hooks("reference_captures")] + [
            sent.loc[sent["src_rank"] == 0, "capture"].sort_values()]:
        if len(chosen):
            return str(chosen.iloc[0])
    return captures[0]


def _job_clocks(obs: pd.DataFrame, events: pd.DataFrame, streams: pd.DataFrame) -> pd.DataFrame:
    """clocks.parquet: every capture's clock (decoders.clocks), job by job. A job is the captures linked by
    messages two of them saw, each with its own reference and epoch, so that captures of another job decoded
    beside it change none of its clocks. A capture that shares no message with another (of a job of its own,
    or whose peers' captures are missing) or has no message at all is listed, not aligned, when there are
    others; alone, it is its own reference."""
    seen = obs[["event_id", "capture"]].drop_duplicates()
    first = seen.drop_duplicates("event_id").rename(columns={"capture": "a"})
    links = seen.merge(first, on="event_id").rename(columns={"capture": "b"})
    captures = sorted({*obs["capture"].unique(), *streams["capture"].astype(str).unique()})
    samples = delay_samples(events)
    spans = obs.groupby("capture").agg(first_ns=("ts_first_ns", "min"), last_ns=("ts_last_ns", "max")).reset_index()
    tables = []
    for job in linked_groups(captures, links[links["a"] != links["b"]]):
        if len(job) == 1 and len(captures) > 1:
            reason = ("it shares no message with another capture (a job of its own, or its peers' captures are "
                      "missing)" if job[0] in spans["capture"].values else
                      "it holds no message the job view merges: ps-lite, Gloo, TCPStore, NCCL or RoCE")
            tables.append(clock_table([unaligned_row(job[0], job[0], 0, reason)]))
            continue
        mine = samples[samples["send_capture"].isin(job).to_numpy(bool)]
        tables.append(estimate_clocks(mine, job, _reference_capture(obs[obs["capture"].isin(job)], job),
                                      spans[spans["capture"].isin(job)]))
    return pd.concat(tables, ignore_index=True).sort_values("capture", ignore_index=True)


def job_view(messages: pd.DataFrame, streams: pd.DataFrame, nodes: pd.DataFrame) -> JobView:
    """Merge the captures' observations into events, estimate the clocks, align (see the module doc): the
    messages (MESSAGE_READ_COLUMNS), streams (STREAM_READ_COLUMNS) and nodes (NODE_READ_COLUMNS) of
    the decode tables. Events come in time order (aligned ts_first_ns); event_id depends only on what the
    messages are."""
    # a column the caller does not have (a protocol's, in an older output) is missing everywhere
    messages = messages.assign(**{name: pd.NA for name in MESSAGE_READ_COLUMNS if name not in messages})
    streams = streams.assign(**{name: pd.NA for name in STREAM_READ_COLUMNS if name not in streams})
    if len(messages) == 0:     # e.g. captures of no protocol dlcsniff decodes: nothing to merge, nothing to align
        return JobView(events=pd.DataFrame(columns=list(EVENT_COLUMNS)),
                       clocks=pd.DataFrame(columns=list(CLOCK_COLUMNS)), losses={"observations": 0, "events": 0})
    obs = observations(messages, streams, nodes)
    n_events = int(obs["event_id"].max()) + 1
    sides = {side: obs[obs[f"{side}_side"]].drop_duplicates("event_id").set_index("event_id")   # time order
             for side in SIDES}
    observer = obs[~obs["send_side"] & ~obs["recv_side"]].drop_duplicates("event_id").set_index("event_id")
    # the fields from an observation that saw the whole message, and among those from the send side, else the
    # receive side, else an observer
    preference = np.select([obs["send_side"].to_numpy(), obs["recv_side"].to_numpy()], [0, 1], 2)
    partial = ~obs["complete"].fillna(False).to_numpy(bool)
    order = np.lexsort([preference, partial, obs["event_id"].to_numpy()])
    source = obs.iloc[order].drop_duplicates("event_id").set_index("event_id")
    ids = np.arange(n_events)
    events = source.reindex(ids)[["connection", "message_row", *ATTRIBUTES]].reset_index(names="event_id")
    for side in SIDES:
        seen = sides[side].reindex(ids)
        events[f"{side}_capture"] = seen["capture"].to_numpy(object)
        events[f"{side}_ts_first_ns"] = seen["ts_first_ns"].array
        events[f"{side}_ts_last_ns"] = seen["ts_last_ns"].array
    events["observer_capture"] = observer["capture"].reindex(ids).to_numpy(object)
    events["observations"] = np.bincount(obs["event_id"].to_numpy(), minlength=n_events)
    # whole only if every capture that saw it saw it whole (the last byte is then the same at each)
    events["complete"] = obs.groupby("event_id")["complete"].all().reindex(ids).to_numpy(bool)

    clocks = _job_clocks(obs, events, streams)
    for side in SIDES:
        for edge in ("first", "last"):
            events[f"{side}_ts_{edge}_aligned_ns"] = align(events[f"{side}_ts_{edge}_ns"], events[f"{side}_capture"],
                                                           clocks)
    seen_first = align(observer["ts_first_ns"].reindex(ids), events["observer_capture"], clocks)
    seen_last = align(observer["ts_last_ns"].reindex(ids), events["observer_capture"], clocks)
    events["ts_first_ns"] = events["send_ts_first_aligned_ns"].fillna(events["recv_ts_first_aligned_ns"]).fillna(
        pd.Series(seen_first))
    events["ts_last_ns"] = events["recv_ts_last_aligned_ns"].fillna(events["send_ts_last_aligned_ns"]).fillna(
        pd.Series(seen_last))
    # a transit across a clock that could not be aligned would be the clocks' difference, not the network's; one
    # of a message a capture saw cut short ends at the edge of its hole, not at its last byte
    apart = clocks.loc[~clocks["aligned"], "capture"].to_numpy(object)
    across = events["send_capture"].isin(apart).to_numpy(bool) | events["recv_capture"].isin(apart).to_numpy(bool)
    events["transit_ns"] = (events["recv_ts_last_aligned_ns"] - events["send_ts_last_aligned_ns"]).mask(
        across | ~events["complete"].to_numpy(bool))
    for column in ("send_capture", "recv_capture", "observer_capture", "connection", "protocol"):
        events[column] = events[column].astype("category")
    losses = {
        "observations": int(len(obs)),
        "events": n_events,
        "events_seen_at_both_ends": int((events["send_capture"].notna() & events["recv_capture"].notna()).sum()),
        "events_seen_by_observers_only": int((events["send_capture"].isna() & events["recv_capture"].isna()).sum()),
        "side_seen_twice": int(sum(obs.loc[obs[f"{side}_side"], "event_id"].duplicated().sum() for side in SIDES)),
        "captures_not_aligned": int((~clocks["aligned"]).sum()),
    }
    events = events.sort_values(["ts_first_ns", "event_id"], kind="stable", ignore_index=True)
    message_events = np.empty(len(messages), dtype=np.int64)
    message_events[obs["message_row"].to_numpy(np.int64)] = obs["event_id"].to_numpy(np.int64)
    return JobView(events=events[list(EVENT_COLUMNS)], clocks=clocks, losses=losses,
                   warnings=clock_warnings(clocks, events), message_events=message_events)


def clock_warnings(clocks: pd.DataFrame, events: pd.DataFrame) -> list[str]:
    """What the decode summary says of the clocks: every capture that could not be aligned and why, and the
    captures whose messages fit no linear clock (aligned transits that are negative)."""
    apart = clocks[~clocks["aligned"]].groupby("reason", sort=False)["capture"].agg(list)
    warnings = [f"clocks: capture {names[0]} could not be aligned ({reason}); its times stay on its own clock"
                if len(names) == 1 else f"clocks: captures {', '.join(names)} could not be aligned ({reason}); "
                f"their times stay on their own clocks" for reason, names in apart.items()]
    inconsistent = clocks.loc[clocks["consistent"].eq(False).fillna(False).to_numpy(bool), "capture"].tolist()
    if inconsistent:
        transit = events["transit_ns"].dropna()
        negative = transit[transit < 0]
        least = f", the least {negative.min() / 1000:.1f} µs" if len(negative) else ""
        warnings.append(f"clocks of {', '.join(inconsistent)} are not consistent: the messages seen at both ends "
                        f"fit no offset and drift (a clock that stepped, or busy hosts' late timestamps); "
                        f"{len(negative)} of {len(transit)} aligned transits are negative{least}")
    return warnings
