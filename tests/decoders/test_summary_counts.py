"""The decode summary counts the job's messages once (issue 19 item 2): `messages`, "messages by protocol" and the
ps-lite KV table are the job's messages (events.parquet), each once however many captures saw it; every
capture's sighting is said apart (`observations`, `observations_by_protocol`). Checked on real jobs against
what the programs did: ps-lite's own log (PS_VERBOSE=2) of every message it sent, and a Gloo job whose every
message both ends' captures saw."""
from __future__ import annotations

import collections
import json
import re

import pandas as pd
import pytest
from typer.testing import CliRunner

from dlcsniff.cli import app
from tests.conftest import PCAPS
from tests.support.groundtruth import load_job, logged_sends

runner = CliRunner()
# fields of a logged_sends key: control command, simple_app, data frame sizes (keys, values, lens: a KV message)
PSLITE_CMD, PSLITE_SIMPLE_APP, PSLITE_DATA_SIZES = 4, 6, -1


def decode(job: str, out, *options: str):
    result = runner.invoke(app, ["decode", str(PCAPS / job), "--out", str(out), *options], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.parametrize("job", ["gloo", "mxnet_sync"])
def test_json_counts_the_jobs_messages_once_and_the_sightings_apart(job, tmp_path):
    summary = json.loads(decode(job, tmp_path / "out", "--json").stdout)
    events = pd.read_parquet(tmp_path / "out" / "events.parquet")
    messages = pd.read_parquet(tmp_path / "out" / "messages.parquet")
    assert summary["messages"] == len(events) == summary["job_view"]["events"]
    assert summary["messages_by_protocol"] == events["protocol"].astype(str).value_counts().to_dict()
    assert summary["observations"] == len(messages) == summary["job_view"]["losses"]["observations"]
    assert summary["observations_by_protocol"] == messages["protocol"].value_counts().to_dict()
    # every capture's sighting of each message, once each (a message between two hosts: both ends' captures)
    assert summary["observations"] == int(events["observations"].sum()) > summary["messages"]
    assert summary["incomplete_messages"] == int((~events["complete"]).sum()) == 0


def test_pslite_messages_once_are_what_ps_lite_logged_as_sent(tmp_path):
    """Data and SimpleApp messages (a control message is logged with the ids the nodes had then, and the
    TERMINATE each node sends itself is not logged): the summary's count is the log's, not twice it."""
    summary = json.loads(decode("mxnet_sync", tmp_path / "out", "--json").stdout)
    sent = logged_sends(load_job(PCAPS / "mxnet_sync"))
    logged_data = sum(n for key, n in sent.items() if key[PSLITE_CMD] is None)
    assert summary["messages_by_protocol"]["pslite"] - summary["control_messages"] == logged_data == 200


def test_printed_summary_and_kv_table_count_once(tmp_path):
    output = decode("mxnet_sync", tmp_path / "out").output
    assert "messages by protocol, each once: pslite 253 " in output
    assert "seen by the captures 497 times (pslite 497)" in output
    table = output[output.index("ps-lite KV traffic"):output.index("job view:")]
    rows = [line.split("│") for line in table.splitlines() if re.search(r"│ (push|pull)", line)]
    kv_messages = sum(int(cells[4].strip().replace(",", "")) for cells in rows)
    sent = logged_sends(load_job(PCAPS / "mxnet_sync"))
    logged_kv = sum(n for key, n in sent.items()
                    if key[PSLITE_CMD] is None and not key[PSLITE_SIMPLE_APP] and key[PSLITE_DATA_SIZES])
    assert kv_messages == logged_kv
    kinds = collections.Counter(cells[3].strip() for cells in rows)
    # MXNet's fused request spelled as the report, the Chrome export and the docs spell it
    assert kinds == collections.Counter({"push-pull request": 1, "push-pull response": 1, "push request": 1,
                                         "pull request": 1, "pull response": 1})


def test_gloo_printed_summary_says_messages_once(tmp_path):
    output = decode("gloo", tmp_path / "out").output
    assert "messages by protocol, each once: gloo 1,908, tcpstore 184 (0 incomplete)" in output
    assert "seen by the captures 4,048 times (gloo 3,816, tcpstore 232)" in output
