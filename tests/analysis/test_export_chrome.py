"""The Chrome trace export (analysis.export_chrome) of the real MXNet jobs in pcaps/.

Perfetto's trace_processor cannot be installed here, so the file is opened by a reader written from the
trace event format alone (tests/support/chrome_trace.py: JSON object, phases, µs timestamps, flow s/f binding
to their enclosing slices) and its events are counted against messages.parquet (read with pyarrow), against
what each node's ps-lite logged (PS_VERBOSE=2), and against the batches the workload itself timed.
"""
from __future__ import annotations

import collections

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dlcsniff.decoders.output import write_decode_output
from dlcsniff.decoders.job import decode_paths
from dlcsniff.cli import app
from tests.conftest import PCAPS, capture_cut_before
from tests.support.chrome_trace import enclosing, ns, open_trace, slices_nest
from tests.support.decoded import on_reference_clock
from tests.support.groundtruth import load_job

JOBS = ["mxnet_sync", "mxnet_async", "mxnet_sparse", "mxnet_sync_large"]
TERMINATE = 1                      # ps-lite Control::TERMINATE


@pytest.fixture(scope="module", params=JOBS)
def exported(request, tmp_path_factory, decoded_job):
    root = tmp_path_factory.mktemp(request.param)
    decode_dir = decoded_job(request.param)
    result = CliRunner().invoke(app, ["export", str(decode_dir), "--format", "chrome",
                                      "--out", str(root / "trace.json")])
    assert result.exit_code == 0, result.output
    # the export's one timeline: every capture read with its clock (clocks.parquet)
    clocks = pq.read_table(decode_dir / "clocks.parquet").to_pandas()
    messages = on_reference_clock(pq.read_table(decode_dir / "messages.parquet").to_pandas(), clocks)
    return load_job(PCAPS / request.param), messages, open_trace(root / "trace.json"), clocks


def test_every_track_is_named_and_its_slices_nest(exported):
    job, _, opened, _ = exported
    # processes are named by ps-lite role and rank, labelled with their capture's file (in mxnet_sync the file
    # worker0.pcap.gz holds worker rank 1: no name is both a node's and a capture's)
    assert opened.process_names == {node["pslite_id"]: "scheduler" if node["role"] == "scheduler"
                                    else f"{node['role']} rank {node['rank']}" for node in job.nodes}
    assert opened.process_labels == {node["pslite_id"]: f"capture {node['name']}.pcap.gz" for node in job.nodes}
    assert not set(opened.process_names.values()) & {node["name"] for node in job.nodes} - {"scheduler"}
    used = set(opened.slices) | {(e["pid"], e["tid"]) for e in opened.instants}
    used |= {(e["pid"], e["tid"]) for flow in opened.flows.values() for e in flow.values()}
    assert used <= set(opened.thread_names) and {pid for pid, _ in used} <= set(opened.process_names)
    for track, slices in opened.slices.items():
        assert slices_nest(slices), opened.thread_names[track]


def test_message_events_are_the_rows_of_messages_parquet_at_each_end(exported):
    """Each row of messages.parquet at each end is one slice holding that end's first to last byte (the slice
    spans the message from its first byte sent to its last received: both ends' rows); where the row was
    seen is said against the slice's start."""
    job, messages, opened, _ = exported
    origin = opened.other["origin_unix_ns"]
    for node in job.nodes:
        pid, mine = node["pslite_id"], messages[messages["capture"] == node["name"]]
        for cat, column in (("send", "sender_id"), ("recv", "recver_id")):
            rows = mine[mine[column] == pid]
            expected = sorted(zip(rows["ts_first_ns"] - origin, rows["ts_last_ns"] - origin, rows["size_bytes"]))
            slices = [s for (p, _), track in opened.slices.items() if p == pid for s in track
                      if s.event.get("cat") == cat]
            here = sorted((s.start_ns + ns(s.event["args"]["first_byte_here_after_us"]),
                           s.start_ns + ns(s.event["args"]["last_byte_here_after_us"]),
                           s.event["args"]["size_bytes"]) for s in slices)
            assert here == expected, (node["name"], cat)
            assert all(s.start_ns <= first <= last <= s.end_ns for s, (first, last, _) in zip(
                sorted(slices, key=lambda s: (s.start_ns + ns(s.event["args"]["first_byte_here_after_us"]),
                                              s.start_ns + ns(s.event["args"]["last_byte_here_after_us"]),
                                              s.event["args"]["size_bytes"])), here))


