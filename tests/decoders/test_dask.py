"""`--engine dask` writes the pandas engine's files: `decode` (every table, the job view's events and clocks
included, and the summary) and `stats` (every table and summary.json), on a local cluster and on a running
one started here as separate `dask scheduler` and `dask worker` processes (in another directory, as a
remote cluster would be, listening on 127.0.0.1 only)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dlcsniff.decoders.output_dir import METADATA_KEY

from dlcsniff.cli import app
from tests.conftest import PCAPS, REPO

DASK = REPO / ".venv" / "bin" / "dask"
DECODE_FILES = ("streams", "zmtp", "messages", "nodes", "events", "clocks")
JOB_VIEW_TABLES = ("requests", "in_flight", "connections", "key_updates")
STATS_TABLES = {"mxnet_sync": ("iterations", "keys", "sizes", "traffic", "volume_iterations", "volume_keys",
                               *JOB_VIEW_TABLES),
                "gloo": ("collective_stats", "collective_ranks", "collective_traffic", "connections")}
CAPTURES = {"mxnet_sync": 5, "gloo": 4}
CLUSTER_START_S = 60

runner = CliRunner()


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _decode(capture_dir: Path, out_dir: Path, *engine_args) -> dict:
    result = _invoke("decode", capture_dir, "--out", out_dir, "--json", *engine_args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    del summary["out"]
    return summary


def _stats(decode_dir: Path, out_dir: Path, *engine_args) -> None:
    result = _invoke("stats", decode_dir, "--out", out_dir, *engine_args)
    assert result.exit_code == 0, result.output


def _assert_same_files(expected_dir: Path, found_dir: Path, tables: tuple[str, ...]) -> None:
    """Every Parquet file the pandas engine wrote (`tables` at least) is there, with the same contents."""
    written = sorted(p.name for p in found_dir.glob("*.parquet"))
    assert written == sorted(p.name for p in expected_dir.glob("*.parquet"))
    assert {f"{name}.parquet" for name in tables} <= set(written)
    for name in written:
        expected, found = pq.read_table(expected_dir / name), pq.read_table(found_dir / name)
        # the metadata too, but for the manifest each run writes into it (its own command and time)
        assert _unlabelled(found.schema).equals(_unlabelled(expected.schema), check_metadata=True), name
        assert found.equals(expected), name


def _unlabelled(schema):
    return schema.remove_metadata().with_metadata({k: v for k, v in (schema.metadata or {}).items()
                                                   if k != METADATA_KEY})


@pytest.fixture(scope="module")
def pandas_runs(tmp_path_factory) -> dict[str, tuple[Path, dict]]:
    """The pandas engine's decode output and summary of each job, its statistics in DIR/stats."""
    runs = {}
    for job in CAPTURES:
        out_dir = tmp_path_factory.mktemp(f"pandas_{job}")
        runs[job] = (out_dir, _decode(PCAPS / job, out_dir))
        _stats(out_dir, out_dir / "stats")
    return runs


@pytest.mark.parametrize("job", list(CAPTURES))
def test_decode_on_a_local_cluster_matches_pandas(job, pandas_runs, tmp_path):
    expected_dir, expected_summary = pandas_runs[job]
    summary = _decode(PCAPS / job, tmp_path, "--engine", "dask", "--processes", "2")
    _assert_same_files(expected_dir, tmp_path, DECODE_FILES)
    assert summary == expected_summary
    assert len(summary["captures"]) == CAPTURES[job] and summary["packets"] > 0


@pytest.mark.parametrize("job", list(CAPTURES))
def test_stats_on_a_local_cluster_match_pandas(job, pandas_runs, tmp_path):
    decode_dir = pandas_runs[job][0]
    _stats(decode_dir, tmp_path, "--engine", "dask")
    _assert_same_files(decode_dir / "stats", tmp_path, STATS_TABLES[job])
    assert (tmp_path / "summary.json").read_bytes() == (decode_dir / "stats" / "summary.json").read_bytes()


def _assert_fail_alike(*args) -> str:
    """Both engines stop with the same one-line error; returns it."""
    outcomes = [_invoke(*args, "--engine", engine) for engine in ("pandas", "dask")]
    assert [o.exit_code for o in outcomes] == [1, 1]
    assert outcomes[0].output == outcomes[1].output
    assert len(outcomes[1].output.strip().splitlines()) == 1, outcomes[1].output
    return outcomes[1].output


def test_stats_of_a_job_with_nothing_to_analyse_fail_alike(tmp_path):
    _decode(PCAPS / "zmq", tmp_path / "zmq")           # ZeroMQ, but neither ps-lite nor collectives
    assert "nothing to analyse" in _assert_fail_alike("stats", tmp_path / "zmq", "--out", tmp_path / "stats")


