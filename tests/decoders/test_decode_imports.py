"""`dlcsniff decode` never imports pandas (issue 22: its import alone cost more than tshark's whole pass over a small
capture): the job steps, the timeline, the summary and the writer work on Arrow and numpy (Gloo's and NCCL's
collectives and a capture daemon's records still take pandas). Nor google.protobuf: decoders.protocols.pslite.pbmeta
reads ps-lite's meta frames. Behaviour, not timing: which modules a fresh
interpreter holds once a real decode is done, and the summary it printed against one computed here, with pandas,
from the tables it wrote."""
from __future__ import annotations

import json
import os
import subprocess

import pandas as pd
import pyarrow.parquet as pq
import pytest

from tests.conftest import PCAPS, REPO

PYTHON = REPO / ".venv" / "bin" / "python"
# Runs the CLI as the installed script does, then writes the modules loaded (a JSON list) into the directory named by
# the MODULES environment variable, and so does each worker process it forks once it has decoded its capture (a
# worker leaves without running atexit).
RUN = """
import atexit, json, os, sys
def say(name):
    with open(os.path.join(os.environ["MODULES"], name), "w") as out:
        json.dump(sorted(sys.modules), out)
atexit.register(say, "program.json")
import dlcsniff.decoders.fork_pool as pool
decode_capture = pool.decode_capture
def decode_and_say(*args, **kwargs):
    result = decode_capture(*args, **kwargs)
    say(f"worker-{os.getpid()}.json")
    return result
pool.decode_capture = decode_and_say
sys.argv = ["dlcsniff", *json.loads(sys.argv[1])]
from dlcsniff.cli import main
main()
"""


def run_program(args: list[str], modules_dir) -> tuple[subprocess.CompletedProcess, set[str]]:
    """The CLI run in a fresh interpreter, and every module it and its workers had loaded. A fresh program decodes
    even a small capture in a worker (decoders.job: its own imports meanwhile), so one is required."""
    modules_dir.mkdir()
    result = subprocess.run([str(PYTHON), "-c", RUN, json.dumps(args)], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "MODULES": str(modules_dir)})
    assert result.returncode == 0, result.stderr
    found = sorted(path.name for path in modules_dir.iterdir())
    assert "program.json" in found and any(name.startswith("worker-") for name in found), found
    return result, {name for path in modules_dir.iterdir() for name in json.loads(path.read_text())}


def decode(capture, out) -> tuple[dict, set[str]]:
    """The --json summary of a decode in a fresh interpreter, and the modules it (and its workers) had loaded."""
    args = ["decode", str(capture), "--out", str(out), "--json", "--no-progress"]
    result, modules = run_program(args, out.parent / f"{out.name}-modules")
    return json.loads(result.stdout), modules


@pytest.mark.parametrize("job", ["zmq", "tcp_zero_window", "mxnet_lossy_heavy", "byteps_colocated_2x2"])
def test_a_decode_never_imports_pandas_nor_protobuf(tmp_path, job):
    summary, modules = decode(PCAPS / job, tmp_path / "out")
    assert {"numpy", "pyarrow"} <= modules           # it did decode and write the tables
    assert "pandas" not in modules
    assert not [name for name in modules if name.split(".")[:2] == ["google", "protobuf"]]
    # the summary's counts, recomputed from the tables written
    streams = pq.read_table(tmp_path / "out" / "streams.parquet").to_pandas()
    tcp = streams[streams["syn_seen"].notna()]
    assert summary["flows_by_protocol"] == streams.groupby("protocol").size().to_dict()
    assert summary["tcp_bytes"] == tcp["bytes"].sum() > 0
    assert summary["missing_bytes"] == tcp["missing_bytes"].sum()
    assert summary["streams_with_holes"] == (tcp["missing_bytes"] > 0).sum()
    plain = tcp[tcp["protocol"] == "tcp"]
    connections = {(c, frozenset({(s, sp), (d, dp)})) for c, s, sp, d, dp in
                   zip(plain["capture"], plain["src_ip"], plain["src_port"], plain["dst_ip"], plain["dst_port"])}
    assert summary["unclaimed"]["tcp_connections"] == len(connections)
    assert summary["unclaimed"]["tcp_bytes"] == plain["bytes"].sum()
    zmtp = pq.read_table(tmp_path / "out" / "zmtp.parquet").to_pandas()
    assert (summary["zmtp_messages"], summary["zmtp_commands"]) == (zmtp["command"].isna().sum(),
                                                                    zmtp["command"].notna().sum())
    events = pq.read_table(tmp_path / "out" / "events.parquet").to_pandas()
    assert summary["messages"] == summary["job_view"]["events"] == len(events)
    assert summary["messages_by_protocol"] == events.groupby("protocol").size().to_dict()
    assert summary["job_view"]["losses"].get("events_seen_at_both_ends", 0) == (
        events["send_capture"].notna() & events["recv_capture"].notna()).sum()