def test_counts_match_what_ps_lite_logged(exported):
    """Receipts: one recv event per logged receipt. Sends: one per logged send, plus the TERMINATE a node
    sends itself, which ps-lite does not log."""
    job, messages, opened, _ = exported
    per_node = collections.Counter((s.event["pid"], s.event["cat"]) for slices in opened.slices.values()
                                   for s in slices if s.event.get("cat") in ("send", "recv"))
    receipts = 0
    for node in job.nodes:
        log, pid = job.log(node["name"]), node["pslite_id"]
        logged = collections.Counter(log["direction"].astype(str))
        mine = messages[messages["capture"] == node["name"]]
        unlogged = int(((mine["sender_id"] == pid) & (mine["recver_id"] == pid)
                        & (mine["control_cmd"] == TERMINATE)).sum())
        assert per_node[(pid, "recv")] == logged["recv"], node["name"]
        assert per_node[(pid, "send")] == logged["send"] + unlogged, node["name"]
        receipts += logged["recv"]
    # every message received was also captured where it was sent: one flow each
    assert len(opened.flows) == receipts


def test_flows_go_from_a_send_slice_to_the_receipt_slice_of_the_same_message(exported):
    _, _, opened, clocks = exported
    # on the aligned timeline a receipt may precede its send by no more than two captures' clock bounds
    slack_us = 2 * clocks["error_bound_ns"].max() / 1000
    for flow_id, ends in opened.flows.items():
        assert set(ends) == {"s", "f"}, flow_id
        start, finish = ends["s"], ends["f"]
        assert finish.get("bp") == "e" and finish["ts"] >= start["ts"] - slack_us
        sent, received = enclosing(opened, start), enclosing(opened, finish)
        assert sent is not None and received is not None, flow_id
        assert sent.event["cat"] == "send" and received.event["cat"] == "recv"
        assert sent.event["name"] == received.event["name"]
        assert sent.event["args"]["size_bytes"] == received.event["args"]["size_bytes"]
        assert opened.process_names[sent.event["pid"]] == received.event["args"]["peer"]
        assert opened.process_names[received.event["pid"]] == sent.event["args"]["peer"]


def test_iterations_are_the_batches_the_workers_ran(exported):
    job, _, opened, _ = exported
    for node in job.nodes:
        if node["role"] != "worker":
            continue
        tracks = [(node["pslite_id"], tid) for (pid, tid), name in opened.thread_names.items()
                  if pid == node["pslite_id"] and name.startswith("iterations")]
        marks = [s.event for track in tracks for s in opened.slices[track] if s.event["name"].startswith("iteration ")]
        marks += [e for e in opened.instants if (e["pid"], e["tid"]) in tracks]
        batches = job.records[node["name"]]["batches"]
        assert sorted(e["args"]["iteration"] for e in marks) == [batch["index"] for batch in batches]
        phases = collections.Counter(s.event["name"] for track in tracks for s in opened.slices[track])
        assert phases["phase 2"] >= len(batches) - 1 and phases["phase 1"] >= len(batches) - 2


def test_a_node_without_capture_and_a_capture_cut_short(tmp_path):
    """worker1 has no capture (its messages are shown from its peers'), worker0's capture stops mid-training:
    what worker0's peers saw of it afterwards has no other end (counted, no flow), and every flow still binds."""
    job = load_job(PCAPS / "mxnet_sync")
    cut_ns = job.records["worker0"]["batches"][5]["start_ns"]
    cut = capture_cut_before(job.capture_path("worker0"), cut_ns, tmp_path / "captures" / "worker0.pcap")
    captures = [job.capture_path(node["name"]) for node in job.nodes if node["role"] != "worker"] + [cut]
    write_decode_output(decode_paths(captures), tmp_path / "decoded")
    result = CliRunner().invoke(app, ["export", str(tmp_path / "decoded"), "--format", "chrome",
                                      "--out", str(tmp_path / "trace.json")])
    assert result.exit_code == 0, result.output
    opened = open_trace(tmp_path / "trace.json")
    worker0, worker1 = job.node("worker0"), job.node("worker1")
    assert opened.process_labels[worker0["pslite_id"]] == "capture worker0.pcap"
    assert opened.process_labels[worker1["pslite_id"]].startswith("no capture of its own, seen from ")

    messages = pq.read_table(tmp_path / "decoded" / "messages.parquet").to_pandas()
    mine = worker0["pslite_id"]
    involving = messages[(messages["sender_id"] == mine) | (messages["recver_id"] == mine)]
    seen_by_worker0 = int((involving["capture"] == "worker0").sum())
    # before the cut each message of worker0 is in its capture and its peer's; after it, in its peer's only
    # (worker1's are seen at both ends through its peers' captures)
    unpaired = len(involving) - 2 * seen_by_worker0
    events = sum(s.event.get("cat") in ("send", "recv") for slices in opened.slices.values() for s in slices)
    assert unpaired > 0 and events - 2 * len(opened.flows) == unpaired
    assert f"messages seen at one end {unpaired:,}" in result.output
    for ends in opened.flows.values():
        assert set(ends) == {"s", "f"} and enclosing(opened, ends["s"]) and enclosing(opened, ends["f"])
