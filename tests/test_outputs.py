"""Output directories as a careful user needs them: checked before any work, never an input's directory, never
mixed with another run's output (--force replaces it, its files only), and labelled: manifest.json (also in
every decode table's metadata) says which dlcsniff, which command and which inputs (size, sha256) made them."""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dlcsniff import __version__
from dlcsniff.cli import app
from dlcsniff.decoders.output_dir import METADATA_KEY
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


# Every command that writes, with what it writes (a directory, or one file) -------------------------------------
# command → (its arguments, then the option naming the output; "dir" | "file"); `wireshark --out DIR` writes
# the one file DIR/dlcsniff.lua
WRITERS = {
    "decode": (["decode", PCAPS / "zmq", "--out"], "dir"),
    "stats": (["stats", "{decoded}", "--out"], "dir"),
    "dlc": (["dlc", "{decoded}", "--out"], "dir"),
    "export chakra": (["export", "{decoded}", "--format", "chakra", "--out"], "dir"),
    "simulate": (["simulate", "{decoded}", "--out"], "dir"),
    "diagnose": (["diagnose", "{decoded}", "--out"], "dir"),
    "report --figures": (["report", "{decoded}", "--out", "{tmp}/report.html", "--figures"], "dir"),
    "export chrome": (["export", "{decoded}", "--format", "chrome", "--out"], "file"),
    "report": (["report", "{decoded}", "--out"], "file"),
    "wireshark": (["wireshark", "--out"], "file"),
}


def _writer(name: str, out, decoded, tmp_path) -> list:
    args, _ = WRITERS[name]
    return [*(str(arg).format(decoded=decoded, tmp=tmp_path) for arg in args), out]


def _written_path(name: str, out):
    """Where the command's one file lands (wireshark: inside --out)."""
    return out / "dlcsniff.lua" if name == "wireshark" else out


def _state(path):
    """What is at path, to compare before and after: a link's target, a file's bytes, a directory's listing."""
    if path.is_symlink():
        return ("link", os.readlink(path))
    if path.is_dir():
        return ("dir", sorted((p.relative_to(path).as_posix(), p.read_bytes() if p.is_file() else None)
                              for p in path.rglob("*")))
    return ("file", path.read_bytes()) if path.exists() else None


