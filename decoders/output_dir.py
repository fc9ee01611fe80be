"""An output directory of dlcsniff (decode, stats, dlc, export), made safely and labelled.

- `claim_output_dir` checks it before any work: never an input's own directory; never mixed with another
  run's output (that takes `force`, which first removes the files the old manifest lists, and nothing else);
  writable.
- `write_manifest` labels it: `manifest.json` says which dlcsniff, which command and which inputs (size and
  sha256) made it, and every file written (tables with their rows). Decode outputs also carry the manifest in
  each Parquet file's metadata (decoders.output).
- `InputDigests` hashes the input files in a forked process while the work runs (on a machine with a free
  core it costs no wall time).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import signal
import sys
import threading
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


def claim_output_dir(out_dir: Path, inputs: Iterable[Path], *, force: bool = False) -> Path:
    """Check `out_dir` before any work (see the module doc) and create it; returns it resolved. An input
    directory's subdirectories may hold outputs (`decode_dir/stats`), its own files may not be mixed with."""
    out = Path(out_dir).expanduser().resolve()
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
    if out.is_dir() and any(out.iterdir()):
        if previous is None and any(out.glob("*.parquet")):
            raise OutputError(f"--out {out_dir} holds tables dlcsniff did not label (no {MANIFEST}): "
                              f"choose another directory")
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


def _command_text(manifest: dict) -> str:
    command = manifest.get("command") or ["dlcsniff"]
    return " ".join(command)


def _remove_outputs(out: Path, manifest: dict) -> None:
    """The files an earlier run wrote (as its manifest lists them), and the manifest: nothing else."""
    for name in [*manifest.get("files", {}), MANIFEST]:
        path = out / name
        if path.parent == out:              # a manifest names files of its own directory only
            path.unlink(missing_ok=True)


class InputDigests:
    """sha256 and size of every input file, computed from the moment it is made: in a forked process where
    there is fork, else in a background thread. (A thread's hashing waits on the GIL whenever this process
    runs Python, e.g. its imports and the timeline while a worker decodes: beside a busy main thread it took
    twice as long, on a 1 GB input as long as the whole decode.)"""

    def __init__(self, files: Sequence[Path]):
        self._files = [Path(f) for f in files]
        self._digests: list[str | None] | None = None
        self._pid: int | None = None
        if not hasattr(os, "fork"):
            self._thread = threading.Thread(target=self._hash_in_thread, daemon=True, name="sha256")
            self._thread.start()
            return
        read_fd, write_fd = os.pipe()
        self._pid = os.fork()
        if self._pid == 0:                     # the child: hash, write the digests, leave without cleanup
            code = 0
            try:
                os.close(read_fd)
                with os.fdopen(write_fd, "w") as out:
                    json.dump(self._hash(self._files), out)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(write_fd)
        self._pipe = os.fdopen(read_fd)

    @staticmethod
    def _hash(files: list[Path]) -> list[str | None]:
        digests = []
        for path in files:
            if not path.is_file():
                digests.append(None)           # a stream (stdin, a fifo): reading it here would take its bytes
                continue
            try:
                with open(path, "rb") as f:
                    digests.append(hashlib.file_digest(f, "sha256").hexdigest())
            except OSError:
                digests.append(None)           # a file gone: no digest
        return digests

    def _hash_in_thread(self) -> None:
        self._digests = self._hash(self._files)

    def _wait(self) -> list[str | None]:
        if self._digests is None and self._pid is None:
            self._thread.join()
        elif self._digests is None:
            text = self._pipe.read()
            try:
                self._digests = json.loads(text)
            except ValueError:                 # the child failed: no digests
                self._digests = [None] * len(self._files)
            self.close()
        return self._digests

    def close(self) -> None:
        """Stop the hashing process if it still runs (when the digests are not wanted after all)."""
        if self._pid is None:
            return
        if self._digests is None:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._digests = [None] * len(self._files)
        self._pipe.close()
        os.waitpid(self._pid, 0)
        self._pid = None

    def result(self) -> list[dict]:
        out = []
        for path, digest in zip(self._files, self._wait()):
            try:
                size = path.stat().st_size if path.is_file() else None
            except OSError:
                size = None
            out.append({"path": str(path), "size_bytes": size, "sha256": digest})
        return out


def dlcsniff_version() -> str:
    """The installed dlcsniff's version (dlcsniff.__version__ is the same; read here without importing the
    package root, which every layer sits under)."""
    from importlib.metadata import version
    return version("dlcsniff")


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
