"""analysis/ on the real MXNet 1.9.1 captures in pcaps/, against what the job itself recorded: ps-lite's
PS_VERBOSE=2 logs (every message each node sent and received) and the workload's own record (its batches
and every kvstore call it made).

Each job is decoded once per session (the real `dlcsniff decode` pipeline) into a temporary directory.
"""
from __future__ import annotations

import base64
import collections
import json
import re

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from dlcsniff.analysis import DLC_HEADER, build_records, load_dataset, read_dlc, statistics, write_dlc
from dlcsniff.analysis.iterations import ITERATION_COLUMNS
from dlcsniff.analysis.overheads import KEY_COLUMNS
from dlcsniff.decoders.output import write_decode_output
from dlcsniff.decoders.job import decode_paths
from dlcsniff.cli import app
from tests.conftest import PCAPS
from tests.support.decoded import on_reference_clock
from tests.support.groundtruth import load_job, mxnet_jobs

JOBS = mxnet_jobs()
OP_ID = re.compile(r"^-?\d+-\d+-(s|w)\d+$")
ID_LIST = re.compile(r"^\((-?\d+-\d+-(s|w)\d+)(,-?\d+-\d+-(s|w)\d+)*\)$")
TRAINING_CALLS = ("pushpull", "push")


@pytest.fixture(scope="session")
def decoded(tmp_path_factory, decoded_job) -> dict:
    """job name → its decode output directory (and one job decoded without a worker's capture)."""
    root = tmp_path_factory.mktemp("decoded")
    out = {job: decoded_job(job) for job in JOBS}
    job = load_job(PCAPS / "mxnet_async")
    kept = [job.capture_path(node["name"]) for node in job.nodes if node["name"] != "worker0"]
    write_decode_output(decode_paths(kept), root / "mxnet_async_without_worker0")
    out["mxnet_async_without_worker0"] = root / "mxnet_async_without_worker0"
    return out


@pytest.fixture(scope="module", params=JOBS)
def analysed(request, decoded, tmp_path_factory):
    job = load_job(PCAPS / request.param)
    trace = build_records(load_dataset(decoded[request.param]))
    files = write_dlc(trace, tmp_path_factory.mktemp(f"dlc_{request.param}"))
    return job, trace, statistics(trace=trace), files, decoded[request.param]


def file_name(node: dict) -> str:
    return "scheduler.txt" if node["role"] == "scheduler" else f"{node['role']}{node['rank']}.txt"


def logged_operations(job, name: str) -> dict[str, int]:
    """What ps-lite's log says the node sent and received, named as the paper's operations. The log has no
    pull flag: a response with values is a pull response (MXNet 1.9.1's push-pull response included)."""
    log = job.log(name)
    role = job.node(name)["role"]
    send = log["direction"].eq("send").to_numpy()
    request = log["request"].astype(bool).to_numpy()
    push = log["push"].fillna(False).astype(bool).to_numpy()
    command = log["simple_app"].fillna(False).astype(bool).to_numpy()
    control = log["control_cmd"].notna().to_numpy()
    data = ~control & ~command
    values = (log["data_sizes"].map(len) > 0).to_numpy()
    if role == "scheduler":
        found = collections.Counter()
        for direction, cmd in zip(log.loc[control, "direction"], log.loc[control, "control_cmd"]):
            name_ = "_".join(part.capitalize() for part in cmd.split("_"))
            found[f"{name_}_{'Send' if direction == 'send' else 'Recv'}_Scheduler"] += 1
            # ps-lite's Van::Stop sends TERMINATE to itself past the logging Send(): only the receipt is logged
            if cmd == "TERMINATE" and direction == "recv":
                found["Terminate_Send_Scheduler"] += 1
        return dict(found)
    role_send, role_recv = (send, ~send) if role == "worker" else (~send, send)
    side = "Worker" if role == "worker" else "Server"
    counts = {
        f"Push_{'Send' if role == 'worker' else 'Recv'}_{side}": role_send & data & request & push,
        f"Pull_{'Send' if role == 'worker' else 'Recv'}_{side}": role_send & data & request & ~push,
        f"Push_{'Recv' if role == 'worker' else 'Send'}_{side}": role_recv & data & ~request & push & ~values,
        f"Pull_{'Recv' if role == 'worker' else 'Send'}_{side}": role_recv & data & ~request & (~push | values),
    }
    if role == "worker":
        counts.update(SendCom_To_Servers=send & command & request, RecvCom_From_Servers=~send & command & ~request)
    else:
        counts.update(RecvCom_From_Workers=~send & command & request, SendCom_To_Workers=send & command & ~request)
    return {operation: int(mask.sum()) for operation, mask in counts.items() if mask.sum()}


