"""Chakra execution traces (analysis.export_chakra), read back by Chakra itself.

The reader is MLCommons' own release (`mlc-chakra`): its generated et_def_pb2 and the varint framing reader
(protolib.decodeMessage) its tools use — nothing shared with dlcsniff's writer, whose schema is built from
the published field numbers. The real MXNet jobs in pcaps/ are checked against what each node's ps-lite logged
(PS_VERBOSE=2) and what the workload recorded; collectives against a hand-built collectives.parquet.
"""
from __future__ import annotations

import collections

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dlcsniff.analysis import build_records, load_dataset, load_job_model
from dlcsniff.analysis.export_chakra import write_chakra_traces
from dlcsniff.analysis.iterations import worker_iterations
from dlcsniff.decoders.output import write_decode_output
from dlcsniff.decoders.schema import table_from_columns
from dlcsniff.decoders.job import decode_paths
from dlcsniff.cli import app
from tests.conftest import PCAPS, capture_cut_before
from tests.support.groundtruth import load_job

try:
    from chakra.schema.protobuf import et_def_pb2 as chakra_pb
    from chakra.src.third_party.utils.protolib import decodeMessage
except ImportError as exc:   # a set-up bug, not a reason to skip
    raise ImportError("Chakra's own reader is missing: `pip install --no-deps mlc-chakra==1.0.0` (make setup)") from exc

JOBS = ["mxnet_sync", "mxnet_async", "mxnet_sparse", "mxnet_sync_large"]
SEND, RECV = chakra_pb.COMM_SEND_NODE, chakra_pb.COMM_RECV_NODE
COMP, COLL = chakra_pb.COMP_NODE, chakra_pb.COMM_COLL_NODE
K_EMPTY = 2**31 - 1


def read_et(path):
    """(GlobalMetadata, [Node]) as Chakra's tools read an .et file."""
    with open(path, "rb") as et:
        metadata = chakra_pb.GlobalMetadata()
        assert decodeMessage(et, metadata), f"{path}: no GlobalMetadata"
        nodes = []
        while True:
            node = chakra_pb.Node()
            if not decodeMessage(et, node):
                break
            nodes.append(node)
        assert et.tell() == path.stat().st_size, f"{path}: bytes left after the last node"
    return metadata, nodes


def attributes(message) -> dict:
    """name → (oneof field used, value)."""
    return {attr.name: (attr.WhichOneof("value"), getattr(attr, attr.WhichOneof("value"))) for attr in message.attr}


def value(message, name):
    return attributes(message)[name][1]


@pytest.fixture(scope="module", params=JOBS)
def exported(request, tmp_path_factory, decoded_job):
    root = tmp_path_factory.mktemp(request.param)
    decode_dir = decoded_job(request.param)
    written = write_chakra_traces(load_job_model(decode_dir), root / "et")
    files = {file.rank: read_et(file.path) for file in written.files}
    return load_job(PCAPS / request.param), decode_dir, written, files


def test_one_file_per_worker_and_server_each_a_metadata_then_nodes(exported):
    job, decode_dir, written, files = exported
    kv_nodes = [node for node in job.nodes if node["role"] in ("worker", "server")]
    assert sorted(files) == list(range(len(kv_nodes)))
    assert sorted(path.name for path in written.prefix.parent.iterdir()) == sorted(
        [f"{decode_dir.name}.{rank}.et" for rank in files] + ["manifest.json"])
    for rank, (metadata, nodes) in files.items():
        assert metadata.version == "1.0.0"
        assert value(metadata, "rank") == rank and value(metadata, "world_size") == len(kv_nodes)
        assert len(nodes) == written.files[rank].nodes > 0
        ids = [node.id for node in nodes]
        assert len(set(ids)) == len(ids)
        for node in nodes:
            assert node.type in (SEND, RECV, COMP)
            assert attributes(node)["is_cpu_op"] == ("bool_val", False)
            # written in dependency order: every parent is in the file, before its child
            assert all(parent < node.id and parent in ids for parent in list(node.data_deps) + list(node.ctrl_deps))


def check_sends_pair_with_receipts(files: dict) -> int:
    """Every SEND has exactly one RECV with the same comm_src, comm_dst, comm_tag and comm_size in the other
    rank's file (else a replay waits for ever), with the attribute types ASTRA-sim reads; returns the pairs."""
    sends, recvs = collections.Counter(), collections.Counter()
    for rank, (_, nodes) in files.items():
        for node in nodes:
            if node.type not in (SEND, RECV):
                continue
            found = attributes(node)
            assert {name: found[name][0] for name in ("comm_src", "comm_dst", "comm_tag", "comm_size")} == {
                "comm_src": "int32_val", "comm_dst": "int32_val", "comm_tag": "int32_val", "comm_size": "int64_val"}
            message = tuple(found[name][1] for name in ("comm_src", "comm_dst", "comm_tag", "comm_size"))
            assert message[2] >= 0 and message[3] > 0 and message[0] != message[1]
            if node.type == SEND:
                assert message[0] == rank
                sends[message] += 1
            else:
                assert message[1] == rank
                recvs[message] += 1
    assert sends == recvs and max(sends.values()) == 1
    return len(sends)


