"""Every capture shape decodes, as far as its data allows, and says what it saw: captures cut out of the real
ones with tshark's own filters (tshark also counts their packets, independently), and files with nothing in
them. The CLI must exit 0 with a summary, never a traceback, and write every table with its columns."""
from __future__ import annotations

import json
import subprocess

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dlcsniff.cli import app
from dlcsniff.decoders.schema import TABLES
from tests.conftest import PCAPS, require_tool

NOISE = PCAPS / "mxnet_noise"


def _tshark_cut(source, display_filter: str, path, *, pcapng: bool = False):
    """The packets of `source` that a tshark display filter keeps, written by tshark."""
    fmt = ["-F", "pcapng"] if pcapng else ["-F", "pcap"]
    subprocess.run([require_tool("tshark"), "-r", str(source), "-Y", display_filter, *fmt, "-w", str(path)],
                   check=True, capture_output=True)
    return path


def _tshark_count(path) -> int:
    return len(subprocess.run([require_tool("tshark"), "-r", str(path), "-T", "fields", "-e", "frame.number"],
                              check=True, capture_output=True, text=True).stdout.split())


SHAPES = {   # name -> (how to make it from the real captures, protocols expected to be found)
    "no_packets": (lambda tmp: _tshark_cut(NOISE / "worker0.pcap.gz", "frame.number == 0", tmp / "none.pcap"), False),
    "no_packets_pcapng": (lambda tmp: _tshark_cut(NOISE / "worker0.pcap.gz", "frame.number == 0",
                                                  tmp / "none.pcapng", pcapng=True), False),
    "no_ip": (lambda tmp: _tshark_cut(NOISE / "services.pcap.gz", "arp", tmp / "arp.pcap"), False),
    "udp_only": (lambda tmp: _tshark_cut(NOISE / "services.pcap.gz", "udp", tmp / "dns.pcap"), False),
    "tls_only": (lambda tmp: _tshark_cut(NOISE / "worker0.pcap.gz", "tcp.port == 443", tmp / "tls.pcap"), False),
    "scan_only": (lambda tmp: _tshark_cut(NOISE / "scanner.pcap.gz", "tcp", tmp / "scan.pcap"), False),
    "pslite_without_handshakes": (lambda tmp: _tshark_cut(PCAPS / "mxnet_sync" / "worker0.pcap.gz",
                                                           "frame.number > 200", tmp / "mid.pcap"), True),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_shape_decodes_and_says_what_it_saw(shape, tmp_path):
    make, deep_learning = SHAPES[shape]
    capture = make(tmp_path)
    result = CliRunner().invoke(app, ["decode", str(capture), "--out", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["packets"] == _tshark_count(capture)
    assert summary["dl_traffic"] is deep_learning
    for name, schema in TABLES.items():
        assert pq.read_schema(tmp_path / "out" / f"{name}.parquet").names == schema.names, name
    text = CliRunner().invoke(app, ["decode", str(capture), "--out", str(tmp_path / "text")])
    assert text.exit_code == 0 and "Traceback" not in text.output
    assert ("no deep-learning traffic found" in text.output) is not deep_learning


def test_an_empty_file_decodes_to_nothing_with_a_warning(tmp_path):
    (tmp_path / "killed.pcap").write_bytes(b"")
    result = CliRunner().invoke(app, ["decode", str(tmp_path / "killed.pcap"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert "the file is empty" in result.output and "no deep-learning traffic found" in result.output


def test_a_job_directory_with_an_empty_capture_still_decodes_its_other_captures(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "worker0.pcap.gz").write_bytes((PCAPS / "mxnet_sync" / "worker0.pcap.gz").read_bytes())
    (job / "worker1.pcap").write_bytes(b"")
    result = CliRunner().invoke(app, ["decode", str(job), "--out", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["messages_by_protocol"]["pslite"] > 0
    assert any("the file is empty" in warning for warning in summary["warnings"])


def test_a_job_of_no_capture_builds_empty_tables_with_every_column():
    """decoders.job.build_dataset of nothing (what the Python API and the engines may hand it): the contract's
    tables, empty, with their columns."""
    from dlcsniff.decoders.job import build_dataset
    from dlcsniff.decoders.schema import MESSAGES_SCHEMA, STREAMS_SCHEMA
    dataset = build_dataset([])
    assert {name: table.num_rows for name, table in dataset.tables.items()} == dict.fromkeys(
        ("streams", "zmtp", "messages", "nodes", "collectives"), 0)
    assert dataset.tables["streams"].schema.names[:len(STREAMS_SCHEMA)] == STREAMS_SCHEMA.names
    assert dataset.tables["messages"].schema.names[:len(MESSAGES_SCHEMA)] == MESSAGES_SCHEMA.names
    assert dataset.summary["packets"] == 0 and not dataset.summary["dl_traffic"]