def test_dlc_record_counts_per_operation_equal_the_pslite_logs(analysed):
    job, _, _, files, _ = analysed
    written = {f.path.name: f.path for f in files}
    for node in job.nodes:
        table = read_dlc(written[file_name(node)])
        assert table["Operation"].value_counts().to_dict() == logged_operations(job, node["name"]), node["name"]


def test_each_file_comes_from_the_nodes_own_capture(analysed):
    job, trace, _, files, _ = analysed
    written = {f.path.name: f for f in files}
    for node in job.nodes:
        dlc = written[file_name(node)]
        capture = node["capture"].removesuffix(".pcap.gz")
        assert (dlc.vantage, dlc.captures) == ("own", capture)
        assert dlc.path.read_text().splitlines()[1] == f"# vantage: this node's own capture ({capture})"
    records = trace.records
    by_id = {node["pslite_id"]: node["capture"].removesuffix(".pcap.gz") for node in job.nodes}
    assert (records["capture"].astype(str) == records["node_id"].map(by_id)).all()


def test_a_node_without_its_capture_is_traced_from_its_peers(decoded, tmp_path):
    job = load_job(PCAPS / "mxnet_async")
    missing = job.node("worker0")
    trace = build_records(load_dataset(decoded["mxnet_async_without_worker0"]))
    files = {f.path.name: f for f in write_dlc(trace, tmp_path)}
    dlc = files[file_name(missing)]
    assert dlc.vantage == "peers" and "worker0" not in dlc.captures
    assert "its peers' captures" in dlc.path.read_text().splitlines()[1]
    # the servers saw every message it exchanged with them
    table = read_dlc(dlc.path)
    assert table["Operation"].value_counts().to_dict() == logged_operations(job, "worker0")


def test_iterations_equal_the_jobs_batches_and_follow_its_calls(analysed, decoded):
    job, trace, stats, _, _ = analysed
    iterations = stats.iterations
    assert tuple(iterations.columns) == ITERATION_COLUMNS
    records = trace.records
    for node in job.nodes:
        if node["role"] != "worker":
            continue
        record = job.records[node["name"]]
        mine = iterations[iterations["worker_rank"] == node["rank"]]
        assert len(mine) == job.meta["batches"] == len(record["batches"])
        assert list(mine["iteration"]) == list(range(job.meta["batches"]))
        pushes = records[(records["node_id"] == node["pslite_id"])
                         & (records["operation"] == "Push_Send_Worker")]
        for key in pushes["tensor_key"].unique():
            calls = [op["call_ns"] for op in record["operations"]
                     if op["op"] in TRAINING_CALLS and [t["key"] for t in op["tensors"]] == [key]]
            for _, part in pushes[pushes["tensor_key"] == key].groupby("server_rank"):
                training = part[part["iteration"] >= 0].sort_values("iteration")
                assert list(training["iteration"]) == list(range(len(calls)))
                # the t-th push of a tensor leaves after the job's t-th call for it (capture: µs resolution)
                assert (training["ts_ns"].to_numpy() + 1000 >= np.array(calls)).all()
                # only kv.init, by worker rank 0, pushes before training
                init = part[part["iteration"] < 0]
                assert len(init) == (1 if node["rank"] == 0 else 0)


