"""The edge of analysis/: the parsers of a `dlcsniff decode` output directory, which the job model
(analysis.job_model) reads its parts with; load_dataset, load_collectives and load_job_view read one part
alone, for scripts and tests.

Only the scalar columns the analysis needs are read (list columns such as `keys` cost more to load than all
the statistics cost to compute). When the directory holds clocks.parquet (decoders.clocks), every
message's times are put on the job's one timeline, the reference capture's clock; each capture's own
reading stays in capture_ts_first_ns / capture_ts_last_ns. The same holds for the collective operations
(collectives.parquet), with the collective libraries' messages.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.clocks import CLOCK_COLUMNS, align
from dlcsniff.decoders.output_dir import read_manifest
from dlcsniff.decoders.timeline import (EVENT_COLUMNS, MESSAGE_READ_COLUMNS, NODE_READ_COLUMNS, STREAM_READ_COLUMNS,
                                       JobView, job_view)


class AnalysisError(Exception):
    """The one error analysis/ raises: the input cannot be analysed (the message says why)."""


MESSAGE_COLUMNS = (
    "capture", "ts_first_ns", "ts_last_ns", "sender_id", "recver_id", "request", "push", "pull", "simple_app",
    "ps_timestamp", "app_id", "customer_id", "control_cmd", "size_bytes", "tensor_key", "req_type", "rows",
    "simple_app_cmd", "complete", "flavor", "server_rank",
)
NODE_COLUMNS = ("node_id", "role", "rank", "hostname", "port")
COLLECTIVE_COLUMNS = (
    "protocol", "capture", "pg", "kind", "seq", "world_size", "local_rank", "ts_first_ns", "ts_last_ns",
    "wire_bytes_sent", "wire_bytes_received", "tensor_bytes", "peers", "algorithm", "messages", "complete",
)
COLLECTIVE_MESSAGE_COLUMNS = ("protocol", "capture", "pg", "collective", "seq", "src_rank", "dst_rank", "outgoing",
                              "payload_bytes", "size_bytes")


@dataclass(frozen=True, slots=True)
class Dataset:
    """A decoded job: one row per ps-lite message per capture, and the nodes the scheduler announced."""

    messages: pd.DataFrame
    nodes: pd.DataFrame
    source: str
    clocks: pd.DataFrame | None = None     # clocks.parquet, when the messages' times were aligned with it


@dataclass(frozen=True, slots=True)
class CollectiveDataset:
    """A decoded job's collective operations (one row per operation per capture, COLLECTIVE_COLUMNS) and the
    collective libraries' messages (COLLECTIVE_MESSAGE_COLUMNS, the rows that name a collective)."""

    collectives: pd.DataFrame
    messages: pd.DataFrame
    source: str
    clocks: pd.DataFrame | None = None     # clocks.parquet rows of the captures whose times it aligned


def read_columns(path: Path, columns: tuple[str, ...], protocol: str | None = None,
          where: pc.Expression | None = None) -> pd.DataFrame:
    """The named columns of a decode table; with `protocol`, only that protocol's rows (messages.parquet
    holds ps-lite, Gloo, NCCL and RoCE messages side by side); with `where`, only the rows it selects."""
    if not path.exists():
        raise AnalysisError(f"{path}: not found — is {path.parent} the output of `dlcsniff decode`?")
    present = _column_names(path)
    missing = [name for name in columns if name not in present]
    if missing:
        raise AnalysisError(f"{path}: missing columns {', '.join(missing)} — written by another dlcsniff version?")
    try:
        if protocol is not None:
            where = pc.field("protocol") == protocol if where is None else where & (pc.field("protocol") == protocol)
        return pq.read_table(path, columns=list(columns), filters=where).to_pandas()
    except (pa.ArrowInvalid, OSError) as exc:
        raise AnalysisError(f"{path}: cannot read ({exc})") from exc


def decode_dir_of(decode_dir: str | Path) -> Path:
    """decode_dir as a Path, if it is a directory (else the error that says what to give)."""
    decode_dir = Path(decode_dir)
    if not decode_dir.is_dir():
        raise AnalysisError(f"{decode_dir}: not a directory (give the --out directory of `dlcsniff decode`)")
    return decode_dir


def _column_names(path: Path) -> list[str]:
    try:
        return pq.read_schema(path).names
    except (pa.ArrowInvalid, OSError) as exc:
        raise AnalysisError(f"{path}: not a readable Parquet file ({exc})") from exc


def require_decode_output(decode_dir: str | Path) -> Path:
    """decode_dir as a Path, if it holds the tables every analysis reads (else AnalysisError: a command checks
    this before it makes its own output, so that a wrong directory leaves nothing behind)."""
    decode_dir = decode_dir_of(decode_dir)
    missing = [f"{name}.parquet" for name in ("messages", "nodes") if not (decode_dir / f"{name}.parquet").is_file()]
    if missing:
        raise AnalysisError(f"{decode_dir}: not the output of `dlcsniff decode` (no {' or '.join(missing)}): give "
                            "the --out directory of `dlcsniff decode`")
    return decode_dir


def load_dataset(decode_dir: str | Path) -> Dataset:
    """Read DIR/messages.parquet and DIR/nodes.parquet (the output of `dlcsniff decode DIR`), on the job's
    one timeline when DIR/clocks.parquet is there."""
    decode_dir = require_decode_output(decode_dir)
    return pslite_dataset(decode_dir, load_clocks(decode_dir))


