"""NCCL collectives inferred from the wire, on generated ring all-reduces (tests/nccl_coll_gen.py: NCCL's
ring algorithm simulated over the socket transport and net-IB/RoCE, written from the protocol
description). The truth is what the simulation did: which operations, of which tensor size, when.

Captures go through the real capture reader and TCP reassembler (tests/nccl_driver.py), and one through
the whole decode pipeline into collectives.parquet's table.
"""
from __future__ import annotations

import pandas as pd
import pytest

from dlcsniff.decoders.nccl_collectives import IDLE_GAP_NS, collectives_from_transfers
from dlcsniff.decoders.protocols.nccl_socket import NcclSocketCaptureDecoder
from dlcsniff.decoders.job import decode_paths
from dlcsniff.decoders.protocols.roce import RoceCaptureDecoder
from tests.support.nccl_coll_gen import RingCapture, ring_capture, roce_ring_capture, split
from tests.support.protocol_driver import run_decoders

COMPUTE_GAP_US = 20_000          # generated idle time between operations: far above IDLE_GAP_NS


def _collectives(capture: RingCapture, decoder) -> pd.DataFrame:
    (rows,), _ = run_decoders(capture.path, [decoder])
    return pd.DataFrame(rows.collectives)


def _check_found(found: pd.DataFrame, capture: RingCapture, *, ranks_known: bool = False) -> None:
    """Every generated operation, on every rank, in order, of the right kind, size and time."""
    k = len(capture.hosts)
    assert sorted(found["local_address"].unique()) == sorted(capture.hosts)
    for rank, host in enumerate(capture.hosts):
        ops = found[found["local_address"] == host].sort_values("ts_first_ns")
        assert list(ops["seq"]) == [op.seq for op in capture.operations]
        assert set(ops["kind"]) == {"all_reduce"} and set(ops["algorithm"]) == {"ring"}
        assert set(ops["world_size"]) == {k}
        assert ops["complete"].all()
        for op, row in zip(capture.operations, ops.itertuples()):
            assert abs(row.tensor_bytes - op.tensor_bytes) <= 0.02 * op.tensor_bytes, (host, op, row)
            assert op.ts_first_us * 1000 < row.ts_first_ns <= row.ts_last_ns <= op.ts_last_us * 1000
            # a ring rank sends 2(k-1) chunks of about N/k
            assert abs(row.payload_bytes_sent - 2 * (k - 1) * op.tensor_bytes / k) <= 2 * (k - 1) * 8
        if ranks_known:
            assert set(ops["local_rank"]) == {rank}
            assert {tuple(peers) for peers in ops["peers"]} == {tuple(sorted({(rank - 1) % k, (rank + 1) % k}))}


@pytest.mark.parametrize(("world_size", "channels", "nsocks", "sizes"), [
    (2, 1, 0, [1 << 20, 4000, 300_004]),
    (3, 2, 2, [96 << 10, 1_500_000, 120_000]),
    (4, 1, 0, [256 << 10, 1_000_000, 40_000, 7_776]),
])
def test_socket_ring_all_reduces_found(tmp_path, world_size, channels, nsocks, sizes):
    capture = ring_capture(tmp_path / "ring.pcap", world_size=world_size, tensor_sizes=sizes,
                           idle_gap_us=COMPUTE_GAP_US, channels=channels, nsocks=nsocks)
    _check_found(_collectives(capture, NcclSocketCaptureDecoder()), capture)


def test_roce_ring_all_reduces_found_with_ranks(tmp_path):
    capture = roce_ring_capture(tmp_path / "roce.pcap", world_size=3, tensor_sizes=[65536, 200_000, 24_000],
                                idle_gap_us=COMPUTE_GAP_US)
    _check_found(_collectives(capture, RoceCaptureDecoder()), capture, ranks_known=True)


