"""The edge of analysis/: read a `dlcsniff decode` output directory into DataFrames.

Only the scalar columns the analysis needs are read (list columns such as `keys` cost more to load than all
the statistics cost to compute). When the directory holds clocks.parquet (see analysis.merge), every
message's times are put on the job's one timeline, the reference capture's clock; each capture's own
reading stays in capture_ts_first_ns / capture_ts_last_ns.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from analysis.clocks import CLOCK_COLUMNS, align


class AnalysisError(Exception):
    """The one error analysis/ raises: the input cannot be analysed (the message says why)."""


MESSAGE_COLUMNS = (
    "capture", "ts_first_ns", "ts_last_ns", "sender_id", "recver_id", "request", "push", "pull", "simple_app",
    "ps_timestamp", "app_id", "customer_id", "control_cmd", "size_bytes", "tensor_key", "req_type", "rows",
    "simple_app_cmd", "complete", "flavor",
)
NODE_COLUMNS = ("node_id", "role", "rank", "hostname", "port")


@dataclass(frozen=True, slots=True)
class Dataset:
    """A decoded job: one row per ps-lite message per capture, and the nodes the scheduler announced."""

    messages: pd.DataFrame
    nodes: pd.DataFrame
    source: str
    clocks: pd.DataFrame | None = None     # clocks.parquet, when the messages' times were aligned with it


def _read(path: Path, columns: tuple[str, ...], protocol: str | None = None) -> pd.DataFrame:
    """The named columns of a decode table; with `protocol`, only that protocol's rows (messages.parquet
    holds ps-lite, Gloo, NCCL and RoCE messages side by side)."""
    if not path.exists():
        raise AnalysisError(f"{path}: not found — is {path.parent} the output of `dlcsniff decode`?")
    try:
        schema = pq.read_schema(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise AnalysisError(f"{path}: not a readable Parquet file ({exc})") from exc
    missing = [name for name in columns if name not in schema.names]
    if missing:
        raise AnalysisError(f"{path}: missing columns {', '.join(missing)} — written by another dlcsniff version?")
    try:
        filters = [("protocol", "=", protocol)] if protocol is not None else None
        return pq.read_table(path, columns=list(columns), filters=filters).to_pandas()
    except (pa.ArrowInvalid, OSError) as exc:
        raise AnalysisError(f"{path}: cannot read ({exc})") from exc


def load_dataset(decode_dir: str | Path) -> Dataset:
    """Read DIR/messages.parquet and DIR/nodes.parquet (the output of `dlcsniff decode DIR`), on the job's
    one timeline when DIR/clocks.parquet is there."""
    decode_dir = Path(decode_dir)
    if not decode_dir.is_dir():
        raise AnalysisError(f"{decode_dir}: not a directory (give the --out directory of `dlcsniff decode`)")
    messages = _read(decode_dir / "messages.parquet", MESSAGE_COLUMNS, protocol="pslite")
    nodes = _read(decode_dir / "nodes.parquet", NODE_COLUMNS)
    clocks = None
    if (decode_dir / "clocks.parquet").exists():
        clocks = _read(decode_dir / "clocks.parquet", CLOCK_COLUMNS)
        for column in ("ts_first_ns", "ts_last_ns"):
            messages[f"capture_{column}"] = messages[column]
            messages[column] = align(messages[column], messages["capture"], clocks).to_numpy(np.int64)
    return Dataset(messages=messages, nodes=nodes, source=str(decode_dir), clocks=clocks)
