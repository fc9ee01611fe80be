"""`dlcsniff simulate`: the job model read from real bundled captures, the replay loop, both network simulators
run for real, and the command's outputs. (tests/analysis/test_simulate_real_job.py checks a prediction against
a real run at another rate.)"""
from __future__ import annotations

import importlib.util
import json
import math
import re

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from dlcsniff.analysis import build_records, load_dataset, load_job_model
from dlcsniff.analysis.iterations import ITERATION_COLUMNS, worker_iterations
from dlcsniff.analysis.operations import (
    CATEGORY_DATA, ROLE_SERVER, ROLE_WORKER, SLOT_PULL_RESPONSE, SLOT_PUSH_REQUEST, Topology, Trace,
)
from dlcsniff.analysis.simulate_engines import simulate_all
from dlcsniff.analysis.simulate_network import EFFICIENCY, UNLIMITED_BIT_S, Links, calibrate
from dlcsniff.analysis.simulate_pslite import (
    ELEMENT_BYTES, MXNET_BIGARRAY_BOUND, build_program, place_keys, pslite_model,
)
import dlcsniff.analysis.simulate_collectives as co
from dlcsniff.analysis.simulate_collectives import CollectiveModel
from dlcsniff.analysis.simulate_replay import DELIVERED, ISSUED, Program, ReplayError, message_times, replay
from dlcsniff.cli import app
from tests.conftest import PCAPS

runner = CliRunner()


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not importable from the venv: run `make setup` (it installs `dlcsniff simulate`'s "
                    "engines: python3-simgrid linked into the venv, and PyPI's ns3)")


def _model(decoded_job, name):
    trace = build_records(load_dataset(decoded_job(name)))
    return trace, pslite_model(trace)


@pytest.mark.parametrize("job", ["mxnet_sync_large", "mxnet_3s4w", "mxnet_async", "mxnet_1s1w"])
def test_the_model_holds_every_training_request_with_its_answer(decoded_job, job):
    trace, model = _model(decoded_job, job)
    records = trace.records
    worker = records[(records["node_role"] == ROLE_WORKER) & (records["category"] == CATEGORY_DATA)
                     & (records["iteration"] >= 0)]
    pushes = worker[worker["slot"] == SLOT_PUSH_REQUEST]
    answers = worker[worker["slot"] == SLOT_PULL_RESPONSE]
    requests = model.requests
    assert len(requests) == len(pushes)
    assert requests["size_bytes"].sum() == pushes["length"].sum()
    assert requests["response_size_bytes"].sum() == answers["length"].sum()
    assert (requests["response_slot"] == SLOT_PULL_RESPONSE).all()          # MXNet 1.9.1: fused push-pull
    # one model iteration per iteration `stats` counts
    counted = worker_iterations(trace).groupby("worker_rank").size()
    assert requests.groupby("worker_rank")["iteration"].nunique().to_dict() == counted.to_dict()
    for column in ("delay_s", "response_delay_s"):
        assert np.isfinite(requests[column]).all() and (requests[column] >= 0).all()
    # computation is what the worker did between receiving and sending: never longer than the iteration
    assert requests.groupby(["worker_rank", "iteration"])["delay_s"].max().max() < 5 * worker_iterations(
        trace)["iteration_s"].max()


@pytest.mark.parametrize("job, servers", [("mxnet_sync_large", 2), ("mxnet_3s4w", 3), ("mxnet_async_split", 3)])
def test_keys_placed_as_mxnet_places_them_give_the_captured_placement(decoded_job, job, servers):
    """MXNet's rule (a small key on server key * 9973 % servers, a large one split evenly) re-applied to the
    captured requests with the captured number of servers lands every key where the real job put it."""
    _, model = _model(decoded_job, job)
    assert model.topology.servers == servers
    placed = place_keys(model.requests, servers, model.bigarray_bound)
    key = ["worker_rank", "iteration", "tensor_key", "server_rank"]
    captured = model.requests.groupby(key)["size_bytes"].sum()
    again = placed.groupby(key)["size_bytes"].sum()
    assert sorted(again.index) == sorted(captured.index)
    # sizes: the parts of a split key within a few bytes (a part's meta is counted with its values)
    assert (again.reindex(captured.index) - captured).abs().max() <= 64


