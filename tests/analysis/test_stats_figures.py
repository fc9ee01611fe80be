"""What `dlcsniff stats` prints and writes is right or says why not (issue 19): the job's ps-lite messages counted
once and the captures' sightings apart, as ps-lite's own log (PS_VERBOSE=2) of every message sent has them; no
server overhead that only a capture's loss made."""
from __future__ import annotations

import json

import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dlcsniff.analysis import load_job_model, write_statistics
from dlcsniff.cli import app
from tests.conftest import PCAPS
from tests.support.groundtruth import load_job, logged_sends

PSLITE_CMD = 4        # the control command's field of a logged_sends key


def test_stats_count_the_jobs_messages_once_and_the_sightings_apart(decoded_job, tmp_path):
    """`stats` printed "messages 497" for mxnet_sync, each message seen at both ends counted twice: the job's
    messages are ps-lite's logged sends (and the control messages), once; observations are the sightings."""
    decoded = decoded_job("mxnet_sync")
    result = CliRunner().invoke(app, ["stats", str(decoded), "--out", str(tmp_path / "stats"), "--json"])
    assert result.exit_code == 0, result.output
    losses = json.loads(result.stdout)["losses"]
    events = pd.read_parquet(decoded / "events.parquet", columns=["protocol", "control_cmd"])
    pslite = events[events["protocol"] == "pslite"]
    sent = logged_sends(load_job(PCAPS / "mxnet_sync"))
    logged_data = sum(n for key, n in sent.items() if key[PSLITE_CMD] is None)
    assert losses["messages"] == len(pslite) == logged_data + pslite["control_cmd"].notna().sum()
    sightings = pq.read_table(decoded / "messages.parquet", columns=["protocol"]).column("protocol").to_pylist()
    assert losses["observations"] == sightings.count("pslite") > losses["messages"]
    printed = CliRunner().invoke(app, ["stats", str(decoded), "--out", str(tmp_path / "stats"), "--force"]).output
    assert f"messages {losses['messages']:,}, observations {losses['observations']:,}," in printed


@pytest.mark.parametrize("job", ["mxnet_lossy", "mxnet_lossy_heavy"])
def test_lossy_server_rounds_whose_pushes_were_not_captured_whole_have_no_overheads(decoded_job, tmp_path, job):
    """mxnet_lossy: the server's capture saw some pushes with a hole, dating their "last byte" at the hole's
    edge, up to 100 ms after the server had answered: the update overhead came out negative (−99 ms). Those
    rounds, and those missing a worker's push, have no sync or update overhead, are flagged, and the summary
    counts them with the reason (mxnet_lossy_heavy had 10 negative: rounds numbered wrong, see
    tests/decoders/test_iterations.py)."""
    stats = write_statistics(load_job_model(decoded_job(job)), tmp_path / "stats")
    keys = stats.keys
    assert (keys["update_overhead_us"].dropna() > 0).all() and (keys["sync_overhead_us"].dropna() >= 0).all()
    unknown = ~keys["push_times_known"]
    assert unknown.any() and keys.loc[unknown, ["sync_overhead_us", "update_overhead_us"]].isna().all().all()
    assert keys.loc[~unknown, ["sync_overhead_us", "update_overhead_us"]].notna().all().all()
    assert (keys.loc[~unknown, "pushes"] == stats.summary["workers"]).all()
    assert stats.summary["losses"]["key_rounds_without_push_times"] == int(unknown.sum())
    assert "hole" in stats.summary["losses_explained"]["key_rounds_without_push_times"]
