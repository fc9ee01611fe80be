"""The daemon's side of the eBPF probes: starting them (the root helper of sniffer/ebpf.py), writing their events
into the probe file, and the in-kernel payload cut."""
from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dlcsniff.decoders.formats import probe_events as events
from dlcsniff.decoders.formats.probe_events import Kind
from dlcsniff.sniffer import ebpf, procnet
from dlcsniff.sniffer.options import CaptureOptions, bad_option, parse_ports

_KIND_TGID = struct.Struct("<H2xI")       # the head of every probe event: kind, tgid


class ProbeRecorder:
    """Receives ring-buffer events, frames them into the probe file, and acts on what they reveal:
    new processes (a PROCESS record) and newly opened shared objects (probes attached when they are
    libzmq or libnccl)."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self._log = log
        self._buffer = bytearray()
        self._seen_tgids: set[int] = set()
        self._pending_libraries: list[tuple[int | None, str]] = []
        self.ring: ebpf.RingReader | None = None         # events and lost counts
        self.helper: ebpf.ProbeHelper | None = None      # the root child that compiled and attaches the probes
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
        if opened.tgid not in (os.getpid(), self.helper.pid):    # the helper reads libraries to inspect them
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

    def queue_library(self, tgid: int | None, path: str) -> None:
        self._pending_libraries.append((tgid, path))

    def attach_pending_libraries(self) -> None:
        """Have the helper look for libzmq/libnccl symbols in the shared objects newly opened, and attach."""
        pending, self._pending_libraries = self._pending_libraries, []
        for tgid, path in pending:
            try:
                attached = self.helper.attach(tgid, path)
            except ebpf.EbpfUnavailable as exc:
                self._log(f"cannot probe {path}: {exc}")
                continue
            if attached is not None:
                self.note_library(tgid, path, attached)

    def note_library(self, tgid: int | None, path: str, attached: ebpf.LibraryProbes) -> None:
        entry = {"path": path, "library": attached.library, "functions": list(attached.functions), "tgid": tgid}
        self.libraries.append(entry)
        self.record(Kind.LIBRARY, entry)
        self._log(f"probing {attached.library} in {path}" + (f" (found in pid {tgid})" if tgid else ""))

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        if self.helper is not None:
            self.helper.close()
            self.helper = None

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
    """Start the probe helper (which compiles and attaches the probes, and closes `close_in_helper`) and
    read its ring buffer; on any failure but a bad --lib say why once and go on without probes.
    With `snap_link_header_bytes`, the helper also loads the ZMTP snap filter for a packet socket whose
    data starts that many bytes before the network header (recorder.helper.snap)."""
    if not options.ebpf:
        return EbpfStatus(False, "disabled by --no-ebpf")
    if os.geteuid() != 0:
        status = EbpfStatus(False, "not root: eBPF probes need root (or CAP_BPF and CAP_PERFMON)")
        log(f"eBPF probes off ({status.reason}); capturing packets only")
        return status
    status = EbpfStatus(True, netns=ebpf.netns_inode())
    try:
        status.notes += [note for note in (ebpf.ensure_tracefs(), ebpf.ensure_kernel_headers()) if note]
        offsets = ebpf.kernel_offsets()
        if not offsets:
            status.notes.append("no kernel BTF: events of every network namespace are recorded, with thread names")
        status.netns_filtered = bool(offsets)
        snap = snap_link_header_bytes is not None
        cflags = ebpf.probe_cflags(
            netns=status.netns, offsets=offsets, link_header_bytes=snap_link_header_bytes or 0,
            port_ranges=parse_ports(options.ports) if snap and options.ports else ())
        libraries = [str(library.resolve()) for library in options.libraries]
        recorder.helper = ebpf.ProbeHelper(cflags, libraries, close_in_child=close_in_helper, snap=snap)
        recorder.ring = ebpf.RingReader(recorder.helper.events_fd, recorder.helper.lost_fd)
        for path, attached in zip(libraries, recorder.helper.libraries):
            recorder.note_library(None, path, attached)
        # Jobs already running: the shared objects their processes map.
        for pid in procnet.pids_in_netns(status.netns):
            for path in procnet.mapped_shared_objects(pid):
                recorder.queue_library(pid, path)
    except ebpf.BadLibrary as exc:
        recorder.close()
        raise bad_option(str(exc)) from None
    except ebpf.EbpfUnavailable as exc:
        recorder.close()
        status = EbpfStatus(False, str(exc), status.notes)
        log(f"eBPF probes off ({exc}); capturing packets only")
        return status
    for note in status.notes:
        log(note)
    return status


def print_bpf_program() -> str:
    """The program and flags `capture` would compile here (nothing is mounted, linked or loaded)."""
    cflags = ebpf.probe_cflags(netns=ebpf.netns_inode(), offsets=ebpf.kernel_offsets())
    return ebpf.program_listing(cflags)


class PayloadCut:
    """What the pcap files hold of each packet: everything ("full", with the reason), or what the ZMTP snap
    filter keeps ("zmtp-cut": probes/zmtp_snap.c, attached to the capture socket in place of libpcap's
    filter). Packets the socket queued before the filter was attached stay whole."""

    def __init__(self, full_reason: str | None) -> None:
        self.reason = full_reason
        self._filter: ebpf.SnapFilter | None = None

    @property
    def mode(self) -> str:
        return "full" if self._filter is None else "zmtp-cut"

    def start(self, helper: ebpf.ProbeHelper | None, ebpf_status: EbpfStatus, packet_socket_fd: int) -> None:
        if helper is None or helper.snap is None:
            self.reason = (helper.snap_error if helper is not None else None) or f"eBPF off: {ebpf_status.reason}"
            return
        try:
            helper.snap.attach(packet_socket_fd)
        except ebpf.EbpfUnavailable as exc:
            helper.snap.close()
            self.reason = str(exc)
            return
        self._filter = helper.snap

    def status(self) -> dict:
        counts = self._filter.counts() if self._filter is not None else dict.fromkeys(ebpf.SNAP_COUNTERS, 0)
        return {"mode": self.mode, "reason": self.reason, **counts}

    def close(self) -> None:
        if self._filter is not None:
            self._filter.close()
