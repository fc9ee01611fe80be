"""The eBPF probes: their object (probes/probes.c, built once: sniffer/bpf_objects.py) loaded through libbpf with
this run's settings, their tracepoint attached, and their ring buffer read. Loading needs root: the daemon's root
helper (sniffer/root_helper.py) loads them and hands every descriptor over; the daemon reads the ring buffer and
attaches uprobes itself (sniffer/uprobes.py), without a privilege.

What the probes need from the machine, and what is done when it is missing:
- BTF (/sys/kernel/btf/vmlinux): libbpf relocates the probes' reads of kernel structures against it (CO-RE).
  Without it the probes cannot load; the daemon says so and captures packets (the cut needs no kernel types).
- tracefs (the tracepoint's id): mounted on /sys/kernel/tracing when no tracefs is there (`ip netns exec`
  gives each command a fresh /sys without it).
- no kprobes here: attribution uses a tracepoint (see probes/sock.c), libraries use uprobes.
No kernel headers, no compiler: the object was built by `make setup`.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dlcsniff.decoders.formats.probe_events import RINGBUF_KIND_COUNT, Kind
from dlcsniff.sniffer import bpf_objects, libbpf
from dlcsniff.sniffer.uprobes import Loader

BTF_PATH = Path("/sys/kernel/btf/vmlinux")
TRACEFS_MOUNTS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
# program -> (tracepoint group, name), in probes/sock.c
TRACEPOINTS = {"sock_state": ("sock", "inet_sock_set_state")}
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}
_PERF_TYPE_TRACEPOINT = 2
_PERF_ATTR = struct.Struct("<IIQQQQQI")    # type, size, config, sample_period, sample_type, read_format, flags, wakeup
_PERF_ATTR_BYTES = 112                     # PERF_ATTR_SIZE_VER5
_PERF_FLAG_FD_CLOEXEC = 8
_PERF_EVENT_IOC_ENABLE = 0x2400
_PERF_EVENT_IOC_SET_BPF = 0x40042408
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


class EbpfUnavailable(RuntimeError):
    """The probes cannot run here (no permission, no BTF, no tracefs, no object, a verifier refusal): the reason."""


def ensure_tracefs() -> str | None:
    """Mount tracefs when no mount of it is visible. Returns what was done (None: nothing needed)."""
    if any((path / "events").is_dir() for path in TRACEFS_MOUNTS):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    target = TRACEFS_MOUNTS[0]
    if libc.mount(b"tracefs", str(target).encode(), b"tracefs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None) != 0:
        errno = ctypes.get_errno()
        raise EbpfUnavailable(f"no tracefs, and mounting it on {target} failed: {os.strerror(errno)}")
    return f"mounted tracefs on {target}"


def netns_inode() -> int:
    """Inode of this process's network namespace (what the probes filter on)."""
    return os.stat("/proc/self/ns/net").st_ino


def probe_settings(*, netns: int, loader: Loader | None) -> dict[str, bytes]:
    """The probes' read-only data for this run (common.h, libs.c): the namespace watched, the loader's hook."""
    settings = {"netns_inum": _U32.pack(netns)}
    if loader is not None:
        settings.update(ldso_debug_state_addr=_U64.pack(loader.debug_state.address),
                        ldso_r_debug_addr=_U64.pack(loader.r_debug_address))
    return settings


