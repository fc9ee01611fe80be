"""The Chrome trace of a collective job (analysis.export_chrome_collectives): the real 4-rank PyTorch Gloo job in
pcaps/gloo, opened by the format's own reader (tests/support/chrome_trace.py) and held to what each rank
recorded of its own calls (rank<k>.json: kind, Gloo tags, call and return times on the host clock the four
captures share) and to events.parquet (read with pyarrow)."""
from __future__ import annotations

import collections
import json

import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dlcsniff.cli import app
from tests.conftest import PCAPS
from tests.support.chrome_trace import enclosing, ns, open_trace, slices_nest

RANKS = [0, 1, 2, 3]
PCAP_RESOLUTION_NS = 1000


@pytest.fixture(scope="module")
def exported(decoded_job, tmp_path_factory):
    decode_dir = decoded_job("gloo")
    path = tmp_path_factory.mktemp("gloo-chrome") / "trace.json"
    result = CliRunner().invoke(app, ["export", str(decode_dir), "--format", "chrome", "--out", str(path)])
    assert result.exit_code == 0, result.output
    assert "96 collective operations (one per rank)" in result.stdout
    return decode_dir, open_trace(path), result.stdout


def _recorded() -> pd.DataFrame:
    rows = []
    for rank in RANKS:
        record = json.loads((PCAPS / "gloo" / f"rank{rank}.json").read_text())
        for op in record["operations"]:
            # a send or receive is one operation whatever its tags; a reduce_scatter one all-reduce per tag
            for tag in (op["gloo_tags"] or [None]) if op["kind"] not in ("send", "recv") else [None]:
                kind = "all_reduce" if op["kind"] == "reduce_scatter" else op["kind"]
                rows.append({"rank": rank, "kind": kind, "seq": tag, "call_ns": op["start_ns"],
                             "return_ns": op["end_ns"]})
    return pd.DataFrame(rows)


def _pid(opened, name: str) -> int:
    (pid,) = [pid for pid, named in opened.process_names.items() if named == name]
    return pid


def test_a_process_per_rank_with_its_operations_as_it_recorded_them(exported):
    decode_dir, opened, _ = exported
    assert sorted(opened.process_names.values()) == [f"rank {rank}" for rank in RANKS]
    recorded = _recorded()
    clocks = pd.read_parquet(decode_dir / "clocks.parquet").set_index("capture")
    origin = opened.other["origin_unix_ns"]
    for rank in RANKS:
        pid = _pid(opened, f"rank {rank}")
        assert opened.thread_names[(pid, 0)] == "collectives"
        # concurrent operations on lanes of their own ("collectives (2)"...), each named as `stats` names it
        operations = [s for (p, tid), track in opened.slices.items() if p == pid
                      and opened.thread_names[(p, tid)].startswith("collectives") for s in track]
        assert all(s.event["name"].startswith("send_recv " if s.event["args"]["kind"] in ("send", "recv")
                                              else s.event["args"]["kind"] + "#") for s in operations)
        assert all(s.event["name"].endswith(f"#{s.event['args']['seq']}") for s in operations)
        mine = recorded[recorded["rank"] == rank]
        # every operation the rank called is one slice, of its kind and Gloo tag (sends and receives: by count)
        found = collections.Counter((s.event["args"]["kind"], s.event["args"]["seq"]) for s in operations
                                    if s.event["args"]["kind"] not in ("send", "recv"))
        called = collections.Counter((k, q) for k, q in zip(mine["kind"], mine["seq"]) if k not in ("send", "recv"))
        assert found == called
        assert collections.Counter(s.event["args"]["kind"] for s in operations
                                   if s.event["args"]["kind"] in ("send", "recv")) == \
            collections.Counter(k for k in mine["kind"] if k in ("send", "recv"))
        # on the wire an operation starts no earlier than the first rank called it and ends before the rank's
        # own call returned: on the job's clock, to within what the clock alignment states
        slack = (int(clocks.loc[f"rank{rank}", "error_bound_ns"]) + int(clocks["error_bound_ns"].max())
                 + PCAP_RESOLUTION_NS)
        first_call = recorded.groupby(["kind", "seq"])["call_ns"].min()
        returns = mine.set_index(["kind", "seq"])["return_ns"]
        for s in operations:
            key = (s.event["args"]["kind"], s.event["args"]["seq"])
            if s.event["args"]["kind"] in ("send", "recv"):
                continue
            assert s.start_ns + origin >= first_call[key] - slack
            assert s.end_ns + origin <= returns[key] + slack


