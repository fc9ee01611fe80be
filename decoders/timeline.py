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

import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pyarrow as pa

from dlcsniff.decoders import connections
from dlcsniff.decoders.arrow_numpy import take, take_rows
from dlcsniff.decoders.capture_hosts import capture_hosts
from dlcsniff.decoders.clocks import aligned_ns, clock_table, estimate_clocks, linked_groups, unaligned_row
from dlcsniff.decoders.protocols import job_hooks
from dlcsniff.decoders.schema import CLOCKS, EVENT_ATTRIBUTES as ATTRIBUTES, EVENTS, MESSAGES, STREAMS, TABLES

if TYPE_CHECKING:
    import pandas as pd

IDENTITY = ("protocol", "request", "push", "pull", "simple_app", "ps_timestamp", "app_id", "customer_id",
            "control_cmd", "head", "opcode", "store_query", "psn", "tcp_seq")
MESSAGE_READ_COLUMNS = ("capture", "flow_id", "ts_first_ns", "ts_last_ns", "outgoing", "stream_offset_bytes",
                        "psn") + ATTRIBUTES
STREAM_READ_COLUMNS = ("capture", "flow_id", "src_ip", "src_port", "dst_ip", "dst_port", "dest_qp", "seq_base")
TCP_SEQ_SPACE = 1 << 32
NODE_READ_COLUMNS = ("node_id", "hostname")
SIDES = ("send", "recv")
EVENT_COLUMNS = EVENTS.names
# what the timeline and the protocols' hooks read of each observation (the events' fields come from the messages)
OBSERVED = ("capture", "flow_id", "ts_first_ns", "ts_last_ns", "outgoing", "stream_offset_bytes", "complete",
            "sender_id", "recver_id", "src_rank", *(name for name in IDENTITY if name != "tcp_seq"))


@dataclass(frozen=True, slots=True)
class JobTimeline:
    """The job's messages, each once (events.parquet), and the clocks that put them on one timeline
    (clocks.parquet), as pyarrow tables; what merging the observations lost, what the decode summary says of the
    clocks, and the event_id of each row of the messages given (`job_timeline`; None: none given)."""

    events: pa.Table
    clocks: pa.Table
    losses: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    message_events: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class JobView:
    """The job's timeline as analysis/ reads it: events (EVENT_COLUMNS) and clocks as DataFrames."""

    events: pd.DataFrame
    clocks: pd.DataFrame
    losses: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)   # what the decode summary says of the clocks
    # the event_id of each row of the messages given to job_view (None: read from a decode output)
    message_events: np.ndarray | None = None


def connection_names(streams: pd.DataFrame) -> pd.Series:
    """decoders.connections.connection_names of every stream, as text on the frame's index (NaN: no name)."""
    from dlcsniff.decoders.arrow_without_pandas import pandas
    pd = pandas()

    return pd.Series(connections.connection_names(streams).to_pylist(), index=streams.index, dtype="str")


def _typed(column: pa.ChunkedArray, data_type: pa.DataType) -> pa.ChunkedArray:
    """The column as data_type; cast (pyarrow.compute, costly to import) only when it is of another."""
    return column if column.type == data_type else column.cast(data_type)


def _in_schema(table: pa.Table, names: Sequence[str], schema: pa.Schema) -> pa.Table:
    """The named columns, each of its decode table's type (null where the table lacks one: an older output's).
    A decode's own tables have their types already."""
    arrays = [_typed(table[name], schema.field(name).type) if name in table.column_names
              else pa.nulls(table.num_rows, schema.field(name).type) for name in names]
    return pa.Table.from_arrays(arrays, names=list(names))


def _order_key(values: tuple) -> tuple:
    """Sorts rows by each value in turn, a missing one after all others (pandas' order of groups)."""
    return tuple((value is None, value) if value is not None else (True, 0) for value in values)


def _time_order(first: list, last: list) -> np.ndarray:
    """The rows by (first, last), stably, a missing time after every other."""
    def key(values: list) -> tuple[np.ndarray, np.ndarray]:
        missing = np.array([value is None for value in values], dtype=bool)
        return missing, np.array([0 if value is None else value for value in values], dtype=np.int64)
    (first_missing, first_ns), (last_missing, last_ns) = key(first), key(last)
    return np.lexsort([last_ns, last_missing, first_ns, first_missing])