def test_a_capture_without_messages_has_an_empty_timeline(tmp_path):
    summary, modules = decode(PCAPS / "zmq", tmp_path / "out")
    for name in ("messages", "events", "clocks"):
        assert pq.read_table(tmp_path / "out" / f"{name}.parquet").num_rows == 0
    assert summary["messages"] == summary["observations"] == 0
    assert summary["job_view"]["reference"] is None and summary["job_view"]["clocks"] == []
    from dlcsniff.decoders.schema import CLOCKS, EVENTS
    assert pq.read_schema(tmp_path / "out" / "events.parquet").remove_metadata().equals(EVENTS.schema)
    assert pq.read_schema(tmp_path / "out" / "clocks.parquet").remove_metadata().equals(CLOCKS.schema)


@pytest.mark.parametrize("job", ["mxnet_lossy_heavy", "byteps_colocated_2x2"])
def test_a_pslite_decode_never_imports_pyarrow_compute_or_numpy_ma(tmp_path, job):
    """Issue 22: importing pyarrow.compute (which wraps every kernel at import) and numpy.ma (which pyarrow.array
    of a numpy array or with a mask imports) cost a small decode a large share of its time. A ps-lite job (MXNet
    with losses, so every summary count and capture limit is computed; BytePS) decodes without either; the
    human summary's tables too."""
    summary, modules = decode(PCAPS / job, tmp_path / "json")
    assert summary["messages_by_protocol"]["pslite"] > 0 and "pyarrow.parquet" in modules
    assert "pyarrow.compute" not in modules and "numpy.ma" not in modules
    args = ["decode", str(PCAPS / job), "--out", str(tmp_path / "human"), "--no-progress"]
    result, modules = run_program(args, tmp_path / "human-modules")
    assert "ps-lite KV traffic" in result.stdout
    assert "pyarrow.compute" not in modules and "numpy.ma" not in modules


@pytest.mark.parametrize("job", ["mxnet_lossy_heavy", "gloo_hang"])
def test_the_summary_of_a_job_with_messages_matches_its_tables(tmp_path, job):
    """The counts the summary gives of the job's messages (each once, from the timeline) and of what each protocol
    lost, against pandas on the tables written."""
    from dlcsniff.decoders.decode_run import decode_to_dir

    run = decode_to_dir([PCAPS / job], tmp_path / "out")
    summary = run.dataset.summary
    events = pd.read_parquet(tmp_path / "out" / "events.parquet")
    messages = pd.read_parquet(tmp_path / "out" / "messages.parquet")
    incomplete = events[~events["complete"].fillna(False).astype(bool)]
    assert summary["messages"] == len(events) > 0
    assert summary["messages_by_protocol"] == events.groupby("protocol").size().to_dict()
    assert summary["observations_by_protocol"] == messages.groupby("protocol").size().to_dict()
    assert summary["incomplete_messages"] == len(incomplete)
    assert summary["control_messages"] == events["control_cmd"].notna().sum()
    pslite = events[events["protocol"] == "pslite"]
    assert summary.get("messages_without_node_ids", 0) == (pslite["sender_id"].isna()
                                                           | pslite["recver_id"].isna()).sum()
    lost = {protocol: found.get("incomplete_messages", 0) for protocol, found in summary["losses_by_protocol"].items()}
    assert {p: n for p, n in lost.items() if n} == incomplete.groupby("protocol").size().to_dict()
    clocks = pd.read_parquet(tmp_path / "out" / "clocks.parquet")
    assert run.job_view["clocks"] == clocks.astype(object).where(clocks.notna(), None).to_dict(orient="records")
    counts = clocks["reference"].value_counts()
    assert run.job_view["reference"] == min(counts[counts == counts.max()].index)
