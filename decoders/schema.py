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

I32 = pa.int32()
I64 = pa.int64()
U64 = pa.uint64()
F64 = pa.float64()
STR = pa.string()
BOOL = pa.bool_()
LIST_I64 = pa.list_(I64)
LIST_U64 = pa.list_(U64)

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


def table(name: str, command: str, description: str, columns: list[tuple]) -> Table:
    """A Table from (name, type, description[, unit]) rows; the unit is the name's suffix unless given."""
    return Table(name, command, description, tuple(
        Column(row[0], row[1], row[2], row[3] if len(row) > 3 else unit_of(row[0])) for row in columns))


STREAMS = table("streams", "decode", "TCP direction, or non-TCP stream (RoCE: source, destination and "
                "destination queue pair)", [
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
    ("protocol", STR, "who claimed it: pslite (ZMTP carrying ps-lite), zmtp (other ZMTP), gloo, tcpstore, "
                      "nccl_socket, nccl_bootstrap, nccl_proxy, nccl_ras, nccl_ib_setup, roce; tcp: nobody"),
    ("zmtp_version", STR, "ZMTP version from the greeting, e.g. \"3.1\""),
    ("mechanism", STR, "ZMTP security mechanism: NULL, PLAIN, CURVE or GSSAPI"),
    ("socket_type", STR, "ZMTP Socket-Type property of the sender (e.g. DEALER)"),
    ("identity", STR, "ZMTP Identity property of the sender (ps-lite: the node's id)"),
    ("encrypted", BOOL, "the ZMTP mechanism encrypts (CURVE, GSSAPI): messages counted and sized only"),
    ("reverse_flow_id", I64, "flow_id of the other direction of the same connection, when seen"),
    ("syn_seen", BOOL, "the capture saw the connection open (false: it started mid-connection)"),
    ("fin_seen", BOOL, "a FIN was seen in this direction"),
    ("rst_seen", BOOL, "a RST was seen in this direction"),
    ("lost_bytes", I64, "stream bytes the protocol decoder skipped to find its framing again"),
    ("resyncs", I64, "times the protocol decoder found its framing again after losing it"),
    ("decode_error", STR, "why the protocol decoder stopped making sense of the stream, if it did"),
    ("node_id", I32, "ps-lite node id of the sending endpoint, when known"),
    ("pid", I64, "process owning the capture host's end of the connection (capture daemon directories)"),
    ("comm", STR, "that process's command name"),
    ("gloo_role", STR, "Gloo pair connection: initiator (connected and sent the sequence number), listener, "
                       "unknown"),
    ("pair_sequence", I64, "Gloo: the pair's sequence number written by the connecting side"),
    ("rank", I32, "Gloo: rank of the sending side"),
    ("peer_rank", I32, "Gloo: rank of the receiving side"),
    ("dest_qp", I64, "RoCE: destination queue pair number"),
    ("bad_icrc", I64, "RoCE: packets whose invariant CRC did not verify"),
    ("cnp", I64, "RoCE: congestion notification packets"),
    ("retransmitted_packets", I64, "RoCE: packets whose PSN was seen before"),
    ("naks", I64, "RoCE: negative acknowledgements"),
    ("acks", I64, "RoCE: acknowledgements"),
    ("lost_packets", I64, "RoCE: packets missing from the PSN sequence (capture loss)"),
    ("icrc_unchecked", I64, "RoCE: packets whose invariant CRC could not be checked (cut by the snap length)"),
    ("ecn_ce_packets", I64, "RoCE: packets marked ECN congestion experienced"),
    ("unmatched_responses", I64, "RoCE: READ responses without a request seen"),
    ("roce_version", I32, "RoCE: 1 (ethertype 0x8915) or 2 (UDP 4791)"),
    ("transport", STR, "RoCE: the transport of the opcodes seen (RC, UC, UD, ...)"),
    ("path_mtu_bytes", I32, "RoCE: the path MTU: the payload of a FIRST or MIDDLE packet"),
    ("src_rank", I32, "NCCL: rank of the sending side, when known"),
    ("dst_rank", I32, "NCCL: rank of the receiving side, when known"),
    ("nccl_direction", STR, "NCCL over RoCE: cts (clear-to-send writes) or data"),
    ("nccl_setup_flow_id", I64, "NCCL over RoCE: flow_id of the TCP connection that set the queue pair up"),
    ("nccl_socket_type", STR, "NCCL sockets: the connection's type from its handshake (bootstrap, proxy, "
                              "net_socket, ras)"),
    ("nccl_magic", STR, "NCCL sockets: the handshake's magic number, hexadecimal"),
    ("nccl_socket_index", I32, "NCCL socket transport: the socket's index in its connection (nsocks = control)"),
    ("nccl_nsocks", I32, "NCCL socket transport: data sockets of the connection"),
    ("nccl_control_flow_id", I64, "NCCL socket transport: flow_id of the connection's control socket"),
    ("nccl_inline", BOOL, "NCCL socket transport: small payloads travel inline on the control socket "
                          "(NCCL 2.16 and later)"),
])

