"""The capture daemon behind `dlcsniff capture`: packets with libpcap, probe events with eBPF, beside an
unmodified job, into one directory per node.

    dlcsniff capture --iface eth0 --out /var/lib/dlcsniff/run1 --ports 9000-9200 --max-disk 20GB

The directory (0700, files 0600: captures hold model weights) receives, per run ("file set" N):
- capture-NNNN-FFFFF.pcap  packets (pcap, ns timestamps), rotated every --rotate-size;
- probes-NNNN.events       probe events (decoders/formats/probe_events.py describes the format);
- capture.json             every run and every file, with per file `packets` and `dropped`.
A restart adds the next set and leaves the old files alone.

Payload: by default each packet is cut in the kernel by the ZMTP snap filter (probes/zmtp_snap.c, an eBPF
socket filter the root helper loads beside the probes, sniffer/snap_filter.py, and the daemon attaches to its
libpcap socket in place of libpcap's filter): TCP/IP headers, ZMTP greetings, frame headers, each message's
first two frames and small bodies are kept, the values of other data frames over 64 KiB are not (their wire
lengths are). Reordered and lost segments do not stop it: it waits for a hole, stores what comes past it, and
finds the framing again when the hole fills. --ports is then applied by the same filter. --full-payload,
--filter (a pcap expression stays libpcap's filter: a socket has one), --snaplen, --no-ebpf or a failed load
mean whole packets; capture.json run["payload"] says which, why, since when the cut ran, and what was cut
(counts refreshed with the status). The README says what the cut saves and costs (`make bench`).

Packets: libpcap, driven in-process through ctypes, each batch written by libpcap's own pcap_dump
(C, no Python per packet), as tcpdump writes. Both are libpcap writing through stdio; the loop wakes on a
clock, not per ring block (a wake per block cost 25 % more per packet, and dropped packets at 2 Gb/s). What
decided for the in-process binding is what tcpdump cannot give: exact per-file `dropped` (pcap_stats at
every rotation; tcpdump reports drops once, at exit), a disk budget that is exact (a batch is limited to the
packets that fit; tcpdump -C rotates only after a file went over), and one process whose privileges are
dropped once the capture is open.

Order of start (everything that can fail on a bad option fails before anything is created):
options → interface → --lib files checked and opened → libpcap open + filter compile (root) → the two root
helpers forked (sniffer/root_helper.py) → directory created → root given up for good (user tcpdump, no_new_privs,
the directory used through a descriptor; START_CAPABILITIES kept) → first file opened, "capturing on", READY=1 to
systemd → the helpers told to load → what only the probes need loaded (sniffer/first_use.py: nothing of it before
"capturing on") → the last capabilities given up (no capability, an empty bounding set) → loop. Packets are
captured from "capturing on" on, whatever the probes do: the helpers load the cut and the probes meanwhile (objects
built once, no compiler: sniffer/bpf_objects.py) and hand them over, the probes with the sockets already open; the
loop attaches the cut to its socket, reads the probes' ring, attaches their uprobes, and has the probes' helper
open the libraries the processes there have loaded (probes/*.c see what happens after they attached). Stop:
SIGINT/SIGTERM/SIGHUP, --duration, a full disk or the disk budget; the kernel ring is drained, all files
flushed and capture.json written within a second or two.
"""
from __future__ import annotations

import errno
import os
import pwd
import select
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dlcsniff.decoders.formats.capture_dir import CAPTURE_JSON, PCAP_NAME, PROBES_NAME
from dlcsniff.sniffer.capture_dir import CaptureDirectory, DiskBudget, FileEntry, directory_usage, now_ns
from dlcsniff.sniffer.first_use import load_deferred, on_first_use
from dlcsniff.sniffer.libpcap import (PCAP_FILE_HEADER_BYTES, PCAP_RECORD_HEADER_BYTES, PCAP_TIMEOUT_MS, LivePcap,
                                      PcapFile, write_error)
from dlcsniff.sniffer.options import (EXIT_OK, LINK_HEADER_BYTES, MAX_SNAPLEN, MB, MIB, CaptureOptions, DaemonError,
                                      bad_option, capture_filter, check_options, full_payload_reason, resolve_user)
