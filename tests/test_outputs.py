"""Output directories as a careful user needs them: checked before any work, never an input's directory, never
mixed with another run's output (--force replaces it, its files only), and labelled: manifest.json (also in
every decode table's metadata) says which dlcsniff, which command and which inputs (size, sha256) made them."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dlcsniff import __version__
from dlcsniff.cli import app
from dlcsniff.decoders.output_dir import METADATA_KEY, InputDigests
from tests.conftest import PCAPS, REPO

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_a_decode_output_says_what_made_it(tmp_path):
    argv = ["decode", str(PCAPS / "mxnet_sync"), "--out", str(tmp_path / "out")]
    subprocess.run([str(REPO / ".venv" / "bin" / "dlcsniff"), *argv], check=True, capture_output=True)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["kind"] == "decode" and manifest["dlcsniff"] == __version__
    assert manifest["command"] == ["dlcsniff", *argv]
    captures = sorted((PCAPS / "mxnet_sync").glob("*.pcap.gz"))
    assert [entry["path"] for entry in manifest["inputs"]] == [str(path) for path in captures]
    for entry, path in zip(manifest["inputs"], captures):
        assert entry["size_bytes"] == path.stat().st_size
        assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    for name, info in manifest["files"].items():
        table = pq.read_table(tmp_path / "out" / name)
        assert table.num_rows == info["rows"], name
        assert json.loads(table.schema.metadata[METADATA_KEY]) == manifest, name
    assert {path.name for path in (tmp_path / "out").iterdir()} == {*manifest["files"], "manifest.json"}


def test_another_runs_output_is_never_mixed_with(tmp_path):
    out = tmp_path / "out"
    assert invoke("decode", PCAPS / "mxnet_sync", "--out", out).exit_code == 0
    again = invoke("decode", PCAPS / "gloo", "--out", out)
    assert again.exit_code == 1 and "--force" in again.output and "holds the output of" in again.output
    (out / "notes.txt").write_text("mine")
    replaced = invoke("decode", PCAPS / "gloo", "--out", out, "--force")
    assert replaced.exit_code == 0, replaced.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert all("gloo" in entry["path"] for entry in manifest["inputs"])
    assert (out / "notes.txt").read_text() == "mine"          # --force removes what the old manifest listed only


def test_statistics_of_another_job_replace_the_old_ones_whole(tmp_path, decoded_job):
    """An MXNet job's iterations.parquet must not stay beside a Gloo job's tables."""
    stats = tmp_path / "stats"
    assert invoke("stats", decoded_job("mxnet_sync"), "--out", stats).exit_code == 0
    assert (stats / "iterations.parquet").exists()
    assert invoke("stats", decoded_job("gloo"), "--out", stats).exit_code == 1
    assert invoke("stats", decoded_job("gloo"), "--out", stats, "--force").exit_code == 0
    assert not (stats / "iterations.parquet").exists() and (stats / "collective_stats.parquet").exists()
    manifest = json.loads((stats / "manifest.json").read_text())
    assert manifest["kind"] == "stats" and manifest["inputs"][0]["path"] == str(decoded_job("gloo"))
    assert {path.name for path in stats.iterdir()} == {*manifest["files"], "manifest.json"}


@pytest.mark.parametrize("where", ["the input directory", "the input's directory"])
def test_never_into_an_input_directory(tmp_path, where):
    job = tmp_path / "job"
    shutil.copytree(PCAPS / "zmq", job)
    before = sorted(path.name for path in job.iterdir())
    if where == "the input directory":
        result = invoke("decode", job, "--out", job)
    else:
        result = invoke("decode", job / "server.pcap.gz", "--out", job)
    assert result.exit_code == 1 and "give a directory of its own" in result.output
    assert sorted(path.name for path in job.iterdir()) == before


def test_out_is_checked_before_any_decoding(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "messages.parquet").write_bytes(b"not ours")
    result = invoke("decode", PCAPS / "mxnet_sync_large", "--out", tmp_path / "out", "--progress")
    assert result.exit_code == 1 and "did not label" in result.output and "decoding" not in result.output
    (tmp_path / "file").write_text("x")
    result = invoke("decode", PCAPS / "zmq", "--out", tmp_path / "file")
    assert result.exit_code == 1 and "is a file" in result.output


def test_an_unwritable_out_is_one_line_before_any_work():
    result = invoke("decode", PCAPS / "mxnet_sync_large", "--out", "/proc/dlcsniff-out", "--progress")
    assert result.exit_code == 1 and "cannot write to /proc/dlcsniff-out" in result.output
    assert result.output.count("\n") == 1


def test_the_inputs_digests_say_what_they_could_not_read_and_the_hashing_stops_when_not_needed(tmp_path):
    """Hashed in a forked process (decoders.output_dir.InputDigests): a file gone before it was read and a
    fifo (reading it would take a stream's bytes) have no digest; closed before its result, the process is
    stopped and reaped."""
    kept, gone, fifo = tmp_path / "kept.pcap", tmp_path / "gone.pcap", tmp_path / "fifo"
    kept.write_bytes(b"x" * 100_000)
    os.mkfifo(fifo)
    gone.write_bytes(b"y")
    digests = InputDigests([kept, fifo])
    assert digests.result() == [
        {"path": str(kept), "size_bytes": 100_000, "sha256": hashlib.sha256(kept.read_bytes()).hexdigest()},
        {"path": str(fifo), "size_bytes": None, "sha256": None}]
    gone.unlink()
    assert InputDigests([gone]).result() == [{"path": str(gone), "size_bytes": None, "sha256": None}]
    big = tmp_path / "big.pcap"
    with open(big, "wb") as f:
        f.truncate(1 << 30)                     # sparse: hashing it takes a while
    stopped = InputDigests([big])
    pid = stopped._pid
    stopped.close()
    with pytest.raises(ChildProcessError):     # reaped: no zombie left
        os.waitpid(pid, os.WNOHANG)
    assert stopped.result()[0]["sha256"] is None