def _independent_phases(messages: pd.DataFrame, job, node: dict) -> pd.DataFrame:
    """The paper's phases for one worker, straight from messages.parquet of its own capture, iterations
    taken from the workload's record: per (server, tensor) the last `batches` pushes are the training ones."""
    own = node["pslite_id"]
    capture = node["capture"].removesuffix(".pcap.gz")
    mine = messages[(messages["capture"] == capture) & messages["control_cmd"].isna() & ~messages["simple_app"]]
    requests = mine[(mine["sender_id"] == own) & mine["request"]].sort_values("ps_timestamp")
    iteration_of = {}
    latest = collections.defaultdict(lambda: -1)
    pushes_left = collections.Counter()
    for row in requests.itertuples():
        if row.push:
            pushes_left[(row.recver_id, row.tensor_key)] += 1
    batches = job.meta["batches"]
    push_times = collections.defaultdict(list)
    for row in requests.itertuples():
        channel = (row.recver_id, row.tensor_key)
        if row.push:
            training_index = batches - pushes_left[channel]
            pushes_left[channel] -= 1
            latest[channel] = training_index
            if training_index >= 0:
                push_times[training_index].append(row.ts_first_ns)
        iteration_of[(row.recver_id, row.ps_timestamp)] = latest[channel]
    pull_times, incomplete = collections.defaultdict(list), set()
    for row in mine[(mine["recver_id"] == own) & ~mine["request"] & mine["pull"]].itertuples():
        iteration = iteration_of[(row.sender_id, row.ps_timestamp)]
        pull_times[iteration].append(row.ts_last_ns)
        if not row.complete:
            incomplete.add(iteration)
    rows = []
    for t in range(batches):
        first_push, last_push = min(push_times[t]), max(push_times[t])
        last_pull = np.nan if t in incomplete else max(pull_times[t])
        previous = np.nan if t == 0 or t - 1 in incomplete else max(pull_times[t - 1])
        p1, p2, p3 = (first_push - previous) / 1e9, (last_push - first_push) / 1e9, (last_pull - first_push) / 1e9
        rows.append({"iteration": t, "phase1_s": p1, "phase2_s": p2, "phase3_s": p3, "overlap_ratio": p2 / (p1 + p3)})
    return pd.DataFrame(rows)


def test_overlap_ratio_recomputed_independently_from_messages(analysed):
    job, _, stats, _, decode_dir = analysed
    messages = on_reference_clock(pd.read_parquet(decode_dir / "messages.parquet"),
                                   pd.read_parquet(decode_dir / "clocks.parquet"))
    for node in job.nodes:
        if node["role"] != "worker":
            continue
        expected = _independent_phases(messages, job, node)
        found = stats.iterations[stats.iterations["worker_rank"] == node["rank"]].reset_index(drop=True)
        for column in ("phase1_s", "phase2_s", "phase3_s", "overlap_ratio"):
            np.testing.assert_allclose(found[column], expected[column], rtol=1e-9, atol=0, err_msg=column)
        assert found["overlap_ratio"].iloc[1:].notna().all()


def test_dlc_format_on_real_traces(analysed):
    job, trace, _, files, _ = analysed
    workers = job.meta["num_workers"]
    for dlc in files:
        lines = dlc.path.read_text().splitlines()
        body = [line for line in lines if not line.startswith("#")]
        assert body[0] == DLC_HEADER
        assert all(len(line.split(" ")) == 12 for line in body[1:])
        table = read_dlc(dlc.path)
        assert list(table["ID"]) == list(range(len(table)))
        assert table["dep_Type"].isin(range(5)).all()
        if dlc.node == "scheduler":
            assert table["Operation"].str.endswith("_Scheduler").all()
            continue
        assert table["OP_ID"].map(OP_ID.match).notna().all()
        lists = table[table["IDdep"].str.startswith("(")]
        assert lists["IDdep"].map(ID_LIST.match).notna().all()
        answers = table[table["Operation"].isin(["Push_Send_Server", "Pull_Send_Server"]) & (table["Dep_PP"] > 0)
                        & table["dep_Type"].isin([1, 2])]
        if dlc.node.startswith("server") and trace.mode == "sync":
            # every training answer to a push waits for all workers' pushes of that tensor
            assert len(answers) and (answers["IDdep"].str.count(",") == workers - 1).all()
        if dlc.node.startswith("server") and trace.mode == "async":
            assert len(answers) and answers["IDdep"].map(OP_ID.match).notna().all()
    if job.name == "mxnet_sync_large":
        # tensor 1 is cut in two parts, one per server: a worker's next push waits for both
        worker = read_dlc(next(f.path for f in files if f.node == "worker rank 0"))
        pushes = worker[(worker["Operation"] == "Push_Send_Worker") & worker["OP_ID"].str.startswith("1-")
                        & (worker["Dep_PP"] > 0)]
        assert (pushes["IDdep"].str.count(",") == 1).all() and len(pushes) == 2 * job.meta["batches"]


