"""A decode output directory, written in one place: the tables, the job's timeline, its clocks and a manifest.

    streams.parquet zmtp.parquet messages.parquet nodes.parquet collectives.parquet
    events.parquet  clocks.parquet     the job's messages once each, on one clock (decoders.timeline)
                    (every table's schema and columns: decoders.schema)
    manifest.json   which dlcsniff, which command and inputs made it, the tables with their row counts,
                    what building the timeline lost and what the decode warned of (decoders.output_dir; also in
                    each file's metadata)

`dlcsniff decode` and the tests both call `write_decode_output`; analysis/ reads what it wrote.
"""
from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import pyarrow.parquet as pq

from dlcsniff.decoders.job import with_job_view
from dlcsniff.decoders.output_dir import METADATA_KEY, OutputError, manifest, write_manifest

if TYPE_CHECKING:
    from dlcsniff.decoders.job import DecodedJob
    from dlcsniff.decoders.timeline import JobTimeline

def job_view_summary(view: JobTimeline) -> dict:
    """What the CLI prints and the manifest keeps of a job view: events, losses, the clocks' alignment."""
    references = collections.Counter(view.clocks["reference"].to_pylist())
    return {"events": view.losses["events"], "losses": view.losses,
            # the reference of the job of the most captures (the first by name among equals)
            "reference": min(references.items(), key=lambda item: (-item[1], item[0]))[0] if references else None,
            "clocks": view.clocks.to_pylist()}


def write_decode_output(dataset: DecodedJob, out_dir: Path, *,
                        inputs: list[dict] | None = None,
                        command: Sequence[str] | None = None) -> dict:
    """Write `dataset` (decoders.job.decode_paths) and its timeline (`dataset.view`) into out_dir (made safe
    first with decoders.output_dir.claim_output_dir), with its manifest; `inputs`: the captures' files with their
    size and sha256 (decoders.output_dir.input_entries). Returns the job view's summary (`job_view_summary`)."""
    out_dir = Path(out_dir)
    if dataset.view is None:            # a dataset straight from decoders.job.build_dataset
        with_job_view(dataset)
    view = dataset.view
    summary = job_view_summary(view)
    tables = {**dataset.tables, "events": view.events, "clocks": view.clocks}
    content = manifest("decode", inputs=inputs or [], command=command,
                       files={f"{name}.parquet": {"rows": table.num_rows} for name, table in tables.items()},
                       job_view={"events": summary["events"], "losses": summary["losses"],
                                 "reference": summary["reference"]},
                       # which files each capture is (the tables name it by `capture`): how outputs show it
                       captures=[{"capture": found["capture"], "files": [piece["path"] for piece in found["files"]]}
                                 for found in dataset.summary.get("captures", ())],
                       # what the decode warned of (the capture limits among them), for what reads the output
                       warnings=dataset.summary["warnings"],
                       # the captures of each job, where the inputs look like several (empty: one job)
                       jobs=dataset.summary.get("jobs", []))
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