def test_pipeline_writes_the_inferred_collectives(tmp_path):
    capture = ring_capture(tmp_path / "ring.pcap", world_size=2, tensor_sizes=[200_000, 64_000],
                           idle_gap_us=COMPUTE_GAP_US)
    table = decode_paths([capture.path], workers=0).tables["collectives"].to_pandas()
    table = table[table["protocol"] == "nccl_socket"]
    assert len(table) == 2 * len(capture.operations)
    assert set(table["kind"]) == {"all_reduce"} and set(table["capture"]) == {"ring"}
    assert sorted(table["tensor_bytes"]) == [64_000, 64_000, 200_000, 200_000]


def test_operations_closer_than_the_idle_gap_merge(tmp_path):
    """The limit: without a pause longer than `idle_gap_ns` between them, operations are one."""
    sizes = [300_000, 100_000, 40_000]
    capture = ring_capture(tmp_path / "ring.pcap", world_size=2, tensor_sizes=sizes, idle_gap_us=300)
    merged = _collectives(capture, NcclSocketCaptureDecoder())
    assert 300_000 < IDLE_GAP_NS
    assert list(merged["seq"]) == [0, 0] and set(merged["kind"]) == {"all_reduce"}
    assert list(merged["tensor_bytes"]) == [sum(sizes)] * 2
    _check_found(_collectives(capture, NcclSocketCaptureDecoder(idle_gap_ns=150_000)), capture)


def test_a_lost_segment_marks_only_its_operation_incomplete(tmp_path):
    # nsocks 0: an isend of more than one segment is one control-socket write; its second data frame
    # (frames alternate data and ACK) is payload only, so the capture loses bytes of that message alone.
    capture = ring_capture(tmp_path / "ring.pcap", world_size=2, tensor_sizes=[200_000, 300_000, 100_000],
                           idle_gap_us=COMPUTE_GAP_US, drop=lambda ops: {ops[1].isend_frames[3] + 2})
    found = _collectives(capture, NcclSocketCaptureDecoder())
    assert list(found["seq"]) == [0, 1, 2] * 2
    assert list(found["complete"]) == [True, False, True] * 2
    assert set(found["kind"]) == {"all_reduce"}


def test_unbalanced_traffic_is_unknown_and_world_size_can_be_given():
    """A node that sends much more than it receives is no ring all-reduce: kind unknown, no tensor size;
    a given world size replaces the number of nodes seen."""
    transfers = pd.DataFrame({"sender": ["a", "b", "a"], "receiver": ["b", "a", "b"],
                              "sender_rank": [None, None, None], "receiver_rank": [None, None, None],
                              "ts_first_ns": [0, 10, 20], "ts_last_ns": [5, 15, 25],
                              "size_bytes": [1000, 10, 1000], "payload_bytes": [None, 10, 1000],
                              "complete": [True, True, True]})
    found = collectives_from_transfers(transfers, protocol="nccl_socket", world_size=8)
    assert list(found["local_address"]) == ["a", "b"]
    assert set(found["kind"]) == {"unknown"} and found["algorithm"].isna().all()
    assert found["tensor_bytes"].isna().all() and set(found["world_size"]) == {8}
    assert list(found["payload_bytes_sent"]) == [2000, 10]


def test_a_node_seen_only_sending_is_not_segmented():
    """A neighbour's traffic seen from one node's capture is partial: only nodes seen both ways count."""
    transfers = pd.DataFrame({"sender": ["a", "c"], "receiver": ["b", "a"], "sender_rank": [0, 2],
                              "receiver_rank": [1, 0], "ts_first_ns": [0, 0], "ts_last_ns": [9, 9],
                              "size_bytes": [4 * 100, 4 * 100], "payload_bytes": [400, 400],
                              "complete": [True, True]})
    found = collectives_from_transfers(transfers, protocol="roce")
    assert list(found["local_address"]) == ["a"]
    assert list(found["peers"]) == [[1, 2]] and list(found["world_size"]) == [3]
    # sent == received: a 3-rank ring all-reduce moving 2/3 of the tensor each way
    assert list(found["tensor_bytes"]) == [300]


def test_split_worked_out_by_hand():
    assert split(40, 3) == [16, 12, 12] and split(12, 4) == [4, 4, 4, 0]