def test_the_bigarray_bound_is_read_from_the_split_keys(decoded_job):
    _, large = _model(decoded_job, "mxnet_sync_large")        # MXNET_KVSTORE_BIGARRAY_BOUND=65536
    per_key = large.requests.groupby("tensor_key")["server_rank"].nunique()
    largest_unsplit = large.requests[large.requests["tensor_key"].isin(per_key[per_key == 1].index)]["size_bytes"].max()
    assert largest_unsplit / ELEMENT_BYTES < large.bigarray_bound <= 1_280_000 + 64
    _, one_server = _model(decoded_job, "mxnet_1s1w")          # one server cannot tell: MXNet's default
    assert one_server.bigarray_bound == MXNET_BIGARRAY_BOUND


def _one_server_records(messages) -> pd.DataFrame:
    """DLC records of (worker, key, iteration, to_server, first byte ms, last byte ms, bytes) messages between
    workers and server 0: the sender's record at the first byte, the receiver's at the last."""
    rows = []
    for worker, key, iteration, to_server, first_ms, last_ms, size in messages:
        for is_send, ts_ms in ((True, first_ms), (False, last_ms)):
            rows.append({"node_role": ROLE_WORKER if is_send == to_server else ROLE_SERVER, "is_send": is_send,
                         "category": CATEGORY_DATA, "worker_rank": worker, "server_rank": 0,
                         "slot": SLOT_PUSH_REQUEST if to_server else SLOT_PULL_RESPONSE, "fused": True,
                         "tensor_key": key, "ps_timestamp": 10 * iteration + key, "iteration": iteration,
                         "length": size, "ts_ns": int(ts_ms * 1e6), "complete": True})
    return pd.DataFrame(rows)


def test_a_queued_answer_takes_the_server_time_of_later_rounds_not_the_first():
    """One server, two workers, sync: a small key (0) and a 5 MB one (1), as the scale bench records them.
    In round 0 the small pushes go first and the server answers them only ~0.85 s later, while both large
    pushes arrive; in every later round the small push follows the large one and its answer is queued behind
    the large answer on its connection (its own server time unseen). Those later answers take the server's
    later rounds' time (the large key's 10 ms), not round 0's stall, which a 3-server what-if would replay in
    every round (the scale bench's 1 server -> 3 servers prediction was 57 % slow)."""
    big, small = 5_120_035, 547
    messages = []
    for worker in (0, 1):
        arrives = 800 + 50 * worker                               # the large push, sharing the server's link
        messages += [(worker, 0, 0, True, worker, worker + 0.1, small),
                     (worker, 1, 0, True, worker + 0.1, arrives, big),
                     (worker, 0, 0, False, 850 + 50 * worker, 850.1 + 50 * worker, small),     # the stall
                     (worker, 1, 0, False, 960, 1760, big)]
        for iteration in (1, 2, 3):
            start = 1800 * iteration
            messages += [(worker, 1, iteration, True, start + 5, start + arrives, big),
                         (worker, 0, iteration, True, start + arrives - 1, start + arrives + 0.1, small),  # queued
                         (worker, 1, iteration, False, start + 860, start + 1660, big),  # 10 ms after the round
                         (worker, 0, iteration, False, start + 1659.9, start + 1660.1, small)]     # queued
    trace = Trace(records=_one_server_records(messages), nodes=pd.DataFrame(), topology=Topology(2, 1),
                  mode="sync", mode_evidence="test")
    requests = pslite_model(trace).requests.set_index(["worker_rank", "iteration", "tensor_key"])
    server_s = requests["response_delay_s"]
    assert server_s.loc[(0, 0, 0)] == pytest.approx(0.85 - 0.0011)   # round 0 keeps its own (unqueued) time
    assert server_s.loc[(slice(None), 2, 1)].tolist() == pytest.approx([0.01, 0.01])
    later_small = server_s.loc[(slice(None), [1, 2, 3], 0)]
    assert later_small.to_numpy() == pytest.approx(np.full(6, 0.01))