def _attach_tracepoint(program_fd: int, group: str, name: str) -> int:
    """A perf event of the tracepoint running the program (what libbpf does): open = attached."""
    events = next((path / "events" for path in TRACEFS_MOUNTS if (path / "events").is_dir()), TRACEFS_MOUNTS[0])
    try:
        tracepoint_id = int((events / group / name / "id").read_text())
    except (OSError, ValueError) as exc:
        raise EbpfUnavailable(f"no tracepoint {group}:{name} here ({exc})") from None
    attr = ctypes.create_string_buffer(_PERF_ATTR_BYTES)
    _PERF_ATTR.pack_into(attr, 0, _PERF_TYPE_TRACEPOINT, _PERF_ATTR_BYTES, tracepoint_id, 1, 0, 0, 0, 1)
    libc = ctypes.CDLL(None, use_errno=True)
    # every task (-1) on CPU 0: a tracepoint's programs run wherever it fires
    fd = libc.syscall(_SYS_PERF_EVENT_OPEN[os.uname().machine], attr, -1, 0, -1, _PERF_FLAG_FD_CLOEXEC)
    if fd < 0:
        raise EbpfUnavailable(f"tracepoint {group}:{name}: {os.strerror(ctypes.get_errno())}")
    if libc.ioctl(fd, _PERF_EVENT_IOC_SET_BPF, program_fd) != 0 or libc.ioctl(fd, _PERF_EVENT_IOC_ENABLE, 0) != 0:
        problem = os.strerror(ctypes.get_errno())
        os.close(fd)
        raise EbpfUnavailable(f"tracepoint {group}:{name}: the program did not attach: {problem}")
    return fd


def load_probes(elf: bytes, settings: dict[str, bytes], uprobe_programs: Iterable[str]) -> LoadedProbes:
    """Load the probes' object (root): the ring buffer and its lost counters, `uprobe_programs` loaded for uprobe
    links, the tracepoints' programs loaded and attached. Raises EbpfUnavailable."""
    if not BTF_PATH.exists():
        raise EbpfUnavailable(f"the kernel has no BTF ({BTF_PATH}, CONFIG_DEBUG_INFO_BTF): the probes are CO-RE "
                              "objects and cannot load without it; packets are still captured, and cut, but no flow "
                              "is attributed to a process and no libzmq or libnccl call is recorded")
    uprobe_programs = list(uprobe_programs)
    try:
        programs, maps = libbpf.load_object(
            elf, [*uprobe_programs, *TRACEPOINTS], ["events", "lost"], settings=settings,
            attach_types=dict.fromkeys(uprobe_programs, libbpf.BPF_TRACE_UPROBE_MULTI))
    except libbpf.BpfError as exc:
        raise EbpfUnavailable(f"the probes did not load: {exc}") from None
    loaded = LoadedProbes(maps["events"], maps["lost"], {name: programs[name] for name in uprobe_programs})
    try:
        for program, (group, name) in TRACEPOINTS.items():
            loaded.tracepoint_fds.append(_attach_tracepoint(programs[program], group, name))
    except EbpfUnavailable:
        loaded.close()
        raise
    finally:
        for program in TRACEPOINTS:
            os.close(programs[program])      # the perf event holds the program
    return loaded


def program_listing(probes: dict[str, bytes], snap: dict[str, bytes]) -> str:
    """What `--print-bpf` shows: each object's build (file, clang flags), its source, and the read-only data this
    run would set at load."""
    lines = []
    for source, settings in ((bpf_objects.PROBES, probes), (bpf_objects.SNAP, snap)):
        built = next((str(path) for path in (bpf_objects.BUILD_DIR / source.file_name,
                                             bpf_objects.CACHE_DIR / source.file_name) if path.exists()),
                     "not built (make setup)")
        lines += [f"// ==== {source.name}: {built}", "// built by clang with:",
                  *(f"//   {flag}" for flag in source.cflags()), "// set at load:",
                  *(f"//   {name} = {_setting_text(value)}" for name, value in settings.items())]
        lines += [f"// ---- probes/{part.name}\n{part.read_text()}" for part in source.parts]
    return "\n".join(lines)


def _setting_text(value: bytes) -> str:
    if len(value) in (4, 8):
        return str(int.from_bytes(value, "little"))
    bits = int.from_bytes(value, "little")
    return f"{bin(bits).count('1')} bits set" if bits else "none"


# -- the loaded probes --------------------------------------------------------------------------------

# The kernel's BPF ring buffer as user space maps it (kernel/bpf/ringbuf.c, the layout libbpf reads):
# page 0 holds the consumer position (the reader writes it), page 1 the producer position, then the data
# pages, mapped twice in a row so that a record that wraps around is contiguous. Each record: a u32 length
# with BUSY (still being written) and DISCARD bits, a u32 page offset, the payload, padding to 8 bytes.
_RINGBUF_BUSY = 1 << 31
_RINGBUF_DISCARD = 1 << 30
_RINGBUF_HEADER = struct.Struct("<I")
_RINGBUF_HEADER_BYTES = 8
_POSITION = struct.Struct("<Q")


