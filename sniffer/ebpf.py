"""The eBPF side of the daemon: the only module that imports bcc, and only in the probe helper process
(`start_probe_helper`), which compiles and loads every program as root, hands their descriptors to the daemon
and exits. The daemon reads the probes' ring buffer through libbpf, attaches uprobes itself
(sniffer/uprobes.py), and never loads libbcc and its LLVM.

What the probes need from the machine, and what is done when it is missing:
- tracefs (tracepoint ids): mounted on /sys/kernel/tracing when no tracefs is there (`ip netns exec`
  gives each command a fresh /sys without it).
- kernel headers for bcc's compile: when /lib/modules/$(uname -r)/build is missing, the newest
  Debian headers package installed (linux-headers-amd64 → /usr/src/linux-headers-<ver>-<arch>, and
  its -common twin) is linked as build/source. Tracepoint and uprobe programs only need the generic
  headers; every kernel structure member they read is located through the running kernel's BTF
  (/sys/kernel/btf/vmlinux), passed to the compiler as -D offsets, never by the headers' layout.
- no kprobes here: attribution uses a tracepoint (see probes/sock.c), libraries use uprobes.

The BPF C text lives in probes/*.c; this module only joins the files and chooses -D flags (`probe_cflags`).
The snap filter (probes/zmtp_snap.c) is compiled by clang and loaded by libbpf (sniffer/snap_filter.py), in the
same helper.
"""
from __future__ import annotations

import ctypes
import json
import mmap
import os
import platform
import re
import signal
import socket
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dlcsniff.decoders.formats.probe_events import RINGBUF_KIND_COUNT, Kind, layout_cflags
from dlcsniff.sniffer import libbpf, snap_filter
from dlcsniff.sniffer.uprobes import Loader

PROBES_DIR = Path(__file__).resolve().parent / "probes"
# One program, one compile, one ring buffer: the daemon reads every probe's events in one time-ordered
# stream. The files are joined in this order (bcc only generates tracepoint argument structs for
# TRACEPOINT_PROBEs of the main text, so they cannot be #included).
PROGRAM_FILES = tuple(PROBES_DIR / name for name in ("common.h", "sock.c", "libs.c", "zmq.c", "nccl.c"))
BTF_PATH = Path("/sys/kernel/btf/vmlinux")
TRACEFS_MOUNTS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))
MODULES_DIR = Path("/lib/modules")
HEADERS_DIR = Path("/usr/src")
DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
RINGBUF_PAGES = 1024             # 4 MiB shared by all probes: ~40k events at the ~100 B they take
# Kernel members the probes read, as (struct, member path) -> the -D name of the byte offset.
KERNEL_MEMBERS = {
    "TASK_NSPROXY_OFFSET": ("task_struct", "nsproxy"),
    "NSPROXY_NET_NS_OFFSET": ("nsproxy", "net_ns"),
    "NET_NS_INUM_OFFSET": ("net", "ns.inum"),
    "SOCK_NET_OFFSET": ("sock", "__sk_common.skc_net.net"),
    "TASK_GROUP_LEADER_OFFSET": ("task_struct", "group_leader"),
    "TASK_COMM_OFFSET": ("task_struct", "comm"),
}
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_PR_SET_PDEATHSIG = 1
HELPER_START_TIMEOUT_S = 300.0    # the compiles: seconds, longer when several daemons start on 2 cores


class EbpfUnavailable(RuntimeError):
    """The probes cannot run here (no permission, no headers, no tracefs, compile failure): the reason."""


# -- BTF: member offsets of the running kernel -------------------------------------------------------

_BTF_HEADER = struct.Struct("<HBBIIIII")
_BTF_TYPE = struct.Struct("<III")
_BTF_MEMBER = struct.Struct("<III")
_BTF_MAGIC = 0xEB9F
_BTF_STRUCT, _BTF_UNION = 4, 5
_BTF_MODIFIERS = {8, 9, 10, 11, 18}        # typedef, volatile, const, restrict, type_tag
# bytes after the common type record: fixed per kind, or per vlen item
_BTF_EXTRA = {1: 4, 3: 12, 14: 4, 17: 4}
_BTF_EXTRA_PER_ITEM = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}


