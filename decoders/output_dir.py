"""An output directory of dlcsniff (decode, stats, dlc, export), made safely and labelled.

- `claim_output_dir` checks it before any work: never an input's own directory; never mixed with what is
  not this command's earlier output (files dlcsniff did not label, another command's output: refused even
  with `force`); this command's earlier output takes `force`, which first removes the files its manifest
  lists, and nothing else; writable. A symlink is followed to the directory it names.
- `claim_output_file` is the same rule for a command that writes one file (the Chrome trace, the report,
  the Wireshark script): a path that holds nothing, or with `force` the same command's earlier file (told
  by its first bytes); never a directory, a symlink, or a file dlcsniff did not write there.
- `write_manifest` labels it: `manifest.json` says which dlcsniff, which command and which inputs (size and
  sha256) made it, and every file written (tables with their rows). Decode outputs also carry the manifest in
  each Parquet file's metadata (decoders.output).
- `input_entries` lists the inputs for the manifest, with the sha256 the decode's reader computed of each file
  from the bytes it read (decoders.inputs.capture_file: one pass over the file).
"""
from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from typing import Iterable, Sequence

from dlcsniff.decoders.errors import DecodeError

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "dlcsniff-output/1"
METADATA_KEY = b"dlcsniff.manifest"        # the manifest in a Parquet file's key-value metadata


class OutputError(DecodeError):
    """The output directory cannot be used (the message says why and what to do)."""