def test_send_and_recv_carry_the_attributes_astra_sim_reads_and_pair_up_across_ranks(exported):
    assert check_sends_pair_with_receipts(exported[3]) > 0


def test_a_capture_that_stopped_early_leaves_out_the_messages_it_missed(tmp_path):
    """worker0's capture cut in the middle of training: what the servers received from it (and sent it)
    afterwards has no other end; it is left out and counted, and every message written still pairs up."""
    job = load_job(PCAPS / "mxnet_sync")
    cut_ns = job.records["worker0"]["batches"][5]["start_ns"]
    cut = capture_cut_before(job.capture_path("worker0"), cut_ns, tmp_path / "captures" / "worker0.pcap")
    captures = [job.capture_path(node["name"]) for node in job.nodes if node["name"] != "worker0"] + [cut]
    write_decode_output(decode_paths(captures), tmp_path / "decoded")
    written = write_chakra_traces(load_job_model(tmp_path / "decoded"), tmp_path / "et")
    files = {file.rank: read_et(file.path) for file in written.files}
    check_sends_pair_with_receipts(files)

    messages = pq.read_table(tmp_path / "decoded" / "messages.parquet").to_pandas()
    worker0 = job.node("worker0")["pslite_id"]
    kv = messages[messages["control_cmd"].isna() & messages["sender_role"].isin(["worker", "server"])
                  & messages["recver_role"].isin(["worker", "server"])]
    with_worker0 = kv[(kv["sender_id"] == worker0) | (kv["recver_id"] == worker0)]
    seen_by_worker0 = (with_worker0["capture"] == "worker0").sum()
    assert written.losses["records_without_other_end"] == len(with_worker0) - 2 * seen_by_worker0 > 0


def test_messages_are_the_ones_each_node_logged(exported):
    """Per rank, direction and peer: as many SEND/RECV nodes as ps-lite logged push/pull/command messages."""
    job, _, written, files = exported
    workers = sum(node["role"] == "worker" for node in job.nodes)
    rank_of = {node["pslite_id"]: node["rank"] + (workers if node["role"] == "server" else 0)
               for node in job.nodes if node["role"] in ("worker", "server")}
    for node in job.nodes:
        if node["role"] not in ("worker", "server"):
            continue
        log = job.log(node["name"])
        log = log[log["control_cmd"].isna().to_numpy()]
        own = rank_of[node["pslite_id"]]
        peer = np.where(log["direction"] == "send", log["recver_id"], log["sender_id"])
        logged = collections.Counter((direction, rank_of[int(p)]) for direction, p in zip(log["direction"], peer))
        _, nodes = files[own]
        seen = collections.Counter(("send", value(n, "comm_dst")) if n.type == SEND else ("recv", value(n, "comm_src"))
                                   for n in nodes if n.type in (SEND, RECV))
        assert seen == logged, node["name"]
    assert written.losses["records_without_other_end"] == 0


def test_dependencies_follow_the_dlc_trace(exported):
    job, _, _, files = exported
    workers = sum(node["role"] == "worker" for node in job.nodes)
    for rank, (_, nodes) in files.items():
        by_id = {node.id: node for node in nodes}
        for node in nodes:
            parents = [by_id[parent] for parent in node.data_deps]
            found = attributes(node)
            if rank < workers and node.type == RECV and "tensor_key" in found:
                # a response depends on its request: to that server, for that tensor
                assert any(p.type == SEND and value(p, "comm_dst") == value(node, "comm_src")
                           and value(p, "tensor_key") == value(node, "tensor_key") for p in parents), node.name
            if rank < workers and node.type == SEND and found.get("iteration", ("", -1))[1] >= 0 and \
                    node.name.startswith("Push_Send_Worker"):
                assert any(p.type == COMP for p in parents), node.name   # the gradient it carries
            if rank >= workers and node.type == SEND:
                assert any(p.type == RECV and value(p, "comm_src") == value(node, "comm_dst") or p.type == COMP
                           for p in parents) or "tensor_key" not in found, node.name
            if node.type == COMP:
                assert node.duration_micros >= 1
        worker_computations = [node for node in nodes if node.type == COMP and rank < workers]
        for earlier, later in zip(worker_computations, worker_computations[1:]):
            assert list(later.ctrl_deps) == [earlier.id]      # one compute stream, in program order