ZMTP = table("zmtp", "decode", "ZMTP message or command", [
    ("flow_id", I64, "the stream (streams.flow_id)"),
    ("capture", STR, "the capture it was seen in"),
    ("ts_first_ns", I64, "capture time of the packet carrying its first byte"),
    ("ts_last_ns", I64, "capture time of the packet carrying its last byte"),
    ("command", STR, "the command's name (READY, SUBSCRIBE, PING, ...); null for a message"),
    ("frame_sizes", LIST_I64, "bytes of each frame", "bytes"),
    ("size_bytes", I64, "bytes of all its frames"),
    ("complete", BOOL, "every byte was captured"),
])

MESSAGES = table("messages", "decode", "application message seen in a capture (ps-lite, Gloo, "
                 "TCPStore, NCCL, RoCE; told apart by protocol)", [
    ("protocol", STR, "pslite, gloo, tcpstore, nccl_socket, nccl_bootstrap or roce"),
    ("capture", STR, "the capture it was seen in"),
    ("flow_id", I64, "the stream it travelled on (streams.flow_id)"),
    ("ts_first_ns", I64, "capture time of the packet carrying its first byte"),
    ("ts_last_ns", I64, "capture time of the packet carrying its last byte"),
    ("sender_id", I32, "ps-lite: sender's node id"),
    ("recver_id", I32, "ps-lite: receiver's node id"),
    ("sender_role", STR, "ps-lite: scheduler, server or worker"),
    ("recver_role", STR, "ps-lite: scheduler, server or worker"),
    ("request", BOOL, "ps-lite: a request (false: a response)"),
    ("push", BOOL, "ps-lite: a push"),
    ("pull", BOOL, "ps-lite: a pull"),
    ("simple_app", BOOL, "ps-lite: a SimpleApp command"),
    ("ps_timestamp", I32, "ps-lite: the message's timestamp, a per-customer request counter (not a time)"),
    ("head", I32, "ps-lite: the meta's head (MXNet: request type and dtype; SimpleApp: the command)"),
    ("app_id", I32, "ps-lite: application id"),
    ("customer_id", I32, "ps-lite: customer id"),
    ("control_cmd", I32, "ps-lite: control command number (null for a data or SimpleApp message)"),
    ("data_sizes", LIST_I64, "ps-lite: bytes of each data frame", "bytes"),
    ("size_bytes", I64, "bytes of the message (ps-lite: meta + data; others: as their framing counts)"),
    ("keys", LIST_U64, "ps-lite: the ps keys it carries"),
    ("tensor_key", I64, "ps-lite: the tensor (MXNet key / BytePS tensor) the keys belong to"),
    ("server_rank", I32, "ps-lite: rank of the server holding the keys"),
    ("req_type", STR, "MXNet: request type (default, row_sparse, ...)"),
    ("dtype", STR, "MXNet: data type of the values"),
    ("complete", BOOL, "every byte was captured"),
    ("meta_bytes", I64, "ps-lite: size of the meta frame"),
    ("lens", LIST_I64, "ps-lite: the lens array (values per key; row-sparse and multi-key messages)"),
    ("part", I32, "MXNet: part of a big array split over servers; BytePS: the tensor's partition"),
    ("rows", I32, "MXNet row-sparse: rows carried"),
    ("simple_app_cmd", STR, "MXNet: SimpleApp command name"),
    ("barrier_group", I32, "ps-lite control: barrier group"),
    ("flavor", STR, "ps-lite: dmlc (MXNet) or byteps"),
    ("sender_pid", I64, "process that sent it, when a capture daemon attributed it"),
    ("recver_pid", I64, "process that received it, when a capture daemon attributed it"),
    ("api_ts_ns", I64, "when the sender handed the message to libzmq (capture daemon probes)"),
    ("send_queue_delay_ns", I64, "from that call to the message's first byte on the wire"),
    ("opcode", STR, "Gloo: SEND_BUFFER, SEND_UNBOUND_BUFFER, NOTIFY_SEND_READY, NOTIFY_RECV_READY"),
    ("slot", I64, "Gloo: the preamble's slot (collective prefix, tag, delta)"),
    ("collective", STR, "Gloo: the collective its slot names (all_reduce, ..., p2p for send/recv)"),
    ("seq", I64, "Gloo: the collective's sequence number in its process group"),
    ("tag", I64, "Gloo: the slot's tag; NCCL bootstrap: the message's tag"),
    ("slot_delta", I32, "Gloo: the slot's delta (the step within the collective)"),
    ("offset_bytes", I64, "Gloo: the preamble's offset into the registered buffer"),
    ("length_bytes", I64, "Gloo: the preamble's length (payload, or bytes announced)"),
    ("roffset_bytes", I64, "Gloo: the preamble's offset into the remote buffer"),
    ("payload_bytes", I64, "Gloo, NCCL: payload bytes (without framing)"),
    ("missing_bytes", I64, "Gloo: payload bytes the capture lost"),
    ("stream_offset_bytes", I64, "Gloo: where its preamble starts in its TCP direction (lost bytes counted)"),
    ("src_rank", I32, "rank of the sender (Gloo, NCCL, RoCE; TCPStore rendezvous: the node's base rank)"),
    ("dst_rank", I32, "rank of the receiver"),
    ("local_rank", I32, "Gloo: rank of the capture's own process in the group"),
    ("peer_rank", I32, "Gloo: rank at the other end; NCCL bootstrap: the sender's rank"),
    ("peer_address", STR, "Gloo: address:port at the other end"),
    ("outgoing", BOOL, "Gloo: sent by the capture's own process or host (null: unknown)"),
    ("world_size", I32, "Gloo, TCPStore: ranks in the group"),
    ("pg", STR, "Gloo: the process group's store prefix"),
    ("store_query", STR, "TCPStore: the query (SET, GET, ADD, WAIT, ...)"),
    ("store_key", STR, "TCPStore: its first key"),
    ("store_keys", I32, "TCPStore: keys in the query"),
    ("value_bytes", I64, "TCPStore: bytes of the values set or returned"),
    ("response_bytes", I64, "TCPStore: bytes of the response"),
    ("store_number", I64, "TCPStore: the number a query carries or returns (ADD amount or result, ...)"),
    ("local_world_size", I32, "torchelastic's rendezvous in the store: processes on the node (role_info/<node>; "
                              "src_rank is then the node's base rank, world_size from assigned_ranks/<node>)"),
    ("rdma_op", STR, "RoCE: SEND, SEND_IMM, WRITE, WRITE_IMM, READ, ATOMIC"),
    ("dest_qp", I64, "RoCE: destination queue pair"),
    ("imm", I64, "RoCE: immediate data, read big-endian (NCCL data writes: the bytes sent, in the sender's "
                 "host order; nccl_bytes has them)"),
    ("va", U64, "RoCE: the RDMA virtual address"),
    ("rkey", I64, "RoCE: the remote key"),
    ("nccl_role", STR, "RoCE: cts, data, or null (not NCCL's)"),
    ("extra_stream", I64, "RoCE: the row's stream among its capture's RoCE streams"),
    ("src_ip", STR, "RoCE: source IP address"),
    ("dst_ip", STR, "RoCE: destination IP address"),
    ("psn", I64, "RoCE: packet sequence number of its first packet"),
    ("packets", I64, "RoCE: packets it took"),
    ("nccl_tag", I32, "NCCL CTS: the tag of the FIFO entry"),
    ("nccl_fifo_idx", I64, "NCCL CTS: the FIFO slot's index"),
    ("nccl_nreqs", I32, "NCCL CTS: requests in the FIFO entry"),
    ("nccl_bytes", I64, "NCCL: bytes the transfer moves (a data write's immediate)"),
    ("nccl_sizes_bytes", LIST_I64, "NCCL CTS: bytes offered per request"),
    ("nccl_addrs", LIST_U64, "NCCL CTS: buffer addresses offered per request"),
    ("head_crc32", I64, "NCCL data: CRC-32 of the first 64 payload bytes, when captured (did a rank forward what "
                        "it received, or reduce it?)"),
    ("nccl_seq", I64, "NCCL socket transport: the message's place on its connection"),
    ("nccl_inline", BOOL, "NCCL socket transport: the payload travelled inline on the control socket"),
    ("nccl_tasks", I32, "NCCL socket transport: data sockets the message was striped over"),
    ("nccl_proto", STR, "NCCL: LL, LL128 or Simple, from the first payload bytes (sockets and RoCE data writes)"),
])