def _same_or_inside(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def claim_output_dir(out_dir: Path, inputs: Iterable[Path], *, kind: str, force: bool = False) -> Path:
    """Check `out_dir` before any work (see the module doc) and create it; returns it resolved. `kind` is the
    command's (its manifest's kind: decode, stats, dlc, chakra, simulate, figures, diagnose). An input directory's
    subdirectories may hold outputs (`decode_dir/stats`), its own files may not be mixed with."""
    given = Path(out_dir).expanduser()
    if given.is_symlink() and not given.exists():
        raise OutputError(f"--out {out_dir} is a symlink to {os.readlink(given)}, which does not exist")
    out = given.resolve()
    for item in inputs:
        item = Path(item).expanduser().resolve()
        home = item if item.is_dir() else item.parent
        if out == home:
            what = "is the input directory" if item.is_dir() else f"holds the input {item.name}"
            raise OutputError(f"--out {out_dir} {what}: give a directory of its own (e.g. {out_dir}/decoded)")
        if not item.is_dir() and _same_or_inside(item, out):
            raise OutputError(f"--out {out_dir} would hold the input {item}")
    if out.exists() and not out.is_dir():
        raise OutputError(f"--out {out_dir} is a file, not a directory")
    previous = read_manifest(out) if out.is_dir() else None
    if previous is not None and previous.get("kind") != kind:
        raise OutputError(f"--out {out_dir} holds the output of `{_command_text(previous)}` (a {previous.get('kind')} "
                          f"output; --force replaces only a {kind} output): choose another directory")
    if previous is None and out.is_dir() and any(out.iterdir()):
        raise OutputError(f"--out {out_dir} holds files dlcsniff did not label (no {MANIFEST}): choose another "
                          "directory, or an empty one")
    if previous is not None and not force:
        raise OutputError(f"--out {out_dir} holds the output of `{_command_text(previous)}`: "
                          f"give --force to replace it, or choose another directory")
    if previous is not None:
        _remove_outputs(out, previous)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".dlcsniff-write-check-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OutputError(f"cannot write to {out_dir}: {exc.strerror or exc}") from None
    return out


OUTPUT_FILE_MARK_BYTES = 4096      # where a file dlcsniff wrote says so: its first or last bytes (claim_output_file)


def claim_output_file(path: Path, *, marker: bytes, command: str, force: bool = False,
                      option: str = "--out") -> Path:
    """Check the one file a command writes before any work (see the module doc) and create its directory;
    returns the path. `marker`: bytes the command writes within the first (or, before this version of dlcsniff,
    the last) OUTPUT_FILE_MARK_BYTES of every such file; `command`: the command as the messages name it;
    `option`: how the user gave the path."""
    path = Path(path).expanduser()
    if path.is_symlink():
        raise OutputError(f"{option} {path} is a symlink (to {os.readlink(path)}): give the path of a file to "
                          "write, not a link to one")
    if path.is_dir():
        raise OutputError(f"{option} {path} is a directory: give the path of the file to write")
    if path.exists():
        if not path.is_file():
            raise OutputError(f"{option} {path} is not a regular file: give the path of a file to write")
        try:
            with open(path, "rb") as existing:
                head = existing.read(OUTPUT_FILE_MARK_BYTES)
                existing.seek(max(0, path.stat().st_size - OUTPUT_FILE_MARK_BYTES))
                tail = existing.read(OUTPUT_FILE_MARK_BYTES)
        except OSError as exc:
            raise OutputError(f"{option} {path}: unreadable ({exc.strerror or exc})") from None
        if head and marker not in head and marker not in tail:
            raise OutputError(f"{option} {path} exists and is not the output of `{command}`: choose another path "
                              "(--force replaces only that command's own file)")
        if head and not force:
            raise OutputError(f"{option} {path} holds the output of `{command}`: give --force to replace it, "
                              "or choose another path")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    if not os.access(path.parent, os.W_OK):
        raise OutputError(f"cannot write {path}: {path.parent} is not writable")
    return path


def _command_text(manifest: dict) -> str:
    command = manifest.get("command") or ["dlcsniff"]
    return " ".join(command)


def _remove_outputs(out: Path, manifest: dict) -> None:
    """The files an earlier run wrote (as its manifest lists them), and the manifest: nothing else."""
    for name in [*manifest.get("files", {}), MANIFEST]:
        path = out / name
        if path.parent == out:              # a manifest names files of its own directory only
            path.unlink(missing_ok=True)


def input_entries(files: Sequence[Path], digests: Sequence[str | None]) -> list[dict]:
    """The manifest's inputs: each file's path, size and sha256 (as the decode's reader hashed it from the bytes it
    read; None for a stream, a fifo or a file gone)."""
    out = []
    for path, digest in zip(files, digests):
        path = Path(path)
        try:
            size = path.stat().st_size if path.is_file() else None
        except OSError:
            size = None
        out.append({"path": str(path), "size_bytes": size, "sha256": digest if size is not None else None})
    return out


def dlcsniff_version() -> str:
    """The installed dlcsniff's version: dlcsniff._version, which the distribution's version is built from
    (dlcsniff.__version__ is the same; imported here without the package root, which every layer sits under)."""
    from dlcsniff._version import __version__
    return __version__


def manifest(kind: str, *, inputs: list[dict], files: dict[str, dict], command: Sequence[str] | None = None,
             **extra) -> dict:
    """A manifest of one output directory: `kind` (decode, stats, dlc, chakra), the inputs (path, size,
    sha256), the files written (name -> {"rows": n} or {"bytes": n}), and what else the kind records."""
    command = list(sys.argv if command is None else command)
    if command and Path(command[0]).name == "dlcsniff":
        command[0] = "dlcsniff"                  # the command as a user types it, wherever it was installed
    return {"format": MANIFEST_FORMAT, "kind": kind, "dlcsniff": dlcsniff_version(), "command": command,
            "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "inputs": inputs, "files": files, **extra}


def write_manifest(out_dir: Path, content: dict) -> Path:
    path = Path(out_dir) / MANIFEST
    try:
        path.write_text(json.dumps(content, indent=1, default=str) + "\n")
    except OSError as exc:
        raise OutputError(f"cannot write to {out_dir}: {exc.strerror or exc}") from exc
    return path


def read_manifest(out_dir: Path) -> dict | None:
    """The manifest of an output directory; None for outputs written before dlcsniff wrote one."""
    path = Path(out_dir) / MANIFEST
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise DecodeError(f"{path}: unreadable ({exc})") from exc
