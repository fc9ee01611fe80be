"""The capture directory as the daemon writes it (its format is defined in decoders/formats/capture_dir.py),
and the disk budget it is written within."""
from __future__ import annotations

import errno
import json
import os
import pwd
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from dlcsniff.decoders.formats.capture_dir import CAPTURE_JSON, FORMAT, SET_FILE_RE
from dlcsniff.sniffer.options import bad_option, write_error

JSON_BYTES_PER_FILE = 512          # capture.json growth per file it lists (disk budget reserve)
JSON_BYTES_BASE = 16384


class DiskBudget:
    """Bytes on disk the directory may use (None: no limit). Files count whole filesystem blocks, and a
    file may only grow into room it reserved first, so the total is never exceeded."""

    def __init__(self, limit_bytes: int | None, block_bytes: int, used_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.block_bytes = block_bytes
        self._reserved: dict[str, int] = {}
        self._used_elsewhere = used_bytes

    def blocks(self, size_bytes: int) -> int:
        return -(-size_bytes // self.block_bytes) * self.block_bytes

    @property
    def total(self) -> int:
        return self._used_elsewhere + sum(self._reserved.values())

    def room(self, name: str) -> int | None:
        """How large file `name` may become (None: unlimited)."""
        if self.limit_bytes is None:
            return None
        room = self.limit_bytes - self.total + self._reserved.get(name, 0)
        return room // self.block_bytes * self.block_bytes

    def reserve(self, name: str, size_bytes: int) -> bool:
        """Let file `name` grow to size_bytes, if the budget has room."""
        room = self.room(name)
        needed = self.blocks(size_bytes)
        if room is not None and needed > room:
            return False
        self._reserved[name] = max(needed, self._reserved.get(name, 0))
        return True

    def settle(self, name: str, size_bytes: int) -> None:
        """The file ended at size_bytes: give back what it reserved beyond."""
        self._reserved[name] = self.blocks(size_bytes)


def directory_usage(directory: Path, block_bytes: int) -> int:
    with os.scandir(directory) as entries:
        return sum(-(-entry.stat().st_size // block_bytes) * block_bytes for entry in entries if entry.is_file())


@dataclass(slots=True)
class FileEntry:
    name: str
    set: int
    kind: str                       # "packets" or "probes"
    opened_ns: int
    closed_ns: int | None = None
    bytes: int = 0
    packets: int | None = None      # packets files
    events: int | None = None       # probes files
    dropped: int = 0                # packets: dropped by the kernel while this file was written; probes: events lost


def now_ns() -> int:
    return time.time_ns()


class CaptureDirectory:
    """DIR: its previous runs (read at start), this run's files, and capture.json.

    Files are created relative to a descriptor of DIR opened while still root: once the daemon is an
    unprivileged user it needs no access to DIR's parents (a root-only /tmp/... or /root/...)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None
        self.document: dict = {"format": FORMAT, "runs": [], "files": []}
        json_path = path / CAPTURE_JSON
        if path.exists():
            if not path.is_dir():
                raise bad_option(f"--out {path}: not a directory")
            others = [entry.name for entry in path.iterdir() if not SET_FILE_RE.match(entry.name)
                      and entry.name not in (CAPTURE_JSON, f".{CAPTURE_JSON}.partial")]
            if others:
                raise bad_option(f"--out {path}: holds files that are not a dlcsniff capture ({', '.join(sorted(others)[:3])})")
            if json_path.exists():
                try:
                    self.document = json.loads(json_path.read_text())
                except (OSError, ValueError) as exc:
                    raise bad_option(f"--out {path}: unreadable {CAPTURE_JSON} ({exc})") from None
                if self.document.get("format") != FORMAT:
                    raise bad_option(f"--out {path}: {CAPTURE_JSON} is not a {FORMAT} file")
            self._mark_unfinished_runs()
        sets = [run["set"] for run in self.document["runs"]]
        sets += [int(found.group(1)) for entry in path.iterdir() if (found := SET_FILE_RE.match(entry.name))] \
            if path.exists() else []
        self.set = max(sets, default=0) + 1
        self.files: list[FileEntry] = []
        self.run: dict = {}

    def _mark_unfinished_runs(self) -> None:
        # A run without a stop time was killed (or lost power): its files are still readable, its counts
        # are those of its last capture.json update.
        for run in self.document["runs"]:
            if run.get("stop_ns") is None:
                run["stop_reason"] = "killed: no clean stop recorded"

    def create(self, owner: pwd.struct_passwd) -> None:
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        os.fchmod(self.fd, 0o700)
        os.fchown(self.fd, owner.pw_uid, owner.pw_gid)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def create_file(self, name: str) -> int:
        """A new file (0600, never an existing one) for writing."""
        try:
            return os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=self.fd)
        except OSError as exc:
            raise write_error(self.path / name, exc.errno or errno.EIO) from None

    def _write_json_atomically(self, name: str, document: dict) -> None:
        partial = f".{name}.partial"
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600, dir_fd=self.fd)
            with os.fdopen(fd, "w") as stream:
                json.dump(document, stream, indent=1)
                stream.write("\n")
                stream.flush()
                os.fdatasync(stream.fileno())
            os.replace(partial, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            os.fsync(self.fd)
        except OSError as exc:
            try:
                os.unlink(partial, dir_fd=self.fd)
            except OSError:
                pass
            raise write_error(self.path / name, exc.errno or errno.EIO) from None

    def begin_run(self, run: dict) -> None:
        self.run = {"set": self.set, **run, "stop_ns": None, "stop_reason": None}
        self.document["runs"].append(self.run)

    def add_file(self, kind: str, name: str) -> FileEntry:
        entry = FileEntry(name=name, set=self.set, kind=kind, opened_ns=now_ns())
        self.files.append(entry)
        return entry

    def save(self) -> None:
        previous = [item for item in self.document["files"] if item.get("set") != self.set]
        files = previous + [{key: value for key, value in asdict(entry).items() if value is not None or key == "closed_ns"}
                            for entry in self.files]
        runs = self.document["runs"]
        self.document.update(
            interface=self.run.get("interface"), filter=self.run.get("filter"),
            start_ns=runs[0].get("start_ns"), stop_ns=self.run.get("stop_ns"), files=files)
        self._write_json_atomically(CAPTURE_JSON, self.document)

    def json_reserve_bytes(self, max_new_files: int) -> int:
        """Room capture.json may need (twice: the new copy is written beside the old one)."""
        current = len(json.dumps(self.document, indent=1))
        return 2 * (current + JSON_BYTES_BASE + JSON_BYTES_PER_FILE * max_new_files)
