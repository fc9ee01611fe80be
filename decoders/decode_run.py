"""One decode from captures to an output directory: the road `dlcsniff decode` and the Python API
(`dlcsniff.decode`) both take.

The output directory is claimed before any work (decoders.output_dir: never an input's directory, never another
run's output unless `force`), the captures are decoded (forked workers, or Dask tasks with engine="dask"; each
input hashed from the bytes read to decode it), and the tables, the job's timeline and the manifest are written
in one place (decoders.output).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Literal, Sequence

from dlcsniff.decoders.inputs.capture_set import ProgressFn, expand_inputs
from dlcsniff.decoders.inputs.selection import PacketSelection
from dlcsniff.decoders.job import DecodedJob, decode_paths, prepare_inputs
from dlcsniff.decoders.output_dir import claim_output_dir, input_entries

Engine = Literal["pandas", "dask"]


@dataclass(frozen=True, slots=True)
class DecodeRun:
    """What one decode made: the job's tables and summary (`dataset`), the job view's summary (events, losses,
    clocks; decoders.output.job_view_summary), where it was written, and how long each step took."""

    dataset: DecodedJob
    job_view: dict
    out_dir: Path
    decode_s: float
    write_s: float


def _load_writer() -> None:
    """Import the writer (pyarrow.parquet), e.g. while forked workers decode."""
    from dlcsniff.decoders import output  # noqa: F401


def decode_to_dir(captures: Iterable[str | Path], out_dir: str | Path, *, force: bool = False,
                  engine: Engine = "pandas", scheduler: str | None = None, workers: int | None = None,
                  selection: PacketSelection | None = None,
                  progress_total: Callable[[int | None], ProgressFn] | None = None,
                  command: Sequence[str] | None = None, meanwhile: Callable[[], None] | None = None) -> DecodeRun:
    """Decode the captures (files, directories of them, streams: every node of one job) into out_dir; with
    `selection` (decoders.inputs.selection.packet_selection) only the packets it keeps.

    `meanwhile`: the caller's next imports, run (after the writer's) while forked workers decode.

    Raises CaptureError (an input cannot be read), OutputError (out_dir cannot be used or written) and, with
    engine="dask", ClusterError."""
    captures = [Path(capture) for capture in captures]
    if engine not in ("pandas", "dask"):
        raise ValueError(f"engine must be 'pandas' or 'dask', not {engine!r}")
    if scheduler is not None and engine != "dask":
        raise ValueError("a scheduler needs engine='dask'")
    if selection is not None:
        prepare_inputs(captures, selection)         # a filter that does not compile fails before anything is made
    out_dir = claim_output_dir(Path(out_dir), captures, kind="decode", force=force)
    files = [file for capture in expand_inputs(captures) for file in capture.files]
    began = time.monotonic()
    if engine == "dask":
        from dlcsniff.decoders.dask_decode import decode_paths_dask
        dataset = decode_paths_dask(captures, scheduler=scheduler, workers=workers, progress_total=progress_total,
                                    selection=selection)
    else:
        def load_next() -> None:
            _load_writer()
            if meanwhile is not None:
                meanwhile()
        dataset = decode_paths(captures, progress_total=progress_total, workers=workers, selection=selection,
                               meanwhile=load_next)
    decoded = time.monotonic()
    from dlcsniff.decoders.output import write_decode_output

    # The tables, and the job's timeline built with them (decoders.job.with_job_view): a message seen at both
    # ends is one event (events.parquet), every capture's clock aligned to a reference capture (clocks.parquet).
    job_view = write_decode_output(dataset, out_dir, inputs=input_entries(files, dataset.input_sha256),
                                   command=command)
    return DecodeRun(dataset=dataset, job_view=job_view, out_dir=out_dir, decode_s=decoded - began,
                     write_s=time.monotonic() - decoded)
