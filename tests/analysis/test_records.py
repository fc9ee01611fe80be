"""analysis/operations.py on small hand-built message tables (the decode output's columns): which node sees
which message as which operation, from where, in which iteration."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dlcsniff.analysis import AnalysisError, build_records
from dlcsniff.analysis.load import NODE_COLUMNS, Dataset
from dlcsniff.analysis.operations import INIT_ITERATION, RECORD_COLUMNS
from dlcsniff.decoders.protocols.pslite.vantage import vantage_points
from tests.support.pslite_rows import S0, S1, SCHED, T0, W0, W1, WIRE, dataset, exchange, message, seen_by_both


def kv_records(trace, node_id):
    """The node's records but its registration."""
    mine = records_of(trace, node_id)
    return mine[~mine["operation"].astype(str).str.startswith("Add_Node")].reset_index(drop=True)


def records_of(trace, node_id):
    mine = trace.records[trace.records["node_id"] == node_id]
    return mine.sort_values("record_id", ignore_index=True)


def test_fused_push_pull_maps_to_push_send_and_pull_recv_with_own_capture_times():
    trace = build_records(dataset(exchange("w0", "s0", 0, W0, S0, stamp=1, key=3, push=True, pull=True)))
    assert tuple(trace.records.columns) == RECORD_COLUMNS
    worker = records_of(trace, W0)
    assert list(worker["operation"]) == ["Push_Send_Worker", "Pull_Recv_Worker"]
    # a send at its first byte, a receipt at its last, both as the worker's own capture saw them
    assert list(worker["ts_ns"] - T0) == [0, 500_000 + WIRE]
    assert list(worker["capture"]) == ["w0", "w0"]
    server = records_of(trace, S0)
    assert list(server["operation"]) == ["Push_Recv_Server", "Pull_Send_Server"]
    assert list(server["ts_ns"] - T0) == [WIRE, 500_000]
    assert server["fused"].all() and list(server["slot"]) == [0, 3]
    # the response carries the request's time, for d_time
    assert list(worker["request_ts_ns"] - T0) == [-1 - T0, 0]
    assert set(trace.nodes["vantage"]) == {"own"}


def test_push_then_pull_gives_the_four_operations_on_each_side():
    rows = (exchange("w0", "s0", 0, W0, S0, stamp=1, key=2, push=True, pull=False, response_size=18)
            + exchange("w0", "s0", 1_000_000, W0, S0, stamp=2, key=2, push=False, pull=True, request_size=30))
    trace = build_records(dataset(rows))
    assert list(records_of(trace, W0)["operation"]) == [
        "Push_Send_Worker", "Push_Recv_Worker", "Pull_Send_Worker", "Pull_Recv_Worker"]
    assert list(records_of(trace, S0)["operation"]) == [
        "Push_Recv_Server", "Push_Send_Server", "Pull_Recv_Server", "Pull_Send_Server"]
    # the empty push response has no key of its own: it inherits its request's
    assert set(records_of(trace, W0)["tensor_key"]) == {2}


def test_without_its_own_capture_a_node_is_seen_from_its_peers():
    trace = build_records(dataset(exchange("w0", "s0", 0, W0, S0, stamp=1, key=0, push=True, pull=True),
                                  without=("w0",)))
    worker = records_of(trace, W0)
    assert list(worker["operation"]) == ["Push_Send_Worker", "Pull_Recv_Worker"]
    assert list(worker["capture"]) == ["s0", "s0"]
    assert list(worker["ts_ns"] - T0) == [WIRE, 500_000]          # when the server saw them
    nodes = trace.nodes.set_index("node_id")
    assert nodes.loc[W0, "vantage"] == "peers" and nodes.loc[W0, "captures"] == "s0, sched"
    assert nodes.loc[S0, "vantage"] == "own"