def observations(messages: pa.Table, streams: pa.Table, nodes: pa.Table) -> dict[str, np.ndarray]:
    """The messages (one row per capture that saw each), sorted by time, with `connection`, the `event_id`
    shared by the observations of one message, and whether each is the send / receive side's (`nodes`: which
    nodes share a host, see decoders.protocols.pslite.vantage): columns by name, as numpy arrays."""
    messages = _in_schema(messages, MESSAGE_READ_COLUMNS, MESSAGES.schema)
    streams = _in_schema(streams, STREAM_READ_COLUMNS, STREAMS.schema)
    stream_row: dict[tuple, int] = {}
    for row, key in enumerate(zip(streams["capture"].to_pylist(), streams["flow_id"].to_pylist())):
        stream_row.setdefault(key, row)
    names = connections.connection_names(streams).to_pylist()
    src_ip, dst_ip, seq_base = (streams[name].to_pylist() for name in ("src_ip", "dst_ip", "seq_base"))
    columns = {name: messages[name].to_pylist() for name in dict.fromkeys(OBSERVED)}
    order = _time_order(columns["ts_first_ns"], columns["ts_last_ns"])
    obs: dict[str, list] = {name: [values[row] for row in order.tolist()] for name, values in columns.items()}
    obs["message_row"] = order.tolist()
    rows = [stream_row.get(key) for key in zip(obs["capture"], obs["flow_id"])]
    # where the message starts in its TCP direction, numbered as the wire numbers it: the same at both ends,
    # however late either capture started and whatever it lost
    obs["tcp_seq"] = [None if row is None or seq_base[row] is None or offset is None
                      else (seq_base[row] + offset) % TCP_SEQ_SPACE
                      for row, offset in zip(rows, obs["stream_offset_bytes"])]
    # a stream the streams table does not list is its own connection (never merged with another capture's)
    obs["connection"] = [names[row] if row is not None and names[row] is not None else f"{capture}#{flow}"
                         for row, capture, flow in zip(rows, obs["capture"], obs["flow_id"])]
    obs["src_ip"] = [None if row is None else src_ip[row] for row in rows]
    obs["dst_ip"] = [None if row is None else dst_ip[row] for row in rows]
    identity = list(zip(obs["connection"], *(obs[name] for name in IDENTITY)))
    seen: collections.Counter = collections.Counter()
    occurrence = []
    for capture, key in zip(obs["capture"], identity):
        occurrence.append(seen[capture, key])
        seen[capture, key] += 1
    # numbered in key order, not time order: the same message gets the same id whatever the clocks say
    keys = [(*key, n) for key, n in zip(identity, occurrence)]
    number = {key: i for i, key in enumerate(sorted(set(keys), key=_order_key))}
    out = {name: np.array(values, dtype=object) for name, values in obs.items()}
    out["message_row"] = order.astype(np.int64)
    out["occurrence"] = np.array(occurrence, dtype=np.int64)
    out["event_id"] = np.array([number[key] for key in keys], dtype=np.int64)
    # the decoder's word where it has one, else the capture's host address; a protocol that knows its messages'
    # sides better says so (its `message_sides` hook: ps-lite's nodes' own captures)
    hosts = capture_hosts(streams)
    host = [hosts.get(capture) for capture in obs["capture"]]
    known = np.array([value is not None for value in obs["outgoing"]], dtype=bool)
    outgoing = np.array([bool(value) for value in obs["outgoing"]], dtype=bool)
    for side, address in (("send", "src_ip"), ("recv", "dst_ip")):
        by_address = np.array([ip is not None and ip == at for ip, at in zip(obs[address], host)], dtype=bool)
        by_decoder = outgoing if side == "send" else ~outgoing
        out[f"{side}_side"] = np.where(known, by_decoder, by_address)
    for message_sides in job_hooks("message_sides"):
        mine, send_side, recv_side = message_sides(out, messages, nodes)
        out["send_side"] = np.where(mine, send_side, out["send_side"])
        out["recv_side"] = np.where(mine, recv_side, out["recv_side"])
    return out


def _first_rows(event_id: np.ndarray, rows: np.ndarray, n_events: int) -> np.ndarray:
    """Per event, the first of `rows` (indices into the observations, in their order) with that event_id; -1
    where none."""
    first = np.full(n_events, -1, dtype=np.int64)
    events, at = np.unique(event_id[rows], return_index=True)
    first[events] = rows[at]
    return first


