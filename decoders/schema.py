"""The decode output's tables, each in one place: its Arrow schema and what every column holds.

`dlcsniff decode` writes streams, zmtp, messages, nodes and collectives (from the decoders' column lists,
`Table.from_columns`) and events and clocks (the job's timeline, DataFrames converted by `Table.from_frame`);
the statistics tables of `dlcsniff stats` are declared the same way in analysis/stats_schema.py, and
`dlcsniff schema` prints them all (SCHEMA.md is that reference, generated).

One naming scheme for every table:
- a time point is in nanoseconds and has `ts` in its name: `ts_first_ns` / `ts_last_ns` for the first and
  last byte of a message (or start and end of anything with a duration), `<what>_ts_ns` for a named instant;
  durations end in their unit without `ts` (`total_ns`, `sync_overhead_us`, `iteration_s`);
- sizes end in `_bytes` (or are `bytes`), rates in `_gb_per_s`, clock drift in `_ppm`; names the issues'
  contracts fixed with the unit inside (`frame_sizes`, `data_sizes`, `wire_bytes_sent`, ...) state their unit
  in the column's `unit`; any other name without a unit suffix is a count, an identifier or a label;
- a tensor is `tensor_key`, a ps-lite key `ps_key` (messages' `keys` lists them), ranks `rank` / `*_rank`;
- integers stay integer where values are missing (null, never float), strings are `string` (never
  large_string or dictionary), and no column is null-typed, even in an empty table.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa

from dlcsniff.decoders.arrow_types import BOOL, F64, I32, I64, LIST_I64, LIST_U64, STR, U64  # noqa: F401
from dlcsniff.decoders.protocols import protocol_columns, protocol_tables

# name suffix -> unit
UNIT_SUFFIXES = (("_ns", "ns"), ("_us", "µs"), ("_s", "s"), ("_bytes", "bytes"), ("_gb_per_s", "GB/s"),
                 ("_ppm", "ppm"))


def unit_of(name: str) -> str:
    """The unit a column's name states ("" for a count, an identifier, a label or a ratio)."""
    if name == "bytes":
        return "bytes"
    # the longest suffix that fits: `_gb_per_s` before `_s`
    return max(((suffix, unit) for suffix, unit in UNIT_SUFFIXES if name.endswith(suffix)),
               key=lambda found: len(found[0]), default=("", ""))[1]


def type_name(data_type: pa.DataType) -> str:
    """int64, string, list<int64>: how the reference writes a type."""
    if pa.types.is_list(data_type):
        return f"list<{type_name(data_type.value_type)}>"
    return str(data_type)


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: pa.DataType
    description: str
    unit: str = ""


@dataclass(frozen=True, slots=True)
class Table:
    """One table of the reference: its file (`<name>.parquet`), the command that writes it, what one row is
    (`description`), and its columns in the order they are written."""

    name: str
    command: str
    description: str
    columns: tuple[Column, ...]
    schema: pa.Schema = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "schema", pa.schema([(column.name, column.type) for column in self.columns]))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns)

    def column(self, name: str) -> Column:
        return self.columns[self.names.index(name)]

    def from_columns(self, columns: dict[str, list]) -> pa.Table:
        """The table from the decoders' column lists (a column they did not fill is null)."""
        n = len(next(iter(columns.values()))) if columns else 0
        arrays = [pa.array(columns.get(name, [None] * n), type=data_type)
                  for name, data_type in zip(self.schema.names, self.schema.types)]
        return pa.Table.from_arrays(arrays, schema=self.schema)

    def from_frame(self, frame) -> pa.Table:
        """The table from a DataFrame with exactly its columns (in any order, of any pandas dtype holding the
        right values: float holding integers with NaN for null, categories, object): each column cast to its
        type, safely (a fractional value in an integer column raises). A column missing or unknown raises."""
        missing = [name for name in self.names if name not in frame.columns]
        unknown = [name for name in frame.columns if name not in self.names]
        if missing or unknown:
            raise ValueError(f"{self.name}: columns {missing} missing and {unknown} not in its schema "
                             "(decoders/schema.py, analysis/stats_schema.py)")
        arrays = [pa.array(frame[name], from_pandas=True).cast(data_type)
                  for name, data_type in zip(self.schema.names, self.schema.types)]
        return pa.Table.from_arrays(arrays, schema=self.schema)