def btf_member_offsets(btf: bytes, members: dict[str, tuple[str, str]]) -> dict[str, int]:
    """Byte offsets of (struct, "member.member...") in a BTF blob; anonymous struct/union members are
    searched through, as C does. Raises EbpfUnavailable naming what is missing."""
    magic, _, _, header_len, type_off, type_len, str_off, _ = _BTF_HEADER.unpack_from(btf)
    if magic != _BTF_MAGIC:
        raise EbpfUnavailable(f"BTF magic {magic:#x}: not little-endian BTF")
    types_at = header_len + type_off
    strings_at = header_len + str_off

    def name(offset: int) -> str:
        start = strings_at + offset
        return btf[start:btf.index(b"\0", start)].decode()

    types: list[tuple[int, int, int, int, int]] = [(0, 0, 0, 0, 0)]   # kind, name_off, size_or_type, kflag, members_at
    structs: dict[str, int] = {}
    position, end = types_at, types_at + type_len
    while position < end:
        name_off, info, size_or_type = _BTF_TYPE.unpack_from(btf, position)
        kind, vlen, kflag = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
        position += _BTF_TYPE.size
        types.append((kind, name_off, size_or_type, kflag, position))
        if kind == _BTF_STRUCT and vlen and name_off:
            structs.setdefault(name(name_off), len(types) - 1)
        position += _BTF_EXTRA.get(kind, 0) + _BTF_EXTRA_PER_ITEM.get(kind, 0) * vlen

    def resolved(type_id: int) -> int:
        while types[type_id][0] in _BTF_MODIFIERS:
            type_id = types[type_id][2]
        return type_id

    def find(type_id: int, member: str) -> tuple[int, int] | None:
        kind, _, _, kflag, members_at = types[resolved(type_id)]
        if kind not in (_BTF_STRUCT, _BTF_UNION):
            return None
        vlen = _BTF_TYPE.unpack_from(btf, members_at - _BTF_TYPE.size)[1] & 0xFFFF
        for index in range(vlen):
            name_off, member_type, offset = _BTF_MEMBER.unpack_from(btf, members_at + index * _BTF_MEMBER.size)
            bit_offset = offset & 0xFFFFFF if kflag else offset
            if name_off and name(name_off) == member:
                return bit_offset, member_type
            if not name_off:
                inner = find(member_type, member)
                if inner is not None:
                    return bit_offset + inner[0], inner[1]
        return None

    offsets = {}
    for define, (struct_name, path) in members.items():
        if struct_name not in structs:
            raise EbpfUnavailable(f"kernel BTF has no struct {struct_name}")
        type_id, bits = structs[struct_name], 0
        for member in path.split("."):
            found = find(type_id, member)
            if found is None:
                raise EbpfUnavailable(f"kernel BTF: struct {struct_name} has no member {path}")
            bits += found[0]
            type_id = found[1]
        offsets[define] = bits // 8
    return offsets


def kernel_offsets() -> dict[str, int]:
    """Offsets of the members the probes read, from the running kernel's BTF ({} when it has none)."""
    try:
        return btf_member_offsets(BTF_PATH.read_bytes(), KERNEL_MEMBERS)
    except FileNotFoundError:
        return {}


# -- what bcc needs from the machine -----------------------------------------------------------------

def _version_key(path: Path) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.name)]


