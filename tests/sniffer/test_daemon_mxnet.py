"""A real MXNet 1.9.1 parameter-server job (scheduler, 2 servers, 2 workers), each node in its own network
namespace with its own `dlcsniff capture --iface any` daemon (a node's messages to itself travel on lo),
as on a cluster, the five daemons started together 1 s before the job (not once they are ready: a prolog
does not wait for the probes), on this 2-core machine. Ground truth: the pids of the job's processes, and
ps-lite's own log of every message it sent and received (PS_VERBOSE=2).

- every ps-lite TCP connection a daemon saw is owned by its node's process, and both ends agree;
- the libzmq probe events, grouped into messages, are the messages ps-lite logged;
- the packets decode into every logged message (the existing pipeline, on the daemons' pcap files).

`run_mxnet_job` is shared with the benchmark (tests/bench/capture.py).
"""
from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from dlcsniff.decoders.job import decode_paths
from dlcsniff.decoders.inputs.daemon_dir import load_capture_dir, zmq_messages
from lab.record import _pslite_node_id
from tests.conftest import require_root, require_workloads
from tests.support.groundtruth import load_job
from tests.support.mxnet_job import NODES, PSLITE_PORTS, JobRun, run_mxnet_job

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def job_run(tmp_path_factory) -> JobRun:
    require_root()
    # every libzmq send and receive probed (the default, --zmq-events none, probes none of them)
    return run_mxnet_job(tmp_path_factory.mktemp("mxnet_daemons"), require_workloads(),
                         daemon_args=("--zmq-events", "calls"))


def test_every_pslite_flow_is_owned_by_its_node_process(job_run):
    pid_of = {name: node.process.pid for name, node in job_run.nodes.items()}
    node_of_ip = {node.ip: name for name, node in job_run.nodes.items()}
    ends = {}
    for name in NODES:
        flows = load_capture_dir(job_run.directory / name).flows
        pslite = flows[(flows["local_port"].isin(PSLITE_PORTS) | flows["remote_port"].isin(PSLITE_PORTS))
                       & flows["remote_ip"].isin(node_of_ip)]
        assert len(pslite) >= len(NODES) - 1, f"{name}: {len(pslite)} ps-lite connections"
        assert set(pslite["pid"]) == {pid_of[name]}, pslite[["local_port", "remote_ip", "remote_port", "pid",
                                                               "source"]]
        assert set(pslite["comm"]) == {"python"} and set(pslite["local_ip"]) == {job_run.nodes[name].ip}
        # one row a connection, whether the tracepoint, /proc or both saw it (the daemons start 1 s before the job)
        addresses = pslite.groupby(["local_port", "remote_ip", "remote_port"]).size()
        assert (addresses == 1).all(), pslite[pslite.set_index(["local_port", "remote_ip", "remote_port"]).index
                                              .isin(addresses.index[addresses > 1])].to_dict("records")
        for row in pslite[pslite["established_ts_ns"].notna()].itertuples():
            ends[(row.local_ip, row.local_port, row.remote_ip, row.remote_port)] = name
    # the daemon at the other end saw the same connection, owned by the other node's process (connect()
    # attempts refused before the peer listened were never established and have no other end)
    for (local_ip, local_port, remote_ip, remote_port), name in ends.items():
        assert ends.get((remote_ip, remote_port, local_ip, local_port)) == node_of_ip[remote_ip]


def _logged_data_sizes(log: Path, direction: str) -> collections.Counter:
    from tests.support.groundtruth import parse_pslite_log

    frame = parse_pslite_log(log)
    return collections.Counter(tuple(int(size) for size in sizes)
                               for sizes in frame.loc[frame["direction"] == direction, "data_sizes"])


