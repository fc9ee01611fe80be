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
from dlcsniff.analysis.job_model import load_job_model
from dlcsniff.analysis.load import AnalysisError
from dlcsniff.analysis.operations import pslite_trace
from dlcsniff.analysis.summary import Stats
from dlcsniff.decoders.decode_run import Engine, decode_to_dir
from dlcsniff.decoders.inputs.selection import packet_selection

# the order `dlcsniff decode` writes them in (decoders.output); others found in the directory follow, sorted
TABLE_ORDER = ("streams", "zmtp", "messages", "nodes", "collectives", "events", "clocks")

_NULLABLE = {pa.int8(): pd.Int8Dtype(), pa.int16(): pd.Int16Dtype(), pa.int32(): pd.Int32Dtype(),
             pa.int64(): pd.Int64Dtype(), pa.uint8(): pd.UInt8Dtype(), pa.uint16(): pd.UInt16Dtype(),
             pa.uint32(): pd.UInt32Dtype(), pa.uint64(): pd.UInt64Dtype(), pa.bool_(): pd.BooleanDtype(),
             pa.string(): pd.StringDtype()}


class Decoded:
    """The output directory of one `dlcsniff decode` (one job: every node's capture)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise AnalysisError(f"{self.path}: not a directory (give the --out directory of `dlcsniff decode`)")
        if not (self.path / "messages.parquet").exists():
            raise AnalysisError(f"{self.path}: no messages.parquet — not the output of `dlcsniff decode`")
        self.job = load_job_model(self.path)     # the job model every method below is computed from
        self.manifest: dict = self.job.manifest or {}

    def __repr__(self) -> str:
        return f"dlcsniff.Decoded({str(self.path)!r}: {', '.join(self.tables)})"

    @property
    def tables(self) -> tuple[str, ...]:
        """The names of the tables in the directory (DIR/<name>.parquet)."""
        present = {path.stem for path in self.path.glob("*.parquet")}
        return (*(name for name in TABLE_ORDER if name in present), *sorted(present - set(TABLE_ORDER)))

    def table(self, name: str, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """One table (all its columns, or the named ones) as a DataFrame. Integer, boolean and string columns
        read as pandas' nullable types (Int64..., boolean, string), so a missing value stays missing (pd.NA) and
        the column keeps its type."""
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

    def messages_by_iteration(self) -> pd.DataFrame:
        """The job's messages, each once, with the training iteration and tensor it belongs to: the question
        "how many bytes per tensor per iteration" in one line,
        `job.messages_by_iteration().groupby(["iteration", "tensor_key"])["size_bytes"].sum()`.

        The decode tables carry iteration and tensor_key themselves (messages, events: decoders.protocols.pslite.job); this
        adds the DLC operation and the ranks. One row per message, at its sender as the DLC trace records it
        (a ps-lite node without a capture of its own: as its peers saw it); collective libraries' messages from
        events.parquet (each once, on the job's clock). Columns, the same dtypes for every protocol:
        protocol; ts_ns (Int64: its first byte sent, on the job's clock); sender, receiver (labels: "worker rank
        1", "server rank 0", "scheduler", "rank 2"); worker_rank, server_rank (Int64; ps-lite data messages);
        tensor_key (Int64: ps-lite's tensor, MXNet's key or BytePS's tensor; null for commands, control and the
        collective libraries, whose messages name no tensor); iteration (Int64: ps-lite: the worker's iteration
        as `stats` counts it, from 0, and -1 for initialisation (kv.init, the first pulls); null for commands,
        control and a response of an unknown tensor whose request no capture saw; collective libraries: null,
        their messages name their collective and its sequence number instead, not a training step); operation
        (ps-lite: the DLC operation, Push_Send_Worker...); collective, seq (the collective libraries');
        size_bytes (Int64)."""
        from dlcsniff.analysis.message_iterations import messages_by_iteration
        return messages_by_iteration(self.job)

    def statistics(self) -> Stats:
        """What `dlcsniff stats` computes, without writing it: Stats.summary (summary.json) and the tables
        (Stats.iterations, .keys, ..., Stats.tables() for all of them by name)."""
        return statistics_of(self.job)

    def dlc(self) -> pd.DataFrame:
        """The DLC records of every node (the rows `dlcsniff dlc` writes, with the node they belong to)."""
        trace = pslite_trace(self.job.pslite)
        if trace is None:
            raise AnalysisError(no_dlc_message(self.path))
        return dlc_table(trace)

    def write_statistics(self, out: str | Path, *, force: bool = False) -> Stats:
        """`dlcsniff stats DIR --out OUT`."""
        return write_statistics(self.job, out, force=force)

    def write_dlc(self, out: str | Path, *, force: bool = False) -> list[DlcFile]:
        """`dlcsniff dlc DIR --out OUT`: one DLC trace file per node."""
        return write_dlc_traces(self.job, out, force=force)[1]

    def write_report(self, path: str | Path, figures_dir: str | Path | None = None, *, force: bool = False) -> Path:
        """`dlcsniff report DIR --out PATH`: one self-contained HTML file."""
        return write_html_report(self.job, path, figures_dir, force=force)

    def export_chrome(self, path: str | Path, *, force: bool = False):
        """`dlcsniff export DIR --format chrome --out PATH`: Chrome trace event JSON for Perfetto."""
        from dlcsniff.analysis.export_chrome import write_chrome_trace
        return write_chrome_trace(self.job, path, force=force)

    def export_chakra(self, out: str | Path, *, force: bool = False):
        """`dlcsniff export DIR --format chakra --out OUT`: Chakra execution traces for ASTRA-sim."""
        from dlcsniff.analysis.export_chakra import write_chakra_traces
        return write_chakra_traces(self.job, out, force=force)


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
