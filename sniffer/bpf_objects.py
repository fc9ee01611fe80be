"""The capture side's BPF programs as objects built once, the way libbpf-tools ship theirs: clang compiles each
C source (probes/) for the BPF target with BTF, libbpf loads the object as it is and relocates its reads of
kernel structures against the running kernel's BTF (CO-RE). Nothing is compiled when a capture starts.

    python -m dlcsniff.sniffer.bpf_objects      # `make setup`: builds every object into probes/build/

An object's file name carries a digest of its sources and build flags (probes-1a2b3c4d5e6f.bpf.o), so an
edited source or a changed record layout is never loaded from an old build. CO-RE objects do not depend on the
kernel they run on: one build serves every kernel with BTF. Where the object of the sources at hand was not
built (a package installed without `make setup`, a source edited since), the daemon's root helper builds it at
start into CACHE_DIR, in the background of a capture that already runs, and says so.
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from dlcsniff.decoders.formats.probe_events import layout_cflags
from dlcsniff.decoders.protocols import ZMTP_KEPT_BODIES

PROBES_DIR = Path(__file__).resolve().parent / "probes"
BUILD_DIR = PROBES_DIR / "build"
CACHE_DIR = Path("/var/cache/dlcsniff/bpf")
CLANG = "clang"
COMPILE_TIMEOUT_S = 120.0
TARGET_ARCH = {"x86_64": "x86", "aarch64": "arm64"}      # bpf_tracing.h's names (__TARGET_ARCH_*)
RINGBUF_BYTES = 4 << 20          # the probes' ring buffer: ~40k events at the ~100 B they take
SNAP_STORE_CHUNKS = 4096         # 4 KiB chunks of bytes past holes, all flows together (16 MiB of kernel memory)
SNAP_WAIT_LIMIT = 8 << 20        # bytes past one hole a flow may store while it waits


class BuildFailed(RuntimeError):
    """An object could not be built (no clang, a compile error): the reason."""


@dataclass(frozen=True, slots=True)
class BpfSource:
    """One object: the C file clang compiles, every file it reads, and the -D flags it is built with."""
    name: str
    main: Path
    parts: tuple[Path, ...]
    defines: tuple[tuple[str, object], ...]

    def cflags(self) -> list[str]:
        multiarch = sysconfig.get_config_var("MULTIARCH")       # where <asm/types.h> lives
        includes = [f"-I/usr/include/{multiarch}"] if multiarch else []
        return ["-O2", "-g", "-target", "bpf", "-Wall", "-Werror", *includes,
                *(f"-D{name}={value}" for name, value in self.defines)]

    @property
    def file_name(self) -> str:
        digest = hashlib.sha256("\0".join(self.cflags()).encode())
        for part in self.parts:
            digest.update(part.name.encode() + b"\0" + part.read_bytes())
        return f"{self.name}-{digest.hexdigest()[:12]}.bpf.o"


def _sorted_defines(defines: dict[str, object]) -> tuple[tuple[str, object], ...]:
    return tuple(sorted(defines.items()))


PROBE_FILES = ("probes.c", "common.h", "kernel.h", "sock.c", "libs.c", "zmq.c", "nccl.c")
PROBES = BpfSource(
    "probes", PROBES_DIR / "probes.c", tuple(PROBES_DIR / name for name in PROBE_FILES),
    _sorted_defines({**layout_cflags(), "RINGBUF_BYTES": RINGBUF_BYTES,
                     f"__TARGET_ARCH_{TARGET_ARCH.get(platform.machine(), platform.machine())}": 1}))
SNAP = BpfSource(
    "zmtp_snap", PROBES_DIR / "zmtp_snap.c", (PROBES_DIR / "zmtp_snap.c",),
    _sorted_defines({"SNAP_KEPT_FIRST_FRAMES": ZMTP_KEPT_BODIES.first_frames,
                     "SNAP_KEPT_BODY_MAX": ZMTP_KEPT_BODIES.max_body_bytes,
                     "SNAP_STORE_CHUNKS": SNAP_STORE_CHUNKS, "SNAP_WAIT_LIMIT": SNAP_WAIT_LIMIT}))
SOURCES = (PROBES, SNAP)


def compile_object(source: BpfSource) -> bytes:
    """The object clang makes of `source` (ELF bytes)."""
    clang = shutil.which(CLANG)
    if clang is None:
        raise BuildFailed("clang is missing (install clang, then run `make setup`)")
    argv = [clang, *source.cflags(), "-c", str(source.main), "-o", "-"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=COMPILE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildFailed(f"clang did not compile {source.main.name}: {exc}") from None
    if done.returncode != 0 or not done.stdout:
        raise BuildFailed(f"clang did not compile {source.main.name}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def _write_atomically(path: Path, data: bytes) -> None:
    """Daemons starting together may build the same object: each writes its own file and renames it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as staging:
        staging.write(data)
    os.chmod(staging.name, 0o644)
    os.replace(staging.name, path)


def object_bytes(source: BpfSource) -> tuple[bytes, str | None]:
    """The object of `source` as built by `make setup` or cached, else built now (and cached where root may
    write): its bytes, and what was done when it had to be built (None: it was there)."""
    for directory in (BUILD_DIR, CACHE_DIR):
        try:
            return (directory / source.file_name).read_bytes(), None
        except OSError:
            continue
    started = time.monotonic()
    elf = compile_object(source)
    spent = f"{time.monotonic() - started:.1f} s"
    try:
        _write_atomically(CACHE_DIR / source.file_name, elf)
    except OSError as exc:
        return elf, f"{source.name}: not built by `make setup`: compiled now with clang ({spent}), not cached ({exc})"
    return elf, (f"{source.name}: not built by `make setup`: compiled now with clang ({spent}), cached in "
                 f"{CACHE_DIR} for the next starts")


def build_all(directory: Path = BUILD_DIR) -> list[Path]:
    """Build every object into `directory` (those already there are kept) and remove older builds of them."""
    built = []
    for source in SOURCES:
        path = directory / source.file_name
        if not path.exists():
            _write_atomically(path, compile_object(source))
        for old in directory.glob(f"{source.name}-*.bpf.o"):
            if old != path:
                old.unlink()
        built.append(path)
    return built


def main() -> int:
    try:
        for path in build_all():
            print(f"BPF object: {path}")
    except (BuildFailed, OSError) as exc:
        print(f"cannot build the BPF objects: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