def test_a_capture_shared_by_two_nodes_only_is_nobodys_own():
    rows = (exchange("w0", "s0", 0, W0, S0, stamp=1, key=0, push=True, pull=True)
            + exchange("w1", "s0", 0, W1, S0, stamp=1, key=0, push=True, pull=True))
    vantage = pd.DataFrame(vantage_points(dataset(rows).messages, dataset(rows).nodes))
    assert vantage[vantage["own"]].set_index("node_id")["capture"].to_dict() == {
        W0: "w0", W1: "w1", S0: "s0", SCHED: "sched"}
    # w1's capture without its registration holds nothing but its traffic with s0: either could own it
    shared = dataset(rows).messages
    shared = shared[~((shared["capture"] == "w1") & shared["control_cmd"].notna())]
    vantage = pd.DataFrame(vantage_points(shared, dataset(rows).nodes))
    assert vantage[vantage["node_id"] == W1].set_index("capture")["own"].to_dict() == {
        "s0": False, "sched": False, "w1": False}
    assert vantage[vantage["node_id"] == S0].set_index("capture")["own"].to_dict() == {"s0": True}


def test_the_capture_of_a_host_two_nodes_share_is_both_nodes_own():
    """BytePS runs a server beside each worker: w0 and s1 share host "h0" (one address in nodes.parquet), w1 and
    s0 share "h1"; a server answers its own host's worker there too."""
    rows = (exchange("h0", "h1", 0, W0, S0, stamp=1, key=0, push=True, pull=True)
            + exchange("h1", "h0", 0, W1, S1, stamp=1, key=0, push=True, pull=True)
            # within h0: one sighting each
            + [message("h0", 0, W0, S1, request=True, push=True, pull=True, stamp=2, key=1),
               message("h0", 1000, S1, W0, request=False, push=True, pull=True, stamp=2, key=1)])
    rows = [row | {"capture": {"w0": "h0", "s1": "h0", "w1": "h1", "s0": "h1"}.get(row["capture"], row["capture"])}
            for row in dataset(rows).messages.to_dict("records")]
    messages = pd.DataFrame(rows)
    nodes = pd.DataFrame({"node_id": [W0, S1, W1, S0], "hostname": ["10.0.0.1", "10.0.0.1", "10.0.0.2", "10.0.0.2"]})
    vantage = pd.DataFrame(vantage_points(messages, nodes))
    assert vantage.set_index("node_id")["capture"].to_dict() == {W0: "h0", S1: "h0", W1: "h1", S0: "h1", SCHED: "sched"}
    assert vantage["own"].all()
    # without the addresses each host's capture holds two nodes' traffic with others: nobody's own
    alone = pd.DataFrame(vantage_points(messages, nodes.iloc[0:0]))
    assert not alone[alone["node_id"] != SCHED]["own"].any()


def test_a_message_in_two_captures_of_the_same_node_is_recorded_once():
    # e.g. a capture and a second file overlapping it, both written on w0
    messages = dataset(exchange("w0", "s0", 0, W0, S0, stamp=1, key=0, push=True, pull=True)).messages
    copy = messages[messages["capture"] == "w0"].assign(capture="w0.1")
    trace = build_records(Dataset(pd.concat([messages, copy], ignore_index=True),
                                  pd.DataFrame(columns=list(NODE_COLUMNS)), "test"))
    assert trace.nodes.set_index("node_id").loc[W0, "captures"] == "w0, w0.1"
    assert len(records_of(trace, W0)) == 2
    assert trace.losses["records_seen_twice_dropped"] == 2