def test_what_if_shapes_keep_every_worker_and_key(decoded_job):
    _, model = _model(decoded_job, "mxnet_sync_large")
    built = build_program(model, workers=4, servers=3)
    messages = built.messages
    assert sorted(messages["worker_rank"].unique()) == [0, 1, 2, 3]
    assert sorted(messages["server_rank"].unique()) == [0, 1, 2]
    # every worker moves what a captured worker moved, whatever the servers
    per_worker = messages[messages["to_server"]].groupby("worker_rank")["size_bytes"].sum()
    captured = model.requests.groupby("worker_rank")["size_bytes"].sum()
    assert per_worker.max() - captured.max() <= 64 * len(model.requests)
    # in sync mode an answer waits for all four workers' pushes of its key and round
    deps = built.program.deps
    answer = messages.index[~messages["to_server"]][0]
    assert len(deps[deps["child"] == answer]) == 4


class _FixedRate:
    """A network without sharing: each transfer takes size / rate once started (for the replay loop only)."""

    def __init__(self, rate_bytes_s: float) -> None:
        self.rate, self.clock, self.active = rate_bytes_s, 0.0, []

    def now(self) -> float:
        return self.clock

    def start(self, message, src, dst, size_bytes) -> None:
        self.active.append((self.clock + size_bytes / self.rate, message))

    def advance(self, until_s):
        self.active.sort()
        if not self.active or self.active[0][0] > until_s:
            self.clock = until_s if math.isfinite(until_s) else self.clock
            return []
        at, message = self.active.pop(0)
        self.clock = at
        return [(message, at)]


def _program(rows, deps, nodes=3):
    return Program(pd.DataFrame(rows, columns=["src", "dst", "size_bytes", "delay_s"]),
                   pd.DataFrame(deps, columns=["child", "parent", "kind"]).astype({"kind": np.int8}), nodes)


def test_replay_keeps_dependencies_delays_and_one_message_at_a_time_per_connection():
    program = _program(
        [(0, 1, 100, 0.5),     # 0: issued at 0.5, but 0->1 carries message 1 until 2.0: 2.0 -> 3.0
         (0, 1, 200, 0.0),     # 1: issued at 0 on an idle connection: 0 -> 2.0
         (1, 2, 100, 0.25),    # 2: 0.25 s after 0 is delivered: 3.25 -> 4.25
         (1, 2, 100, 0.0),     # 3: issued with 2 (ISSUED), queued behind it on 1->2: 4.25 -> 5.25
         (2, 0, 100, 1.0)],    # 4: 1 s after 3 is delivered: 6.25 -> 7.25
        [(2, 0, DELIVERED), (3, 2, ISSUED), (4, 3, DELIVERED)])
    times = replay(program, _FixedRate(100.0))
    expected = [[0.5, 2.0, 3.0], [0.0, 0.0, 2.0], [3.25, 3.25, 4.25], [3.25, 4.25, 5.25], [6.25, 6.25, 7.25]]
    assert times[["issue_s", "start_s", "end_s"]].to_numpy().tolist() == expected


def test_replay_refuses_a_program_that_cannot_finish():
    with pytest.raises(ReplayError, match="never sent"):
        replay(_program([(0, 1, 1, 0.0), (1, 0, 1, 0.0)], [(0, 1, DELIVERED), (1, 0, DELIVERED)]), _FixedRate(1.0))