def _taken(values: np.ndarray, rows: np.ndarray) -> list:
    """values[row] of each row, None where the row is -1."""
    return [None if row < 0 else values[row] for row in rows.tolist()]


def delay_samples(events: dict[str, list]) -> dict[str, list]:
    """One-way delay samples (clocks.SAMPLE_COLUMNS) of the events seen at both ends in two captures: the
    first byte always, the last byte when both ends saw the whole message."""
    both = [i for i, (sent, received) in enumerate(zip(events["send_capture"], events["recv_capture"]))
            if sent is not None and received is not None and str(sent) != str(received)]
    whole = [i for i in both if events["complete"][i]]
    samples: dict[str, list] = {"send_capture": [], "send_ts_ns": [], "recv_capture": [], "recv_ts_ns": []}
    for part, edge in ((both, "first"), (whole, "last")):
        samples["send_capture"] += [str(events["send_capture"][i]) for i in part]
        samples["send_ts_ns"] += [events[f"send_ts_{edge}_ns"][i] for i in part]
        samples["recv_capture"] += [str(events["recv_capture"][i]) for i in part]
        samples["recv_ts_ns"] += [events[f"recv_ts_{edge}_ns"][i] for i in part]
    return samples


def _reference_capture(sent: dict[str, np.ndarray], captures: list[str]) -> str:
    """The capture a protocol prefers (its `reference_captures` hook: ps-lite's scheduler's own), else the one rank
    0 sends from, else the first by name."""
    for chosen in [list(hook(sent)) for hook in job_hooks("reference_captures")] + [
            sorted(capture for capture, rank in zip(sent["capture"], sent["src_rank"]) if rank == 0)]:
        if len(chosen):
            return str(chosen[0])
    return captures[0]


def _job_clocks(obs: dict[str, np.ndarray], events: dict[str, list], streams: pa.Table) -> pa.Table:
    """clocks.parquet: every capture's clock (decoders.clocks), job by job. A job is the captures linked by
    messages two of them saw, each with its own reference and epoch, so that captures of another job decoded
    beside it change none of its clocks. A capture that shares no message with another (of a job of its own,
    or whose peers' captures are missing) or has no message at all is listed, not aligned, when there are
    others; alone, it is its own reference."""
    first_capture: dict[int, str] = {}
    links = set()
    for event, capture in zip(obs["event_id"].tolist(), obs["capture"].tolist()):
        first = first_capture.setdefault(event, capture)
        if first != capture:
            links.add((first, capture))
    captures = sorted({*obs["capture"].tolist(), *(str(c) for c in streams["capture"].to_pylist())})
    samples = delay_samples(events)
    spans: dict[str, tuple] = {}
    for capture, first, last in zip(obs["capture"].tolist(), obs["ts_first_ns"].tolist(), obs["ts_last_ns"].tolist()):
        low, high = spans.get(capture, (None, None))
        spans[capture] = (first if low is None or (first is not None and first < low) else low,
                          last if high is None or (last is not None and last > high) else high)
    tables = []
    for job in linked_groups(captures, sorted(links)):
        if len(job) == 1 and len(captures) > 1:
            reason = ("it shares no message with another capture (a job of its own, or its peers' captures are "
                      "missing)" if job[0] in spans else
                      "it holds no message the job view merges: ps-lite, Gloo, TCPStore, NCCL or RoCE")
            tables.append(clock_table([unaligned_row(job[0], job[0], 0, reason)]))
            continue
        members = set(job)
        mine = [i for i, capture in enumerate(samples["send_capture"]) if capture in members]
        in_job = np.isin(obs["capture"], job)
        sent = {name: values[in_job & obs["send_side"]] for name, values in obs.items()}
        tables.append(estimate_clocks({name: [values[i] for i in mine] for name, values in samples.items()}, job,
                                      _reference_capture(sent, job),
                                      {capture: span for capture, span in spans.items() if capture in members}))
    clocks = pa.concat_tables(tables)
    captures = clocks["capture"].to_pylist()
    return take_rows(clocks, sorted(range(len(captures)), key=lambda row: (captures[row] is None, captures[row] or "")))