def with_protocol_columns(name: str, rows: list[tuple]) -> list[tuple]:
    """A decode table's rows with every protocol's own (decoders.protocols.protocol_columns), each block right
    after its anchor column (which may be another protocol's)."""
    rows = list(rows)
    pending = list(protocol_columns(name))
    while pending:
        names = [row[0] for row in rows]
        placeable = [block for block in pending if block[0] in names]
        if not placeable:
            raise ValueError(f"{name}: no column {', '.join(anchor for anchor, _ in pending)} to place "
                             "protocol columns after")
        for anchor, block in placeable:
            at = [row[0] for row in rows].index(anchor) + 1
            rows[at:at] = block
            pending.remove((anchor, block))
    return rows


def table(name: str, command: str, description: str, columns: list[tuple]) -> Table:
    """A Table from (name, type, description[, unit]) rows; the unit is the name's suffix unless given."""
    return Table(name, command, description, tuple(
        Column(row[0], row[1], row[2], row[3] if len(row) > 3 else unit_of(row[0])) for row in columns))


STREAMS = table("streams", "decode", "TCP direction, or non-TCP stream (RoCE: source, destination and "
                "destination queue pair)", with_protocol_columns("streams", [
    ("flow_id", I64, "the stream's id, unique in the decode output (messages and zmtp name their stream by it)"),
    ("capture", STR, "the capture it was seen in: the input file's name without its extensions"),
    ("src_ip", STR, "source IP address"),
    ("src_port", I32, "source TCP port (null for RoCE)"),
    ("dst_ip", STR, "destination IP address"),
    ("dst_port", I32, "destination TCP port (null for RoCE)"),
    ("ts_first_ns", I64, "capture time of its first packet (epoch ns, the capture's clock)"),
    ("ts_last_ns", I64, "capture time of its last packet"),
    ("packets", I64, "packets captured"),
    ("bytes", I64, "payload bytes captured, each once (retransmissions not counted again)"),
    ("missing_bytes", I64, "payload bytes of segments the capture never saw (holes)"),
    ("uncaptured_bytes", I64, "payload bytes of segments cut short by the snap length"),
    ("retransmitted_bytes", I64, "payload bytes seen again (retransmissions and overlaps)"),
    ("zero_windows", I64, "TCP: segments (no SYN/FIN/RST) in which the sender advertised a zero receive window, "
                          "as Wireshark's tcp.analysis.zero_window: its application stopped reading the "
                          "reverse direction (null for RoCE)"),
    ("zero_window_ns", I64, "TCP: how long the sender kept its window at zero, from a zero advertisement to the "
                            "next one with room (still zero: to its last segment)"),
    ("protocol", STR, "who claimed it: pslite (ZMTP carrying ps-lite), zmtp (other ZMTP), gloo, tcpstore, "
                      "nccl_socket, nccl_bootstrap, nccl_proxy, nccl_ras, nccl_ib_setup, roce; tcp: nobody"),
    ("reverse_flow_id", I64, "flow_id of the other direction of the same connection, when seen"),
    ("syn_seen", BOOL, "the capture saw the connection open (false: it started mid-connection)"),
    ("seq_base", I64, "TCP sequence number of the direction's first byte in the stream (after the SYN, or the "
                       "first seen mid-connection): the same byte has the same number in every capture"),
    ("fin_seen", BOOL, "a FIN was seen in this direction"),
    ("rst_seen", BOOL, "a RST was seen in this direction"),
    ("lost_bytes", I64, "stream bytes the protocol decoder skipped to find its framing again"),
    ("resyncs", I64, "times the protocol decoder found its framing again after losing it"),
    ("decode_error", STR, "why the protocol decoder stopped making sense of the stream, if it did"),
    ("pid", I64, "process owning the capture host's end of the connection (capture daemon directories)"),
    ("comm", STR, "that process's command name"),
]))

