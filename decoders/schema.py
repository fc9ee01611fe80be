"""The decode output contract: the schemas of the tables `dlcsniff decode` writes (decoders.output).

Other code (analysis/, the checks) relies on these exact names; extra columns may follow the contract's.
"""
from __future__ import annotations

import pyarrow as pa

_i64 = pa.int64()
_list_i64 = pa.list_(pa.int64())
_list_u64 = pa.list_(pa.uint64())

STREAMS_SCHEMA = pa.schema([
    ("flow_id", _i64),
    ("capture", pa.string()),
    ("src_ip", pa.string()),
    ("src_port", pa.int32()),
    ("dst_ip", pa.string()),
    ("dst_port", pa.int32()),
    ("first_ts_ns", _i64),
    ("last_ts_ns", _i64),
    ("packets", _i64),
    ("bytes", _i64),
    ("missing_bytes", _i64),
    ("uncaptured_bytes", _i64),
    ("retransmitted_bytes", _i64),
    ("protocol", pa.string()),
    ("zmtp_version", pa.string()),
    ("mechanism", pa.string()),
    ("socket_type", pa.string()),
    ("identity", pa.string()),
    ("encrypted", pa.bool_()),
    # beyond the contract
    ("reverse_flow_id", _i64),          # the other direction of the same connection, when seen
    ("syn_seen", pa.bool_()),           # False: the capture started mid-connection
    ("fin_seen", pa.bool_()),
    ("rst_seen", pa.bool_()),
    ("lost_bytes", _i64),               # bytes the ZMTP decoder had to skip to resynchronise
    ("resyncs", _i64),
    ("decode_error", pa.string()),      # why decoding stopped on this stream, if it did
    ("node_id", pa.int32()),            # ps-lite node id of the sending endpoint, when known
    # from a capture daemon's directory (decoders.processes): the process at the capture's end
    ("pid", _i64),
    ("comm", pa.string()),
    # Gloo / TCPStore
    ("gloo_role", pa.string()),
    ("pair_sequence", _i64),
    ("rank", pa.int32()),
    ("peer_rank", pa.int32()),
    # RoCE rows (one per source, destination, dest_qp) and NCCL sockets
    ("dest_qp", _i64),
    ("bad_icrc", _i64),
    ("cnp", _i64),
    ("retransmitted_packets", _i64),
    ("naks", _i64),
    ("acks", _i64),
    ("lost_packets", _i64),
    ("icrc_unchecked", _i64),
    ("ecn_ce_packets", _i64),
    ("unmatched_responses", _i64),
    ("roce_version", pa.int32()),
    ("transport", pa.string()),
    ("path_mtu", pa.int32()),
    ("src_rank", pa.int32()),
    ("dst_rank", pa.int32()),
    ("nccl_direction", pa.string()),
    ("nccl_setup_flow_id", _i64),
    ("nccl_socket_type", pa.string()),
    ("nccl_magic", pa.string()),
    ("nccl_socket_index", pa.int32()),
    ("nccl_nsocks", pa.int32()),
    ("nccl_control_flow_id", _i64),
    ("nccl_inline", pa.bool_()),
])

ZMTP_SCHEMA = pa.schema([
    ("flow_id", _i64),
    ("capture", pa.string()),
    ("ts_first_ns", _i64),
    ("ts_last_ns", _i64),
    ("command", pa.string()),
    ("frame_sizes", _list_i64),
    ("size_bytes", _i64),
    ("complete", pa.bool_()),
])

