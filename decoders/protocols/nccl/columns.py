"""NCCL's columns in the decode tables (over RoCE and sockets): ranks, the connections' set-up, the CTS FIFO
entries and the socket transport's framing. decoders.schema places each block after its anchor column."""
from __future__ import annotations

from dlcsniff.decoders.arrow_types import BOOL, I32, I64, LIST_I64, LIST_U64, STR

# table -> (anchor column, rows: name, type, description[, unit]) in the order they are written
COLUMNS: dict[str, tuple[tuple[str, list[tuple]], ...]] = {
    "streams": (
        ("retransmitted_times_ns", [
            ("src_rank", I32, "NCCL: rank of the sending side, when known"),
            ("dst_rank", I32, "NCCL: rank of the receiving side, when known"),
            ("nccl_direction", STR, "NCCL over RoCE: cts (clear-to-send writes) or data"),
            ("nccl_setup_flow_id", I64, "NCCL over RoCE: flow_id of the TCP connection that set the queue pair up"),
            ("nccl_socket_type", STR, "NCCL sockets: the connection's type from its handshake (bootstrap, proxy, "
                                      "net_socket, ras)"),
            ("nccl_magic", STR, "NCCL sockets: the handshake's magic number, hexadecimal"),
            ("nccl_socket_index", I32, "NCCL socket transport: the socket's index in its connection "
                                       "(nsocks = control)"),
            ("nccl_nsocks", I32, "NCCL socket transport: data sockets of the connection"),
            ("nccl_control_flow_id", I64, "NCCL socket transport: flow_id of the connection's control socket"),
            ("nccl_inline", BOOL, "NCCL socket transport: small payloads travel inline on the control socket "
                                  "(NCCL 2.16 and later)"),
        ]),
    ),
    "messages": (
        ("packets", [
            ("nccl_tag", I32, "NCCL CTS: the tag of the FIFO entry"),
            ("nccl_fifo_idx", I64, "NCCL CTS: the FIFO slot's index"),
            ("nccl_nreqs", I32, "NCCL CTS: requests in the FIFO entry"),
            ("nccl_bytes", I64, "NCCL: bytes the transfer moves (a data write's immediate)"),
            ("nccl_sizes_bytes", LIST_I64, "NCCL CTS: bytes offered per request"),
            ("nccl_addrs", LIST_U64, "NCCL CTS: buffer addresses offered per request"),
            ("head_crc32", I64, "NCCL data: CRC-32 of the first 64 payload bytes, when captured (did a rank "
                                "forward what it received, or reduce it?)"),
            ("nccl_seq", I64, "NCCL socket transport: the message's place on its connection"),
            ("nccl_inline", BOOL, "NCCL socket transport: the payload travelled inline on the control socket"),
            ("nccl_tasks", I32, "NCCL socket transport: data sockets the message was striped over"),
            ("nccl_proto", STR, "NCCL: LL, LL128 or Simple, from the first payload bytes (sockets and RoCE data "
                                "writes)"),
        ]),
    ),
}
