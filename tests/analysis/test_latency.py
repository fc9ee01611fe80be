"""The latency breakdown and the other statistics of the merged view (analysis.latency): real MXNet jobs from
every node's capture and from one node's alone, checked against ps-lite's logs, the workload's own record
and tshark's reading of the captures; hand-built requests with exactly known parts."""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from dlcsniff.analysis import load_job_model, write_statistics
from dlcsniff.analysis.latency import (
    CONNECTION_COLUMNS, IN_FLIGHT_COLUMNS, PART_COLUMNS, REQUEST_COLUMNS, job_statistics, key_updates,
    request_latency, requests_in_flight, update_skew,
)
from dlcsniff.decoders.output import write_decode_output
from dlcsniff.decoders.job import decode_paths
from tests.conftest import PCAPS, require_tool
from tests.support.groundtruth import load_job

JOBS = ["mxnet_sync", "mxnet_sparse"]
TSHARK_FIELDS = ("tcp.stream", "frame.time_epoch", "ip.src", "tcp.srcport", "ip.dst", "tcp.dstport", "tcp.flags.syn",
                 "tcp.flags.ack", "tcp.flags.reset")


def decoded(captures, out):
    write_decode_output(decode_paths(captures), out)
    return out


@pytest.fixture(scope="module", params=JOBS)
def job_and_stats(request, tmp_path_factory):
    out = decoded([PCAPS / request.param], tmp_path_factory.mktemp(request.param))
    return load_job(PCAPS / request.param), job_statistics(load_job_model(out)), out


def assert_parts_add_up(requests: pd.DataFrame) -> None:
    parts = requests[list(PART_COLUMNS)]
    assert list(requests.columns) == list(REQUEST_COLUMNS)
    assert [c for c in requests.columns if c.endswith("_ns")] == ["ts_first_ns", "total_ns", *PART_COLUMNS]
    assert requests["total_ns"].notna().all() and requests["ts_first_ns"].notna().all()
    assert (parts.fillna(0) >= 0).all().all() and (requests["total_ns"] >= 0).all()
    assert (parts.sum(axis=1, skipna=True) == requests["total_ns"]).all()


def logged_requests(job) -> pd.DataFrame:
    """Every request a worker's ps-lite logged sending to a server (KV traffic and SimpleApp commands)."""
    frames = []
    for node in job.nodes:
        if node["role"] == "worker":
            log = job.log(node["name"])
            frames.append(log[(log["direction"] == "send") & log["request"].astype(bool) & log["control_cmd"].isna()])
    return pd.concat(frames, ignore_index=True)


def test_every_request_is_broken_down_from_both_ends(job_and_stats):
    job, stats, _ = job_and_stats
    requests = stats.requests
    logged = logged_requests(job)
    assert len(requests) == len(logged)
    command = logged["simple_app"].astype(bool)
    assert (requests["kind"] == "command").sum() == command.sum()
    assert requests["kind"].isin(["push", "pushpull"]).sum() == (logged["push"].astype(bool) & ~command).sum()
    assert (requests["view"] == "both").all()
    assert_parts_add_up(requests)
    assert requests[list(PART_COLUMNS[:5])].notna().all().all() and requests["unsplit_ns"].isna().all()
    # where the clocks' residual error broke causality, the server's times moved by no more than the bounds
    largest = max(float(c["error_bound_ns"]) for c in stats.summary["clocks"])
    assert requests["clock_fix_us"].abs().max() * 1e3 <= 2 * largest


def test_worker_view_matches_the_worker_capture(job_and_stats):
    """total_ns is what the worker's own capture shows: its response's last byte minus its request's first
    (aligned times differ from its raw clock only by the drift correction over one request)."""
    job, stats, decode_dir = job_and_stats
    messages = pd.read_parquet(decode_dir / "messages.parquet", columns=[
        "capture", "sender_id", "recver_id", "request", "ps_timestamp", "customer_id", "ts_first_ns", "ts_last_ns",
        "control_cmd"])
    name = {node["pslite_id"]: node["name"] for node in job.nodes}
    mine = messages[messages["control_cmd"].isna() & (messages["capture"] == messages["sender_id"].map(name))
                    & messages["request"]]
    answers = messages[messages["control_cmd"].isna() & (messages["capture"] == messages["recver_id"].map(name))
                       & ~messages["request"]]
    pairs = mine.merge(answers, left_on=["sender_id", "recver_id", "customer_id", "ps_timestamp"],
                       right_on=["recver_id", "sender_id", "customer_id", "ps_timestamp"], suffixes=("", "_answer"))
    pairs = pairs[pairs["capture"].str.startswith("worker")]
    requests = stats.requests.merge(pairs, left_on=["worker_id", "server_id", "customer_id", "ps_timestamp"],
                                    right_on=["sender_id", "recver_id", "customer_id", "ps_timestamp"])
    assert len(requests) == len(stats.requests)
    raw_total = requests["ts_last_ns_answer"] - requests["ts_first_ns_y"]
    assert ((requests["total_ns"] - raw_total).abs() <= 1_000).all()