def test_worker_computation_adds_up_to_the_iteration_phases(exported):
    """The COMP nodes of a worker's iteration last its computation (phase 1 + phase 2) and lie inside the
    batch the workload itself timed."""
    job, decode_dir, _, files = exported
    iterations = worker_iterations(build_records(load_dataset(decode_dir)))
    checked = 0
    for row in iterations.itertuples():
        _, nodes = files[row.worker_rank]
        mine = [n for n in nodes if n.type == COMP and value(n, "iteration") == row.iteration]
        assert mine, (row.worker_rank, row.iteration)
        if np.isfinite(row.computation_s):
            total_us = sum(n.duration_micros for n in mine)
            assert abs(total_us - row.computation_s * 1e6) <= len(mine)
            checked += 1
    assert checked >= len(iterations) // 2


def _write_empty_tables(decode_dir):
    """A decode directory holding only empty messages and nodes tables (what an output without ps-lite has)."""
    decode_dir.mkdir(parents=True, exist_ok=True)
    for name in ("messages", "nodes"):
        pq.write_table(table_from_columns(name, {}), decode_dir / f"{name}.parquet")


def _collective_job(tmp_path):
    """A decode directory with no ps-lite traffic and the collectives of two Gloo ranks."""
    decode_dir = tmp_path / "gloo_job"
    _write_empty_tables(decode_dir)
    ms = 1_000_000
    rows = [  # local rank, kind, seq, first, last, tensor bytes, peers (decoders/schema.py: collectives)
        (0, "all_reduce", 0, 10 * ms, 12 * ms, 4 << 20, [1]), (1, "all_reduce", 0, 10 * ms, 12 * ms, 4 << 20, [0]),
        (0, "send", 7, 15 * ms, 16 * ms, 4096, [1]), (1, "recv", 7, 15 * ms, 16 * ms, 4096, [0]),
        (0, "all_to_all", 1, 20 * ms, 21 * ms, 1 << 16, [1]), (1, "all_to_all", 1, 20 * ms, 21 * ms, 1 << 16, [0]),
        (1, "barrier", 2, 21 * ms, 21 * ms + 500, 0, [0]),
    ]
    columns = ["local_rank", "kind", "seq", "ts_first_ns", "ts_last_ns", "tensor_bytes", "peers"]
    frame = pd.DataFrame(rows, columns=columns)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), decode_dir / "collectives.parquet")
    return decode_dir


def test_collectives_become_comm_coll_nodes_chained_through_computation(tmp_path):
    written = write_chakra_traces(load_job_model(_collective_job(tmp_path)), tmp_path / "et")
    files = {file.rank: read_et(file.path)[1] for file in written.files}
    assert sorted(files) == [0, 1]
    zero = files[0]
    assert [n.type for n in zero] == [COLL, COMP, SEND, COMP, COLL]
    assert attributes(zero[0])["comm_type"] == ("int64_val", chakra_pb.ALL_REDUCE)
    assert value(zero[0], "comm_size") == 4 << 20 and value(zero[4], "comm_type") == chakra_pb.ALL_TO_ALL
    assert [n.duration_micros for n in zero if n.type == COMP] == [3000, 4000]
    assert [(value(zero[2], name)) for name in ("comm_src", "comm_dst", "comm_tag")] == [0, 1, 7]
    recv = next(n for n in files[1] if n.type == RECV)
    assert [(value(recv, name)) for name in ("comm_src", "comm_dst", "comm_tag", "comm_size")] == [0, 1, 7, 4096]
    for nodes in files.values():
        for parent, child in zip(nodes, nodes[1:]):
            assert list(child.data_deps) == [parent.id]
    # the barrier follows the all_to_all within a microsecond: no computation between them
    assert [n.type for n in files[1]][-2:] == [COLL, COLL]
    assert value(files[1][-1], "comm_type") == chakra_pb.BARRIER


def test_cli_export_chakra_and_its_errors(tmp_path):
    runner = CliRunner()
    decode_dir = _collective_job(tmp_path)
    result = runner.invoke(app, ["export", str(decode_dir), "--format", "chakra", "--out", str(tmp_path / "et")])
    assert result.exit_code == 0, result.output
    assert "gloo_job.0.et" in result.output and (tmp_path / "et" / "gloo_job.1.et").exists()
    for args in (["export", str(tmp_path / "missing"), "--format", "chakra", "--out", str(tmp_path / "x")],
                 ["export", str(decode_dir), "--format", "chakra", "--out", str(decode_dir / "collectives.parquet")]):
        result = runner.invoke(app, args)
        assert result.exit_code == 1
        assert result.output.startswith("error:") and result.output.count("\n") <= 2, result.output
    empty = tmp_path / "empty"
    _write_empty_tables(empty)
    result = runner.invoke(app, ["export", str(empty), "--format", "chakra", "--out", str(tmp_path / "y")])
    assert result.exit_code == 1 and "nothing to export" in result.output