def test_every_message_is_a_slice_at_each_end_with_a_flow(exported):
    decode_dir, opened, stdout = exported
    events = pq.read_table(decode_dir / "events.parquet").to_pandas()
    gloo = events[events["protocol"] == "gloo"]
    assert gloo["send_capture"].notna().all() and gloo["recv_capture"].notna().all()
    messages = [s for slices in opened.slices.values() for s in slices if s.event["cat"] in ("send", "recv")]
    assert len(messages) == 2 * len(gloo) and len(opened.flows) == len(gloo)
    assert f"{2 * len(gloo):,} message events, {len(gloo):,} flows" in stdout
    # per track: one peer and direction, its messages one after the other
    for (pid, tid), slices in opened.slices.items():
        name = opened.thread_names[(pid, tid)]
        if name.startswith("collectives"):
            continue
        direction, peer = name.split(" ", 1)
        assert direction in ("send", "recv")
        assert {s.event["cat"] for s in slices} == {direction} and slices_nest(slices)
    # the flow binds the sender's slice of a message to the receiver's slice of the same message
    for ends in opened.flows.values():
        sent, received = enclosing(opened, ends["s"]), enclosing(opened, ends["f"])
        assert sent and received and sent.event["cat"] == "send" and received.event["cat"] == "recv"
        assert sent.event["name"] == received.event["name"]
        assert sent.event["args"]["opcode"] == received.event["args"]["opcode"]
        assert sent.event["args"]["size_bytes"] == received.event["args"]["size_bytes"]
        sender = opened.process_names[ends["s"]["pid"]]
        assert opened.thread_names[(ends["f"]["pid"], ends["f"]["tid"])].split(" (")[0] == f"recv ← {sender}"
    # the payload each rank sent, by the trace, is what events.parquet says each rank sent
    sent_bytes = collections.Counter()
    for s in messages:
        if s.event["cat"] == "send":
            sent_bytes[opened.process_names[s.event["pid"]]] += s.event["args"]["payload_bytes"]
    truth = gloo.groupby("src_rank")["payload_bytes"].sum()
    assert sent_bytes == {f"rank {int(rank)}": int(n) for rank, n in truth.items()}
    assert all(ns(s.event["dur"]) >= 0 for s in messages)


def test_the_collective_job_in_the_other_views(decoded_job, tmp_path):
    """decode prints only the protocols present; dlc says where a collective job's traffic is shown instead
    (and writes nothing); the Chakra export has a trace per rank."""
    runner = CliRunner()
    decoded = runner.invoke(app, ["decode", str(PCAPS / "gloo"), "--out", str(tmp_path / "decoded")])
    assert decoded.exit_code == 0, decoded.output
    assert "ZMTP" not in decoded.stdout and "ps-lite" not in decoded.stdout
    assert "messages by protocol, each once: gloo 1,908, tcpstore 184" in decoded.stdout
    assert "clocks aligned to rank0: rank1" in decoded.stdout
    refused = runner.invoke(app, ["dlc", str(decoded_job("gloo")), "--out", str(tmp_path / "dlc")])
    assert refused.exit_code == 1 and "dlcsniff export --format chrome|chakra" in refused.output
    assert not (tmp_path / "dlc").exists()
    chakra = runner.invoke(app, ["export", str(decoded_job("gloo")), "--format", "chakra", "--out",
                                 str(tmp_path / "et")])
    assert chakra.exit_code == 0, chakra.output
    assert len(list((tmp_path / "et").glob("*.et"))) == len(RANKS)


@pytest.mark.parametrize("run", ["ring2", "tree2"])
def test_real_nccl_over_roce_from_elsewhere(run, tmp_path):
    """The real NCCL 2.20.5 jobs over Soft-RoCE in pcaps/realcaps (3 ranks, one capture each; README there):
    each rank ran a barrier (an all_reduce of one byte) and a 6144-float all_reduce, as its NCCL log says. The
    data writes name their sender and the CTS writes their receiver: the other end is the capture's rank."""
    from dlcsniff.decoders.decode_run import decode_to_dir
    captures = sorted((PCAPS / "realcaps" / "softroce-tutorial" / "nccl").glob(f"{run}_node*.pcap.gz"))
    decode_to_dir(captures, tmp_path / "decoded")
    result = CliRunner().invoke(app, ["export", str(tmp_path / "decoded"), "--format", "chrome", "--out",
                                      str(tmp_path / "trace.json")])
    assert result.exit_code == 0, result.output
    opened = open_trace(tmp_path / "trace.json")
    assert sorted(opened.process_names.values()) == ["rank 0", "rank 1", "rank 2"]
    for pid in opened.process_names:
        operations = sorted(opened.slices[(pid, 0)], key=lambda s: s.start_ns)
        assert [(s.event["args"]["kind"], s.event["args"]["tensor_bytes"]) for s in operations] == [
            ("all_reduce", 1), ("all_reduce", 24576)]
    events = pq.read_table(tmp_path / "decoded" / "events.parquet").to_pandas()
    roce = events[events["protocol"] == "roce"]
    # every RDMA message was captured by its sender's host and its receiver's: one event seen at both ends
    assert len(roce) and roce["send_capture"].notna().all() and roce["recv_capture"].notna().all()
    assert len(opened.flows) == len(roce)
    for ends in opened.flows.values():
        sent, received = enclosing(opened, ends["s"]), enclosing(opened, ends["f"])
        assert sent and received and sent.event["args"]["size_bytes"] == received.event["args"]["size_bytes"]
    for (pid, tid), slices in opened.slices.items():
        assert slices_nest(slices), opened.thread_names[(pid, tid)]
