"""Every figure the analysis shows says what it is (issue 19 item 7): the report's header lists each decoded
table with its rows and what a row is (from the manifest decode writes) and the decode's warnings; the stats'
"records dropped" and the Chakra export's "dependencies against time dropped" say what was dropped and why, in
the printed line, in --json / summary.json and in the report. On bundled real jobs where the counts are not zero,
checked against ps-lite's own log where it says what happened."""
from __future__ import annotations

import json
import re
from datetime import datetime, timezone

from typer.testing import CliRunner

from dlcsniff.analysis import load_dataset, pslite_trace
from dlcsniff.analysis.export_chakra import chakra_graph
from dlcsniff.analysis.report import header_rows
from dlcsniff.cli import app
from dlcsniff.decoders.output_dir import read_manifest
from tests.conftest import PCAPS
from tests.support.groundtruth import load_job

runner = CliRunner()


def invoke(*args) -> str:
    result = runner.invoke(app, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_records_dropped_are_each_nodes_terminate_to_itself(decoded_job, tmp_path):
    """mxnet_sync: the 8 records no trace holds are the TERMINATE each worker and server sends itself at
    shutdown (its log shows the receipt), seen at both ends of the message: the send and the receipt."""
    summary = json.loads(invoke("stats", decoded_job("mxnet_sync"), "--out", tmp_path / "stats", "--json"))
    losses = summary["losses"]
    job = load_job(PCAPS / "mxnet_sync")
    to_itself = 0
    for node in job.nodes:
        log = job.log(node["name"])
        own = (log["control_cmd"] == "TERMINATE") & (log["sender_id"] == node["pslite_id"])
        to_itself += int(own.sum()) if node["role"] in ("worker", "server") else 0
    assert losses["records_dropped"] == losses["records_dropped_control"] == 2 * to_itself == 8
    assert losses["records_dropped_unknown_node"] == losses["records_dropped_outside_kv"] == 0
    assert set(summary["losses_explained"]) == set(losses)
    assert "TERMINATE each node sends itself" in summary["losses_explained"]["records_dropped_control"]
    written = json.loads((tmp_path / "stats" / "summary.json").read_text())
    assert written["losses_explained"] == summary["losses_explained"]
    printed = invoke("stats", decoded_job("mxnet_sync"), "--out", tmp_path / "printed")
    assert re.search(r"records dropped control 8: control messages at a worker or server .* scheduler's file only",
                     printed)


def test_dependencies_against_time_are_explained_and_none_is_kept(decoded_job, tmp_path):
    """mxnet_sync: 3 dependencies point later in their rank's time (the initial pull of a tensor answered after
    the first push); the export keeps only dependencies a replay can honour."""
    found = json.loads(invoke("export", decoded_job("mxnet_sync"), "--format", "chakra", "--out", tmp_path / "c",
                              "--json"))
    assert found["losses"]["dependencies_against_time_dropped"] == 3
    assert "initial pull" in found["losses_explained"]["dependencies_against_time_dropped"]
    assert set(found["losses_explained"]) == set(found["losses"])
    printed = invoke("export", decoded_job("mxnet_sync"), "--format", "chakra", "--out", tmp_path / "p")
    assert re.search(r"dependencies against time dropped 3: dependencies on a node that comes later", printed)
    graph = chakra_graph(pslite_trace(load_dataset(decoded_job("mxnet_sync"))), None)
    assert len(graph.edges) and (graph.edges["parent_id"] < graph.edges["child_id"]).all()


def test_the_report_header_lists_every_table_and_the_decode_warnings(decoded_job):
    """The header read a manifest key that was never written ("decoded tables: rows"): it names each file with
    its rows and what a row is, and says what the decode warned of (mxnet_lossy: its holes)."""
    for job, warned in (("mxnet_sync", False), ("mxnet_lossy", True)):
        manifest = read_manifest(decoded_job(job))
        rows = dict(header_rows(str(decoded_job(job)), manifest, datetime.now(timezone.utc)))
        assert "decoded tables" not in rows
        for name, found in manifest["files"].items():
            assert rows[name].startswith(f"{found['rows']:,} rows, one per ")
        assert rows["events.parquet"].endswith("message of the job, however many captures saw it, on the reference "
                                               "clock (decoders/timeline.py)")
        if warned:
            assert rows["decode warning"].startswith("capture limit (holes): ")
        else:
            assert rows["decode warnings"] == "none"