def test_a_broadcast_pull_that_leaves_after_the_first_push_pull_is_still_initialisation():
    """MXNet issues the initial broadcast asynchronously: in pcaps/mxnet_1s1w the pull of tensor 3 left after
    its first training push-pull. The first plain pull of a push-pulled dense tensor is initialisation."""
    rows = []
    rows += exchange("w0", "s0", 0, W0, S0, stamp=1, key=3, push=True, pull=False, response_size=18)
    rows += exchange("w0", "s0", 1_000_000, W0, S0, stamp=2, key=3, push=True, pull=True)
    rows += exchange("w0", "s0", 1_500_000, W0, S0, stamp=3, key=3, push=False, pull=True, request_size=30)
    rows += exchange("w0", "s0", 3_000_000, W0, S0, stamp=4, key=3, push=True, pull=True)
    worker0 = records_of(build_records(dataset(rows)), W0)
    by_request = worker0.groupby("ps_timestamp")["iteration"].agg(set).to_dict()   # a request and its response
    assert by_request == {1: {INIT_ITERATION}, 2: {0}, 3: {INIT_ITERATION}, 4: {1}}


def test_init_push_and_first_pulls_are_initialisation_and_rounds_follow_pushes():
    rows = []
    # worker 0: kv.init (a push before any pull), the broadcast pull, then two push-pull rounds
    rows += exchange("w0", "s0", 0, W0, S0, stamp=1, key=5, push=True, pull=False, response_size=18)
    rows += exchange("w0", "s0", 1_000_000, W0, S0, stamp=2, key=5, push=False, pull=True, request_size=30)
    rows += exchange("w0", "s0", 2_000_000, W0, S0, stamp=3, key=5, push=True, pull=True)
    rows += exchange("w0", "s0", 3_000_000, W0, S0, stamp=4, key=5, push=True, pull=True)
    # worker 1: pulls first (its broadcast), so its first push is already training
    rows += exchange("w1", "s0", 1_000_000, W1, S0, stamp=1, key=5, push=False, pull=True, request_size=30)
    rows += exchange("w1", "s0", 2_000_000, W1, S0, stamp=2, key=5, push=True, pull=True)
    rows += exchange("w1", "s0", 3_000_000, W1, S0, stamp=3, key=5, push=True, pull=True)
    # a pull after a push belongs to that push's round
    rows += exchange("w1", "s0", 3_600_000, W1, S0, stamp=4, key=5, push=False, pull=True, request_size=30)
    trace = build_records(dataset(rows))
    worker0, worker1 = records_of(trace, W0), records_of(trace, W1)
    assert list(worker0["iteration"]) == [INIT_ITERATION] * 4 + [0, 0, 1, 1]
    assert list(worker0["op_num"]) == [0, 1, 2, 3, 4, 7, 8, 11]
    assert list(worker1["iteration"]) == [INIT_ITERATION] * 2 + [0, 0, 1, 1, 1, 1]
    assert list(worker1["op_num"]) == [2, 3, 4, 7, 8, 11, 10, 11]
    # the server sees the same rounds, per worker
    server = records_of(trace, S0)
    pushes = server[server["operation"] == "Push_Recv_Server"]
    assert sorted(zip(pushes["worker_rank"], pushes["iteration"])) == [(0, -1), (0, 0), (0, 1), (1, 0), (1, 1)]


def test_rounds_follow_the_dispatch_order_not_the_capture_order():
    # the request with the lower ps-lite timestamp was dispatched first even if its packet came later
    rows = (exchange("w0", "s0", 500_000, W0, S0, stamp=1, key=0, push=True, pull=True)
            + exchange("w0", "s0", 0, W0, S0, stamp=2, key=0, push=True, pull=True)
            + exchange("w1", "s0", 0, W1, S0, stamp=1, key=0, push=False, pull=True))
    worker = records_of(build_records(dataset(rows)), W0)
    pushes = worker[worker["operation"] == "Push_Send_Worker"]
    assert list(zip(pushes["ts_ns"] - T0, pushes["iteration"])) == [(0, 1), (500_000, 0)]


