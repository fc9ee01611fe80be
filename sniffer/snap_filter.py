"""The in-kernel ZMTP cut (probes/zmtp_snap.c): compiled by clang, loaded through libbpf (root, in the probe
helper), attached by the daemon to its own packet socket.

The probes go through bcc, which compiles at run time against kernel headers. The cut needs no kernel header
(it reads packets only) but walks the ZMTP framing one frame per bpf_loop() step, and bcc cannot load a
program that hands a callback to a helper: it loads each function's section alone, without the relocation
of the callback's address. So the filter is plain BPF C for clang's BPF target, loaded by libbpf, which links
callbacks; its -D flags stay run-time choices (the link header, --ports, the kept-bodies rule).
"""
from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sysconfig
from collections.abc import Iterable
from pathlib import Path

from dlcsniff.sniffer import libbpf

SNAP_SOURCE = Path(__file__).resolve().parent / "probes" / "zmtp_snap.c"
SNAP_FUNCTION = "zmtp_snap"
# snap_counts in probes/zmtp_snap.c, in order: what was cut, and how holes in flows were waited for
SNAP_COUNTERS = ("cut_packets", "cut_bytes", "full_flows", "waits", "resumed")
SNAP_STORE_CHUNKS = 4096          # 4 KiB chunks of bytes past holes, all flows together (16 MiB of kernel memory)
SNAP_WAIT_LIMIT = 8 << 20         # bytes past one hole a flow may store while it waits
CLANG = "clang"
COMPILE_TIMEOUT_S = 120.0
SO_ATTACH_BPF = 50


class SnapUnavailable(RuntimeError):
    """The cut cannot run here (no clang, no libbpf, a compile or verifier failure): the reason."""


def snap_cflags(*, link_header_bytes: int, kept_first_frames: int, kept_body_max: int,
                port_ranges: Iterable[tuple[int, int]] = ()) -> list[str]:
    """Compiler flags for probes/zmtp_snap.c (its header comment lists them)."""
    defines: dict[str, object] = {
        "SNAP_LINK_HEADER_LEN": link_header_bytes, "SNAP_KEPT_FIRST_FRAMES": kept_first_frames,
        "SNAP_KEPT_BODY_MAX": kept_body_max, "SNAP_STORE_CHUNKS": SNAP_STORE_CHUNKS, "SNAP_WAIT_LIMIT": SNAP_WAIT_LIMIT}
    ranges = " || ".join(f"((port) >= {low} && (port) <= {high})" for low, high in port_ranges)
    if ranges:
        defines["SNAP_PORT_WANTED(port)"] = f"({ranges})"
    return [f"-D{name}={value}" for name, value in sorted(defines.items())]


def compile_snap_filter(cflags: list[str], source: Path = SNAP_SOURCE) -> bytes:
    """The BPF object file (ELF) clang makes of the filter with these flags."""
    clang = shutil.which(CLANG)
    if clang is None:
        raise SnapUnavailable("clang is missing (install clang): it compiles the cut")
    multiarch = sysconfig.get_config_var("MULTIARCH")       # where <asm/types.h> lives
    includes = [f"-I/usr/include/{multiarch}"] if multiarch else []
    argv = [clang, "-O2", "-g", "-target", "bpf", "-Wall", "-Werror", *includes, *cflags, "-c", str(source), "-o", "-"]
    try:
        done = subprocess.run(argv, capture_output=True, timeout=COMPILE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SnapUnavailable(f"clang did not compile {source.name}: {exc}") from None
    if done.returncode != 0 or not done.stdout:
        raise SnapUnavailable(f"clang did not compile {source.name}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def load_snap_filter(elf: bytes) -> tuple[int, int]:
    """Load the compiled filter (root): its program and counters descriptors, the caller's to close."""
    try:
        program, (counts,) = libbpf.load_object(elf, SNAP_FUNCTION, ["snap_counts"])
    except libbpf.BpfError as exc:
        raise SnapUnavailable(f"the snap filter did not load: {exc}") from None
    return program, counts


class SnapFilter:
    """The snap filter as the daemon holds it: the program's descriptor, to attach to its own packet socket
    (no privilege needed), and its counters."""

    def __init__(self, program_fd: int, counts_fd: int) -> None:
        self._lib = libbpf.load_libbpf()
        self.program_fd = program_fd
        self.counts_fd = counts_fd

    def attach(self, packet_socket_fd: int) -> None:
        """Make the filter the packet socket's only filter (it replaces libpcap's, if any)."""
        with socket.fromfd(packet_socket_fd, socket.AF_PACKET, socket.SOCK_RAW) as packet_socket:
            try:
                packet_socket.setsockopt(socket.SOL_SOCKET, SO_ATTACH_BPF, struct.pack("i", self.program_fd))
            except OSError as exc:
                raise SnapUnavailable(f"cannot attach the snap filter: {exc.strerror}") from None

    def counts(self) -> dict[str, int]:
        """Since the start: cut_packets, cut_bytes (bytes of packets not copied), full_flows (directions kept
        whole for good), waits (holes that may hold a frame header, waited for) and resumed (waits after which
        the framing was found again and the flow followed on)."""
        return {name: libbpf.percpu_total(self._lib, self.counts_fd, index) for index, name in enumerate(SNAP_COUNTERS)}

    def close(self) -> None:
        for fd in (self.program_fd, self.counts_fd):
            os.close(fd)
