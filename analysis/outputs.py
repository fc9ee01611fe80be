"""The outputs analysis writes, claimed before any work as decode's output is (decoders.output_dir): the
directories (stats, DLC traces, Chakra traces, the report's figures, simulations: never the decode output
itself, never mixed with what is not the same command's earlier output, which takes `force`), labelled with a
manifest naming the decode output they were computed from; and the single files (the Chrome trace, the
report: an existing file only when it is the same command's and `force` is given)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from dlcsniff.analysis.load import AnalysisError, require_decode_output
from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.output_dir import claim_output_dir, claim_output_file, manifest, write_manifest

if TYPE_CHECKING:
    from dlcsniff.analysis.job_model import JobModel


def claim(out_dir: str | Path, decode_dir: str | Path, *, kind: str, force: bool = False) -> Path:
    """`out_dir` checked and made for the output of `kind` (decoders.output_dir.claim_output_dir), once
    decode_dir is known to be a decode output: refused, nothing is made."""
    require_decode_output(decode_dir)
    try:
        return claim_output_dir(Path(out_dir), [Path(decode_dir)], kind=kind, force=force)
    except DecodeError as exc:
        raise AnalysisError(str(exc)) from None


def claim_file(path: str | Path, *, marker: bytes, command: str, force: bool = False, option: str = "--out") -> Path:
    """`path` checked for the one file a command writes (decoders.output_dir.claim_output_file)."""
    try:
        return claim_output_file(Path(path), marker=marker, command=command, force=force, option=option)
    except DecodeError as exc:
        raise AnalysisError(str(exc)) from None


def label(out_dir: Path, kind: str, job: JobModel, written: Iterable[Path], **extra) -> Path:
    """manifest.json of an analysis output: its decode output (path, and the command and time that made it) and
    every file written with its size."""
    source = job.manifest or {}
    inputs = [{"path": job.source, "decoded_by": source.get("command"), "decoded_utc": source.get("created_utc")}]
    files = {path.name: {"bytes": path.stat().st_size} for path in written}
    try:
        return write_manifest(out_dir, manifest(kind, inputs=inputs, files=files, **extra))
    except DecodeError as exc:
        raise AnalysisError(str(exc)) from None