def job_timeline(messages: pa.Table, streams: pa.Table, nodes: pa.Table) -> JobTimeline:
    """Merge the captures' observations into events, estimate the clocks, align (see the module doc): the
    messages (MESSAGE_READ_COLUMNS), streams (STREAM_READ_COLUMNS) and nodes (NODE_READ_COLUMNS) of
    the decode tables. Events come in time order (aligned ts_first_ns); event_id depends only on what the
    messages are."""
    # a column the caller does not have (a protocol's, in an older output) is missing everywhere
    messages = _in_schema(messages, MESSAGE_READ_COLUMNS, MESSAGES.schema)
    streams = _in_schema(streams, STREAM_READ_COLUMNS, STREAMS.schema)
    nodes = _in_schema(nodes, NODE_READ_COLUMNS, TABLES["nodes"].schema)
    if messages.num_rows == 0:     # e.g. captures of no protocol dlcsniff decodes: nothing to merge, nothing to align
        return JobTimeline(events=EVENTS.schema.empty_table(), clocks=CLOCKS.schema.empty_table(),
                           losses={"observations": 0, "events": 0})
    obs = observations(messages, streams, nodes)
    event_id = obs["event_id"]
    n_events = int(event_id.max()) + 1
    every = np.arange(len(event_id))
    sides = {side: _first_rows(event_id, every[obs[f"{side}_side"]], n_events) for side in SIDES}   # time order
    observer = _first_rows(event_id, every[~obs["send_side"] & ~obs["recv_side"]], n_events)
    # the fields from an observation that saw the whole message, and among those from the send side, else the
    # receive side, else an observer
    preference = np.select([obs["send_side"], obs["recv_side"]], [0, 1], 2)
    partial = np.array([value is not True for value in obs["complete"]], dtype=bool)
    order = np.lexsort([preference, partial, event_id])
    source = _first_rows(event_id, order, n_events)
    events: dict[str, list] = {"event_id": list(range(n_events)),
                               "connection": _taken(obs["connection"], source),
                               "message_row": obs["message_row"][source].tolist()}
    for side in SIDES:
        events[f"{side}_capture"] = _taken(obs["capture"], sides[side])
        events[f"{side}_ts_first_ns"] = _taken(obs["ts_first_ns"], sides[side])
        events[f"{side}_ts_last_ns"] = _taken(obs["ts_last_ns"], sides[side])
    events["observer_capture"] = _taken(obs["capture"], observer)
    events["observations"] = np.bincount(event_id, minlength=n_events).tolist()
    # whole only if every capture that saw it saw it whole (the last byte is then the same at each)
    broken = np.zeros(n_events, dtype=bool)
    broken[event_id[np.array([value is False for value in obs["complete"]], dtype=bool)]] = True
    events["complete"] = (~broken).tolist()

    clocks = _job_clocks(obs, events, streams)

    def aligned(times: list, captures: list) -> list:
        seen = np.array([time is not None for time in times], dtype=bool)
        values = aligned_ns(np.array([0 if time is None else time for time in times], dtype=np.int64), seen,
                            captures, clocks).tolist()
        return [value if ok else None for value, ok in zip(values, seen.tolist())]
    for side in SIDES:
        for edge in ("first", "last"):
            events[f"{side}_ts_{edge}_aligned_ns"] = aligned(events[f"{side}_ts_{edge}_ns"], events[f"{side}_capture"])
    seen_first = aligned(_taken(obs["ts_first_ns"], observer), events["observer_capture"])
    seen_last = aligned(_taken(obs["ts_last_ns"], observer), events["observer_capture"])

    def first_of(*columns: list) -> list:
        return [next((value for value in values if value is not None), None) for values in zip(*columns)]
    events["ts_first_ns"] = first_of(events["send_ts_first_aligned_ns"], events["recv_ts_first_aligned_ns"], seen_first)
    events["ts_last_ns"] = first_of(events["recv_ts_last_aligned_ns"], events["send_ts_last_aligned_ns"], seen_last)
    # a transit across a clock that could not be aligned would be the clocks' difference, not the network's; one
    # of a message a capture saw cut short ends at the edge of its hole, not at its last byte
    aligned_of = dict(zip(clocks["capture"].to_pylist(), clocks["aligned"].to_pylist()))
    apart = {capture for capture, ok in aligned_of.items() if not ok}
    events["transit_ns"] = [None if sent is None or received is None or whole is False
                            or sender in apart or receiver in apart else received - sent
                            for sent, received, whole, sender, receiver in zip(
                                events["send_ts_last_aligned_ns"], events["recv_ts_last_aligned_ns"],
                                events["complete"], events["send_capture"], events["recv_capture"])]
    both_seen = [sent is not None and received is not None
                 for sent, received in zip(events["send_capture"], events["recv_capture"])]
    neither_seen = [sent is None and received is None
                    for sent, received in zip(events["send_capture"], events["recv_capture"])]
    losses = {
        "observations": len(event_id),
        "events": n_events,
        "events_seen_at_both_ends": sum(both_seen),
        "events_seen_by_observers_only": sum(neither_seen),
        "side_seen_twice": sum(int(obs[f"{side}_side"].sum()) - len(set(event_id[obs[f"{side}_side"]].tolist()))
                               for side in SIDES),
        "captures_not_aligned": len(apart),
    }
    first_missing = np.array([value is None for value in events["ts_first_ns"]], dtype=bool)
    first_ns = np.array([0 if value is None else value for value in events["ts_first_ns"]], dtype=np.int64)
    in_time = np.lexsort([np.arange(n_events), first_ns, first_missing])
    in_time_rows = in_time.tolist()
    taken_from = obs["message_row"][source][in_time]        # each event's fields come from this row of messages
    columns = {}
    for name, data_type in zip(EVENTS.schema.names, EVENTS.schema.types):
        if name in events:
            columns[name] = pa.array([events[name][row] for row in in_time_rows], type=data_type)
        else:
            columns[name] = take(_typed(messages[name], data_type), taken_from)
    table = pa.Table.from_arrays(list(columns.values()), schema=EVENTS.schema)
    message_events = np.empty(messages.num_rows, dtype=np.int64)
    message_events[obs["message_row"]] = event_id
    return JobTimeline(events=table, clocks=clocks, losses=losses, warnings=clock_warnings(clocks, table),
                       message_events=message_events)