MESSAGES = table("messages", "decode", "application message seen in a capture (ps-lite, Gloo, "
                 "TCPStore, NCCL, RoCE; told apart by protocol)", with_protocol_columns("messages", [
    ("protocol", STR, "pslite, gloo, tcpstore, nccl_socket, nccl_bootstrap or roce"),
    ("capture", STR, "the capture it was seen in"),
    ("flow_id", I64, "the stream it travelled on (streams.flow_id)"),
    ("event_id", I64, "the job's message this row is one capture's sighting of (events.event_id): a message seen "
                      "at both ends has two rows, one event"),
    ("ts_first_ns", I64, "capture time of the packet carrying its first byte"),
    ("ts_last_ns", I64, "capture time of the packet carrying its last byte"),
    ("size_bytes", I64, "bytes of the message (ps-lite: meta + data; others: as their framing counts)"),
    ("complete", BOOL, "every byte was captured"),
    ("sender_pid", I64, "process that sent it, when a capture daemon attributed it"),
    ("recver_pid", I64, "process that received it, when a capture daemon attributed it"),
    ("api_ts_ns", I64, "when the sender handed the message to libzmq (capture daemon probes)"),
    ("send_queue_delay_ns", I64, "from that call to the message's first byte on the wire"),
    ("collective", STR, "Gloo: the collective its slot names (all_reduce, ..., p2p for send/recv); NCCL (RoCE, "
                        "sockets): the kind of the collectives row it was read into (p2p for send/recv)"),
    ("seq", I64, "Gloo: the collective's sequence number in its process group; NCCL: that collectives row's seq"),
    ("tag", I64, "Gloo: the slot's tag; NCCL bootstrap: the message's tag"),
    ("payload_bytes", I64, "Gloo, NCCL: payload bytes (without framing; NCCL's CTS writes carry none)"),
    ("stream_offset_bytes", I64, "Gloo, TCPStore: where it starts in its TCP direction (lost bytes counted; "
                                 "Gloo: its preamble, TCPStore: its query)"),
    ("src_rank", I32, "rank of the sender (Gloo, NCCL, RoCE; TCPStore rendezvous: the node's base rank)"),
    ("dst_rank", I32, "rank of the receiver"),
    ("local_rank", I32, "Gloo: rank of the capture's own process in the group; NCCL: of the capture's host"),
    ("peer_rank", I32, "Gloo: rank at the other end; NCCL bootstrap: the sender's rank"),
    ("outgoing", BOOL, "Gloo, NCCL: sent by the capture's own process or host (null: unknown)"),
    ("world_size", I32, "Gloo, TCPStore: ranks in the group"),
]))

COLLECTIVES = table("collectives", "decode", "collective operation seen in a capture (one rank's "
                    "view)", [
    ("protocol", STR, "gloo, nccl_socket or roce"),
    ("kind", STR, "all_reduce, all_to_all, broadcast, all_gather, reduce_scatter, reduce, gather, scatter, "
                  "barrier, send, recv; NCCL also what the wire cannot decide (all_gather_or_reduce_scatter, "
                  "broadcast_or_reduce) or unknown (sends that fit no schedule)"),
    ("seq", I64, "the collective's sequence number in its group (NCCL: its place among the host's "
                 "collectives; send/recv: among those on one connection)"),
    ("world_size", I32, "ranks in the group"),
    ("ts_first_ns", I64, "its first byte on this rank's wire (sent or received)"),
    ("ts_last_ns", I64, "its last byte on this rank's wire"),
    ("wire_bytes_sent", I64, "bytes this rank sent for it, framing included", "bytes"),
    ("wire_bytes_received", I64, "bytes this rank received for it, framing included", "bytes"),
    ("tensor_bytes", I64, "the tensor's size, recovered from the traffic through the algorithm's volume"),
    ("peers", LIST_I64, "ranks this rank exchanged data with"),
    ("algorithm", STR, "ring, tree, p2p, ... as the traffic shows it"),
    ("capture", STR, "the capture (rank) that saw it"),
    ("pg", STR, "Gloo: the process group"),
    ("local_rank", I32, "this rank (NCCL: from the CTS tags, the TCPStore or the ring chunk schedule)"),
    ("payload_bytes_sent", I64, "payload bytes this rank sent for it", "bytes"),
    ("payload_bytes_received", I64, "payload bytes this rank received for it", "bytes"),
    ("messages", I64, "messages it took at this rank"),
    ("complete", BOOL, "every message of it was captured whole"),
    ("local_address", STR, "NCCL: the host (IP address) whose operation the row is"),
    ("tag", I64, "send/recv: the caller's tag (Gloo: the slot); null for collectives"),
    ("channel", I32, "NCCL: the first channel it ran on (channels numbered by set-up order)"),
    ("channels", I32, "NCCL: how many channels carried it"),
    ("root_rank", I32, "NCCL broadcast / reduce: the root, when a capture of the job shows it"),
    ("evidence", STR, "NCCL, JSON: the ring or tree seen, loops, per connection FIFO idx range, sends, zero-byte "
                      "sends, offered sizes; where rank and world size came from"),
])

# the messages' fields an event carries (decoders.timeline)
EVENT_ATTRIBUTES = ("protocol", "sender_id", "recver_id", "sender_role", "recver_role", "request", "push", "pull",
                    "simple_app", "ps_timestamp", "head", "app_id", "customer_id", "control_cmd", "size_bytes",
                    "tensor_key", "server_rank", "iteration", "req_type", "dtype", "rows", "simple_app_cmd",
                    "barrier_group", "flavor", "complete", "pg", "collective", "seq", "opcode", "store_query",
                    "src_rank", "dst_rank", "payload_bytes")


