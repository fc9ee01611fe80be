"""The DLC trace files: the paper's record format, numbering and dependencies, on synthetic and hand-built
jobs (the real captures are checked in test_analysis_real.py)."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from dlcsniff.analysis import DLC_HEADER, build_records, read_dlc, write_dlc
from dlcsniff.analysis.load import NODE_COLUMNS, Dataset
from tests.bench.analysis import SyntheticJob, synthetic_messages
from tests.support.pslite_rows import S0, S1, W0, W1, dataset, exchange

OP_ID = re.compile(r"^-?\d+-\d+-(s|w)\d+$")
ID_LIST = re.compile(r"^\((-?\d+-\d+-(s|w)\d+)(,-?\d+-\d+-(s|w)\d+)*\)$")
DEP_TYPES = {  # operation → the dep_Type its records may have
    "Push_Send_Worker": {0, 4}, "Push_Recv_Worker": {1}, "Pull_Send_Worker": {0, 2}, "Pull_Recv_Worker": {2, 3},
    "Push_Recv_Server": {0}, "Push_Send_Server": {1}, "Pull_Recv_Server": {0}, "Pull_Send_Server": {2, 3},
}


@pytest.fixture(scope="module", params=[True, False], ids=["fused", "push_then_pull"])
def synthetic_files(request, tmp_path_factory):
    job = SyntheticJob(workers=3, servers=2, keys=4, iterations=5, fused=request.param)
    trace = build_records(Dataset(synthetic_messages(job), pd.DataFrame(columns=list(NODE_COLUMNS)), "synthetic"))
    out = tmp_path_factory.mktemp("dlc")
    return job, trace, write_dlc(trace, out), out


def test_one_file_per_node_with_the_exact_header(synthetic_files):
    job, _, files, out = synthetic_files
    names = sorted(path.name for path in out.iterdir())
    assert names == sorted([f"worker{r}.txt" for r in range(job.workers)] + [f"server{r}.txt" for r in
                                                                               range(job.servers)] + ["scheduler.txt"])
    for written in files:
        lines = written.path.read_text().splitlines()
        banner = [line for line in lines if line.startswith("#")]
        body = lines[len(banner):]
        assert lines[:len(banner)] == banner                       # the banner comes first, then the header
        assert body[0] == DLC_HEADER
        assert all(len(line.split(" ")) == 12 for line in body[1:])
        assert f"this node's own capture ({written.captures})" in banner[1]
        assert len(body) - 1 == written.records


def test_records_are_numbered_in_time_order_with_valid_fields(synthetic_files):
    job, _, files, _ = synthetic_files
    ranks = job.workers + job.servers + 1
    for written in files:
        table = read_dlc(written.path)
        assert list(table.columns) == DLC_HEADER.split()
        assert list(table["ID"]) == list(range(len(table)))
        times = table["time_sec"] * 1_000_000 + table["time_usec"]
        assert (np.diff(times) >= 0).all()
        assert table["src"].between(0, ranks - 1).all() and table["dst"].between(0, ranks - 1).all()
        kv = table[table["Operation"].isin(DEP_TYPES)]
        assert kv["OP_ID"].map(OP_ID.match).notna().all()
        for operation, allowed in DEP_TYPES.items():
            assert set(kv.loc[kv["Operation"] == operation, "dep_Type"]) <= allowed, operation
        independent = table["dep_Type"] == 0
        assert (table.loc[independent, "IDdep"] == "-1").all() and (table.loc[independent, "dTime"] == 0).all()


def test_worker_trace_numbers_dependencies_and_times(synthetic_files):
    job, _, files, _ = synthetic_files
    worker = read_dlc(next(f.path for f in files if f.node == "worker rank 1"))
    key = worker["OP_ID"].str.split("-").str[0].astype(int)
    op_num = worker["OP_ID"].str.split("-").str[1].astype(int)
    receipts = worker[worker["Operation"] == "Pull_Recv_Worker"]
    training = receipts[op_num[receipts.index] >= 4]
    # a Pull_Recv depends on the request that asked for the values, dTime later (µs)
    expected = (job.rtt_ns + key[training.index] * job.rtt_step_ns - (0 if job.fused else 2 * job.ack_ns)) / 1e3
    assert (training["dTime"] == expected.round().astype(int)).all()
    assert set(training["dep_Type"]) == ({2} if job.fused else {3})
    # Dep_PP: -15 initialisation, 2t+1 push side, 2t+2 pull side; op numbers 4(t+1) + slot
    iteration = op_num // 4 - 1
    pushes = worker[worker["Operation"] == "Push_Send_Worker"]
    assert (pushes["Dep_PP"] == 2 * iteration[pushes.index] + 1).all()
    assert (receipts.loc[op_num[receipts.index] < 4, "Dep_PP"] == -15).all()
    assert (training["Dep_PP"] == 2 * iteration[training.index] + 2).all()
    # a training push depends on that tensor's values of the previous round, one list per server holding it
    later = pushes[iteration[pushes.index] >= 1]
    server = later["OP_ID"].str.split("-").str[2]
    assert (later["IDdep"] == "(" + key[later.index].astype(str) + "-" + (op_num[later.index] - 1).astype(str)
            + "-" + server + ")").all()
    assert (later["dTime"] == ((job.period_ns - job.rtt_ns - key[later.index] * job.rtt_step_ns) / 1e3)).all()
    assert (later["dep_Type"] == 4).all()


def test_sync_server_answers_depend_on_every_workers_push(synthetic_files):
    job, trace, files, _ = synthetic_files
    assert trace.mode == "sync"
    server = read_dlc(next(f.path for f in files if f.node == "server rank 0"))
    answers = server[server["Operation"] == ("Pull_Send_Server" if job.fused else "Push_Send_Server")]
    training = answers[answers["Dep_PP"] > 0]
    assert training["IDdep"].map(ID_LIST.match).notna().all()
    lists = training["IDdep"].str.strip("()").str.split(",")
    assert (lists.map(len) == job.workers).all()
    assert (lists.map(lambda ids: [i.split("-")[2] for i in ids]) == [[f"w{r}" for r in range(job.workers)]]
            * len(lists)).all()
    # dTime from the last worker's push receipt: the update overhead for the first answer (to worker 0),
    # then each later worker's skew more
    key = training["OP_ID"].str.split("-").str[0].astype(int)
    worker = training["OP_ID"].str.split("-").str[2].str[1:].astype(int)
    answer = (job.rtt_ns + key * job.rtt_step_ns) if job.fused else job.ack_ns
    update = answer - 2 * job.wire_ns - (job.workers - 1) * job.worker_skew_ns
    assert (training["dTime"] == np.round((update + worker * job.worker_skew_ns) / 1e3).astype(int)).all()


def test_a_tensor_split_across_servers_gives_one_to_many_worker_dependencies(tmp_path):
    rows = []
    for stamp, (push, pull) in enumerate(((False, True), (True, True), (True, True)), start=1):
        for worker, capture in ((W0, "w0"), (W1, "w1")):
            for server, server_capture in ((S0, "s0"), (S1, "s1")):      # tensor 7's two parts
                rows += exchange(capture, server_capture, stamp * 10_000_000 + (worker - 9) * 100_000, worker,
                                 server, stamp=stamp, key=7, push=push, pull=pull)
    files = write_dlc(build_records(dataset(rows)), tmp_path)
    worker = read_dlc(next(f.path for f in files if f.node == "worker rank 0"))
    pushes = worker[worker["Operation"] == "Push_Send_Worker"]
    assert list(pushes["IDdep"]) == ["(7-3-s0,7-3-s1)"] * 2 + ["(7-7-s0,7-7-s1)"] * 2
    assert set(pushes["dep_Type"]) == {4}


def test_peers_vantage_and_unanswerable_records_are_said(tmp_path):
    rows = (exchange("w0", "s0", 0, W0, S0, stamp=1, key=0, push=False, pull=True)
            + [row for row in exchange("w0", "s0", 1_000_000, W0, S0, stamp=2, key=0, push=True, pull=True)
               if not row["request"]])
    files = write_dlc(build_records(dataset(rows, without=("w0",))), tmp_path)
    worker = next(f for f in files if f.node == "worker rank 0")
    assert worker.vantage == "peers"
    banner = worker.path.read_text().splitlines()[1]
    assert banner == ("# vantage: its peers' captures (s0, sched); the dataset has no capture of this node, so times "
                      "are when the peers saw each message")
    table = read_dlc(worker.path)
    # the response whose request no capture saw is iteration 0's (its echoed flags and timestamp say it was a
    # push-pull), but has nothing to depend on
    assert list(table["OP_ID"]) == ["0-2-s0", "0-3-s0", "0-7-s0"]
    assert list(table["Dep_PP"]) == [-15, -15, 2]
    assert list(table["IDdep"]) == ["-1", "0-2-s0", "-1"]


def test_nodes_and_captures_are_never_named_alike(decoded_job, tmp_path):
    """mxnet_sync's worker0.pcap.gz holds ps-lite worker rank 1 (the scheduler ranks nodes by registration, as the
    job's own record says): dlc's table and each file's banner name the node by role and rank, its capture by
    its file, and no node is called what a capture is."""
    import json

    from typer.testing import CliRunner

    from dlcsniff.cli import app
    from tests.conftest import PCAPS
    from tests.support.groundtruth import load_job
    result = CliRunner().invoke(app, ["dlc", str(decoded_job("mxnet_sync")), "--out", str(tmp_path / "dlc"), "--json"])
    assert result.exit_code == 0, result.output
    files = {entry["file"]: entry for entry in json.loads(result.stdout)["files"]}
    # ground truth: the rank ps-lite gave each node (its PS_VERBOSE log), against the capture taken on it
    for node in load_job(PCAPS / "mxnet_sync").nodes:
        role, rank, capture = node["role"], node["rank"], node["name"]
        if role == "scheduler":
            continue
        mine = files[f"{role}{rank}.txt"]
        assert mine["node"] == f"{role} rank {rank}" and mine["captures"] == capture
        banner = (tmp_path / "dlc" / f"{role}{rank}.txt").read_text().splitlines()[:2]
        assert banner[0].startswith(f"# dlcsniff DLC trace of {role} rank {rank} (")
        assert banner[1] == f"# vantage: this node's own capture ({capture}.pcap.gz)"
    assert any(entry["node"].replace(" rank ", "") != entry["captures"] for entry in files.values())
    table = CliRunner().invoke(app, ["dlc", str(decoded_job("mxnet_sync")), "--out", str(tmp_path / "again")])
    assert "│ worker rank 1 │" in table.stdout and "own capture worker0.pcap.gz" in table.stdout