def ring_records(data: memoryview, mask: int, position: list[int], producer: int) -> Iterator[memoryview]:
    """The committed records of a BPF ring buffer's data area (mapped twice in a row: `data` is 2 x size
    bytes, `mask` = size - 1) from the consumer position position[0] up to `producer`, as views of their
    payloads. position[0] advances past each record yielded or discarded, and stops at the first record
    still being written. A pure function of the bytes: tested on rings built by hand."""
    consumer, header = position[0], _RINGBUF_HEADER.unpack_from
    while consumer < producer:
        start = consumer & mask
        length = header(data, start)[0]
        if length & _RINGBUF_BUSY:
            break                   # still being written: the next read takes it
        size = length & ~_RINGBUF_DISCARD
        consumer += (_RINGBUF_HEADER_BYTES + size + 7) & ~7
        position[0] = consumer
        if not length & _RINGBUF_DISCARD:
            yield data[start + _RINGBUF_HEADER_BYTES:start + _RINGBUF_HEADER_BYTES + size]


class RingReader:
    """The probes' ring buffer and lost counters, read from map descriptors the root helper handed over. The ring
    is mapped and walked here rather than through libbpf's ring_buffer__consume, whose per-event callback into
    Python (ctypes) cost several microseconds an event; walking the records in place costs a fraction of one."""

    def __init__(self, events_fd: int, lost_fd: int) -> None:
        try:
            self._lib = libbpf.load_libbpf()
            self.size = libbpf.map_max_entries(self._lib, events_fd)
        except libbpf.BpfError as exc:
            raise EbpfUnavailable(str(exc)) from None
        self._lost_fd = lost_fd
        if self.size & (self.size - 1) or self.size < mmap.PAGESIZE:
            raise EbpfUnavailable(f"the events map is not a ring buffer ({self.size} bytes)")
        self._mask = self.size - 1
        try:
            self._consumer = mmap.mmap(events_fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self._producer = mmap.mmap(events_fd, mmap.PAGESIZE + 2 * self.size, mmap.MAP_SHARED, mmap.PROT_READ,
                                       offset=mmap.PAGESIZE)
        except OSError as exc:
            raise EbpfUnavailable(f"cannot map the ring buffer: {exc}") from None
        self._data = memoryview(self._producer)[mmap.PAGESIZE:]

    def records(self) -> Iterator[memoryview]:
        """Every event waiting, oldest first, as views into the ring: use (copy) each before asking for
        the next; the space is handed back to the kernel when the iteration ends."""
        position = [_POSITION.unpack_from(self._consumer)[0]]
        try:
            yield from ring_records(self._data, self._mask, position, _POSITION.unpack_from(self._producer)[0])
        finally:
            _POSITION.pack_into(self._consumer, 0, position[0])

    def lost_counts(self) -> dict[str, int]:
        """Events dropped because the ring buffer was full, per kind name, since the start."""
        totals = ((kind.name, libbpf.percpu_total(self._lib, self._lost_fd, int(kind))) for kind in Kind
                  if kind < RINGBUF_KIND_COUNT)
        return {name: total for name, total in totals if total}

    def close(self) -> None:
        if self._data is not None:
            self._data.release()
            self._data = None
            self._producer.close()
            self._consumer.close()


@dataclass
class LoadedProbes:
    """The probes' descriptors, the holder's to close: the ring buffer and its lost counters, the uprobe programs
    (loaded for uprobe links, by name) and the tracepoints' perf events (open = attached)."""
    events_fd: int = -1
    lost_fd: int = -1
    programs: dict[str, int] = field(default_factory=dict)
    tracepoint_fds: list[int] = field(default_factory=list)

    def close(self) -> None:
        for fd in (self.events_fd, self.lost_fd, *self.programs.values(), *self.tracepoint_fds):
            if fd >= 0:
                os.close(fd)
        self.events_fd = self.lost_fd = -1
        self.programs, self.tracepoint_fds = {}, []