@pytest.mark.parametrize("node, view", [("worker0", "worker"), ("server0", "server")])
def test_one_vantage_point_keeps_the_sum_for_the_known_parts(tmp_path, node, view):
    job = load_job(PCAPS / "mxnet_sync")
    stats = job_statistics(load_job_model(decoded([job.capture_path(node)], tmp_path)))
    requests = stats.requests
    assert len(requests) > 0 and (requests["view"] == view).all()
    assert_parts_add_up(requests)
    known = {"worker": ["request_wire_ns", "unsplit_ns"],
             "server": ["server_ns", "response_wire_ns", "unsplit_ns"]}[view]
    assert requests[known].notna().all().all()
    assert requests[[c for c in PART_COLUMNS if c not in known]].isna().all().all()
    own = job.node(node)["pslite_id"]
    assert (requests["worker_id" if view == "worker" else "server_id"] == own).all()
    both = job_statistics(load_job_model(decoded([PCAPS / "mxnet_sync"], tmp_path / "all"))).requests
    mine = both[both["worker_id" if view == "worker" else "server_id"] == own]
    assert len(requests) == len(mine)
    if view == "worker":   # the worker's view of a request does not depend on the other captures
        assert sorted(requests["total_ns"]) == pytest.approx(sorted(mine["total_ns"]), abs=1_000)


# --- hand-built requests --------------------------------------------------------------------------------

def exchange_events(times: dict[str, int | None]) -> pd.DataFrame:
    """One push request (worker 9 → server 8) and its response, with the given aligned times (None: the end
    that was not captured)."""
    def event(request: bool, prefix: str) -> dict:
        sender, recver = (9, 8) if request else (8, 9)
        return {"sender_id": sender, "recver_id": recver, "request": request, "push": True, "pull": False,
                "simple_app": False, "control_cmd": None, "customer_id": 0, "app_id": 0, "ps_timestamp": 3,
                "tensor_key": 1, "req_type": "default", "size_bytes": 1000 if request else 20,
                "connection": "a>b" if request else "b>a",
                "ts_first_ns": times[f"{prefix}send_first"] or times[f"{prefix}recv_first"],
                **{f"{side}_ts_{edge}_aligned_ns": times[f"{prefix}{side}_{edge}"]
                   for side in ("send", "recv") for edge in ("first", "last")}}
    frame = pd.DataFrame([event(True, ""), event(False, "r_")])
    for column in [c for c in frame.columns if c.endswith("_ns")]:
        frame[column] = frame[column].astype("Int64")
    return frame


BOTH = {"send_first": 1_000, "send_last": 1_400, "recv_first": 1_450, "recv_last": 1_600,
        "r_send_first": 9_600, "r_send_last": 9_700, "r_recv_first": 9_800, "r_recv_last": 9_900}


def test_parts_are_exact_from_both_ends():
    row = request_latency(exchange_events(BOTH)).iloc[0]
    assert row["view"] == "both" and row["kind"] == "push" and row["clock_fix_us"] == 0
    assert (row["ts_first_ns"], row["total_ns"]) == (1_000, 8_900)
    assert [row[c] for c in PART_COLUMNS[:5]] == [400, 200, 8_000, 100, 200] and pd.isna(row["unsplit_ns"])


