"""The daemon's side of the eBPF probes: starting them (the root helper of sniffer/ebpf.py loads them), attaching
uprobes to the libraries jobs load (sniffer/uprobes.py), writing their events into the probe file, and the
in-kernel payload cut."""
from __future__ import annotations

import ctypes
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dlcsniff.decoders.formats import probe_events as events
from dlcsniff.decoders.formats.probe_events import Kind
from dlcsniff.decoders.protocols import ZMTP_KEPT_BODIES
from dlcsniff.sniffer import ebpf, libbpf, procnet, snap_filter, uprobes
from dlcsniff.sniffer.options import CaptureOptions, bad_option, parse_ports

_KIND_TGID = struct.Struct("<H2xI")       # the head of every probe event: kind, tgid
_LIBC = ctypes.CDLL(None)


class ProbeRecorder:
    """Receives ring-buffer events, frames them into the probe file, and acts on what they reveal:
    new processes (a PROCESS record) and newly loaded shared objects (probes attached when they are
    libzmq or libnccl)."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self._log = log
        self._buffer = bytearray()
        self._seen_tgids: set[int] = set()
        self._pending_libraries: list[tuple[int, str]] = []
        self.ring: ebpf.RingReader | None = None         # events and lost counts
        self.probes: ebpf.LoadedProbes | None = None     # what the probe helper loaded
        self.uprobes: uprobes.Uprobes | None = None      # the uprobes attached
        self.events = 0
        self.libraries: list[dict] = []

    def consume(self) -> None:
        """Take every event waiting in the ring buffer: frame it into the probe file's buffer, and act on
        the few that reveal something (a library opened, a process not seen before). Runs for every
        event the probes emit, so it does as little as it can per event."""
        buffer, seen, frame_length = self._buffer, self._seen_tgids, events.RECORD_LEN.pack
        kind_tgid, lib_open, sock_state = _KIND_TGID.unpack_from, int(Kind.LIB_OPEN), int(Kind.SOCK_STATE)
        count = 0
        for payload in self.ring.records():
            kind, tgid = kind_tgid(payload)
            if kind == lib_open:          # for discovery only: not recorded
                self._library_opened(bytes(payload))
                continue
            buffer += frame_length(len(payload))
            buffer += payload
            count += 1
            # State changes often run in softirq, where the task is arbitrary.
            if tgid not in seen and kind != sock_state:
                self.note_process(tgid, events.HEAD.unpack_from(payload)[4])
        self.events += count

    def _library_opened(self, payload: bytes) -> None:
        opened = events.parse_event(payload)
        if opened.tgid != os.getpid():
            self._pending_libraries.append((opened.tgid, opened.path))

    def note_process(self, tgid: int, netns: int | None) -> None:
        if tgid and tgid not in self._seen_tgids:
            self._seen_tgids.add(tgid)
            self.record_process(tgid, netns)

    def record(self, kind: Kind, fields: dict) -> None:
        self._buffer += events.daemon_record(kind, {"mono_ns": time.monotonic_ns(), **fields})

    def record_process(self, tgid: int, netns: int | None) -> None:
        info = procnet.process_info(tgid)
        if info is not None:
            self.record(Kind.PROCESS, {"tgid": tgid, "netns": netns, **info})

    def record_clock(self) -> None:
        # The pair read closest together of three: realtime bracketed by two monotonic reads.
        samples = []
        for _ in range(3):
            before = time.monotonic_ns()
            realtime = time.time_ns()
            after = time.monotonic_ns()
            samples.append((after - before, (before + after) // 2, realtime))
        _, mono_ns, realtime_ns = min(samples)
        self._buffer += events.daemon_record(Kind.CLOCK, {"mono_ns": mono_ns, "realtime_ns": realtime_ns})

    def record_open_sockets(self, netns: int) -> None:
        for owner in procnet.socket_owners(netns):
            sock = owner.socket
            self.record(Kind.SOCKET_SNAPSHOT, {
                "family": sock.family, "local_ip": sock.local_ip, "local_port": sock.local_port,
                "remote_ip": sock.remote_ip, "remote_port": sock.remote_port, "state": sock.state,
                "inode": sock.inode, "tgid": owner.pid, "comm": owner.comm})
            if owner.pid is not None:
                self.note_process(owner.pid, netns)

    def queue_library(self, tgid: int, path: str) -> None:
        self._pending_libraries.append((tgid, path))

    def attach_pending_libraries(self) -> None:
        """Look for libzmq/libnccl symbols in the shared objects newly loaded, and attach their probes."""
        pending, self._pending_libraries = self._pending_libraries, []
        if pending:
            self.uprobes.detach_exited()
        for tgid, path in pending:
            try:
                attached = self.uprobes.probe_loaded(tgid, path)
            except libbpf.BpfError as exc:
                self._log(f"cannot probe {path}: {exc}")
                continue
            if attached is not None:
                self.note_library(tgid, path, attached)
        if pending:
            # Symbol tables of large libraries were read (libmxnet.so's: tens of MB) and are garbage: give the
            # memory back rather than keep it for the whole capture.
            _LIBC.malloc_trim(0)

    def note_library(self, tgid: int | None, path: str, attached: uprobes.LibraryProbes) -> None:
        entry = {"path": path, "library": attached.library, "functions": list(attached.functions), "tgid": tgid}
        self.libraries.append(entry)
        self.record(Kind.LIBRARY, entry)
        self._log(f"probing {attached.library} in {path}" + (f" (found in pid {tgid})" if tgid else ""))

    def close_probes(self) -> None:
        """Everything but the snap filter."""
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        if self.uprobes is not None:
            self.uprobes.close()
            self.uprobes = None
        if self.probes is not None:
            self.probes.close()

    def close(self) -> None:
        self.close_probes()
        if self.probes is not None and self.probes.snap is not None:
            self.probes.snap.close()
        self.probes = None

    def take_buffer(self) -> bytes:
        data, self._buffer = bytes(self._buffer), bytearray()
        return data

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)


@dataclass(slots=True)
class EbpfStatus:
    enabled: bool
    reason: str | None = None                 # why not, when disabled
    notes: list[str] = field(default_factory=list)
    netns: int | None = None
    netns_filtered: bool = False


def start_probes(options: CaptureOptions, recorder: ProbeRecorder, log: Callable[[str], None],
                 close_in_helper: tuple[int, ...], snap_link_header_bytes: int | None = None) -> EbpfStatus:
    """Have the probe helper compile and load the probes (it closes `close_in_helper`), read their ring buffer
    and attach the uprobes; on any failure but a bad --lib say why once and go on without probes. With
    `snap_link_header_bytes`, the helper also loads the ZMTP snap filter for a packet socket whose data starts
    that many bytes before the network header (recorder.probes.snap): it needs no kernel headers, and is
    loaded when the probes cannot be."""
    if not options.ebpf:
        return EbpfStatus(False, "disabled by --no-ebpf")
    if os.geteuid() != 0:
        status = EbpfStatus(False, "not root: eBPF probes are loaded as root")
        log(f"eBPF probes off ({status.reason}); capturing packets only")
        return status
    status = EbpfStatus(True, netns=ebpf.netns_inode())
    libraries = [str(library.resolve()) for library in options.libraries]
    try:
        try:
            status.notes += [note for note in (ebpf.ensure_tracefs(), ebpf.ensure_kernel_headers()) if note]
            cflags, loader = _probe_cflags(status)
        except ebpf.EbpfUnavailable as exc:
            cflags, loader, problem = None, None, str(exc)
        else:
            problem = None
        recorder.probes = ebpf.start_probe_helper(
            cflags, uprobes.uprobe_programs(options.zmq_events, loader=loader is not None), close_in_helper,
            snap_cflags=None if snap_link_header_bytes is None else snap_cflags(options, snap_link_header_bytes))
        if problem or recorder.probes.error:
            raise ebpf.EbpfUnavailable(problem or recorder.probes.error)
        recorder.ring = ebpf.RingReader(recorder.probes.events_fd, recorder.probes.lost_fd)
        recorder.uprobes = uprobes.Uprobes(recorder.probes.programs, options.zmq_events)
        if loader is not None:
            recorder.uprobes.attach_loader(loader)
        for path in libraries:
            attached = recorder.uprobes.attach_library(path)
            if attached is None:
                found = uprobes.classify_library(uprobes.elf_symbols(path))
                raise bad_option(f"--lib {path}: " + ("libzmq's calls are probed with --zmq-events sends or calls"
                                                     if found else "exports neither libzmq (>= 4.2) nor libnccl symbols"))
            recorder.uprobes.note_probed_everywhere(path)
            recorder.note_library(None, path, attached)
        # Jobs already running: the shared objects their processes map.
        for pid in procnet.pids_in_netns(status.netns):
            for path in procnet.mapped_shared_objects(pid):
                recorder.queue_library(pid, path)
    except (ebpf.EbpfUnavailable, libbpf.BpfError) as exc:
        recorder.close_probes()       # the snap filter may still cut: it needs no kernel headers
        status = EbpfStatus(False, str(exc), status.notes)
        log(f"eBPF probes off ({exc}); capturing packets only")
        return status
    except BaseException:
        recorder.close()
        raise
    for note in status.notes:
        log(note)
    return status


def _probe_cflags(status: EbpfStatus) -> tuple[list[str], uprobes.Loader | None]:
    offsets = ebpf.kernel_offsets()
    if not offsets:
        status.notes.append("no kernel BTF: events of every network namespace are recorded, with thread names")
    status.netns_filtered = bool(offsets)
    loader = uprobes.find_loader()
    if loader is None:
        status.notes.append("no glibc loader hook: only libraries loaded before the start or given with --lib are "
                            "probed")
    return ebpf.probe_cflags(netns=status.netns, offsets=offsets, loader=loader), loader


def snap_cflags(options: CaptureOptions, link_header_bytes: int) -> list[str]:
    return snap_filter.snap_cflags(link_header_bytes=link_header_bytes, kept_first_frames=ZMTP_KEPT_BODIES.first_frames,
                                   kept_body_max=ZMTP_KEPT_BODIES.max_body_bytes,
                                   port_ranges=parse_ports(options.ports) if options.ports else ())


def print_bpf_program(options: CaptureOptions) -> str:
    """The programs and flags `capture` would compile here (nothing is mounted, linked or loaded)."""
    cflags = ebpf.probe_cflags(netns=ebpf.netns_inode(), offsets=ebpf.kernel_offsets(), loader=uprobes.find_loader())
    return ebpf.program_listing(cflags, snap_cflags(options, 0))


class PayloadCut:
    """What the pcap files hold of each packet: everything ("full", with the reason), or what the ZMTP snap
    filter keeps ("zmtp-cut": probes/zmtp_snap.c, attached to the capture socket in place of libpcap's
    filter). Packets the socket queued before the filter was attached stay whole."""

    def __init__(self, full_reason: str | None) -> None:
        self.reason = full_reason
        self._filter: snap_filter.SnapFilter | None = None

    @property
    def mode(self) -> str:
        return "full" if self._filter is None else "zmtp-cut"

    def start(self, probes: ebpf.LoadedProbes | None, ebpf_status: EbpfStatus, packet_socket_fd: int) -> None:
        if probes is None or probes.snap is None:
            self.reason = (probes.snap_error if probes is not None else None) or f"eBPF off: {ebpf_status.reason}"
            return
        snap, probes.snap = probes.snap, None            # this object closes it from now on
        try:
            snap.attach(packet_socket_fd)
        except snap_filter.SnapUnavailable as exc:
            snap.close()
            self.reason = str(exc)
            return
        self._filter = snap

    def status(self) -> dict:
        counts = self._filter.counts() if self._filter is not None else dict.fromkeys(snap_filter.SNAP_COUNTERS, 0)
        return {"mode": self.mode, "reason": self.reason, **counts}

    def close(self) -> None:
        if self._filter is not None:
            self._filter.close()