MESSAGES_SCHEMA = pa.schema([
    ("protocol", pa.string()),
    ("capture", pa.string()),
    ("flow_id", _i64),
    ("ts_first_ns", _i64),
    ("ts_last_ns", _i64),
    ("sender_id", pa.int32()),
    ("recver_id", pa.int32()),
    ("sender_role", pa.string()),
    ("recver_role", pa.string()),
    ("request", pa.bool_()),
    ("push", pa.bool_()),
    ("pull", pa.bool_()),
    ("simple_app", pa.bool_()),
    ("ps_timestamp", pa.int32()),
    ("head", pa.int32()),
    ("app_id", pa.int32()),
    ("customer_id", pa.int32()),
    ("control_cmd", pa.int32()),
    ("data_sizes", _list_i64),
    ("size_bytes", _i64),
    ("keys", _list_u64),
    ("tensor_key", _i64),
    ("server_rank", pa.int32()),
    ("req_type", pa.string()),
    ("dtype", pa.string()),
    ("complete", pa.bool_()),
    # beyond the contract
    ("meta_bytes", _i64),               # size of the meta frame
    ("lens", _list_i64),                # ps-lite lens array (row-sparse / multi-key)
    ("part", pa.int32()),               # big-array part index (MXNet) or partition (BytePS)
    ("rows", pa.int32()),               # row-sparse: number of rows carried
    ("simple_app_cmd", pa.string()),    # MXNet SimpleApp command name
    ("barrier_group", pa.int32()),
    ("flavor", pa.string()),            # "dmlc" (MXNet) or "byteps"
    # from capture daemons' directories (decoders.processes)
    ("sender_pid", _i64),
    ("recver_pid", _i64),
    ("api_ts_ns", _i64),                # when the sender handed the message to libzmq
    ("send_queue_delay_ns", _i64),      # from that call to the message's first byte on the wire
    # Gloo (protocol "gloo")
    ("opcode", pa.string()),
    ("slot", _i64),
    ("collective", pa.string()),
    ("seq", _i64),
    ("tag", _i64),
    ("slot_delta", pa.int32()),
    ("offset", _i64),
    ("length", _i64),
    ("roffset", _i64),
    ("payload_bytes", _i64),
    ("missing_bytes", _i64),
    ("src_rank", pa.int32()),
    ("dst_rank", pa.int32()),
    ("local_rank", pa.int32()),
    ("peer_rank", pa.int32()),
    ("peer_address", pa.string()),
    ("outgoing", pa.bool_()),
    ("world_size", pa.int32()),
    ("pg", pa.string()),
    # PyTorch TCPStore (protocol "tcpstore")
    ("store_query", pa.string()),
    ("store_key", pa.string()),
    ("store_keys", pa.int32()),
    ("value_bytes", _i64),
    ("response_bytes", _i64),
    ("store_number", _i64),
    # torchelastic's rendezvous in the store (also src_rank = the node's base global rank and world_size,
    # from assigned_ranks/<node>): processes on the node, from role_info/<node>
    ("local_world_size", pa.int32()),
    # RoCE (protocol "roce") and NCCL
    ("rdma_op", pa.string()),
    ("dest_qp", _i64),
    ("imm", _i64),
    ("va", pa.uint64()),
    ("rkey", _i64),
    ("nccl_role", pa.string()),
    ("extra_stream", _i64),             # the RoCE streams.parquet row (index among a capture's RoCE rows)
    ("src_ip", pa.string()),
    ("dst_ip", pa.string()),
    ("psn", _i64),
    ("packets", _i64),
    ("nccl_tag", pa.int32()),
    ("nccl_fifo_idx", _i64),
    ("nccl_nreqs", pa.int32()),
    ("nccl_bytes", _i64),
    ("nccl_sizes", _list_i64),
    ("nccl_addrs", pa.list_(pa.uint64())),
    ("head_crc32", _i64),               # NCCL data: CRC-32 of the first 64 payload bytes, when captured (did a
    #                                     rank forward what it received, or reduce it?)
    # NCCL socket transport
    ("nccl_seq", _i64),
    ("nccl_inline", pa.bool_()),
    ("nccl_tasks", pa.int32()),
    ("nccl_proto", pa.string()),        # LL / LL128 / Simple from the first payload bytes (RoCE data writes too)
])

COLLECTIVES_SCHEMA = pa.schema([
    ("protocol", pa.string()),
    ("kind", pa.string()),
    ("seq", _i64),
    ("world_size", pa.int32()),
    ("ts_first_ns", _i64),
    ("ts_last_ns", _i64),
    ("wire_bytes_sent", _i64),
    ("wire_bytes_received", _i64),
    ("tensor_bytes", _i64),
    ("peers", _list_i64),
    ("algorithm", pa.string()),
    # beyond the contract
    ("capture", pa.string()),
    ("pg", pa.string()),
    ("local_rank", pa.int32()),
    ("payload_bytes_sent", _i64),
    ("payload_bytes_received", _i64),
    ("messages", _i64),
    ("complete", pa.bool_()),
    ("local_address", pa.string()),     # NCCL: the host (IP address) whose operation the row is
    # NCCL (decoders.nccl_collectives): operations cut by NCCL's step structure. kind all_reduce,
    # all_gather, reduce_scatter, broadcast, reduce, send, recv, or what the wire cannot decide
    # (all_gather_or_reduce_scatter, broadcast_or_reduce) or unknown (sends that fit no schedule);
    # algorithm ring / tree / p2p; local_rank from the CTS tags, the TCPStore or the ring chunk schedule;
    # seq: the operation's place among the host's collectives (send/recv: among those on one connection)
    ("channel", pa.int32()),            # the first channel it ran on (channels numbered by set-up order)
    ("channels", pa.int32()),           # how many channels carried it
    ("root_rank", pa.int32()),          # broadcast / reduce: the root, when a capture of the job shows it
    ("evidence", pa.string()),          # JSON: the ring / tree seen, loops, per connection FIFO idx range,
    #                                     sends, zero-byte sends, offered sizes; where rank and world size came from
])

NODES_SCHEMA = pa.schema([
    ("node_id", pa.int32()),
    ("role", pa.string()),
    ("rank", pa.int32()),
    ("hostname", pa.string()),
    ("port", pa.int32()),
])

TABLES = {
    "streams": STREAMS_SCHEMA,
    "zmtp": ZMTP_SCHEMA,
    "messages": MESSAGES_SCHEMA,
    "nodes": NODES_SCHEMA,
    "collectives": COLLECTIVES_SCHEMA,
}


def table_from_columns(name: str, columns: dict[str, list]) -> pa.Table:
    """Build a contract table from column lists (missing columns become nulls)."""
    schema = TABLES[name]
    n = len(next(iter(columns.values()))) if columns else 0
    arrays = [pa.array(columns.get(f.name, [None] * n), type=f.type) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)
