"""A decode output directory, written in one place: the tables, the job's timeline, its clocks and a manifest.

    streams.parquet zmtp.parquet messages.parquet nodes.parquet collectives.parquet   (decoders.schema)
    events.parquet  clocks.parquet     the job's messages once each, on one clock (decoders.timeline)
    manifest.json   which dlcsniff, which command and inputs made it, the tables with their row counts,
                    and what building the timeline lost

`dlcsniff decode` and the tests both call `write_decode_output`; analysis/ reads what it wrote.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.timeline import MESSAGE_READ_COLUMNS, NODE_READ_COLUMNS, STREAM_READ_COLUMNS, job_view

if TYPE_CHECKING:
    from dlcsniff.decoders.job import DecodedJob

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "dlcsniff-decode/1"


class OutputError(DecodeError):
    """The output directory cannot be written."""


def job_view_summary(view) -> dict:
    """What the CLI prints and the manifest keeps of a job view: events, losses, the clocks' alignment."""
    return {"events": view.losses["events"], "losses": view.losses,
            "reference": str(view.clocks["reference"].iloc[0]) if len(view.clocks) else None,
            "clocks": view.clocks.astype(object).where(view.clocks.notna(), None).to_dict(orient="records")}


def write_decode_output(dataset: DecodedJob, out_dir: Path, *, inputs: Sequence[Path] = (),
                        command: Sequence[str] | None = None) -> dict:
    """Write `dataset` (decoders.job.decode_paths) and its timeline into out_dir; returns the job view's
    summary (`job_view_summary`)."""
    from dlcsniff import __version__

    out_dir = Path(out_dir)
    messages = dataset.tables["messages"]
    pslite = messages.filter(pc.equal(messages.column("protocol"), "pslite"))
    view = job_view(pslite.select(list(MESSAGE_READ_COLUMNS)).to_pandas(),
                    dataset.tables["streams"].select(list(STREAM_READ_COLUMNS)).to_pandas(),
                    dataset.tables["nodes"].select(list(NODE_READ_COLUMNS)).to_pandas())
    summary = job_view_summary(view)
    tables = {**dataset.tables,
              "events": pa.Table.from_pandas(view.events, preserve_index=False),
              "clocks": pa.Table.from_pandas(view.clocks, preserve_index=False)}
    manifest = {"format": MANIFEST_FORMAT, "dlcsniff": __version__,
                "command": list(command) if command is not None else None,
                "inputs": [{"path": str(path), "size_bytes": Path(path).stat().st_size if Path(path).is_file() else None}
                           for path in inputs],
                "tables": {name: {"file": f"{name}.parquet", "rows": table.num_rows} for name, table in tables.items()},
                "job_view": {"events": summary["events"], "losses": summary["losses"], "reference": summary["reference"]}}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, table in tables.items():
            pq.write_table(table, out_dir / f"{name}.parquet", compression="zstd")
        (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str) + "\n")
    except OSError as exc:
        raise OutputError(f"cannot write to {out_dir}: {exc.strerror or exc}") from exc
    return summary


def read_manifest(decode_dir: Path) -> dict | None:
    """The manifest of a decode output; None for outputs written before dlcsniff wrote one."""
    path = Path(decode_dir) / MANIFEST
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise DecodeError(f"{path}: unreadable ({exc})") from exc
