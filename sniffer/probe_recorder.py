"""The daemon's side of the eBPF probes: having them loaded (by the root helper, sniffer/root_helper.py, while
packets are already captured), attaching uprobes to the libraries jobs load (sniffer/uprobes.py), writing their
events into the probe file, and the in-kernel payload cut."""
from __future__ import annotations

import ctypes
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dlcsniff.sniffer import libbpf, snap_filter
from dlcsniff.sniffer.capture_dir import now_ns
from dlcsniff.sniffer.elf_symbols import elf_symbols
from dlcsniff.sniffer.first_use import on_first_use
from dlcsniff.sniffer.options import CaptureOptions, bad_option, parse_ports
from dlcsniff.sniffer.root_helper import (MAX_FDS_PER_MESSAGE, HelperGone, Loaded, RootHelper, start_probes_helper,
                                          start_snap_helper)

# what only the probes need, loaded once packets are captured (sniffer/first_use.py)
events = on_first_use("dlcsniff.decoders.formats.probe_events")
ebpf = on_first_use("dlcsniff.sniffer.ebpf")
procnet = on_first_use("dlcsniff.sniffer.procnet")
uprobes = on_first_use("dlcsniff.sniffer.uprobes")

_KIND_TGID = struct.Struct("<H2xI")       # the head of every probe event: kind, tgid
# Looking into processes' libraries takes turns with the packets: at most this long per tick (one process at
# least), so that a namespace of many processes found when the probes attach never holds the capture up.
LIBRARY_WORK_PER_TICK_S = 0.01
_LIBC = ctypes.CDLL(None)


ATTACHING = "being loaded by the root helper"


@dataclass(slots=True)
class EbpfStatus:
    enabled: bool                             # the probes run
    reason: str | None = None                 # why not, when disabled (ATTACHING: not yet)
    notes: list[str] = field(default_factory=list)
    netns: int | None = None
    netns_filtered: bool = False
    attached_ns: int | None = None            # when they began to run (realtime)


@dataclass(frozen=True, slots=True)
class GivenLibrary:
    """A --lib file, opened at start: the daemon attaches its probes through the descriptor."""
    path: str
    fd: int


def given_libraries(options: CaptureOptions) -> list[GivenLibrary]:
    """The --lib files, checked and opened before anything starts (as root: they may lie where the daemon's user
    cannot look). Raises a bad option for a file that is neither libzmq nor libnccl."""
    given: list[GivenLibrary] = []
    try:
        for library in options.libraries:
            path = str(library.resolve())
            symbols = elf_symbols(path)
            found = uprobes.classify_library(symbols, options.zmq_events)
            if found is None or not found[1]:
                raise bad_option(f"--lib {path}: " + ("libzmq's calls are probed with --zmq-events sends or calls"
                                                     if uprobes.classify_library(symbols)
                                                     else "exports neither libzmq (>= 4.2) nor libnccl symbols"))
            given.append(GivenLibrary(path, os.open(path, os.O_RDONLY | os.O_CLOEXEC)))
    except BaseException:
        for library in given:
            os.close(library.fd)
        raise
    return given