NODES = table("nodes", "decode", "ps-lite node the scheduler announced", [
    ("node_id", I32, "ps-lite node id"),
    ("role", STR, "scheduler, server or worker"),
    ("rank", I32, "the node's rank among its role"),
    ("hostname", STR, "its address, as announced"),
    ("port", I32, "its port, as announced"),
])

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
                    "tensor_key", "server_rank", "req_type", "dtype", "rows", "simple_app_cmd", "barrier_group",
                    "flavor", "complete", "pg", "collective", "seq", "opcode", "store_query", "src_rank",
                    "dst_rank", "payload_bytes")


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
    ("transit_ns", I64, "last byte received - last byte sent, when both ends saw it"),
])

CLOCKS = table("clocks", "decode", "capture: how to put its times on the reference capture's clock "
               "(decoders/clocks.py)", [
    ("capture", STR, "the capture"),
    ("reference", STR, "the reference capture (the same in every row)"),
    ("aligned", BOOL, "linked to the reference by messages both ways (false: it keeps its own clock)"),
    ("via", STR, "the capture it is aligned through, towards the reference"),
    ("offset_ns", I64, "added to its times (with the drift term) to align them"),
    ("drift_ppm", F64, "rate correction: aligned = ts + offset_ns + drift_ppm * 1e-6 * (ts - epoch_ts_ns)"),
    ("epoch_ts_ns", I64, "the instant the drift is measured from (the same in every row)"),
    ("error_bound_ns", I64, "how far the aligned times may be off, at most, for a linear clock"),
    ("consistent", BOOL, "the samples admit a linear clock (false: some aligned transit may be negative)"),
    ("messages_used", I64, "messages the estimate used"),
    ("samples_from_via", I64, "one-way delay samples from `via` to this capture"),
    ("samples_to_via", I64, "one-way delay samples from this capture to `via`"),
])

TABLES: dict[str, Table] = {t.name: t for t in (STREAMS, ZMTP, MESSAGES, NODES, COLLECTIVES, EVENTS, CLOCKS)}
# the tables the decoders fill from column lists (events and clocks come from decoders.timeline)
COLUMN_TABLES = ("streams", "zmtp", "messages", "nodes", "collectives")


def table_from_columns(name: str, columns: dict[str, list]) -> pa.Table:
    """Build a decode table from column lists (missing columns become nulls)."""
    return TABLES[name].from_columns(columns)