def _collective_model(rows, ranks=3):
    """Hand-made captured messages (src, dst, size_bytes, send_ms, send_last_ms, recv_first_ms, recv_ms)."""
    frame = pd.DataFrame(rows, columns=["src", "dst", "size_bytes", "send_ns", "send_last_ns", "recv_first_ns",
                                        "recv_ns"])
    for column in ("send_ns", "send_last_ns", "recv_first_ns", "recv_ns"):
        frame[column] = (frame[column] * 1_000_000).astype(np.int64)
    frame = frame.assign(pg="0", kind="all_reduce", seq=0, iteration=0)
    return CollectiveModel(frame, ranks, 1, True, 0, 0)


def test_a_collective_message_sent_while_one_arrived_waits_for_that_share_of_it_at_any_rate():
    model = _collective_model([
        (1, 0, 1000, 0, 1000, 0, 1000),        # 0: a segment arriving at rank 0 over the first second
        (0, 1, 48, 300, 300, 300, 300),        # 1: rank 0's notification, 30 % into it
        (2, 0, 48, 2000, 2000, 2000, 2000),    # 2: rank 2's own message, after 2 s of computation
    ])
    program = co.build_program(model)
    assert program.messages["message"].tolist() == [0, 1, 2, 0]
    assert program.messages["size_bytes"].tolist() == [700, 48, 48, 300]
    assert program.messages["delay_s"].tolist() == [0.0, 0.0, 2.0, 0.0]
    for rate_bytes_s in (1000.0, 4000.0):
        times = message_times(program, replay(program, _FixedRate(rate_bytes_s)))
        assert times.loc[1, "issue_s"] == pytest.approx(300 / rate_bytes_s)
        assert times.loc[0, ["start_s", "end_s"]].tolist() == pytest.approx([0.0, 1000 / rate_bytes_s])
        assert times.loc[2, "issue_s"] == pytest.approx(2.0)


def test_a_collective_message_that_left_behind_its_ranks_own_data_is_issued_as_soon_as_it_could_be():
    model = _collective_model([
        (0, 1, 1000, 0, 500, 1, 501),          # 0: rank 0's data on its link for half a second
        (0, 2, 48, 200, 200, 201, 201),        # 1: its next message, which left 0.2 s into it
    ])
    assert co.build_program(model).messages["delay_s"].tolist() == [0.0, 0.0]


def _links(rate_bit_s: float, nodes: int = 3, latency_s: float = 1e-6) -> Links:
    rates = np.full(nodes, rate_bit_s)
    return Links(rates, rates.copy(), np.full(nodes, UNLIMITED_BIT_S), latency_s)


SHARING = _program([(0, 2, 1_000_000, 0.0), (1, 2, 1_000_000, 0.0), (0, 2, 1_000_000, 0.0), (2, 0, 500_000, 0.1)],
                   [(3, 0, DELIVERED)])


@pytest.mark.parametrize("engine, tolerance", [("simgrid", 0.01), ("ns3", 0.05)])
def test_the_simulators_share_a_link_between_the_transfers_crossing_it(engine, tolerance):
    """Two 1 MB transfers into one node at 100 Mbit/s share its link: each takes twice as long as alone; a third
    on the first one's connection waits for it, then has the link to itself; an answer follows after 0.1 s."""
    _require("simgrid" if engine == "simgrid" else "ns")
    (times,) = simulate_all(engine, [(SHARING, _links(100e6))])
    alone = 1_000_000 * 8 / (100e6 * EFFICIENCY)
    assert times.loc[0, "end_s"] == pytest.approx(2 * alone, rel=tolerance)
    assert times.loc[1, "end_s"] == pytest.approx(2 * alone, rel=tolerance)
    assert times.loc[2, "start_s"] == pytest.approx(times.loc[0, "end_s"], abs=1e-9)
    assert times.loc[2, "end_s"] - times.loc[2, "start_s"] == pytest.approx(alone, rel=tolerance)
    assert times.loc[3, "start_s"] == pytest.approx(times.loc[0, "end_s"] + 0.1, rel=1e-6)
    assert times.attrs["wall_s"] > 0