def ensure_kernel_headers(release: str | None = None) -> str | None:
    """Make /lib/modules/<release>/build (and source) point at installed headers when they are missing.
    Returns what was done (None: nothing was needed)."""
    release = release or os.uname().release
    modules = MODULES_DIR / release
    if (modules / "build" / "include").is_dir():
        return None
    arch = DEBIAN_ARCH.get(platform.machine(), platform.machine())
    candidates = sorted((path for path in HEADERS_DIR.glob(f"linux-headers-*-{arch}") if path.is_dir()),
                        key=_version_key)
    if not candidates:
        raise EbpfUnavailable(f"no kernel headers for {release} and none in {HEADERS_DIR} "
                              f"(install linux-headers-{arch})")
    build = candidates[-1]
    common = build.with_name(build.name.removesuffix(f"-{arch}") + "-common")
    modules.mkdir(parents=True, exist_ok=True)
    _replace_symlink(modules / "build", build)
    if common.is_dir() and not (modules / "source" / "include").is_dir():
        _replace_symlink(modules / "source", common)
    return f"kernel {release} ships no headers: linked {build} as its build tree"


def _replace_symlink(link: Path, target: Path) -> None:
    # Atomic, so that daemons starting together never see a half-made link.
    staging = link.with_name(f".{link.name}.{os.getpid()}")
    staging.unlink(missing_ok=True)
    staging.symlink_to(target)
    os.replace(staging, link)


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


def probe_cflags(*, netns: int | None, offsets: dict[str, int], loader: Loader | None = None) -> list[str]:
    """Compiler flags for the probes. Without BTF offsets the probes watch every namespace and report thread
    names: the daemon says so. With `loader`, the loader hook (probes/libs.c) is compiled for it."""
    defines: dict[str, object] = {**layout_cflags(), **offsets, "RINGBUF_PAGES": RINGBUF_PAGES}
    if netns is not None and offsets:
        defines["NETNS_INUM"] = netns
    if loader is not None:
        defines.update(LDSO_DEBUG_STATE_ADDR=loader.debug_state.address, LDSO_R_DEBUG_ADDR=loader.r_debug_address)
    return [f"-D{name}={value}" for name, value in sorted(defines.items())]


def program_text() -> str:
    return "".join(f"// ==== probes/{path.name} ====\n{path.read_text()}\n" for path in PROGRAM_FILES)


def program_listing(cflags: list[str], snap_cflags: list[str]) -> str:
    """What `--print-bpf` shows: the compiler flags and the program text bcc compiles, then the snap filter's."""
    return "\n".join(["// compiled by bcc with:", *(f"//   {flag}" for flag in cflags), program_text(),
                      f"// ==== probes/{snap_filter.SNAP_SOURCE.name}, compiled by clang with:",
                      *(f"//   {flag}" for flag in snap_cflags), snap_filter.SNAP_SOURCE.read_text()])


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
    """The probes' ring buffer and lost counters, read from map descriptors the helper handed over. The ring is mapped and walked here rather than
    through libbpf's ring_buffer__consume, whose per-event callback into Python (ctypes) cost several
    microseconds an event; walking the records in place costs a fraction of one (`make bench`, capture)."""

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


# -- the probe helper: the root part --------------------------------------------------------------------------

@dataclass
class LoadedProbes:
    """What the probe helper hands the daemon, every descriptor the daemon's to close: the ring buffer and its
    lost counters, the uprobe programs (loaded for uprobe links, by name) and the tracepoints' perf events
    (open = attached), or why the probes did not load (`error`); the snap filter, or why it did not load.
    Either can load without the other (the cut needs no kernel headers)."""
    error: str | None
    events_fd: int = -1
    lost_fd: int = -1
    programs: dict[str, int] = field(default_factory=dict)
    tracepoint_fds: list[int] = field(default_factory=list)
    snap: snap_filter.SnapFilter | None = None
    snap_error: str | None = None

    def close(self) -> None:
        for fd in (self.events_fd, self.lost_fd, *self.programs.values(), *self.tracepoint_fds):
            if fd >= 0:
                os.close(fd)
        self.events_fd = self.lost_fd = -1
        self.programs, self.tracepoint_fds = {}, []
        if self.snap is not None:
            self.snap.close()
            self.snap = None


