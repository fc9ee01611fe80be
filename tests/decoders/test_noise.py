"""A training job among a cloud VM's other traffic (pcaps/mxnet_noise, recorded by lab/record.py with
lab/workloads/noise.py): every node also made HTTPS requests to an API, HTTP requests to an instance metadata
service and DNS queries, all to a "services" host, and nmap ran a TCP connect scan of every node while the job
ran (its parameter-server ports answered). Ground truth: ps-lite's own logs for the job, the noise programs' own
records (requests made, ports nmap found open) for the rest. Nothing of the noise may be claimed by a decoder;
all of it is counted; captures of noise alone decode and say there is no deep-learning traffic."""
from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from dlcsniff.cli import app
from tests.conftest import PCAPS
from tests.support.groundtruth import decoded_message_keys, load_job, logged_message_keys

JOB = PCAPS / "mxnet_noise"
PSLITE_ROLES = ("scheduler", "server", "worker")


@pytest.fixture(scope="module")
def job():
    return load_job(JOB)


@pytest.fixture(scope="module")
def decoded(decoded_job):
    out = decoded_job("mxnet_noise")
    return {name: pd.read_parquet(out / f"{name}.parquet") for name in ("streams", "messages", "zmtp")}


def test_every_logged_message_is_decoded_among_the_noise(job, decoded):
    for node in job.nodes:
        if node["role"] not in PSLITE_ROLES:
            continue
        logged, found = logged_message_keys(job, node["name"]), decoded_message_keys(decoded["messages"], job,
                                                                                       node["name"])
        assert sum(logged.values()) > 0 and logged == found, node["name"]


def test_the_scan_really_hit_the_parameter_servers(job):
    scan = json.loads((JOB / "scanner.json").read_text())["open_ports"]
    assert any("/open/" in ports for ports in scan.values())


def test_nothing_of_the_noise_is_claimed(job, decoded):
    streams = decoded["streams"]
    services, scanner = job.node("services")["ip"], job.node("scanner")["ip"]
    noise = streams[streams["src_ip"].isin([services, scanner]) | streams["dst_ip"].isin([services, scanner])]
    assert len(noise) > 1000
    assert set(noise["protocol"]) == {"tcp"}
    assert (noise["lost_bytes"] == 0).all() and (noise["resyncs"] == 0).all()
    assert set(decoded["messages"]["protocol"]) == {"pslite"}
    zmtp_flows = set(decoded["zmtp"]["flow_id"])
    assert zmtp_flows <= set(streams.loc[streams["protocol"] == "pslite", "flow_id"])


def test_the_noise_is_counted_as_the_programs_made_it(job, tmp_path):
    """The summary of one node's capture counts its HTTPS, HTTP and DNS exchanges as its noise client made them."""
    result = CliRunner().invoke(app, ["decode", str(job.capture_path("worker0")), "--out", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    record = json.loads((JOB / "worker0.noise.json").read_text())
    tried, done = record["tried"], record["done"]
    unclaimed = summary["unclaimed"]
    assert summary["dl_traffic"] and done["https"] > 10
    # each request a connection of its own, and nmap's probe of the port
    assert unclaimed["tcp_ports"]["443"] == tried["https"] + 1 and unclaimed["tcp_ports"]["80"] == tried["http"] + 1
    assert unclaimed["udp_ports"]["53"] == tried["dns"] + done["dns"]      # each query, and each answer that came


@pytest.mark.parametrize("node", ["services", "scanner"])
def test_a_capture_of_noise_alone_decodes_and_says_so(job, node, tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["decode", str(job.capture_path(node)), "--out", str(tmp_path / "json"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert not summary["dl_traffic"] and summary["messages"] == 0 and summary["unclaimed"]["tcp_connections"] > 0
    result = runner.invoke(app, ["decode", str(job.capture_path(node)), "--out", str(tmp_path / "text")])
    assert result.exit_code == 0 and "no deep-learning traffic found" in result.output
    assert "not of any protocol dlcsniff decodes" in result.output
