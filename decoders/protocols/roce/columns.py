"""RoCE's columns in the decode tables: the queue pair's counters and the RDMA operations' fields. decoders.schema
places each block after its anchor column."""
from __future__ import annotations

from dlcsniff.decoders.arrow_types import BOOL, I32, I64, LIST_I64, STR, U64

# table -> (anchor column, rows: name, type, description[, unit]) in the order they are written
COLUMNS: dict[str, tuple[tuple[str, list[tuple]], ...]] = {
    "streams": (
        ("peer_rank", [
            ("dest_qp", I64, "RoCE: destination queue pair number"),
            ("bad_icrc", I64, "RoCE: packets whose invariant CRC did not verify"),
            ("cnp", I64, "RoCE: congestion notification packets"),
            ("retransmitted_packets", I64, "RoCE: packets whose PSN was seen before"),
            ("naks", I64, "RoCE: negative acknowledgements"),
            ("acks", I64, "RoCE: acknowledgements"),
            ("lost_packets", I64, "RoCE: packets missing from the PSN sequence (capture loss)"),
            ("icrc_unchecked", I64, "RoCE: packets whose invariant CRC could not be checked (cut by the snap length)"),
            ("icrc_verified", BOOL, "RoCE: some packet's invariant CRC verified; false: none did (a capture tool that "
                                    "rewrites frames or cuts them short), claimed on its transport headers' structure "
                                    "(decoders/protocols/roce/decoder.py)"),
            ("ecn_ce_packets", I64, "RoCE: packets marked ECN congestion experienced"),
            ("unmatched_responses", I64, "RoCE: READ responses without a request seen"),
            ("roce_version", I32, "RoCE: 1 (ethertype 0x8915) or 2 (UDP 4791)"),
            ("transport", STR, "RoCE: the transport of the opcodes seen (RC, UC, UD, ...)"),
            ("path_mtu_bytes", I32, "RoCE: the path MTU: the payload of a FIRST or MIDDLE packet"),
            ("udp_src_ports", LIST_I64, "RoCEv2: the UDP source ports of its packets, ascending (the entropy "
                                        "ECMP hashes on)"),
            ("udp_src_port_packets", LIST_I64, "RoCEv2: its packets from each of those ports"),
            ("cnp_times_ns", LIST_I64, "RoCE: when each of its CNPs was captured (the capture's clock)"),
            ("nak_times_ns", LIST_I64, "RoCE: when each of its NAKs was captured"),
            ("retransmitted_times_ns", LIST_I64, "RoCE: when each of its retransmitted packets was captured"),
        ]),
    ),
    "messages": (
        ("local_world_size", [
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
        ]),
        ("nccl_proto", [
            ("icrc_verified", BOOL, "RoCE: its stream's icrc_verified (streams.parquet)"),
        ]),
    ),
}