from dlcsniff.sniffer.privileges import CAP_DAC_READ_SEARCH, CAP_SETPCAP, drop_kept, drop_privileges
from dlcsniff.sniffer.probe_recorder import ATTACHING, PayloadCut, ProbeRecorder, given_libraries
from dlcsniff.sniffer.root_helper import HelperGone, Loaded

events = on_first_use("dlcsniff.decoders.formats.probe_events")      # once the probes attach

# While packets come, the loop wakes on a clock, not on each ring block the kernel retires: a wake costs some
# Python (~50 us), a block holds only a few hundred packets, and waking per block cost 25% more CPU per packet
# than tcpdump. The clock follows what the ring receives: SLOW_TICK_S while the bytes captured since the last
# tick come slowly enough to fill less than SLOW_TICK_RING_SHARE of the ring in one (10 wakes a second while a
# job trains: its bytes, cut in the kernel, come at a few MB/s), TICK_S faster (in a TICK_S tick the 64 MiB ring
# fills only above ~25 Gb/s). After a tick that found nothing it waits for the next ring block (or a root
# helper's message), IDLE_WAIT_S at most: an idle daemon costs next to nothing.
TICK_S = 0.02
SLOW_TICK_S = 0.1
SLOW_TICK_RING_SHARE = 1 / 16
IDLE_WAIT_S = 0.2
FLUSH_INTERVAL_S = 0.5             # stdio and probe buffers reach the file at least this often
STATUS_INTERVAL_S = 5.0            # capture.json rewritten with fresh counts
CLOCK_INTERVAL_S = 10.0            # monotonic/realtime pair written to the probe file
STOP_DRAIN_S = 1.0                 # at stop: time allowed to drain the kernel ring into the file
PROBE_BUFFER_BYTES = 1 << 20
# Kept from the drop of root until the modules deferred past "capturing on" are loaded (sniffer/first_use.py; this
# Python's files may lie where the daemon's user cannot look), then given up before anything is read from the
# network or the probes.
START_CAPABILITIES = (CAP_DAC_READ_SEARCH, CAP_SETPCAP)