def test_stats_of_a_damaged_decode_output_fail_alike(pandas_runs, tmp_path):
    for table in pandas_runs["mxnet_sync"][0].glob("*.parquet"):
        (tmp_path / table.name).write_bytes(table.read_bytes())
    (tmp_path / "messages.parquet").write_bytes(b"PAR1 cut short")
    assert "messages.parquet: not a readable Parquet file" in _assert_fail_alike(
        "stats", tmp_path, "--out", tmp_path / "stats")


def test_decoding_a_damaged_capture_fails_alike(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "worker0.pcap").write_bytes(b"not a capture at all")
    assert "worker0.pcap" in _assert_fail_alike("decode", tmp_path / "jobs", "--out", tmp_path / "out")


def _scheduler_address(scheduler_file: Path) -> str | None:
    """The address in the scheduler's file, once it is there whole."""
    try:
        return json.loads(scheduler_file.read_text())["address"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None


@pytest.fixture(scope="module")
def running_cluster(tmp_path_factory):
    """`dask scheduler` and `dask worker` (2 processes) on 127.0.0.1, in their own directory: the address."""
    from distributed import Client

    home = tmp_path_factory.mktemp("cluster")
    scheduler_file = home / "scheduler.json"
    processes: list[subprocess.Popen] = []
    with open(home / "cluster.log", "wb") as log:
        def start(*args) -> subprocess.Popen:
            processes.append(subprocess.Popen([DASK, *args, "--host", "127.0.0.1", "--no-dashboard"], cwd=home,
                                              start_new_session=True, stdout=subprocess.DEVNULL, stderr=log))
            return processes[-1]

        try:
            scheduler = start("scheduler", "--port", "0", "--scheduler-file", scheduler_file)
            deadline = time.monotonic() + CLUSTER_START_S
            while (address := _scheduler_address(scheduler_file)) is None:
                if time.monotonic() > deadline or scheduler.poll() is not None:
                    pytest.fail(f"dask scheduler did not start: {(home / 'cluster.log').read_text()[-2000:]}")
                time.sleep(0.1)
            start("worker", "--scheduler-file", scheduler_file, "--nworkers", "2", "--nthreads", "1")
            with Client(address, set_as_default=False) as client:
                client.wait_for_workers(2, timeout=CLUSTER_START_S)
            yield address
        finally:
            for process in reversed(processes):        # each in its own session: its workers go with it
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)


def _task_prefixes(address: str) -> set[str]:
    from distributed import Client
    with Client(address, set_as_default=False) as client:
        return set(client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.task_prefixes)))


def test_a_running_cluster_decodes_and_computes_the_statistics(running_cluster, pandas_runs, tmp_path,
                                                               monkeypatch):
    expected_dir, expected_summary = pandas_runs["mxnet_sync"]
    # relative paths here, while the workers run in another directory
    monkeypatch.chdir(REPO)
    summary = _decode(Path("pcaps/mxnet_sync"), tmp_path / "decoded", "--engine", "dask",
                      "--scheduler", running_cluster)
    _assert_same_files(expected_dir, tmp_path / "decoded", DECODE_FILES)
    assert summary == dict(expected_summary, captures=[dict(c, path=f"pcaps/mxnet_sync/{Path(c['path']).name}")
                                                       for c in expected_summary["captures"]])
    _stats(expected_dir, tmp_path / "stats", "--engine", "dask", "--scheduler", running_cluster)
    _assert_same_files(expected_dir / "stats", tmp_path / "stats", STATS_TABLES["mxnet_sync"])
    assert (tmp_path / "stats" / "summary.json").read_bytes() == (
        expected_dir / "stats" / "summary.json").read_bytes()
    # the work was done there: the decode tasks and the statistics' graph
    assert {"decode_capture", "pslite_trace_of", "worker_iterations", "job_statistics", "collective_statistics_of",
            "network_behaviour_of", "compute_stats"} <= _task_prefixes(running_cluster)


@pytest.mark.parametrize("args, needle", [
    (("--scheduler", "tcp://127.0.0.1:8786"), "--scheduler needs --engine dask"),
    (("--engine", "dask", "--scheduler", "nonsense"), "cannot reach the Dask scheduler at nonsense"),
    (("--engine", "dask", "--scheduler", "tcp://127.0.0.1:8786", "--processes", "2"), "has its own"),
])
def test_cluster_options_are_checked(args, needle, tmp_path):
    result = _invoke("decode", PCAPS / "zmq", "--out", tmp_path, *args)
    assert result.exit_code == 1
    assert needle in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_an_unreachable_scheduler_is_a_clear_error(tmp_path, decoded_job):
    result = _invoke("stats", decoded_job("mxnet_1s1w"), "--out", tmp_path / "stats", "--engine", "dask",
                     "--scheduler", "tcp://127.0.0.1:1")
    assert result.exit_code == 1
    assert "cannot reach the Dask scheduler at tcp://127.0.0.1:1" in result.output
    assert "Traceback" not in result.output