def pslite_dataset(decode_dir: Path, clocks: pd.DataFrame | None) -> Dataset:
    """load_dataset, with DIR/clocks.parquet as read already (None: absent)."""
    path = decode_dir / "messages.parquet"
    # an output older than them lacks the decode's iterations (analysis.operations numbers them then) and the
    # messages' event ids
    present = _column_names(path) if path.exists() else []
    later = tuple(name for name in ("iteration", "event_id") if name in present)
    messages = read_columns(path, MESSAGE_COLUMNS + later, protocol="pslite")
    nodes = read_columns(decode_dir / "nodes.parquet", NODE_COLUMNS)
    if clocks is not None:
        _align(messages, clocks)
    return Dataset(messages=messages, nodes=nodes, source=str(decode_dir), clocks=clocks)


def load_clocks(decode_dir: str | Path) -> pd.DataFrame | None:
    """DIR/clocks.parquet; None for an output without it."""
    path = Path(decode_dir) / "clocks.parquet"
    return read_columns(path, CLOCK_COLUMNS) if path.exists() else None


def _align(table: pd.DataFrame, clocks: pd.DataFrame) -> None:
    """ts_first_ns / ts_last_ns on the reference clock, in place; the capture's own in capture_ts_*_ns."""
    for column in ("ts_first_ns", "ts_last_ns"):
        table[f"capture_{column}"] = table[column]
        table[column] = align(table[column], table["capture"], clocks).to_numpy(np.int64)


def load_collectives(decode_dir: str | Path) -> CollectiveDataset | None:
    """DIR/collectives.parquet and the messages that name a collective, on the job's one timeline for the
    captures DIR/clocks.parquet aligns (the others keep their own clock); None when the job has no
    collective operation (or was decoded before dlcsniff knew them)."""
    decode_dir = Path(decode_dir)
    return collective_dataset(decode_dir, load_clocks(decode_dir))


def collective_dataset(decode_dir: Path, clocks: pd.DataFrame | None) -> CollectiveDataset | None:
    """load_collectives, with DIR/clocks.parquet as read already (None: absent)."""
    path = decode_dir / "collectives.parquet"
    if not path.exists():
        return None
    collectives = read_columns(path, COLLECTIVE_COLUMNS)
    if len(collectives) == 0:
        return None
    messages = read_columns(decode_dir / "messages.parquet", COLLECTIVE_MESSAGE_COLUMNS,
                     where=pc.field("collective").is_valid())
    aligned = None if clocks is None else clocks[clocks["aligned"].fillna(False).astype(bool).to_numpy()]
    if aligned is not None and len(aligned):
        _align(collectives, aligned)
    else:
        aligned = None
    return CollectiveDataset(collectives=collectives, messages=messages, source=str(decode_dir), clocks=aligned)


def decode_manifest(decode_dir: str | Path) -> dict | None:
    """DIR/manifest.json (what was decoded, how, by which dlcsniff); None for an output older than it."""
    try:
        return read_manifest(Path(decode_dir))
    except DecodeError as exc:
        raise AnalysisError(str(exc)) from None


def load_job_view(decode_dir: str | Path) -> JobView:
    """The job's timeline as `dlcsniff decode` wrote it (events.parquet, clocks.parquet, and the losses in
    manifest.json); recomputed from messages and streams for an output written before it had them."""
    decode_dir = decode_dir_of(decode_dir)
    return job_view_of(decode_dir, decode_manifest(decode_dir), load_clocks(decode_dir))


def job_view_of(decode_dir: Path, manifest: dict | None, clocks: pd.DataFrame | None) -> JobView:
    """load_job_view, with DIR/manifest.json and DIR/clocks.parquet as read already (None: absent)."""
    losses = (manifest or {}).get("job_view", {}).get("losses")
    events_path = decode_dir / "events.parquet"
    if losses is not None and events_path.exists() and clocks is not None:
        return JobView(events=read_columns(events_path, EVENT_COLUMNS), clocks=clocks, losses=losses)
    return job_view(read_columns(decode_dir / "messages.parquet", MESSAGE_READ_COLUMNS),
                    read_columns(decode_dir / "streams.parquet", STREAM_READ_COLUMNS),
                    read_columns(decode_dir / "nodes.parquet", NODE_READ_COLUMNS))


@dataclass(frozen=True, slots=True)
class WireView:
    """What the judgements on the wire read (analysis/diagnosis.py, analysis/network_behaviour.py): the job's
    messages each once (events, on the job's one timeline), its collective operations (aligned where the
    clocks align them, else None), its streams (the named columns) and clocks."""

    events: pd.DataFrame
    collectives: pd.DataFrame | None
    streams: pd.DataFrame
    clocks: pd.DataFrame | None
    source: str


def load_streams(decode_dir: str | Path, columns: tuple[str, ...]) -> pd.DataFrame:
    """The named columns of DIR/streams.parquet, null where an output older than a column lacks it (the RoCE
    signals' times, its UDP source ports)."""
    path = Path(decode_dir) / "streams.parquet"
    try:
        present = set(pq.read_schema(path).names)
    except (pa.ArrowInvalid, OSError):          # missing or unreadable: read_columns says which
        present = set(columns)
    streams = read_columns(path, tuple(name for name in columns if name in present))
    return streams.assign(**{name: None for name in columns if name not in present})
