"""The Python API (dlcsniff.decode, dlcsniff.load → analysis.decoded.Decoded) against the commands it stands for,
and the README's example script run from an installed wheel in a fresh virtual environment."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import dlcsniff
from dlcsniff.analysis import summary_json
from tests.conftest import PCAPS, REPO

DLCSNIFF = Path(sys.executable).parent / "dlcsniff"


def _tables(directory: Path) -> dict:
    return {path.stem: pq.read_table(path).replace_schema_metadata(None)
            for path in sorted(directory.glob("*.parquet"))}


def test_decode_writes_what_the_command_writes(tmp_path):
    subprocess.run([str(DLCSNIFF), "-q", "decode", str(PCAPS / "mxnet_sync"), "--out", str(tmp_path / "cli")],
                   check=True, capture_output=True)
    job = dlcsniff.decode(PCAPS / "mxnet_sync", out=tmp_path / "api")
    assert isinstance(job, dlcsniff.Decoded) and job.path == tmp_path / "api"
    cli, api = _tables(tmp_path / "cli"), _tables(tmp_path / "api")
    assert list(api) == list(cli) and set(job.tables) == set(cli)
    for name in cli:
        assert api[name].equals(cli[name]), name
    assert job.manifest["kind"] == "decode"
    assert job.manifest["files"] == json.loads((tmp_path / "cli" / "manifest.json").read_text())["files"]
    assert [entry["sha256"] for entry in job.manifest["inputs"]] == \
        [entry["sha256"] for entry in json.loads((tmp_path / "cli" / "manifest.json").read_text())["inputs"]]


def test_tables_are_dataframes_whose_integers_stay_integer(decoded_job):
    job = dlcsniff.load(decoded_job("mxnet_sync"))
    assert job.tables[:4] == ("streams", "zmtp", "messages", "nodes")
    messages = job.table("messages")
    assert len(messages) == pq.read_metadata(job.path / "messages.parquet").num_rows
    key = messages["tensor_key"]
    assert key.isna().any() and key.notna().any()          # control messages have no tensor
    assert str(key.dtype) == "Int64"
    assert str(messages["push"].dtype) == "boolean"
    assert set(job.messages("pslite")["protocol"]) == {"pslite"}
    two = job.table("nodes", columns=["node_id", "role"])
    assert list(two.columns) == ["node_id", "role"] and len(two) == 5


def test_statistics_and_exports_are_the_commands(decoded_job, tmp_path):
    job = dlcsniff.load(decoded_job("mxnet_sync"))
    stats = job.statistics()
    written = job.write_statistics(tmp_path / "stats")
    assert summary_json(stats) == summary_json(written)
    assert json.loads((tmp_path / "stats" / "summary.json").read_text())["iterations"] == stats.summary["iterations"]
    assert stats.summary["workers"] == 2 and stats.iterations is not None and len(stats.iterations) == 20
    records = job.dlc()
    files = job.write_dlc(tmp_path / "dlc")
    assert sum(file.records for file in files) == len(records)
    chrome = job.export_chrome(tmp_path / "job.json")
    assert chrome.message_events > 0 and (tmp_path / "job.json").stat().st_size > 0


def test_errors_say_what_is_wrong(decoded_job, tmp_path):
    with pytest.raises(dlcsniff.AnalysisError, match="not a directory"):
        dlcsniff.load(tmp_path / "nothing")
    with pytest.raises(dlcsniff.AnalysisError, match="not the output of `dlcsniff decode`"):
        dlcsniff.load(PCAPS / "mxnet_sync")
    job = dlcsniff.load(decoded_job("gloo"))
    with pytest.raises(dlcsniff.AnalysisError, match="no table 'iterations' .*tables: streams"):
        job.table("iterations")
    with pytest.raises(dlcsniff.AnalysisError, match=r"DLC traces \(SketchDLC\) describe parameter-server jobs"):
        job.dlc()
    with pytest.raises(dlcsniff.CaptureError):
        dlcsniff.decode(tmp_path / "missing.pcap", out=tmp_path / "out")
    with pytest.raises(dlcsniff.OutputError, match="input"):
        dlcsniff.decode(PCAPS / "zmq", out=PCAPS / "zmq")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "theirs.parquet").write_text("a table of another tool")
    with pytest.raises(dlcsniff.OutputError, match="did not label"):
        dlcsniff.decode(PCAPS / "zmq", out=tmp_path / "taken", force=True)
    assert (tmp_path / "taken" / "theirs.parquet").read_text() == "a table of another tool"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        dlcsniff.nothing


def test_import_dlcsniff_loads_nothing_heavy():
    code = ("import sys, dlcsniff; heavy = {'pandas', 'pyarrow', 'dask', 'matplotlib'} & set(sys.modules); "
            "assert not heavy, heavy; dlcsniff.load; assert 'pandas' in sys.modules; print(sorted(dir(dlcsniff)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "'decode'" in done.stdout and "'load'" in done.stdout


def _readme_example() -> str:
    readme = (REPO / "README.md").read_text()
    section = readme.split("### Scripts and notebooks (Python API)", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
def test_readme_example_runs_from_an_installed_wheel(tmp_path, decoded_job):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"),
                    str(REPO)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("dlcsniff-*.whl")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # the wheel alone in the new environment; its dependencies from this one's (appended after its own)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
                    str(wheel)], check=True, capture_output=True)
    work = tmp_path / "work"
    work.mkdir()
    (work / "pcaps").symlink_to(PCAPS)
    (work / "example.py").write_text(_readme_example())
    where = subprocess.run([str(python), "-c", "import dlcsniff.analysis as a; print(a.__file__)"], cwd=work,
                           capture_output=True, text=True, check=True).stdout
    assert where.startswith(site), where
    for other in ("analysis", "decoders", "sniffer"):
        assert subprocess.run([str(python), "-c", f"import {other}"], cwd=work, capture_output=True).returncode != 0
    done = subprocess.run([str(python), "example.py"], cwd=work, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines()[1:]}
    assert list(lines) == ["mxnet_sync", "mxnet_async", "mxnet_3s4w", "gloo"]
    for name, line in lines.items():
        rows = pq.read_metadata(decoded_job(name) / "messages.parquet").num_rows
        assert line.split()[1] == f"{rows:,}", line
    assert "sync, 2 workers" in lines["mxnet_sync"] and "async, 2 workers" in lines["mxnet_async"]
    # mxnet_sync's largest tensor, dense0_weight (100,352 B), pushed and pulled by both workers each iteration
    assert "largest tensor 0.40 MB an iteration" in lines["mxnet_sync"]
    assert "sync, 4 workers" in lines["mxnet_3s4w"] and "all_reduce ×10" in lines["gloo"]


def test_bytes_per_tensor_per_iteration_in_one_groupby(decoded_job):
    """messages_by_iteration: the job's messages once, with the worker iteration and tensor; held to what the
    workload itself recorded (pcaps/mxnet_sync/worker*.json: its batches and each parameter's bytes): per
    iteration and tensor, both workers' push-pull request and its response, each carrying the tensor and a
    meta of a few dozen bytes. A collective job's messages have the same columns and dtypes, iteration null."""
    job = dlcsniff.load(decoded_job("mxnet_sync"))
    messages = job.messages_by_iteration()
    record = json.loads((PCAPS / "mxnet_sync" / "worker0.json").read_text())
    nbytes = {parameter["key"]: parameter["nbytes"] for parameter in record["parameters"]}
    per = messages[messages["iteration"] >= 0].groupby(["iteration", "tensor_key"])["size_bytes"].sum()
    assert sorted(per.index.get_level_values(0).unique()) == [batch["index"] for batch in record["batches"]]
    workers = record["num_workers"]
    for (iteration, key), size in per.items():
        meta = size - 2 * workers * nbytes[key]
        assert 0 < meta <= 2 * workers * 100, (iteration, key, size)
    gloo = dlcsniff.load(decoded_job("gloo")).messages_by_iteration()
    assert list(gloo.columns) == list(messages.columns)
    assert {str(t) for t in gloo.dtypes} == {str(t) for t in messages.dtypes}
    assert gloo["iteration"].isna().all() and set(gloo["protocol"]) == {"gloo"}
    assert str(messages["iteration"].dtype) == "Int64" and messages["iteration"].isna().any()   # commands
