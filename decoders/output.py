"""A decode output directory, written in one place: the tables, the job's timeline, its clocks and a manifest.

    streams.parquet zmtp.parquet messages.parquet nodes.parquet collectives.parquet
    events.parquet  clocks.parquet     the job's messages once each, on one clock (decoders.timeline)
                    (every table's schema and columns: decoders.schema)
    manifest.json   which dlcsniff, which command and inputs made it, the tables with their row counts,
                    and what building the timeline lost (decoders.output_dir; also in each file's metadata)

`dlcsniff decode` and the tests both call `write_decode_output`; analysis/ reads what it wrote.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import pyarrow.parquet as pq

from dlcsniff.decoders.output_dir import METADATA_KEY, OutputError, manifest, write_manifest
from dlcsniff.decoders.schema import CLOCKS, EVENTS
from dlcsniff.decoders.timeline import MESSAGE_READ_COLUMNS, NODE_READ_COLUMNS, STREAM_READ_COLUMNS, job_view

if TYPE_CHECKING:
    from dlcsniff.decoders.job import DecodedJob

def job_view_summary(view) -> dict:
    """What the CLI prints and the manifest keeps of a job view: events, losses, the clocks' alignment."""
    return {"events": view.losses["events"], "losses": view.losses,
            "reference": str(view.clocks["reference"].iloc[0]) if len(view.clocks) else None,
            "clocks": view.clocks.astype(object).where(view.clocks.notna(), None).to_dict(orient="records")}


def write_decode_output(dataset: DecodedJob, out_dir: Path, *,
                        inputs: list[dict] | Callable[[], list[dict]] | None = None,
                        command: Sequence[str] | None = None) -> dict:
    """Write `dataset` (decoders.job.decode_paths) and its timeline into out_dir (made safe first with
    decoders.output_dir.claim_output_dir), with its manifest; `inputs`: the captures' files with their size and
    sha256, or what returns them once ready (decoders.output_dir.InputDigests.result), called only after the
    timeline is built. Returns the job view's summary (`job_view_summary`)."""
    out_dir = Path(out_dir)
    view = job_view(dataset.tables["messages"].select(list(MESSAGE_READ_COLUMNS)).to_pandas(),
                    dataset.tables["streams"].select(list(STREAM_READ_COLUMNS)).to_pandas(),
                    dataset.tables["nodes"].select(list(NODE_READ_COLUMNS)).to_pandas())
    summary = job_view_summary(view)
    tables = {**dataset.tables,
              "events": EVENTS.from_frame(view.events), "clocks": CLOCKS.from_frame(view.clocks)}
    if callable(inputs):
        inputs = inputs()
    content = manifest("decode", inputs=inputs or [], command=command,
                       files={f"{name}.parquet": {"rows": table.num_rows} for name, table in tables.items()},
                       job_view={"events": summary["events"], "losses": summary["losses"],
                                 "reference": summary["reference"]})
    label = {METADATA_KEY: json.dumps(content, default=str).encode()}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, table in tables.items():
            labelled = table.replace_schema_metadata({**(table.schema.metadata or {}), **label})
            pq.write_table(labelled, out_dir / f"{name}.parquet", compression="zstd")
    except OSError as exc:
        raise OutputError(f"cannot write to {out_dir}: {exc.strerror or exc}") from exc
    write_manifest(out_dir, content)
    return summary