def test_a_clock_error_is_corrected_within_the_workers_window():
    """The server's clock reads 500 ns early (the request would arrive 300 ns before it left): its times are
    moved by the least amount that restores causality, and the parts still add up."""
    early = {k: (v - 500 if k in ("recv_first", "recv_last", "r_send_first", "r_send_last") else v)
             for k, v in BOTH.items()}
    row = request_latency(exchange_events(early)).iloc[0]
    assert row["clock_fix_us"] == pytest.approx(0.3)
    assert [row[c] for c in PART_COLUMNS[:5]] == [400, 0, 8_000, 100, 400]
    # a server window longer than the worker's cannot be placed: the worker's view is kept
    squeezed = dict(BOTH, r_send_last=10_200)
    row = request_latency(exchange_events(squeezed)).iloc[0]
    assert row["view"] == "worker" and row["unsplit_ns"] == 8_500 and row["request_wire_ns"] == 400


def test_one_end_only():
    worker = {k: (None if k in ("recv_first", "recv_last", "r_send_first", "r_send_last") else v)
              for k, v in BOTH.items()}
    row = request_latency(exchange_events(worker)).iloc[0]
    assert row["view"] == "worker"
    assert (row["total_ns"], row["request_wire_ns"], row["unsplit_ns"]) == (8_900, 400, 8_500)
    server = {k: (None if k in ("send_first", "send_last", "r_recv_first", "r_recv_last") else v)
              for k, v in BOTH.items()}
    row = request_latency(exchange_events(server)).iloc[0]
    assert row["view"] == "server" and row["ts_first_ns"] == 1_450
    assert (row["total_ns"], row["unsplit_ns"], row["server_ns"], row["response_wire_ns"]) == (8_250, 150, 8_000, 100)


def test_requests_in_flight_step_per_connection():
    requests = pd.DataFrame({"connection": ["a", "a", "a", "b"], "worker_id": 9, "server_id": 8,
                             "ts_first_ns": pd.array([0, 10, 30, 5], dtype="Int64"),
                             "total_ns": pd.array([30, 10, 5, 1], dtype="Int64")})
    steps = requests_in_flight(requests)
    assert list(steps.columns) == list(IN_FLIGHT_COLUMNS)
    a = steps[steps["connection"] == "a"]
    # at 20 one ends, at 30 one ends before the next starts
    assert list(zip(a["ts_ns"], a["in_flight"])) == [(0, 1), (10, 2), (20, 1), (30, 0), (30, 1), (35, 0)]
    assert list(steps.loc[steps["connection"] == "b", "in_flight"]) == [1, 0]


def test_requests_in_flight_on_a_real_job(job_and_stats):
    _, stats, _ = job_and_stats
    requests, steps = stats.requests, stats.in_flight
    assert (steps["in_flight"] >= 0).all()
    assert (steps.groupby("connection")["in_flight"].last() == 0).all()
    # brute force at a few instants: requests whose [first byte, last response byte) holds the instant
    start = requests["ts_first_ns"].to_numpy(np.int64)
    end = start + requests["total_ns"].to_numpy(np.int64)
    for instant in np.quantile(start, [0.1, 0.5, 0.9]).astype(np.int64) + 1:
        for connection, group in steps.groupby("connection"):
            before = group[group["ts_ns"] <= instant]
            table = int(before["in_flight"].iloc[-1]) if len(before) else 0
            mine = (requests["connection"] == connection).to_numpy()
            assert table == int(((start <= instant) & (instant < end) & mine).sum())
    assert stats.summary["in_flight"]["max_per_connection"]["max"] == steps["in_flight"].max()


def test_connection_costs_match_tshark(job_and_stats):
    job, stats, _ = job_and_stats
    tshark = require_tool("tshark")
    connections = stats.connections
    assert list(connections.columns) == list(CONNECTION_COLUMNS)
    for node in job.nodes:
        fields = subprocess.run(
            [tshark, "-r", str(job.capture_path(node["name"])), "-Y", "tcp.flags.syn==1 || tcp.flags.reset==1",
             "-T", "fields", *(arg for field in TSHARK_FIELDS for arg in ("-e", field))],
            check=True, capture_output=True, text=True).stdout.split("\n")
        packets = pd.DataFrame([line.split("\t") for line in fields if line],
                               columns=["stream", "time", "src", "sport", "dst", "dport", "syn", "ack", "rst"])
        packets["ns"] = packets["time"].map(lambda t: int(t.replace(".", "")))
        syn = packets[(packets["syn"] == "1") & (packets["ack"] == "0") & (packets["src"] == node["ip"])]
        answer = packets[packets["ack"] == "1"].drop_duplicates("stream")
        expected = syn.merge(answer, on="stream", suffixes=("", "_answer"))
        expected["connection"] = (expected["src"] + ":" + expected["sport"] + ">" + expected["dst"] + ":"
                                  + expected["dport"])
        mine = connections[(connections["capture"] == node["name"]) & connections["at_connector"]]
        got = mine.set_index("connection")
        assert set(got.index) == set(expected["connection"]), node["name"]
        for row in expected.itertuples():
            assert got.loc[row.connection, "handshake_rtt_ns"] == row.ns_answer - row.ns
            assert got.loc[row.connection, "refused"] == (row.rst_answer == "1")
    summary = stats.summary["connections"]
    assert summary["attempts"] == len(connections) and summary["refused"] == connections["refused"].sum()


