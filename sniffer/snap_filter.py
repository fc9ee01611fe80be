"""The in-kernel ZMTP cut (probes/zmtp_snap.c): an object built once (sniffer/bpf_objects.py), loaded through
libbpf with the run's choices set (root, in the root helper), attached by the daemon to its own packet socket.

It walks the ZMTP framing one frame per bpf_loop() step, a callback handed to a helper, which libbpf links; the
run's choices (the link header, --ports) are read-only data set before the load, so the verifier knows them as
constants, as it knew the -D flags the filter was once compiled with at every start.
"""
from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterable

from dlcsniff.sniffer import libbpf

SNAP_FUNCTION = "zmtp_snap"
# snap_counts in probes/zmtp_snap.c, in order: what was cut, and how holes in flows were waited for
SNAP_COUNTERS = ("cut_packets", "cut_bytes", "full_flows", "waits", "resumed")
SO_ATTACH_BPF = 50
_U32 = struct.Struct("<I")


class SnapUnavailable(RuntimeError):
    """The cut cannot run here (no object, no libbpf, a verifier refusal): the reason."""


def snap_settings(*, link_header_bytes: int, port_ranges: Iterable[tuple[int, int]] = ()) -> dict[str, bytes]:
    """The filter's read-only data for a socket whose data starts `link_header_bytes` before the network header,
    capturing only TCP on `port_ranges` when there are any (--ports): the header comment of probes/zmtp_snap.c."""
    wanted = bytearray(65536 // 8)
    ranges = list(port_ranges)
    for low, high in ranges:
        for port in range(low, high + 1):
            wanted[port >> 3] |= 1 << (port & 7)
    return {"snap_link_header_len": _U32.pack(link_header_bytes), "snap_ports_filtered": _U32.pack(bool(ranges)),
            "snap_ports_wanted": bytes(wanted)}


def load_snap_filter(elf: bytes, settings: dict[str, bytes]) -> tuple[int, int]:
    """Load the filter's object with these settings (root): its program and counters descriptors, the caller's to
    close."""
    try:
        programs, maps = libbpf.load_object(elf, [SNAP_FUNCTION], ["snap_counts"], settings=settings)
    except libbpf.BpfError as exc:
        raise SnapUnavailable(f"the snap filter did not load: {exc}") from None
    return programs[SNAP_FUNCTION], maps["snap_counts"]


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