def _event_attribute(name: str) -> tuple:
    column = MESSAGES.column(name)
    return (name, column.type, "every capture that saw it saw it whole" if name == "complete"
            else column.description)


def _side_columns(side: str, who: str) -> list[tuple]:
    return [(f"{side}_capture", STR, f"the {who}'s own capture, when it saw the message"),
            (f"{side}_ts_first_ns", I64, f"first byte at the {who}, on that capture's clock"),
            (f"{side}_ts_last_ns", I64, f"last byte at the {who}, on that capture's clock")]


EVENTS = table("events", "decode", "message of the job, however many captures saw it, on the "
               "reference clock (decoders/timeline.py)", [
    ("event_id", I64, "the message's id (the same whatever the clocks say)"),
    ("connection", STR, "src_ip:port>dst_ip:port, the same in every capture"),
    ("message_row", I64, "the messages.parquet row its fields come from"),
    *map(_event_attribute, EVENT_ATTRIBUTES),
    *_side_columns("send", "sender"),
    *_side_columns("recv", "receiver"),
    ("observer_capture", STR, "a capture neither end's that saw it, when one did"),
    ("observations", I64, "captures that saw it"),
    ("send_ts_first_aligned_ns", I64, "send_ts_first_ns on the reference clock"),
    ("send_ts_last_aligned_ns", I64, "send_ts_last_ns on the reference clock"),
    ("recv_ts_first_aligned_ns", I64, "recv_ts_first_ns on the reference clock"),
    ("recv_ts_last_aligned_ns", I64, "recv_ts_last_ns on the reference clock"),
    ("ts_first_ns", I64, "first byte sent, else first byte seen (reference clock)"),
    ("ts_last_ns", I64, "last byte received, else last byte seen (reference clock)"),
    ("transit_ns", I64, "last byte received - last byte sent, when both ends saw it whole and their clocks are "
                        "aligned"),
])

CLOCKS = table("clocks", "decode", "capture: how to put its times on the clock of its job's reference "
               "capture (decoders/clocks.py)", [
    ("capture", STR, "the capture"),
    ("reference", STR, "the reference capture of its job (the captures linked by messages they both saw: one "
                       "reference per job, the same in each of its rows)"),
    ("aligned", BOOL, "linked to the reference by messages both ways (false: offset_ns, drift_ppm and "
                      "error_bound_ns are null, its times stay on its own clock, `reason` says why)"),
    ("via", STR, "the capture it is aligned through, towards the reference"),
    ("offset_ns", I64, "added to its times (with the drift term) to align them; null when not aligned"),
    ("drift_ppm", F64, "rate correction: aligned = ts + offset_ns + drift_ppm * 1e-6 * (ts - epoch_ts_ns)"),
    ("epoch_ts_ns", I64, "the instant the drift is measured from (the same for every capture of a job)"),
    ("error_bound_ns", I64, "how far the aligned times may be off, at most, for a linear clock"),
    ("consistent", BOOL, "the samples admit a linear clock (false: some aligned transit may be negative; the "
                         "decode summary warns)"),
    ("messages_used", I64, "messages the estimate used"),
    ("samples_from_via", I64, "one-way delay samples from `via` to this capture"),
    ("samples_to_via", I64, "one-way delay samples from this capture to `via`"),
    ("reason", STR, "why it could not be aligned (null when it is); the decode summary warns"),
])

def with_protocol_tables(tables: list[Table]) -> dict[str, Table]:
    """The decode tables with every protocol's own (decoders.protocols.protocol_tables), each right after the table
    it names."""
    names = [t.name for t in tables]
    for anchor, (name, command, description, columns) in protocol_tables():
        at = names.index(anchor) + 1
        tables.insert(at, table(name, command, description, columns))
        names.insert(at, name)
    return {t.name: t for t in tables}


TABLES: dict[str, Table] = with_protocol_tables([STREAMS, MESSAGES, COLLECTIVES, EVENTS, CLOCKS])
# the tables the decoders fill from column lists (events and clocks come from decoders.timeline)
COLUMN_TABLES = tuple(name for name in TABLES if name not in (EVENTS.name, CLOCKS.name))


def table_from_columns(name: str, columns: dict[str, list]) -> pa.Table:
    """Build a decode table from column lists (missing columns become nulls)."""
    return TABLES[name].from_columns(columns)