def test_server_overheads_come_from_each_servers_own_capture(analysed):
    job, trace, stats, _, _ = analysed
    keys = stats.keys
    assert tuple(keys.columns) == KEY_COLUMNS
    assert (keys["vantage"] == "own").all()
    assert (keys.groupby(["server_rank", "tensor_key"]).size() == job.meta["batches"]).all()
    assert (keys["update_overhead_us"] > 0).all()
    if trace.mode == "sync":
        assert (keys["sync_overhead_us"] >= 0).all() and (keys["pushes"] == job.meta["num_workers"]).all()
    else:
        assert keys["sync_overhead_us"].isna().all()
    # explicit pulls exist only for the row-sparse embedding; MXNet 1.9.1 push-pulls everything else
    sparse = stats.volume_keys.loc[stats.volume_keys["req_type"] == "row_sparse", "tensor_key"]
    with_search = keys.loc[keys["search_overhead_us"].notna(), "tensor_key"].unique()
    assert sorted(with_search) == sorted(sparse)


def test_cli_stats_dlc_and_a_self_contained_report(decoded, tmp_path):
    runner = CliRunner()
    decode_dir = decoded["mxnet_sparse"]
    result = runner.invoke(app, ["stats", str(decode_dir), "--out", str(tmp_path / "stats"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["iterations"]["per_worker"] == {"0": 8, "1": 8} and summary["mode"] == "sync"
    assert summary["volume"]["row_sparse_push_bytes"] > 0
    written = {path.name for path in (tmp_path / "stats").iterdir()}
    assert written == {"iterations.parquet", "keys.parquet", "sizes.parquet", "traffic.parquet",
                       "volume_iterations.parquet", "volume_keys.parquet", "requests.parquet",
                       "in_flight.parquet", "connections.parquet", "key_updates.parquet", "summary.json",
                       "manifest.json", *(f"{name}.parquet" for name in (
                           "arrivals", "arrival_spread", "link_health", "burstiness", "on_off", "incast",
                           "size_distributions", "roce_paths", "roce_collectives"))}
    assert tuple(pd.read_parquet(tmp_path / "stats" / "iterations.parquet").columns) == ITERATION_COLUMNS
    table = runner.invoke(app, ["stats", str(decode_dir), "--out", str(tmp_path / "stats"), "--force"])
    assert table.exit_code == 0 and "mean overlap ratio" in table.stdout
    dlc = runner.invoke(app, ["dlc", str(decode_dir), "--out", str(tmp_path / "dlc")])
    assert dlc.exit_code == 0 and sorted(p.name for p in (tmp_path / "dlc").iterdir()) == [
        "manifest.json", "scheduler.txt", "server0.txt", "server1.txt", "worker0.txt", "worker1.txt"]

    report = runner.invoke(app, ["report", str(decode_dir), "--out", str(tmp_path / "report.html"),
                                 "--figures", str(tmp_path / "figures")])
    assert report.exit_code == 0, report.output
    page = (tmp_path / "report.html").read_text()
    # self-contained: images are data: URIs, links go within the page, scripts are inline, nothing else loads
    sources = re.findall(r"""(?:src|href)=['"]([^'"]*)['"]""", page)
    images = [src for src in sources if src.startswith("data:image/png;base64,")]
    # the iteration figure, the server overheads and the arrival lags are PNG images
    assert len(images) == 3 and all(src.startswith("#") for src in sources if src not in images)
    assert "<script src" not in page and "<link" not in page and "default-src 'none'" in page
    embedded = {base64.b64decode(src.removeprefix("data:image/png;base64,")) for src in images}
    files = {path.read_bytes() for path in (tmp_path / "figures").glob("*.png")}
    # the other four are interactive charts in the page (the what-if curve among them)
    assert embedded < files and len(files) == 7
    assert all(png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000 for png in files)


def test_cli_errors_are_one_line(tmp_path):
    runner = CliRunner()
    for command in ("dlc", "stats", "report"):
        result = runner.invoke(app, [command, str(tmp_path), "--out", str(tmp_path / "out")])
        assert result.exit_code == 1
        assert "not the output of `dlcsniff decode` (no messages.parquet" in result.stderr
        assert "Traceback" not in result.output
        assert len(result.stderr.strip().splitlines()) == 1