def start_probe_helper(cflags: list[str] | None, programs: Iterable[str], close_in_child: Iterable[int] = (), *,
                       snap_cflags: list[str] | None = None) -> LoadedProbes:
    """Fork the probe helper (before anything of bcc is loaded here): as root it compiles the probes (bcc;
    not with `cflags` None) and loads them (tracepoints attached, `programs` loaded for uprobe links),
    compiles and loads the snap filter when `snap_cflags` are given (clang, libbpf), hands every descriptor
    over (SCM_RIGHTS) and exits.
    Its few hundred MB of compilers go with it: the daemon keeps descriptors only, and needs no privilege to
    use them (reading maps, attaching uprobe links, attaching a socket filter)."""
    programs = list(programs)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        ours.close()
        for fd in close_in_child:
            os.close(fd)
        _helper_main(cflags, programs, snap_cflags, theirs)
    theirs.close()
    try:
        ours.settimeout(HELPER_START_TIMEOUT_S)
        message, fds, _, _ = socket.recv_fds(ours, 1 << 16, 2 + len(programs) + _MAX_TRACEPOINTS + 2)
        reply = json.loads(message or b'{"error": "the probe helper exited"}')
    except (OSError, ValueError) as exc:
        raise EbpfUnavailable(f"the probe helper did not start: {exc}") from None
    finally:
        ours.close()
        os.waitpid(pid, 0)
    snap_fds, fds = (fds[-2:], fds[:-2]) if reply.get("snap") else ([], fds)
    loaded = LoadedProbes(reply.get("error"), snap=snap_filter.SnapFilter(*snap_fds) if snap_fds else None,
                          snap_error=reply.get("snap_error"))
    if loaded.error is None:
        loaded.events_fd, loaded.lost_fd, *rest = fds
        loaded.programs = dict(zip(programs, rest[:len(programs)]))
        loaded.tracepoint_fds = rest[len(programs):]
    return loaded


_MAX_TRACEPOINTS = 8


def _load_probes(cflags: list[str], programs: list[str]) -> list[int]:
    """Descriptors: the ring, its lost counters, the programs, the tracepoints' perf events."""
    try:
        from bcc import BPF  # noqa: PLC0415 - the one bcc import, in the probe helper only
    except ImportError as exc:
        raise EbpfUnavailable(f"bcc is not importable ({exc}): install python3-bpfcc") from None
    try:
        bpf = BPF(text=program_text().encode(), cflags=cflags)     # attaches the tracepoints it defines
        loaded = [bpf.load_func(name.encode(), BPF.KPROBE, attach_type=libbpf.BPF_TRACE_UPROBE_MULTI).fd
                  for name in programs]
    except Exception as exc:   # bcc raises bare Exception for compile and load failures
        raise EbpfUnavailable(f"BPF program did not load: {exc}") from None
    tracepoints = list(bpf.tracepoint_fds.values())
    if len(tracepoints) > _MAX_TRACEPOINTS:
        raise EbpfUnavailable(f"{len(tracepoints)} tracepoints: more than the {_MAX_TRACEPOINTS} handed over")
    return [bpf["events"].map_fd, bpf["lost"].map_fd, *loaded, *tracepoints]


def _helper_main(cflags: list[str] | None, programs: list[str], snap_cflags: list[str] | None,
                 reply: socket.socket) -> None:
    """The helper child's whole life; never returns."""
    code = 0
    try:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)     # the daemon decides: it waits for the answer
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        answer: dict = {}
        try:
            if cflags is None:
                raise EbpfUnavailable("the probes were not asked for")
            fds = _load_probes(cflags, programs)
        except Exception as exc:   # noqa: BLE001 - whatever it is, the daemon reports it and goes on without probes
            answer["error"] = str(exc) if isinstance(exc, EbpfUnavailable) else f"probe helper failed: {exc!r}"
            fds = []
        if snap_cflags is not None:
            try:
                fds += snap_filter.load_snap_filter(snap_filter.compile_snap_filter(snap_cflags))
                answer["snap"] = True
            except snap_filter.SnapUnavailable as exc:
                answer["snap_error"] = str(exc)
        socket.send_fds(reply, [json.dumps(answer).encode()], fds)
    except BaseException:   # noqa: BLE001 - a child of the daemon must never return into its code
        code = 1
    finally:
        os._exit(code)