def test_ns3_recovers_from_its_queue_drops_with_linux_timers():
    """30 senders, 200 kB each, into one node at 10 Mbit/s overflow its port's queue. The hosts that ran the jobs
    retransmit after Linux's least timeout (200 ms), not ns-3's own (1 s): with that, the transfers end within 5 %
    of what their bytes take on the link (with ns-3's defaults, 14 % later: the link idles through the timeouts)."""
    _require("ns")
    senders, size = 30, 200_000
    program = _program([(sender, 0, size, 0.0) for sender in range(1, senders + 1)], [], nodes=senders + 1)
    (times,) = simulate_all("ns3", [(program, _links(10e6, nodes=senders + 1, latency_s=1e-4))])
    on_the_link = senders * size * 8 / (10e6 * EFFICIENCY)
    assert times["end_s"].max() == pytest.approx(on_the_link, rel=0.05)


def test_simgrid_keeps_a_host_limit_shared_by_both_ways():
    _require("simgrid")
    program = _program([(0, 1, 1_000_000, 0.0), (1, 0, 1_000_000, 0.0)], [])
    limited = Links(np.full(2, 1e9), np.full(2, 1e9), np.array([100e6, UNLIMITED_BIT_S]), 1e-6)
    (times,) = simulate_all("simgrid", [(program, limited)])
    both_ways = 2 * 1_000_000 * 8 / (100e6 * EFFICIENCY)     # node 0's host carries its send and its receipt
    assert times["end_s"].max() == pytest.approx(both_ways, rel=0.01)


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _two_nodes_moving(payload_bit_s: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Node 0 sends node 1 ten 1 MB messages back to back at payload_bit_s: the ends both captures saw, the pairs."""
    size, seconds = 1_000_000, 1_000_000 * 8 / payload_bit_s
    first = (np.arange(10) * seconds * 1e9).astype(np.int64)
    last = first + int(seconds * 1e9)
    ends = pd.DataFrame({"node": [0] * 10 + [1] * 10, "sent": [True] * 10 + [False] * 10,
                         "first_ns": np.concatenate([first, first]), "last_ns": np.concatenate([last, last]),
                         "size_bytes": size})
    pairs = pd.DataFrame({"src": 0, "dst": 1, "size_bytes": size, "send_ns": first, "recv_ns": last})
    return ends, pairs


def test_a_what_if_at_the_captured_rate_keeps_what_the_calibrated_links_carried():
    # links that carried 1.5 times the rate the capture was taken at (a shaper's bursts): a what-if scales them
    ends, pairs = _two_nodes_moving(300e6 * EFFICIENCY)
    links = calibrate(ends, pairs, 2, captured_rate_bit_s=200e6).links
    assert links.up_bit_s == pytest.approx([300e6, 300e6]) and links.down_bit_s == pytest.approx([300e6, 300e6])
    assert links.with_rate(200e6).up_bit_s == pytest.approx(links.up_bit_s)
    assert links.with_rate(100e6).down_bit_s == pytest.approx([150e6, 150e6])
    # links that carried a little less (TCP's own pace, which the simulators model) are the captured rate
    paced = calibrate(*_two_nodes_moving(180e6 * EFFICIENCY), 2, captured_rate_bit_s=200e6).links
    assert not calibrate(*_two_nodes_moving(180e6 * EFFICIENCY), 2, captured_rate_bit_s=200e6).host_limited
    assert paced.up_bit_s == pytest.approx([200e6, 200e6]) and paced.with_rate(100e6).up_bit_s == pytest.approx(
        [100e6, 100e6])
    # without the captured rate, a stated rate is every link's
    assert calibrate(ends, pairs, 2).links.with_rate(100e6).up_bit_s == pytest.approx([100e6, 100e6])
    # hosts that moved far less than the captured rate keep their limit; the links are that rate, and scale
    slow = calibrate(*_two_nodes_moving(50e6 * EFFICIENCY), 2, captured_rate_bit_s=200e6)
    assert slow.host_limited and slow.links.host_bit_s == pytest.approx([50e6, 50e6])
    assert slow.links.with_rate(400e6).up_bit_s == pytest.approx([400e6, 400e6])


@pytest.mark.parametrize("job", ["mxnet_sync_large", "mxnet_sync", "mxnet_async"])
def test_a_replay_of_the_captured_network_reproduces_the_captured_iteration_time(decoded_job, tmp_path, job):
    _require("simgrid")
    result = _invoke("simulate", decoded_job(job), "--out", tmp_path / "sim", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    measured = summary["measured_iteration_s_mean"]
    assert measured == pytest.approx(worker_iterations(build_records(load_dataset(decoded_job(job))))[
        "iteration_s"].mean())
    assert summary["iteration_s_mean"] == pytest.approx(measured, rel=0.15)
    assert summary["replay"] is True


def test_a_collective_job_replays_its_messages(decoded_job, tmp_path):
    _require("simgrid")
    result = _invoke("simulate", decoded_job("gloo"), "--out", tmp_path / "sim", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["model"]["kind"] == "collectives" and summary["model"]["message_ends_unmatched"] == 0
    # the bundled job runs its operations once: no iteration repeats, the span is what compares
    assert summary["span_s"] == pytest.approx(summary["measured_span_s"], rel=0.15)
    refused = _invoke("simulate", decoded_job("gloo"), "--out", tmp_path / "sim4", "--training-workers", "4")
    assert refused.exit_code == 1 and "parameter-server" in refused.output and "Traceback" not in refused.output
    # the table names the what-if and the job's own unit: ranks, not workers
    shown = _invoke("simulate", decoded_job("gloo"), "--out", tmp_path / "sim1g", "--bandwidth", "1Gbit")
    assert shown.exit_code == 0, shown.output
    assert "what-if (every link 1Gbit each way) on simgrid" in shown.output
    # and says what the stated rate did to the calibrated links: without the captured rate, took their place
    assert "links: 1,000.0 Mbit/s each way in place of the " in shown.output and "--captured-bandwidth" in shown.output
    assert "per rank" in shown.output and "per worker" not in shown.output


def test_simulate_writes_its_tables_summary_and_manifest(decoded_job, tmp_path):
    _require("simgrid")
    out = tmp_path / "sim"
    result = _invoke("simulate", decoded_job("mxnet_sync_large"), "--out", out, "--bandwidth", "10Gbit",
                     "--latency", "20us", "--training-workers", "3", "--servers", "3", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary == json.loads(result.output)
    assert summary["parameters"]["bandwidth_bit_s"] == 10e9
    assert summary["parameters"]["latency_s"] == pytest.approx(20e-6)
    assert summary["parameters"]["workers"] == 3 and summary["parameters"]["servers"] == 3
    assert summary["replay"] is False
    assert [row["worker_rank"] for row in summary["per_worker"]] == [0, 1, 2]
    for row in summary["per_worker"]:
        assert row["communication_s_mean"] > 0 and 0 <= row["overlap_ratio_mean"] <= 1
    iterations = pd.read_parquet(out / "iterations.parquet")
    assert tuple(iterations.columns) == ITERATION_COLUMNS
    assert iterations["iteration_s"].mean() == pytest.approx(summary["iteration_s_mean"])
    assert set(pd.read_parquet(out / "messages.parquet")["server_rank"]) == {0, 1, 2}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kind"] == "simulate"
    assert set(manifest["files"]) == {"summary.json", "iterations.parquet", "measured_iterations.parquet",
                                      "messages.parquet", "keys.parquet"}
    again = _invoke("simulate", decoded_job("mxnet_sync_large"), "--out", out)
    assert again.exit_code == 1 and "--force" in again.output
    assert _invoke("simulate", decoded_job("mxnet_sync_large"), "--out", out, "--force").exit_code == 0


def test_a_faster_network_is_never_slower_and_more_workers_on_one_network_never_faster(decoded_job, tmp_path):
    _require("simgrid")
    figures = {}
    for name, options in {"slow": ["--bandwidth", "50M"], "fast": ["--bandwidth", "5G"],
                          "slow4": ["--bandwidth", "50M", "--training-workers", "4"]}.items():
        result = _invoke("simulate", decoded_job("mxnet_sync_large"), "--out", tmp_path / name, "--json", *options)
        figures[name] = json.loads(result.output)["iteration_s_mean"]
    assert figures["fast"] < figures["slow"] <= figures["slow4"]
    # at 50 Mbit/s two workers push 2 x 5.12 MB through 2 servers' links each iteration: at least that long
    assert figures["slow"] > 2 * 5.12e6 * 8 / (50e6 * EFFICIENCY) / 2


@pytest.mark.parametrize("options, needle", [
    (["--bandwidth", "fast"], "not a rate"), (["--latency", "1 minute"], "not a duration"),
    (["--bandwidth", "0"], "not a rate"),
])
def test_bad_what_ifs_are_refused_in_one_line(decoded_job, tmp_path, options, needle):
    result = _invoke("simulate", decoded_job("mxnet_sync"), "--out", tmp_path / "sim", *options)
    assert result.exit_code != 0 and needle in result.output and "Traceback" not in result.output


def test_a_directory_without_a_decode_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    result = _invoke("simulate", tmp_path / "empty", "--out", tmp_path / "sim")
    assert result.exit_code == 1 and "Traceback" not in result.output


def test_a_barrier_a_pause_and_one_all_reduce_are_no_loop(tmp_path):
    """The real Soft-RoCE NCCL job (shared/realcaps, softroce-tutorial's test.py: barrier, sleep(10), one
    all-reduce on three ranks): nothing repeats, and taken as one iteration its communication was the pause
    (10,022 ms captured, 10,048 ms simulated). Each collective is a step: the pause is computation, the
    all-reduce's communication its own milliseconds, and the output says why."""
    from dlcsniff.decoders.decode_run import decode_to_dir

    _require("simgrid")
    nccl = PCAPS / "realcaps" / "softroce-tutorial" / "nccl"
    decode_to_dir([nccl / f"ring2_node{node}.pcap.gz" for node in range(3)], tmp_path / "decoded")
    result = CliRunner().invoke(app, ["simulate", str(tmp_path / "decoded"), "--out", str(tmp_path / "sim")])
    assert result.exit_code == 0, result.output
    assert "no run of collectives repeats" in result.output
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["model"]["collectives_repeat"] is False and summary["model"]["collectives_per_iteration"] == 1
    # the all-reduce took 4.4-4.6 ms on each rank's capture (its first to its last RDMA write of the tensor)
    assert summary["measured_communication_s_mean"] == pytest.approx(4.5e-3, abs=0.5e-3)
    assert summary["measured_iteration_s_mean"] == pytest.approx(10.0, abs=0.05)
    assert summary["iteration_s_mean"] == pytest.approx(summary["measured_iteration_s_mean"], rel=0.01)
    # its replayed communication is not the capture's (11-21 ms a rank for 0.6-4.5 ms): a quarter of its small RDMA
    # writes arrive before they left on clocks aligned to ±91 µs, and the output says the replay's order is a guess
    [note] = summary["model"]["notes"]
    assert re.fullmatch(r"25 of 96 messages arrive before they left on the aligned clocks \(±91 µs\): .*", note)
    assert note in result.output.replace("\n", " ")
    assert "no message of 65536 bytes or more: the links are taken as unlimited" in result.output


def test_a_job_on_one_clock_has_no_note_on_its_order(decoded_job):
    """pcaps/gloo, four ranks on one host: no message arrives before it left, and nothing is said."""
    model = co.collective_model(load_job_model(decoded_job("gloo")))
    assert (model.before_sent, co.clock_note(model)) == (0, None)