def job_view(messages: pd.DataFrame, streams: pd.DataFrame, nodes: pd.DataFrame) -> JobView:
    """job_timeline of DataFrames, as DataFrames (analysis/: the timeline of a decode output older than it)."""
    from dlcsniff.decoders.arrow_without_pandas import pandas
    pd = pandas()

    timeline = job_timeline(*(pa.Table.from_pandas(frame, preserve_index=False) for frame in (messages, streams, nodes)))
    integers = {pa.int64(): pd.Int64Dtype()}.get
    return JobView(events=timeline.events.to_pandas(types_mapper=integers),
                   clocks=timeline.clocks.to_pandas(types_mapper=integers), losses=timeline.losses,
                   warnings=timeline.warnings, message_events=timeline.message_events)


def clock_warnings(clocks: pa.Table, events: pa.Table) -> list[str]:
    """What the decode summary says of the clocks: every capture that could not be aligned and why, and the
    captures whose messages fit no linear clock (aligned transits that are negative)."""
    apart: dict[str, list[str]] = {}
    for capture, ok, reason in zip(*(clocks[name].to_pylist() for name in ("capture", "aligned", "reason"))):
        if not ok and reason is not None:
            apart.setdefault(reason, []).append(capture)
    warnings = [f"clocks: capture {names[0]} could not be aligned ({reason}); its times stay on its own clock"
                if len(names) == 1 else f"clocks: captures {', '.join(names)} could not be aligned ({reason}); "
                f"their times stay on their own clocks" for reason, names in apart.items()]
    inconsistent = [capture for capture, consistent in zip(clocks["capture"].to_pylist(),
                                                           clocks["consistent"].to_pylist()) if consistent is False]
    if inconsistent:
        transit = [value for value in events["transit_ns"].to_pylist() if value is not None]
        negative = [value for value in transit if value < 0]
        least = f", the least {min(negative) / 1000:.1f} µs" if len(negative) else ""
        warnings.append(f"clocks of {', '.join(inconsistent)} are not consistent: the messages seen at both ends "
                        f"fit no offset and drift (a clock that stepped, or busy hosts' late timestamps); "
                        f"{len(negative)} of {len(transit)} aligned transits are negative{least}")
    return warnings