class ProbeRecorder:
    """Has the root helper load the probes, receives their ring-buffer events, frames them into the probe file,
    and acts on what they reveal: new processes (a PROCESS record) and newly loaded shared objects (probes
    attached when they are libzmq or libnccl)."""

    def __init__(self, options: CaptureOptions, log: Callable[[str], None], libraries: list[GivenLibrary]) -> None:
        self._options = options
        self._log = log
        self._given = libraries
        self._buffer = bytearray()
        self._seen_tgids: set[int] = set()
        self._scan_processes = False                            # the processes there when the probes attached:
        self._pids_to_scan: list[int] = []                      # listed once, then looked into one by one
        self._paths_to_probe: dict[int, list[str]] = {}         # pid -> objects it loaded or maps, to look into
        self.status = EbpfStatus(False, "disabled by --no-ebpf")
        self.helper: RootHelper | None = None
        self.loader: uprobes.Loader | None = None
        self.ring: ebpf.RingReader | None = None         # events and lost counts
        self.probes: ebpf.LoadedProbes | None = None     # what the root helper loaded
        self.uprobes: uprobes.Uprobes | None = None      # the uprobes attached
        self.events = 0
        self.libraries: list[dict] = []

    # -- start: the helper loads, the daemon attaches
    def start(self, user, close_in_helper: tuple[int, ...]) -> None:
        """Fork the probes' root helper (before the daemon gives up root): it loads them once told to (`go`),
        and they arrive through `helper.poll()`. Without root or with --no-ebpf, says why once (status)."""
        if not self._options.ebpf:
            return
        if os.geteuid() != 0:
            self.status = EbpfStatus(False, "not root: eBPF probes are loaded as root")
            self._log(f"eBPF probes off ({self.status.reason}); capturing packets only")
            return
        self.status = EbpfStatus(False, ATTACHING)
        self.helper = start_probes_helper(user, close_in_helper)

    def go(self) -> None:
        """Tell the helper to load the probes, with this run's settings (once packets are being captured: finding
        the loader's hook reads ld.so's symbols)."""
        self.status.netns = ebpf.netns_inode()
        self.loader = uprobes.find_loader()
        if self.loader is None:
            self.status.notes.append("no glibc loader hook: only libraries loaded before the probes or given with "
                                     "--lib are probed")
        self.helper.go(ebpf.probe_settings(netns=self.status.netns, loader=self.loader),
                       tuple(uprobes.uprobe_programs(self._options.zmq_events, loader=self.loader is not None)))

    def attach(self, loaded: Loaded) -> bool:
        """The probes the helper loaded, or why not: read their ring, attach the loader's hook and --lib, record
        the sockets open when they attached and probe the libraries already loaded. Returns whether the probes
        run."""
        self.status.notes += loaded.notes
        if loaded.probes is None:
            return self._off(loaded.error)
        self.probes = loaded.probes
        try:
            self.ring = ebpf.RingReader(self.probes.events_fd, self.probes.lost_fd)
            self.uprobes = uprobes.Uprobes(self.probes.programs, self._options.zmq_events)
            if self.loader is not None:
                self.uprobes.attach_loader(self.loader)
            for given in self._given:
                attached = self.uprobes.attach_library(uprobes.descriptor_path(given.fd))
                self.note_library(None, given.path, uprobes.LibraryProbes(given.path, attached.library,
                                                                          attached.functions))
        except (ebpf.EbpfUnavailable, libbpf.BpfError) as exc:
            self.close_probes()
            return self._off(str(exc))
        finally:
            self._close_given()
        self.status.enabled, self.status.reason, self.status.netns_filtered = True, None, True
        self.status.attached_ns = now_ns()
        self.record_clock()
        self.record_open_sockets(loaded.open_sockets, loaded.open_sockets_mono_ns)
        self._scan_processes = True        # the libraries the processes there already loaded
        return True

    def _off(self, reason: str | None) -> bool:
        self.status = EbpfStatus(False, reason or "the root helper loaded no probes", self.status.notes,
                                 self.status.netns)
        self._close_given()
        self._log(f"eBPF probes off ({self.status.reason}); capturing packets only")
        return False

    def _close_given(self) -> None:
        for given in self._given:
            os.close(given.fd)
        self._given = []

    # -- events
    def consume(self) -> None:
        """Take every event waiting in the ring buffer: frame it into the probe file's buffer, and act on
        the few that reveal something (a library opened, a process not seen before). Runs for every
        event the probes emit, so it does as little as it can per event."""
        buffer, seen, frame_length = self._buffer, self._seen_tgids, events.RECORD_LEN.pack
        kind_tgid = _KIND_TGID.unpack_from
        lib_open, sock_state = int(events.Kind.LIB_OPEN), int(events.Kind.SOCK_STATE)
        count = 0
        for payload in self.ring.records():
            kind, tgid = kind_tgid(payload)
            if kind == lib_open:          # for discovery only: not recorded
                self._paths_to_probe.setdefault(tgid, []).append(events.parse_event(payload).path)
                continue
            buffer += frame_length(len(payload))
            buffer += payload
            count += 1
            # State changes often run in softirq, where the task is arbitrary.
            if tgid not in seen and kind != sock_state:
                self.note_process(tgid, events.HEAD.unpack_from(payload)[4])
        self.events += count

    def note_process(self, tgid: int, netns: int | None) -> None:
        if tgid and tgid not in self._seen_tgids:
            self._seen_tgids.add(tgid)
            self.record_process(tgid, netns)

    def record(self, kind: events.Kind, fields: dict, mono_ns: int | None = None) -> None:
        mono_ns = time.monotonic_ns() if mono_ns is None else mono_ns
        self._buffer += events.daemon_record(kind, {"mono_ns": mono_ns, **fields})

    def record_process(self, tgid: int, netns: int | None) -> None:
        info = procnet.process_info(tgid)
        if info is not None:
            self.record(events.Kind.PROCESS, {"tgid": tgid, "netns": netns, **info})

    def record_clock(self) -> None:
        # The pair read closest together of three: realtime bracketed by two monotonic reads.
        samples = []
        for _ in range(3):
            before = time.monotonic_ns()
            realtime = time.time_ns()
            after = time.monotonic_ns()
            samples.append((after - before, (before + after) // 2, realtime))
        _, mono_ns, realtime_ns = min(samples)
        self._buffer += events.daemon_record(events.Kind.CLOCK, {"mono_ns": mono_ns, "realtime_ns": realtime_ns})

    def record_open_sockets(self, owners: list[procnet.SocketOwner], mono_ns: int) -> None:
        """The namespace's TCP sockets as /proc showed them when the probes attached, with their owners."""
        for owner in owners:
            sock = owner.socket
            self.record(events.Kind.SOCKET_SNAPSHOT, {
                "family": sock.family, "local_ip": sock.local_ip, "local_port": sock.local_port,
                "remote_ip": sock.remote_ip, "remote_port": sock.remote_port, "state": sock.state,
                "inode": sock.inode, "tgid": owner.pid, "comm": owner.comm}, mono_ns)
            if owner.pid is not None:
                self.note_process(owner.pid, self.status.netns)

    # -- libraries
    def attach_pending_libraries(self) -> None:
        """Probe the libzmq/libnccl among the objects processes loaded (and, once, the processes there when the
        probes attached map), in turns of LIBRARY_WORK_PER_TICK_S."""
        if self.helper is None or not self.libraries_pending:
            return
        ours = os.getpid()
        try:
            if self._scan_processes:
                self._scan_processes = False
                self._pids_to_scan = self.helper.request(op="pids")[0]["pids"]
            self.uprobes.detach_exited()
            deadline = time.monotonic() + LIBRARY_WORK_PER_TICK_S
            while (self._paths_to_probe or self._pids_to_scan) and time.monotonic() < deadline:
                if not self._paths_to_probe:
                    self._scan(self._pids_to_scan.pop(0))
                    continue
                pid = next(iter(self._paths_to_probe))
                paths = self._paths_to_probe.pop(pid)
                if ours in (pid, procnet.parent_of(pid)):
                    continue                  # the daemon and its helpers
                try:
                    for attached in self.uprobes.probe_files(pid, paths, self._open_files):
                        self.note_library(pid, attached.path, attached)
                except libbpf.BpfError as exc:
                    self._log(f"cannot probe the libraries of pid {pid}: {exc}")
        except HelperGone as exc:
            self._helper_gone(exc)
            return
        if not self.libraries_pending:
            # Symbol tables of large libraries were read (libmxnet.so's: tens of MB) and are garbage: give the
            # memory back rather than keep it for the whole capture.
            _LIBC.malloc_trim(0)

    def _scan(self, pid: int) -> None:
        """The objects a process there when the probes attached maps, to look into: asked process by process (the
        list of a namespace of many processes, a node's, outgrows one message)."""
        reply, _ = self.helper.request(op="files", pids=[pid])
        for pid_text, files in reply["files"].items():
            paths = [item["path"] for item in files if not self.uprobes.known((item["device"], item["inode"]))]
            if paths:
                self._paths_to_probe.setdefault(int(pid_text), []).extend(paths)

    @property
    def libraries_pending(self) -> bool:
        """Whether objects processes loaded are still to be looked into (the loop then keeps its pace)."""
        return bool(self._paths_to_probe or self._scan_processes or self._pids_to_scan)

    def _open_files(self, pid: int, paths: list[str]) -> list[tuple[procnet.MappedFile, int]]:
        opened = []
        for start in range(0, len(paths), MAX_FDS_PER_MESSAGE):
            reply, fds = self.helper.request(op="open", pid=pid, paths=paths[start:start + MAX_FDS_PER_MESSAGE])
            opened += [(procnet.MappedFile(**item), fd) for item, fd in zip(reply["opened"], fds)]
        return opened

    def _helper_gone(self, exc: HelperGone) -> None:
        self._log(f"libraries loaded from now on are not probed: {exc}")
        self.close_helper()

    def close_helper(self) -> None:
        if self.helper is not None:
            self.helper.close()
            self.helper = None

    def note_library(self, tgid: int | None, path: str, attached: uprobes.LibraryProbes) -> None:
        entry = {"path": path, "library": attached.library, "functions": list(attached.functions), "tgid": tgid}
        self.libraries.append(entry)
        self.record(events.Kind.LIBRARY, entry)
        self._log(f"probing {attached.library} in {path}" + (f" (found in pid {tgid})" if tgid else ""))

    # -- stop
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
            self.probes = None

    def close(self) -> None:
        self.close_probes()
        self._close_given()
        self.close_helper()

    def take_buffer(self) -> bytes:
        data, self._buffer = bytes(self._buffer), bytearray()
        return data

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)


def snap_settings(options: CaptureOptions, link_header_bytes: int) -> dict[str, bytes]:
    return snap_filter.snap_settings(link_header_bytes=link_header_bytes,
                                     port_ranges=parse_ports(options.ports) if options.ports else ())


def print_bpf_program(options: CaptureOptions) -> str:
    """The objects and the settings `capture` would load here (nothing is mounted, built or loaded)."""
    return ebpf.program_listing(ebpf.probe_settings(netns=ebpf.netns_inode(), loader=uprobes.find_loader()),
                                snap_settings(options, 0))


class PayloadCut:
    """What the pcap files hold of each packet: everything ("full", with the reason), or what the ZMTP snap
    filter keeps ("zmtp-cut": probes/zmtp_snap.c, loaded by a root helper of its own, attached to the capture
    socket in place of libpcap's filter, `attached_ns` on). Packets captured before the filter was attached stay
    whole, and so do the flows that began before (the filter follows a flow from its SYN)."""

    LOADING = "the cut is being loaded by its root helper"

    def __init__(self, full_reason: str | None) -> None:
        self.reason = full_reason
        self.attached_ns: int | None = None
        self.helper: RootHelper | None = None
        self._settings: dict[str, bytes] = {}
        self._filter: snap_filter.SnapFilter | None = None

    @property
    def mode(self) -> str:
        return "full" if self._filter is None else "zmtp-cut"

    def load(self, options: CaptureOptions, link_header_bytes: int, close_in_helper: tuple[int, ...]) -> None:
        """Fork the cut's root helper (before the daemon gives up root), for a packet socket whose data starts
        `link_header_bytes` before the network header: it loads the filter once told to (`go`), and the filter
        arrives later, through `helper.poll()`."""
        self.helper = start_snap_helper(close_in_helper)
        self._settings = snap_settings(options, link_header_bytes)
        self.reason = self.LOADING

    def go(self) -> None:
        self.helper.go(self._settings)

    def start(self, loaded: Loaded, packet_socket_fd: int) -> None:
        """Attach the filter the helper loaded (or say why there is none)."""
        self.helper.close()
        self.helper = None
        if loaded.snap is None:
            self.reason = loaded.error
            return
        try:
            loaded.snap.attach(packet_socket_fd)
        except snap_filter.SnapUnavailable as exc:
            loaded.snap.close()
            self.reason = str(exc)
            return
        self._filter, self.reason, self.attached_ns = loaded.snap, None, now_ns()

    def status(self) -> dict:
        counts = self._filter.counts() if self._filter is not None else dict.fromkeys(snap_filter.SNAP_COUNTERS, 0)
        return {"mode": self.mode, "reason": self.reason, "attached_ns": self.attached_ns, **counts}

    def close(self) -> None:
        if self.helper is not None:
            self.helper.close()
        if self._filter is not None:
            self._filter.close()