def _existing(what: str, path, tmp_path):
    """Put at path an output that is not the command's: an unrelated file, an unrelated non-empty directory,
    a symlink to either, or a symlink to nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if what == "a file":
        path.write_text("my notes, not dlcsniff's\n")
    elif what == "a non-empty unrelated directory":
        path.mkdir()
        (path / "thesis.tex").write_text("\\chapter{mine}\n")
    elif what == "a symlink to an unrelated file":
        (tmp_path / "elsewhere.txt").write_text("keep me\n")
        path.symlink_to(tmp_path / "elsewhere.txt")
    elif what == "a symlink to an unrelated directory":
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "elsewhere" / "data.csv").write_text("1,2\n")
        path.symlink_to(tmp_path / "elsewhere")
    elif what == "a dangling symlink":
        path.symlink_to(tmp_path / "nowhere")
    else:
        raise AssertionError(what)


EXISTING = ["a file", "a non-empty unrelated directory", "a symlink to an unrelated file",
            "a symlink to an unrelated directory", "a dangling symlink"]


# wireshark --out names a directory: an unrelated file or a dangling symlink in its place is tested inside it
NOT_OWN_OUTPUTS = [(name, what) for name in WRITERS for what in EXISTING
                   if not (name == "wireshark" and what in ("a file", "a dangling symlink"))]


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
@pytest.mark.parametrize(("name", "what"), NOT_OWN_OUTPUTS)
def test_what_is_not_the_commands_own_output_is_refused_even_with_force(name, what, force, tmp_path, decoded_job):
    """decode's rule for every command that writes: an existing output that is not this command's earlier output
    is refused with a one-line error (exit 1) before any work, and --force does not change that; nothing there
    is touched (a symlink's target neither). A directory output may be a symlink to a directory of its own."""
    out = tmp_path / "out"
    target = _written_path(name, out)
    _existing(what, target, tmp_path)
    before = [_state(target), _state(tmp_path / "elsewhere.txt"), _state(tmp_path / "elsewhere")]
    result = invoke(*_writer(name, out, decoded_job("mxnet_sync"), tmp_path), *(["--force"] if force else []))
    assert result.exit_code == 1, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    assert [_state(target), _state(tmp_path / "elsewhere.txt"), _state(tmp_path / "elsewhere")] == before
    assert not (tmp_path / "report.html").exists()            # report --figures: refused before the page, too


@pytest.mark.parametrize("name", ["stats", "dlc", "export chakra", "simulate", "report --figures", "decode",
                                  "diagnose"])
def test_another_commands_output_is_refused_even_with_force(name, tmp_path, decoded_job):
    """A directory holding another command's output (here `dlc`'s; decode's for dlc) is not replaced by a mistyped
    --out: --force replaces only the same command's output."""
    out = tmp_path / "out"
    other = ["stats", decoded_job("mxnet_sync"), "--out", out] if name == "dlc" else \
        ["dlc", decoded_job("mxnet_sync"), "--out", out]
    assert invoke(*other).exit_code == 0
    before = _state(out)
    result = invoke(*_writer(name, out, decoded_job("mxnet_sync"), tmp_path), "--force")
    assert result.exit_code == 1 and "--force replaces only a" in result.output, result.output
    assert _state(out) == before


@pytest.mark.parametrize("name", ["export chrome", "wireshark", "dlc", "export chakra", "decode", "diagnose"])
def test_the_commands_own_output_takes_force(name, tmp_path, decoded_job):
    """The same command's earlier output is refused without --force and replaced with it; an empty directory
    (and for one file, an empty file) holds nothing to lose and is written into; a directory output given as a
    symlink to a directory of its own is written there."""
    decoded = decoded_job("mxnet_sync")
    out = tmp_path / "out"
    if WRITERS[name][1] == "dir":
        (tmp_path / "real").mkdir()
        out.symlink_to(tmp_path / "real")
    elif name == "wireshark":
        out.mkdir()
        (out / "dlcsniff.lua").write_bytes(b"")
    else:
        out.write_bytes(b"")
    first = invoke(*_writer(name, out, decoded, tmp_path))
    assert first.exit_code == 0, first.output
    assert out.is_symlink() == (WRITERS[name][1] == "dir")
    again = invoke(*_writer(name, out, decoded, tmp_path))
    assert again.exit_code == 1 and "give --force to replace it" in again.output, again.output
    assert again.output.count("\n") == 1
    replaced = invoke(*_writer(name, out, decoded, tmp_path), "--force")
    assert replaced.exit_code == 0, replaced.output


def test_the_report_and_its_figures_take_force(tmp_path, decoded_job):
    decoded = decoded_job("gloo")
    page, figures = tmp_path / "report.html", tmp_path / "figures"
    argv = ["report", decoded, "--out", page, "--figures", figures]
    assert invoke(*argv).exit_code == 0
    manifest = json.loads((figures / "manifest.json").read_text())
    assert manifest["kind"] == "figures" and set(manifest["files"]) == {p.name for p in figures.glob("*.png")}
    again = invoke(*argv)
    assert again.exit_code == 1 and "give --force to replace it" in again.output and str(page) in again.output
    assert invoke(*argv, "--force").exit_code == 0
    # the page alone: an earlier report is replaced, an unrelated HTML page is not
    (tmp_path / "mine.html").write_text("<!DOCTYPE html><html><head><title>mine</title></head></html>")
    refused = invoke("report", decoded, "--out", tmp_path / "mine.html", "--force")
    assert refused.exit_code == 1 and "is not the output of `dlcsniff report`" in refused.output
    assert "mine" in (tmp_path / "mine.html").read_text()


@pytest.mark.parametrize("engine", ["pandas", "dask"])
def test_the_inputs_digests_are_of_the_whole_files_as_stored(tmp_path, monkeypatch, engine):
    """Each input is hashed from the bytes read to decode it (one pass, decoders.inputs.capture_file), and the
    digest is still of the whole file as stored where decoding stops early: compressed (gzip), cut off inside a
    record, followed by bytes that are no records; decoded in this process, in forked workers or on Dask; a
    stream has no digest (nothing to read twice)."""
    source = (PCAPS / "mxnet_sync" / "worker0.pcap.gz").read_bytes()
    plain = gzip.decompress(source)
    files = {"packed.pcap.gz": source, "plain.pcap": plain, "cut.pcap": plain[:len(plain) // 2 + 7],
             "trailing.pcap": plain + b"\x00" * 5000 + os.urandom(3000)}
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name, data in files.items():
        (inputs / name).write_bytes(data)
    def second_pass(*args, **kwargs):
        raise AssertionError("an input read a second time to hash it")

    monkeypatch.setattr(hashlib, "file_digest", second_pass)
    for workers in (["0", "2"] if engine == "pandas" else ["1"]):
        out = tmp_path / f"out-{engine}-{workers}"
        result = invoke("decode", *sorted(inputs.iterdir()), "--out", out, "--engine", engine, "--processes", workers)
        assert result.exit_code == 0, result.output
        manifest = json.loads((out / "manifest.json").read_text())
        assert {Path(entry["path"]).name: (entry["size_bytes"], entry["sha256"]) for entry in manifest["inputs"]} \
            == {name: (len(data), hashlib.sha256(data).hexdigest()) for name, data in files.items()}
    streamed = subprocess.run([str(REPO / ".venv" / "bin" / "dlcsniff"), "decode", "-", "--out",
                               str(tmp_path / "stdin")], input=plain, capture_output=True, check=True)
    assert streamed.returncode == 0
    (entry,) = json.loads((tmp_path / "stdin" / "manifest.json").read_text())["inputs"]
    assert entry["sha256"] is None and entry["size_bytes"] is None
