"""The directories analysis writes (stats, DLC traces, Chakra traces): claimed before any work, as decode's
output is (never the decode output itself, never mixed with another run's output without `force`), and
labelled with a manifest naming the decode output they were computed from (decoders.output_dir)."""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from dlcsniff.analysis.load import AnalysisError
from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.output_dir import claim_output_dir, manifest, read_manifest, write_manifest


def claim(out_dir: str | Path, decode_dir: str | Path, *, force: bool = False) -> Path:
    try:
        return claim_output_dir(Path(out_dir), [Path(decode_dir)], force=force)
    except DecodeError as exc:
        raise AnalysisError(str(exc)) from None


def label(out_dir: Path, kind: str, decode_dir: str | Path, written: Iterable[Path], **extra) -> Path:
    """manifest.json of an analysis output: its decode output (path, and the command and time that made it) and
    every file written with its size."""
    try:
        source = read_manifest(Path(decode_dir)) or {}
    except DecodeError as exc:
        raise AnalysisError(str(exc)) from None
    inputs = [{"path": str(decode_dir), "decoded_by": source.get("command"), "decoded_utc": source.get("created_utc")}]
    files = {path.name: {"bytes": path.stat().st_size} for path in written}
    try:
        return write_manifest(out_dir, manifest(kind, inputs=inputs, files=files, **extra))
    except DecodeError as exc:
        raise AnalysisError(str(exc)) from None