def _notify_systemd(state: bytes) -> None:
    """sd_notify(3) without libsystemd: one datagram to $NOTIFY_SOCKET (a path, or '@' for an abstract name)."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as notify:
        try:
            notify.sendto(state, address)
        except OSError:
            pass


# -- the daemon --------------------------------------------------------------------------------------------

@dataclass(slots=True)
class CaptureResult:
    directory: Path
    set: int
    stop_reason: str
    exit_code: int
    packets: int
    dropped: int
    probe_events: int
    files: list[str]


class _Stop(Exception):
    """Why the loop ended; `drain`: whether what the kernel still holds may be written (not when the
    disk or the budget is what stopped it)."""

    def __init__(self, reason: str, exit_code: int = EXIT_OK, *, drain: bool = True) -> None:
        super().__init__(reason)
        self.exit_code = exit_code
        self.drain = drain


def _budget_used_up(max_disk_bytes: int | None) -> _Stop:
    return _Stop(f"disk budget of {(max_disk_bytes or 0) / MB:g} MB used up", drain=False)


class Daemon:
    def __init__(self, options: CaptureOptions, log: Callable[[str], None]) -> None:
        self.options = options
        self.log = log
        self._stop_signal: int | None = None
        self.dropped = False            # root given up (but START_CAPABILITIES)

    # the parts of start that may fail on bad options come first, and create nothing
    def run(self) -> CaptureResult:
        options = self.options
        check_options(options)
        user = resolve_user(options.user)
        directory = CaptureDirectory(options.out_dir)
        filter_text = capture_filter(options.filter, options.ports)
        budget = self._budget(directory)
        recorder = ProbeRecorder(options, self.log, given_libraries(options))
        payload = PayloadCut(None)
        self.pcap = None
        try:
            self.pcap = LivePcap(options.interface, snaplen=options.snaplen, buffer_bytes=options.buffer_bytes,
                                 filter_text=filter_text)
            payload.reason = full_payload_reason(options, self.pcap.linktype)
            # The root helpers load the probes and the cut while the capture runs (sniffer/root_helper.py).
            recorder.start(user, close_in_helper=(self.pcap.fd,))
            if payload.reason is None and recorder.helper is None:
                payload.reason = f"eBPF off: {recorder.status.reason}"
            elif payload.reason is None:
                payload.load(options, LINK_HEADER_BYTES[self.pcap.linktype], close_in_helper=(self.pcap.fd,))
            directory.create(user)
            # From here on nothing needs a privilege: the helpers do what does.
            self.dropped = drop_privileges(user, keep=START_CAPABILITIES)
            os.umask(0o077)
            # Batch scheduling: the daemon's work is throughput, not latency (the kernel ring holds the
            # packets), so its wakeups must not preempt the job it watches.
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
            return self._loop(directory, budget, recorder, payload, filter_text, user)
        finally:
            payload.close()
            if self.pcap is not None:
                self.pcap.close()
            directory.close()
            recorder.close()

    def _budget(self, directory: CaptureDirectory) -> DiskBudget:
        """The disk budget, with what DIR already holds counted; refused when a new set cannot fit."""
        options = self.options
        existing = directory.path if directory.path.exists() else next(
            parent for parent in directory.path.resolve().parents if parent.exists())
        block_bytes = os.statvfs(existing).f_bsize
        used = directory_usage(directory.path, block_bytes) if directory.path.exists() else 0
        if options.max_disk_bytes is None:
            return DiskBudget(None, block_bytes, used)
        max_disk = options.max_disk_bytes
        budget = DiskBudget(max_disk, block_bytes, used)
        json_reserve = directory.json_reserve_bytes(max_disk // options.rotate_bytes + 2)
        first_record = PCAP_FILE_HEADER_BYTES + PCAP_RECORD_HEADER_BYTES + (options.snaplen or MAX_SNAPLEN)
        if budget.room(CAPTURE_JSON) < budget.blocks(json_reserve) + budget.blocks(first_record):
            raise bad_option(f"--max-disk {max_disk / MB:g} MB: {directory.path} already uses "
                              f"{used / MB:.1f} MB of it, no room for a new file set")
        budget.reserve(CAPTURE_JSON, json_reserve)
        return budget

    def _handle_signal(self, signum: int, _frame) -> None:
        self._stop_signal = signum

    def _loop(self, directory: CaptureDirectory, budget: DiskBudget, recorder: ProbeRecorder, payload: PayloadCut,
              filter_text: str | None, user: pwd.struct_passwd) -> CaptureResult:
        options = self.options
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, self._handle_signal)
        start_ns = now_ns()
        directory.begin_run({
            "start_ns": start_ns, "interface": options.interface, "filter": filter_text, "snaplen": options.snaplen,
            "rotate_bytes": options.rotate_bytes, "max_disk_bytes": options.max_disk_bytes,
            "duration_s": options.duration_s, "buffer_bytes": options.buffer_bytes,
            # the keys of the --*-mb options, kept for readers of earlier records
            "rotate_mb": options.rotate_bytes / MB, "buffer_mb": options.buffer_bytes / MIB,
            "max_disk_mb": None if options.max_disk_bytes is None else options.max_disk_bytes / MB, "linktype": self.pcap.linktype, "libpcap": self.pcap.version,
            "user": user.pw_name, "pid": os.getpid(), "hostname": socket.gethostname(), "kernel": os.uname().release,
            "ebpf": {}, "payload": payload.status(),
        })
        state = _RunState(self, directory, budget, recorder, payload)
        try:
            state.open_pcap_file()
            state.save_status()
            self.log(f"capturing on {options.interface} into {directory.path} (set {directory.set})"
                     + (", eBPF probes loading" if recorder.helper else ", packets only"))
            if payload.helper is None:
                self.log(f"payload: {payload.mode} ({payload.reason})")
            _notify_systemd(b"READY=1\nSTATUS=" + state.summary().encode())
            for loading in (payload, recorder):
                if loading.helper is not None:
                    loading.go()
            load_deferred()
            if self.dropped:
                drop_kept(START_CAPABILITIES)
            stop = state.loop(start_ns)
        except _Stop as stopped:
            stop = stopped
        except DaemonError as exc:
            stop = _Stop(str(exc), exc.exit_code, drain=False)
        _notify_systemd(b"STOPPING=1")
        state.finish(stop)
        self.log(f"stopped: {stop} — {state.packets:,} packets ({state.pcap_dropped:,} dropped by the kernel)"
                 + (f", {recorder.events:,} probe events" if recorder.status.enabled else "")
                 + f" in {len(directory.files)} files")
        return CaptureResult(directory.path, directory.set, str(stop), stop.exit_code, state.packets,
                             state.pcap_dropped, recorder.events, [entry.name for entry in directory.files])


class _RunState:
    """The files of one run and the loop that fills them."""

    def __init__(self, daemon: Daemon, directory: CaptureDirectory, budget: DiskBudget, recorder: ProbeRecorder,
                 payload: PayloadCut) -> None:
        self.daemon = daemon
        self.pcap = daemon.pcap
        self.options = daemon.options
        self.directory = directory
        self.budget = budget
        self.recorder = recorder
        self.payload = payload
        self.loading = [helper for helper in (recorder.helper, payload.helper) if helper is not None]
        self.pcap_file: PcapFile | None = None
        self.pcap_entry: FileEntry | None = None
        self.pcap_index = 0
        self.probe_fd: int | None = None
        self.probe_entry: FileEntry | None = None
        self.probe_size = 0
        self.packets = 0
        self.captured_bytes = 0            # written into the pcap files (record headers included)
        self.pcap_dropped = 0
        self._dropped_at_file_start = 0
        self.rotate_bytes = self.options.rotate_bytes

    # -- files
    def open_pcap_file(self) -> None:
        name = PCAP_NAME.format(set=self.directory.set, index=self.pcap_index)
        if not self.budget.reserve(name, PCAP_FILE_HEADER_BYTES + self.pcap.max_record_bytes):
            raise _budget_used_up(self.options.max_disk_bytes)
        self.pcap_file = self.pcap.open_file(self.directory.path / name, self.directory.create_file(name))
        self.pcap_entry = self.directory.add_file("packets", name)
        self.pcap_entry.packets = 0
        self._dropped_at_file_start = self.pcap.dropped()
        self.pcap_index += 1

    def close_pcap_file(self) -> None:
        file, entry = self.pcap_file, self.pcap_entry
        if file is None:
            return
        self.pcap_file = None
        dropped_total = self.pcap.dropped()
        entry.dropped = dropped_total - self._dropped_at_file_start
        self.pcap_dropped += entry.dropped
        entry.packets = file.packets
        entry.closed_ns = now_ns()
        entry.bytes = file.size()
        try:
            file.close()
        finally:
            self.budget.settle(entry.name, entry.bytes)

    def open_probe_file(self) -> None:
        name = PROBES_NAME.format(set=self.directory.set)
        header = events.file_header({
            "format": 1, "set": self.directory.set, "hostname": socket.gethostname(), "kernel": os.uname().release,
            "netns": self.recorder.status.netns, "netns_filtered": self.recorder.status.netns_filtered,
            "created_ns": now_ns()})
        if not self.budget.reserve(name, len(header)):
            raise _budget_used_up(self.options.max_disk_bytes)
        self.probe_fd = self.directory.create_file(name)
        self.probe_entry = self.directory.add_file("probes", name)
        self.probe_entry.events = 0
        self._write_probes(header)

    def _write_probes(self, data: bytes) -> None:
        if not data:
            return
        name = self.probe_entry.name
        if not self.budget.reserve(name, self.probe_size + len(data)):
            raise _budget_used_up(self.options.max_disk_bytes)
        view = memoryview(data)
        while view:
            try:
                written = os.write(self.probe_fd, view)
            except OSError as exc:
                raise write_error(self.directory.path / name, exc.errno or errno.EIO) from None
            view = view[written:]
            self.probe_size += written
        self.probe_entry.bytes = self.probe_size

    def flush_probes(self) -> None:
        if self.probe_fd is None:
            return
        self._write_probes(self.recorder.take_buffer())
        self.probe_entry.events = self.recorder.events

    def close_probe_file(self) -> None:
        if self.probe_fd is None:
            return
        try:
            self.flush_probes()
        finally:
            fd, self.probe_fd = self.probe_fd, None
            os.fdatasync(fd)
            os.close(fd)
            self.probe_entry.closed_ns = now_ns()
            self.budget.settle(self.probe_entry.name, self.probe_size)

    # -- packets
    def capture_packets(self) -> None:
        """Move what the kernel holds into the file, rotating at --rotate-size and never past the budget."""
        max_record = self.pcap.max_record_bytes
        while True:
            file = self.pcap_file
            size = file.size()
            max_packets = (self.rotate_bytes - size) // max_record
            budget_room = self.budget.room(file.name)
            if budget_room is not None:
                # Whole filesystem blocks: the file may not grow past the last block it can have.
                budget_packets = (budget_room - size) // max_record
                if budget_packets <= 0:
                    raise _budget_used_up(self.options.max_disk_bytes)
                max_packets = min(max_packets, budget_packets)
            if max_packets <= 0:
                self.rotate()
                continue
            self.budget.reserve(file.name, size + max_packets * max_record)
            count = self.pcap.dispatch(file, max_packets)
            file.packets += count
            self.packets += count
            self.captured_bytes += file.size() - size
            self.budget.settle(file.name, file.size())
            if count < max_packets:
                return

    def drain_packets(self) -> None:
        """Take what the kernel still holds. The last ring block is handed over only when it fills or its
        timeout expires, so wait until a block timeout passed without a packet (or STOP_DRAIN_S)."""
        now = time.monotonic()
        give_up, quiet_until = now + STOP_DRAIN_S, now + 2 * PCAP_TIMEOUT_MS / 1000
        while (now := time.monotonic()) < min(give_up, quiet_until):
            select.select([self.pcap.fd], [], [], min(give_up, quiet_until) - now)
            before = self.packets
            self.capture_packets()
            if self.packets != before:
                quiet_until = time.monotonic() + 2 * PCAP_TIMEOUT_MS / 1000

    def rotate(self) -> None:
        self.close_pcap_file()
        self.open_pcap_file()
        self.save_status()

    # -- probes
    def take_loaded(self) -> None:
        """What the root helpers loaded since the last tick: the cut (attached to the capture socket) and the
        probes (their file opened, their events read from now on)."""
        log = self.daemon.log
        for helper in list(self.loading):
            try:
                loaded = helper.poll()
            except HelperGone as exc:
                loaded = Loaded(helper.what, error=str(exc))
            if loaded is None:
                continue
            self.loading.remove(helper)
            for note in loaded.notes:
                log(note)
            if loaded.what == "snap":
                self.payload.start(loaded, self.pcap.fd)
                log(f"payload: {self.payload.mode} ({self._since_start()})"
                    + (f" ({self.payload.reason})" if self.payload.reason else ""))
            elif self.recorder.attach(loaded):
                self.open_probe_file()
                log(f"eBPF probes attached ({self._since_start()})")
            else:
                self.recorder.close_helper()      # it loaded no probes: nothing to ask it
            self.save_status()
            _notify_systemd(b"STATUS=" + self.summary().encode())

    def _since_start(self) -> str:
        return f"{(now_ns() - self.directory.run['start_ns']) / 1e9:.2f} s after the start"

    def summary(self) -> str:
        """One line for systemd's status: what runs."""
        status = self.recorder.status
        probes = ("probes on" if status.enabled else "probes loading" if status.reason == ATTACHING
                  else f"probes off: {status.reason}" if self.options.ebpf else "no probes")
        return f"capturing on {self.options.interface}, {probes}, payload {self.payload.mode}"

    def capture_probes(self) -> None:
        if self.loading:
            self.take_loaded()
        if self.recorder.ring is None:
            return
        self.recorder.consume()
        self.recorder.attach_pending_libraries()
        if self.recorder.buffered_bytes >= PROBE_BUFFER_BYTES:
            self.flush_probes()

    def save_status(self) -> None:
        if self.pcap_entry is not None and self.pcap_file is not None:
            self.pcap_entry.packets = self.pcap_file.packets
            self.pcap_entry.bytes = self.pcap_file.size()
            self.pcap_entry.dropped = self.pcap.dropped() - self._dropped_at_file_start
        status = self.recorder.status
        run_ebpf = self.directory.run["ebpf"]
        run_ebpf.update(enabled=status.enabled, reason=status.reason, notes=status.notes, netns=status.netns,
                        netns_filtered=status.netns_filtered, attached_ns=status.attached_ns,
                        libraries=self.recorder.libraries, lost=run_ebpf.get("lost", {}))
        if self.probe_entry is not None and self.recorder.ring is not None:
            lost = self.recorder.ring.lost_counts()
            run_ebpf["lost"] = lost
            self.probe_entry.dropped = sum(lost.values())
        self.directory.run["payload"] = self.payload.status()
        self.directory.save()

    def loop(self, start_ns: int) -> _Stop:
        daemon, options = self.daemon, self.options
        deadline = time.monotonic() + options.duration_s if options.duration_s is not None else None
        next_flush = next_status = time.monotonic()
        next_clock = time.monotonic() + CLOCK_INTERVAL_S
        slow_rate = self.options.buffer_bytes * SLOW_TICK_RING_SHARE / SLOW_TICK_S      # bytes a second
        wait, woken = TICK_S, time.monotonic()
        while True:
            if daemon._stop_signal is not None:
                return _Stop(f"signal {signal.Signals(daemon._stop_signal).name}")
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return _Stop(f"--duration {options.duration_s:g} s reached")
            timeout = wait if deadline is None else max(0.0, min(wait, deadline - now))
            if wait == IDLE_WAIT_S:
                select.select([self.pcap.fd, *self.loading], [], [], timeout)
            else:
                time.sleep(timeout)
            packets, events, captured_bytes = self.packets, self.recorder.events, self.captured_bytes
            self.capture_packets()
            self.capture_probes()
            now = time.monotonic()
            rate = (self.captured_bytes - captured_bytes) / max(now - woken, TICK_S)
            woken = now
            if (self.packets, self.recorder.events) == (packets, events) and not self.recorder.libraries_pending:
                wait = IDLE_WAIT_S
            else:      # (after an idle wait, one short tick first: the rate is not known yet)
                wait = TICK_S if wait == IDLE_WAIT_S or rate > slow_rate or self.recorder.libraries_pending \
                    else SLOW_TICK_S
            if now >= next_flush:
                self.pcap_file.flush()
                self.flush_probes()
                next_flush = now + FLUSH_INTERVAL_S
            if self.recorder.ring is not None and now >= next_clock:
                self.recorder.record_clock()
                next_clock = now + CLOCK_INTERVAL_S
            if now >= next_status:
                self.save_status()
                next_status = now + STATUS_INTERVAL_S

    def finish(self, stop: _Stop) -> None:
        """Drain, flush and close everything, then the final capture.json. Errors here (a full disk)
        are reported but never prevent the remaining files from being closed."""
        problems = []
        if self.recorder.status.reason == ATTACHING:
            self.recorder.status.reason = "the capture stopped before they were loaded"
            self.daemon.log(f"eBPF probes off ({self.recorder.status.reason})")
        if self.payload.reason == PayloadCut.LOADING:
            self.payload.reason = "the capture stopped before it was loaded"
            self.daemon.log(f"payload: {self.payload.mode} ({self.payload.reason})")
        if self.pcap_file is not None and stop.drain:
            try:
                self.drain_packets()
            except (_Stop, DaemonError) as exc:
                problems.append(str(exc))
        if self.recorder.ring is not None:
            try:
                self.recorder.consume()
                self.recorder.record_clock()
            except Exception as exc:   # noqa: BLE001 - keep closing files whatever the probes do
                problems.append(f"probes: {exc}")
        for close in (self.close_pcap_file, self.close_probe_file):
            try:
                close()
            except (_Stop, DaemonError, OSError) as exc:
                problems.append(str(exc))
        run = self.directory.run
        run["stop_ns"] = now_ns()
        run["stop_reason"] = "; ".join([str(stop), *problems])
        try:
            self.save_status()
        except DaemonError as exc:
            problems.append(str(exc))
        for problem in problems:
            self.daemon.log(f"while stopping: {problem}")


def run_capture(options: CaptureOptions, *, log: Callable[[str], None] | None = None) -> CaptureResult:
    """Capture until a signal, --duration, a full disk or the budget. Raises DaemonError when the capture
    cannot start (exit_code EXIT_BAD_OPTIONS for bad options); stops during the run are in the result."""
    def log_to_stderr(message: str) -> None:
        print(f"dlcsniff capture: {message}", file=sys.stderr, flush=True)

    return Daemon(options, log or log_to_stderr).run()
