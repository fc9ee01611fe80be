"""The job model (analysis.job_model): a command loads the decode output once, its analyzers read no file; and
the statistics graph (analysis.stats_graph), defined once, grows by one function and one line on both engines."""
from __future__ import annotations

import collections
import json
import pickle
import shutil

import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dlcsniff.analysis import stats_graph
from dlcsniff.analysis.job_model import JobModel, load_job_model
from dlcsniff.analysis.stats_graph import Statistic, statistics
from dlcsniff.analysis.summary import summary_json
from dlcsniff.cli import app


@pytest.fixture
def parquet_reads(monkeypatch):
    """Every Parquet read while the test runs: (file name, columns, filter) → times read."""
    reads = collections.Counter()
    read_table = pq.read_table

    def counted(source, *args, columns=None, filters=None, **kwargs):
        reads[(str(source).rsplit("/", 1)[-1], tuple(columns or ()), str(filters))] += 1
        return read_table(source, *args, columns=columns, filters=filters, **kwargs)
    monkeypatch.setattr(pq, "read_table", counted)
    return reads


@pytest.mark.parametrize("job", ["mxnet_sync", "gloo"])
@pytest.mark.parametrize("command", [["stats", "--out", "{tmp}/stats"], ["report", "--out", "{tmp}/report.html"],
                                     ["export", "--format", "chrome", "--out", "{tmp}/trace.json"]])
def test_a_command_reads_each_table_once(job, command, decoded_job, parquet_reads, tmp_path):
    """What a command computes comes from one model: no table's columns are read twice (the statistics read
    the merged view for the requests and again for the network's judgements before it)."""
    args = [part.format(tmp=tmp_path) for part in command]
    result = CliRunner().invoke(app, [args[0], str(decoded_job(job)), *args[1:]])
    assert result.exit_code == 0, result.output
    assert parquet_reads and max(parquet_reads.values()) == 1, [key for key, n in parquet_reads.items() if n > 1]


def test_the_analyzers_read_nothing_but_the_model(decoded_job, tmp_path):
    """Once a model holds the parts the statistics use, its decode output can go: the statistics are the same,
    so no analyzer reads a file of its own."""
    decoded = tmp_path / "decoded"
    shutil.copytree(decoded_job("mxnet_sync"), decoded)
    job = load_job_model(decoded)
    first = summary_json(statistics(job.source, job=job))
    shutil.rmtree(decoded)
    again = statistics(job.source, job=job)
    assert summary_json(again) == first
    assert set(again.tables()) >= {"iterations", "requests", "arrivals"}


def test_a_model_goes_to_a_worker_unread(decoded_job):
    """Pickled for a Dask task: its path and manifest only; the worker reads what its task needs."""
    job = load_job_model(decoded_job("mxnet_sync"))
    job.pslite, job.view
    shipped = pickle.loads(pickle.dumps(job))
    assert isinstance(shipped, JobModel) and shipped.path == job.path and shipped.manifest == job.manifest
    assert "pslite" not in vars(shipped) and "view" not in vars(shipped)
    assert len(pickle.dumps(job)) < 100_000
    assert shipped.pslite.messages.equals(job.pslite.messages)


def message_records(trace) -> pd.DataFrame:
    """A statistic a test adds: the number of ps-lite records per operation."""
    return trace.records.groupby("operation", observed=True).size().rename("records").reset_index()


@pytest.fixture
def one_more_statistic(monkeypatch):
    monkeypatch.setattr(stats_graph, "STATISTICS",
                        (*stats_graph.STATISTICS, Statistic("records_per_operation", message_records, ("trace",))))


def test_a_statistic_is_one_function_and_one_line(one_more_statistic, decoded_job):
    """Added to STATISTICS, a statistic is computed and is among the tables `stats` writes; a job without its
    input (no ps-lite traffic) has none."""
    job = load_job_model(decoded_job("mxnet_sync"))
    tables = statistics(job.source, job=job).tables()
    records = tables["records_per_operation"]
    trace = stats_graph.pslite_trace_of(job)
    assert records["records"].sum() == len(trace.records)
    assert list(tables)[:7] == ["iterations", "keys", "sizes", "traffic", "volume_iterations", "volume_keys",
                                "requests"]
    gloo = load_job_model(decoded_job("gloo"))
    assert "records_per_operation" not in statistics(gloo.source, job=gloo).tables()


def test_the_dask_engine_runs_the_same_graph(one_more_statistic, decoded_job):
    """The Dask engine submits the graph's steps as they are listed: the added statistic too, the same table."""
    from dlcsniff.analysis.dask_stats import statistics_dask
    job = load_job_model(decoded_job("mxnet_sync"))
    on_dask = statistics_dask(job, workers=1)
    here = statistics(job.source, job=job)
    assert on_dask.tables()["records_per_operation"].equals(here.tables()["records_per_operation"])
    assert json.loads(summary_json(on_dask)) == json.loads(summary_json(here))
