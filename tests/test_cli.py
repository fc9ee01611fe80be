"""The CLI as a user meets it: typer's CliRunner over real captures and bad input."""
from __future__ import annotations

import gzip
import json
import re
import shutil
import struct
import subprocess

import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dlcsniff.decoders.schema import TABLES
from dlcsniff.cli import app
from tests.conftest import PCAPS, require_tool

runner = CliRunner()


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _assert_one_line_error(result, *needles):
    assert result.exit_code != 0
    text = result.output.strip()
    assert "Traceback" not in text
    assert len(text.splitlines()) == 1, text
    for needle in needles:
        assert needle in text, text


def test_version():
    result = _invoke("--version")
    assert result.exit_code == 0 and result.output.startswith("dlcsniff ")


def test_decode_writes_the_contract_tables_and_a_summary(tmp_path):
    result = _invoke("decode", PCAPS / "mxnet_sync", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    for name in ("streams", "zmtp", "messages"):
        schema = pq.read_schema(tmp_path / "out" / f"{name}.parquet")
        assert schema.remove_metadata().equals(TABLES[name].schema)
    assert "ps-lite:" in result.output and "flows (TCP directions) by protocol" in result.output
    messages = pd.read_parquet(tmp_path / "out" / "messages.parquet")
    assert set(messages["capture"]) == {"scheduler", "server0", "server1", "worker0", "worker1"}
    assert (messages["protocol"] == "pslite").all()


def test_decode_of_one_capture_says_its_clock_is_its_own(tmp_path):
    """One node's capture has no other clock to align with: the job view says so (it said "clocks aligned to
    worker0: " and nothing after), and the clocks of a job of several captures are still listed."""
    alone = _invoke("decode", PCAPS / "mxnet_sync" / "worker0.pcap.gz", "--out", tmp_path / "alone")
    assert alone.exit_code == 0, alone.output
    [line] = [line for line in alone.output.splitlines() if line.startswith("job view:")]
    assert line.endswith("; worker0 on its own clock (no other capture to align with it)"), line
    assert "clocks aligned" not in alone.output
    job = _invoke("decode", PCAPS / "mxnet_sync", "--out", tmp_path / "job")
    [line] = [line for line in job.output.splitlines() if line.startswith("job view:")]
    assert "; clocks aligned to scheduler: server0 " in line and "own clock" not in line, line


def test_a_clock_seconds_off_reads_with_its_digits_grouped(tmp_path):
    """worker0's capture 4 s late (editcap -t 4): its offset to the scheduler was printed +3999659.3 µs."""
    moved = tmp_path / "captures"
    shutil.copytree(PCAPS / "mxnet_sync", moved)
    subprocess.run([require_tool("editcap"), "-t", "4", str(PCAPS / "mxnet_sync" / "worker0.pcap.gz"),
                    str(moved / "worker0.pcap")], check=True)
    (moved / "worker0.pcap.gz").unlink()
    job = _invoke("decode", moved, "--out", tmp_path / "job")
    [line] = [line for line in job.output.splitlines() if line.startswith("job view:")]
    offset = re.search(r"worker0 ([-+][0-9,]+\.[0-9]) µs ±[0-9,]+\.[0-9] µs", line)
    assert offset and re.fullmatch(r"[-+][0-9]{1,3}(,[0-9]{3})+\.[0-9]", offset.group(1)), line
    assert float(offset.group(1).replace(",", "")) == pytest.approx(-4e6, abs=1000)


def test_decode_json_summary(tmp_path):
    result = _invoke("decode", PCAPS / "zmq" / "client.pcap.gz", "--out", tmp_path / "out", "--json")
    assert result.exit_code == 0
    summary = json.loads(result.output)
    assert summary["flows_by_protocol"] == {"zmtp": 10}
    assert summary["captures"][0]["capture"] == "client"


def test_missing_file(tmp_path):
    _assert_one_line_error(_invoke("decode", tmp_path / "nope.pcap", "--out", tmp_path / "o"), "nope.pcap")


def test_not_a_capture(tmp_path):
    bogus = tmp_path / "notes.pcap"
    bogus.write_text("these are not packets\n")
    _assert_one_line_error(_invoke("decode", bogus, "--out", tmp_path / "o"), "notes.pcap")


def test_unknown_link_type(tmp_path):
    capture = tmp_path / "usb.pcap"
    # A valid pcap of link type 189 (USB Linux) with one record.
    header = struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 189)
    record = struct.pack("<IIII", 1, 0, 8, 8) + b"\x00" * 8
    capture.write_bytes(header + record)
    _assert_one_line_error(_invoke("decode", capture, "--out", tmp_path / "o"), "link type 189")


def test_empty_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    _assert_one_line_error(_invoke("decode", tmp_path / "empty", "--out", tmp_path / "o"), "no capture files")


def test_truncated_gzip_capture_warns_and_decodes(tmp_path):
    data = gzip.decompress((PCAPS / "mxnet_sync" / "worker1.pcap.gz").read_bytes())
    cut = tmp_path / "worker1.pcap.gz"
    cut.write_bytes(gzip.compress(data[: len(data) // 2 + 5]))
    result = _invoke("decode", cut, "--out", tmp_path / "o")
    assert result.exit_code == 0
    assert "warning" in result.output and "truncat" in result.output
    assert len(pd.read_parquet(tmp_path / "o" / "messages.parquet")) > 0
