"""A decode output opened for scripts and notebooks: its tables as DataFrames, its statistics, traces and
exports as methods. `dlcsniff.load(DIR)` and `dlcsniff.decode(CAPTURES, out=DIR)` return one.

    import dlcsniff
    job = dlcsniff.load("out/mxnet_sync")
    job.tables                       # ('streams', 'zmtp', 'messages', 'nodes', 'collectives', 'events', 'clocks')
    messages = job.table("messages") # a DataFrame; integer columns stay integer where values are missing
    stats = job.statistics()         # what `dlcsniff stats` computes: stats.summary, stats.iterations, ...
    job.write_report("job.html")     # and write_statistics, write_dlc, export_chrome, export_chakra

Every method computes what the command of the same name does, by the same functions; errors are AnalysisError
(dlcsniff.AnalysisError) with a message that says what is wrong, as the CLI prints it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dlcsniff.analysis import (no_dlc_message, statistics_of, write_dlc_traces, write_html_report,
                               write_statistics)
from dlcsniff.analysis.dlc import DlcFile, dlc_table
from dlcsniff.analysis.load import AnalysisError, load_dataset
from dlcsniff.analysis.operations import pslite_trace
from dlcsniff.analysis.summary import Stats
from dlcsniff.decoders.decode_run import Engine, decode_to_dir
from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.inputs.selection import packet_selection
from dlcsniff.decoders.output_dir import read_manifest

# the order `dlcsniff decode` writes them in (decoders.output); others found in the directory follow, sorted
TABLE_ORDER = ("streams", "zmtp", "messages", "nodes", "collectives", "events", "clocks")

_NULLABLE = {pa.int8(): pd.Int8Dtype(), pa.int16(): pd.Int16Dtype(), pa.int32(): pd.Int32Dtype(),
             pa.int64(): pd.Int64Dtype(), pa.uint8(): pd.UInt8Dtype(), pa.uint16(): pd.UInt16Dtype(),
             pa.uint32(): pd.UInt32Dtype(), pa.uint64(): pd.UInt64Dtype(), pa.bool_(): pd.BooleanDtype()}


class Decoded:
    """The output directory of one `dlcsniff decode` (one job: every node's capture)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise AnalysisError(f"{self.path}: not a directory (give the --out directory of `dlcsniff decode`)")
        if not (self.path / "messages.parquet").exists():
            raise AnalysisError(f"{self.path}: no messages.parquet — not the output of `dlcsniff decode`")
        try:
            self.manifest: dict = read_manifest(self.path) or {}
        except DecodeError as exc:
            raise AnalysisError(str(exc)) from None

    def __repr__(self) -> str:
        return f"dlcsniff.Decoded({str(self.path)!r}: {', '.join(self.tables)})"

    @property
    def tables(self) -> tuple[str, ...]:
        """The names of the tables in the directory (DIR/<name>.parquet)."""
        present = {path.stem for path in self.path.glob("*.parquet")}
        return (*(name for name in TABLE_ORDER if name in present), *sorted(present - set(TABLE_ORDER)))

    def table(self, name: str, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """One table (all its columns, or the named ones) as a DataFrame. Integer and boolean columns read
        as pandas' nullable types, so a missing value stays missing and the column stays integer."""
        if name not in self.tables:
            raise AnalysisError(f"{self.path}: no table {name!r} (tables: {', '.join(self.tables)})")
        path = self.path / f"{name}.parquet"
        try:
            table = pq.read_table(path, columns=list(columns) if columns is not None else None)
        except (pa.ArrowInvalid, KeyError, OSError) as exc:
            raise AnalysisError(f"{path}: {exc}") from None
        return table.to_pandas(types_mapper=_NULLABLE.get)

    def messages(self, protocol: str | None = None) -> pd.DataFrame:
        """messages.parquet, or only one protocol's rows ("pslite", "gloo", "tcpstore", "nccl", "roce")."""
        messages = self.table("messages")
        return messages if protocol is None else messages[messages["protocol"] == protocol].reset_index(drop=True)

    def statistics(self) -> Stats:
        """What `dlcsniff stats` computes, without writing it: Stats.summary (summary.json) and the tables
        (Stats.iterations, .keys, ..., Stats.tables() for all of them by name)."""
        return statistics_of(self.path)

    def dlc(self) -> pd.DataFrame:
        """The DLC records of every node (the rows `dlcsniff dlc` writes, with the node they belong to)."""
        trace = pslite_trace(load_dataset(self.path))
        if trace is None:
            raise AnalysisError(no_dlc_message(self.path))
        return dlc_table(trace)

    def write_statistics(self, out: str | Path, *, force: bool = False) -> Stats:
        """`dlcsniff stats DIR --out OUT`."""
        return write_statistics(self.path, out, force=force)

    def write_dlc(self, out: str | Path, *, force: bool = False) -> list[DlcFile]:
        """`dlcsniff dlc DIR --out OUT`: one DLC trace file per node."""
        return write_dlc_traces(self.path, out, force=force)[1]

    def write_report(self, path: str | Path, figures_dir: str | Path | None = None) -> Path:
        """`dlcsniff report DIR --out PATH`: one self-contained HTML file."""
        return write_html_report(self.path, path, figures_dir)

    def export_chrome(self, path: str | Path):
        """`dlcsniff export DIR --format chrome --out PATH`: Chrome trace event JSON for Perfetto."""
        from dlcsniff.analysis.export_chrome import write_chrome_trace
        return write_chrome_trace(self.path, path)

    def export_chakra(self, out: str | Path, *, force: bool = False):
        """`dlcsniff export DIR --format chakra --out OUT`: Chakra execution traces for ASTRA-sim."""
        from dlcsniff.analysis.export_chakra import write_chakra_traces
        return write_chakra_traces(self.path, out, force=force)


def load(path: str | Path) -> Decoded:
    """Open the output directory of `dlcsniff decode`."""
    return Decoded(path)


def decode(captures: str | Path | Iterable[str | Path], out: str | Path, *, force: bool = False,
           filter: str | None = None, start: str | None = None, end: str | None = None,
           engine: Engine = "pandas", workers: int | None = None, scheduler: str | None = None) -> Decoded:
    """`dlcsniff decode CAPTURES --out OUT`: decode every node's capture of one job (files, directories of
    them, compressed or not) and open the result; `filter`, `start`, `end` as decode's --filter, --start and
    --end (a pcap filter expression; epoch seconds, ISO 8601 or "+5s"). Raises dlcsniff.CaptureError when an
    input cannot be read (or the filter compiled), dlcsniff.OutputError when `out` cannot be used (another
    run's output: force=True replaces it), ValueError for a window bound that is no time."""
    if isinstance(captures, (str, Path)):
        captures = [captures]
    run = decode_to_dir(captures, out, force=force, engine=engine, workers=workers, scheduler=scheduler,
                        selection=packet_selection(filter, start, end),
                        command=["dlcsniff.decode", *map(str, captures)])
    return Decoded(run.out_dir)
