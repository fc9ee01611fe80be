"""What the user names on the command line → the captures to decode, each one node's capture in its files.

A file is a capture; a capture daemon's directory (capture.json) stands for its captures, one per daemon run,
named after the directory; any other directory for the capture files directly inside it.
"""
from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from dlcsniff.decoders.errors import CaptureError
from dlcsniff.decoders.formats.capture_dir import is_capture_dir, read_capture_json, set_files

CAPTURE_SUFFIXES = (".pcap", ".pcapng", ".cap", ".pcap.gz", ".pcapng.gz", ".cap.gz")
ProgressFn = Callable[[int], None]   # called with the number of raw input bytes consumed since the last call


def capture_name(path: Path) -> str:
    """The input file name without its extensions (`worker0.pcap.gz` → `worker0`)."""
    name = path.name
    while True:
        stem, dot, ext = name.rpartition(".")
        if not dot or ext.lower() not in {"pcap", "pcapng", "cap", "gz", "dmp"}:
            return name
        name = stem


@dataclass(frozen=True)
class CaptureInput:
    """One capture: its files, read in order as one continuous capture (a capture daemon rotates its
    files), and the daemon's directory when it came from one (its probe files then join the tables)."""
    name: str
    files: tuple[Path, ...]
    directory: Path | None = None

    @property
    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files)

    @property
    def path(self) -> Path:
        """What the user named: the file, or the daemon's directory."""
        return self.files[0] if self.directory is None else self.directory

    def with_files(self, files: Iterable[Path]) -> CaptureInput:
        return dataclasses.replace(self, files=tuple(files))


def expand_inputs(inputs: Iterable[Path]) -> list[CaptureInput]:
    """The captures the inputs name (see the module doc), with unique names."""
    captures: list[CaptureInput] = []
    for item in inputs:
        item = Path(item)
        if item.is_dir() and is_capture_dir(item):
            read_capture_json(item)                # one clear error when it is unreadable
            sets, _ = set_files(item)
            if not any(sets.values()):
                raise CaptureError(f"{item}: the capture daemon's directory holds no packet files")
            for run, files in sorted(sets.items()):
                name = item.resolve().name if len(sets) == 1 else f"{item.resolve().name}-{run}"
                captures.append(CaptureInput(name, tuple(files), item))
        elif item.is_dir():
            found = sorted(p for p in item.iterdir() if p.is_file() and p.name.lower().endswith(CAPTURE_SUFFIXES))
            if not found:
                raise CaptureError(f"{item}: directory holds no capture files (*.pcap, *.pcapng, optionally .gz)")
            captures.extend(CaptureInput(capture_name(p), (p,)) for p in found)
        elif not item.exists():
            raise CaptureError(f"{item}: no such file")
        else:
            captures.append(CaptureInput(capture_name(item), (item,)))
    dupes = [n for n, c in collections.Counter(c.name for c in captures).items() if c > 1]
    if dupes:
        raise CaptureError(f"two inputs share the capture name {dupes[0]!r}; rename one of them")
    return captures