def test_libzmq_events_are_the_messages_pslite_logged(job_run):
    for name, node in job_run.nodes.items():
        loaded = load_capture_dir(job_run.directory / name)
        assert list(loaded.libraries["library"]) == ["libzmq"]
        assert loaded.libraries["path"].iloc[0].endswith("mxnet/libmxnet.so")
        events = loaded.zmq_events[loaded.zmq_events["pid"] == node.process.pid]
        assert len(events) == len(loaded.zmq_events)      # nothing from other namespaces
        messages = zmq_messages(events)
        assert messages["complete"].all()
        by_direction = {direction: messages.loc[messages["direction"] == direction, "frame_sizes"]
                        for direction in ("send", "recv")}
        # ps-lite sends [meta, data...] on a DEALER socket. Van::Stop sends TERMINATE (no data) to itself
        # without logging it: one send more than the log holds.
        sent = collections.Counter(tuple(frames[1:]) for frames in by_direction["send"])
        assert sent == _logged_data_sizes(node.log, "send") + collections.Counter({(): 1}), name
        # The ROUTER socket delivers [sender identity, meta, data...].
        received = collections.Counter(tuple(frames[2:]) for frames in by_direction["recv"])
        assert received == _logged_data_sizes(node.log, "recv"), name
        # api time first, then the return: a send never waits for the wire
        assert (events["ts_ns"] <= events["return_ts_ns"]).all()


def test_the_daemon_packets_decode_into_every_logged_message(job_run, tmp_path):
    from tests.support.groundtruth import decoded_message_keys, logged_message_keys

    nodes = []
    for name, node in job_run.nodes.items():
        captures = load_capture_dir(job_run.directory / name).captures
        assert len(captures) == 1
        (tmp_path / f"{name}.pcap").symlink_to(captures[0])
        (tmp_path / f"{name}.log").symlink_to(node.log)
        nodes.append({"name": name, "role": node.role, "ip": node.ip, "pid": node.process.pid,
                      "pslite_id": _pslite_node_id(node.log), "log": f"{name}.log", "capture": f"{name}.pcap"})
    (tmp_path / "job.json").write_text(json.dumps({"job": "daemons", "nodes": nodes}))
    job = load_job(tmp_path)
    messages = decode_paths(sorted(tmp_path.glob("*.pcap"))).tables["messages"].to_pandas()
    for node in nodes:
        logged, decoded = logged_message_keys(job, node["name"]), decoded_message_keys(messages, job, node["name"])
        assert sum(logged.values()) > 0 and logged == decoded, node["name"]


def test_decode_of_the_daemon_directories_names_processes_and_api_times(job_run, tmp_path):
    """`dlcsniff decode DIR...` on the daemons' own directories: the captures are named after them, every
    ps-lite flow carries the pid of the process at the capture's end, messages carry both ends' pids, and
    the messages a node sent carry when the program handed them to libzmq (api_ts_ns) and how long they
    waited before their first byte reached the wire."""
    import pandas as pd
    from typer.testing import CliRunner

    from dlcsniff.cli import app

    directories = [str(job_run.directory / name) for name in job_run.nodes]
    result = CliRunner().invoke(app, ["decode", *directories, "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    streams = pd.read_parquet(tmp_path / "out" / "streams.parquet")
    messages = pd.read_parquet(tmp_path / "out" / "messages.parquet")
    assert set(streams["capture"]) == set(job_run.nodes)
    pid_of = {name: node.process.pid for name, node in job_run.nodes.items()}
    pslite = streams[(streams["protocol"] == "pslite") & (streams["bytes"] > 0)]
    assert len(pslite) > 0
    assert (pslite["pid"] == pslite["capture"].map(pid_of)).all(), "a flow's pid is its node's process"
    node_pid = {n: pid_of[n] for n in job_run.nodes}
    by_id = {_pslite_node_id(node.log): node_pid[name] for name, node in job_run.nodes.items()}
    ps = messages[messages["protocol"] == "pslite"]
    assert (ps["sender_pid"] == ps["sender_id"].map(by_id)).all()
    assert (ps["recver_pid"] == ps["recver_id"].map(by_id)).all()
    own_sends = ps[ps["capture"].map(pid_of) == ps["sender_pid"]]
    timed = own_sends[own_sends["api_ts_ns"].notna()]
    assert len(timed) >= 0.9 * len(own_sends)
    # the program hands a message over before its first byte is captured (1 µs pcap resolution)
    assert (timed["send_queue_delay_ns"] >= -1_000).all()