def test_a_response_without_its_request_is_counted_and_still_opens_its_round():
    """Its request was made (ps-lite echoes the request's flags and timestamp in the response): numbering the
    rounds without it put every later push a round early (mxnet_lossy_heavy, tests/decoders/test_iterations.py)."""
    rows = [row for row in exchange("w0", "s0", 0, W0, S0, stamp=7, key=1, push=True, pull=True) if row["request"]
            is False] + exchange("w0", "s0", 1_000_000, W0, S0, stamp=8, key=1, push=True, pull=True)
    trace = build_records(dataset(rows))
    worker = records_of(trace, W0)
    assert list(worker["iteration"]) == [0, 1, 1]
    assert list(worker["op_num"]) == [7, 8, 11]
    assert trace.losses["responses_without_request"] == 2          # the worker's and the server's record


def test_commands_and_control_records_and_what_no_trace_holds():
    rows = (seen_by_both("w0", "s0", 0, W0, S0, request=True, simple_app=True, stamp=0, size=533,
                         simple_app_cmd="controller")
            + seen_by_both("s0", "w0", 100_000, S0, W0, request=False, simple_app=True, stamp=0, size=18,
                           simple_app_cmd="controller")
            + seen_by_both("w0", "sched", 200_000, W0, SCHED, request=True, control_cmd=3, size=28)
            + seen_by_both("sched", "w0", 300_000, SCHED, W0, request=False, control_cmd=3, size=37)
            + seen_by_both("w0", "s0", 400_000, W0, S0, request=False, control_cmd=5, size=20))   # no trace
    trace = build_records(dataset(rows))
    assert list(records_of(trace, W0)["operation"]) == ["SendCom_To_Servers", "RecvCom_From_Servers"]
    assert list(records_of(trace, W0)["op_num"]) == [0, 1]
    assert list(records_of(trace, S0)["operation"]) == ["RecvCom_From_Workers", "SendCom_To_Workers"]
    assert list(kv_records(trace, SCHED)["operation"]) == ["Barrier_Recv_Scheduler", "Barrier_Send_Scheduler"]
    # the worker-to-server HEARTBEAT belongs in no trace (the barrier's worker side is the scheduler's)
    assert trace.losses["records_dropped"] == 2


def test_kvstore_mode_from_the_command_or_from_the_answers():
    def round_of(answer_after_push_ns):
        rows = []
        for worker, capture, pushed in ((W0, "w0", 0), (W1, "w1", 300_000)):
            rows += exchange(capture, "s0", pushed, worker, S0, stamp=1, key=0, push=False, pull=True)
            rows += exchange(capture, "s0", 1_000_000 + pushed, worker, S0, stamp=2, key=0, push=True, pull=True,
                             rtt=answer_after_push_ns - pushed if worker == W1 else answer_after_push_ns)
        return rows

    assert build_records(dataset(round_of(600_000))).mode == "sync"       # both answered after both pushes
    assert build_records(dataset(round_of(100_000))).mode == "async"      # w0 answered before w1 pushed
    announced = round_of(100_000) + seen_by_both("w0", "s0", 10, W0, S0, request=True, simple_app=True,
                                                 simple_app_cmd="sync_mode", stamp=0, size=18)
    trace = build_records(dataset(announced))
    assert (trace.mode, trace.mode_evidence) == ("sync", "the workers sent the sync_mode command")


def test_no_messages_is_a_clear_error():
    with pytest.raises(AnalysisError, match="no ps-lite messages"):
        build_records(dataset([]))


def test_dlc_ranks_are_workers_then_servers_then_scheduler():
    rows = (exchange("w1", "s1", 0, W1, S1, stamp=1, key=0, push=True, pull=True)
            + seen_by_both("w1", "sched", 10, W1, SCHED, request=True, control_cmd=3, size=28))
    trace = build_records(dataset(rows))
    ranks = trace.nodes.set_index("name")["dlc_rank"].to_dict()
    # two workers and two servers exist (ids 11 and 10 imply ranks 1): W = 2, S = 2
    assert ranks == {"worker1": 1, "server1": 3, "scheduler": 4}
    assert sorted(kv_records(trace, SCHED)["peer_dlc_rank"]) == [1]
    assert np.array_equal(records_of(trace, W1)["dlc_rank"].unique(), [1])