def test_row_sparse_updates_match_the_workload_record(job_and_stats):
    """Every row a worker pushed is one update of its ps key; kv.init goes on the wire from worker rank 0
    only (MXNet's KVStoreDist pushes the initial values from rank 0)."""
    job, stats, _ = job_and_stats
    sparse_pushes = [tensor for node in job.nodes if node["role"] == "worker"
                     for op in job.records[node["name"]]["operations"]
                     if op["op"] == "push" or (op["op"] == "init" and job.records[node["name"]]["rank"] == 0)
                     for tensor in op["tensors"] if tensor["stype"] == "row_sparse"]
    rows = sum(tensor["rows"] for tensor in sparse_pushes)
    keys = stats.key_updates
    assert keys.loc[keys["req_type"] == "row_sparse", "updates"].sum() == rows
    summary = stats.summary
    assert summary["row_sparse"]["pushes"] == len(sparse_pushes)
    if rows:
        assert summary["key_updates"]["row_sparse"]["updates"] == rows
        assert summary["row_sparse"]["rows_per_push"]["max"] == max(tensor["rows"] for tensor in sparse_pushes)
        assert 0 < summary["key_updates"]["row_sparse"]["gini"] < 1


def test_update_skew_of_known_counts():
    assert update_skew([5, 5, 5, 5]) == {"keys": 4, "updates": 20, "top_keys": 1, "top1pct_share": 0.25, "gini": 0.0}
    skew = update_skew([1, 3])
    assert skew["gini"] == pytest.approx(0.25) and skew["top1pct_share"] == 0.75
    skew = update_skew([1] * 199 + [801])
    assert skew["top_keys"] == 2 and skew["top1pct_share"] == pytest.approx(802 / 1000)
    assert skew["gini"] == pytest.approx((2 * (sum(range(1, 200)) + 200 * 801)) / (200 * 1000) - 201 / 200)
    assert update_skew([]) is None


def test_keys_without_values_are_not_updates():
    """A row-sparse push's master key (lens 0) is not an update; a push without lens updates every key."""
    keys = pa.array([[10, 11, 12], [20], [10, 12]], type=pa.list_(pa.uint64()))
    lens = pa.array([[0, 64, 64], None, [0, 64]], type=pa.list_(pa.int64()))
    table = key_updates(keys, lens, np.array(["row_sparse", "default", "row_sparse"]), np.array([1, 2, 1]))
    assert dict(zip(table["ps_key"], table["updates"])) == {12: 2, 11: 1, 20: 1}
    assert dict(zip(table["ps_key"], table["tensor_key"])) == {12: 1, 11: 1, 20: 2}


def test_stats_write_the_merged_tables(tmp_path):
    decode_dir = decoded([PCAPS / "mxnet_sync"], tmp_path / "decoded")
    stats = write_statistics(load_job_model(decode_dir), tmp_path / "stats")
    for name in ("requests", "in_flight", "connections", "key_updates"):
        table = pd.read_parquet(tmp_path / "stats" / f"{name}.parquet")
        assert len(table) == len(stats.tables()[name]) > 0
    assert_parts_add_up(pd.read_parquet(tmp_path / "stats" / "requests.parquet"))
    summary = json.loads((tmp_path / "stats" / "summary.json").read_text())
    for section in ("merge", "clocks", "latency", "in_flight", "connections", "key_updates", "row_sparse"):
        assert section in summary
    assert summary["latency"]["requests"] == len(stats.tables()["requests"])
    assert summary["merge"]["events"] == summary["merge"]["events_seen_at_both_ends"]
