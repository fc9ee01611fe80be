"""The job model: one decoded job (a `dlcsniff decode` output directory), loaded once, that every analyzer is
a function of (HTA's trace model). Its parts are read when first asked for and kept: the ps-lite messages and
nodes, the collective operations, the merged timeline, the clocks, any other table's columns; the manifest
at once. Analyzers take the model (or DataFrames of it) and read no file; analysis.load is its parser.
"""
from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dlcsniff.analysis.load import (AnalysisError, CollectiveDataset, Dataset, WireView, collective_dataset,
                                    decode_manifest, job_view_of, load_clocks, load_streams, pslite_dataset,
                                    read_columns, require_decode_output)
from dlcsniff.analysis.names import capture_labels
from dlcsniff.decoders.timeline import JobView


class JobModel:
    """One decoded job. `path` is the decode output; its tables are read from there only, once each."""

    def __init__(self, path: str | Path, manifest: dict | None):
        self.path = Path(path)
        self.manifest = manifest       # DIR/manifest.json; None for an output older than it

    def __repr__(self) -> str:
        return f"JobModel({str(self.path)!r})"

    def __getstate__(self) -> dict:
        """What a Dask task is given: the path and manifest, never the parts read so far (a worker reads
        the ones its task needs, where it runs)."""
        return {"path": self.path, "manifest": self.manifest}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def at(self, path: Path) -> JobModel:
        """The same job, its tables read from `path` (where the workers of a running cluster see it)."""
        return JobModel(path, self.manifest)

    @property
    def source(self) -> str:
        """How outputs name the job: its decode directory as it was given."""
        return str(self.path)

    @cached_property
    def pslite(self) -> Dataset:
        """The ps-lite messages (analysis.load.MESSAGE_COLUMNS) on the job's one timeline, and the nodes."""
        return pslite_dataset(self.path, self.clocks)

    @cached_property
    def collectives(self) -> CollectiveDataset | None:
        """The collective operations and the messages that name one; None without any."""
        return collective_dataset(self.path, self.clocks)

    @cached_property
    def view(self) -> JobView:
        """The merged timeline (events, clocks, losses) as `dlcsniff decode` wrote it."""
        return job_view_of(self.path, self.manifest, self.clocks)

    @cached_property
    def clocks(self) -> pd.DataFrame | None:
        """clocks.parquet (decoders.clocks.CLOCK_COLUMNS); None for an output without it."""
        return load_clocks(self.path)

    @cached_property
    def captures(self) -> dict[str, str]:
        """Capture name → how outputs show it (analysis.names.capture_labels)."""
        return capture_labels(self.manifest)

    @property
    def jobs(self) -> list[list[str]]:
        """The captures of each job where the decode's inputs looked like several jobs (decoders.job:
        two_jobs_evidence); empty for one job, or an output older than the record."""
        return (self.manifest or {}).get("jobs") or []

    def jobs_mixed(self) -> str | None:
        """What an analysis of a decode of several jobs says beside its figures (None for one job)."""
        return jobs_mixed(self.jobs, self.captures)

    @property
    def nodes(self) -> pd.DataFrame:
        """The ps-lite nodes the scheduler announced (node_id, role, rank, hostname, port)."""
        return self.pslite.nodes

    def wire(self, stream_columns: tuple[str, ...]) -> WireView:
        """What the judgements on the wire read (analysis.load.WireView), with stream_columns of the streams."""
        key = ("wire", stream_columns)
        if key not in self._parts:
            view, collectives = self.view, self.collectives
            self._parts[key] = WireView(events=view.events,
                                        collectives=None if collectives is None else collectives.collectives,
                                        streams=load_streams(self.path, stream_columns),
                                        clocks=view.clocks if len(view.clocks) else None, source=self.source)
        return self._parts[key]

    def has_table(self, name: str) -> bool:
        return (self.path / f"{name}.parquet").exists()

    def columns_of(self, name: str) -> list[str]:
        """The column names of table `name` (empty when it is absent or unreadable)."""
        try:
            return pq.read_schema(self.path / f"{name}.parquet").names
        except (pa.ArrowInvalid, OSError):
            return []

    def table(self, name: str, columns: Sequence[str], *, where: pc.Expression | None = None) -> pd.DataFrame:
        """The named columns of table `name` (the rows `where` selects), read once: callers do not change it."""
        key = (name, tuple(columns), None if where is None else str(where))
        if key not in self._parts:
            self._parts[key] = read_columns(self.path / f"{name}.parquet", tuple(columns), where=where)
        return self._parts[key]

    def arrow(self, name: str, columns: Sequence[str]) -> pa.Table:
        """The named columns of table `name` as Arrow (list columns: `keys`, `lens`), read once."""
        key = ("arrow", name, tuple(columns))
        if key not in self._parts:
            path = self.path / f"{name}.parquet"
            try:
                self._parts[key] = pq.read_table(path, columns=list(columns))
            except (pa.ArrowInvalid, KeyError, OSError) as exc:
                raise AnalysisError(f"{path}: cannot read ({exc})") from None
        return self._parts[key]

    @cached_property
    def _parts(self) -> dict:
        return {}


def jobs_mixed(jobs: list[list[str]], captures: dict[str, str]) -> str | None:
    """The words for figures of several jobs decoded together (`jobs`: each one's captures; `captures`: how
    outputs name them): their ranks and operations share numbers, one job's rank 0 is the other's."""
    if not jobs:
        return None
    return (f"the decode holds {len(jobs)} jobs (" + "; ".join(
        ", ".join(captures.get(name, name) for name in group) for group in jobs)
        + "): judged as one, their ranks and operations mixed; decode each job on its own")


def load_job_model(decode_dir: str | Path) -> JobModel:
    """The model of the decode output in decode_dir (its manifest read now, its tables when first used)."""
    decode_dir = require_decode_output(decode_dir)
    return JobModel(decode_dir, decode_manifest(decode_dir))
