"""The eBPF side of the daemon: the only module that imports bcc, and only in the probe helper process
(`ProbeHelper`): the daemon itself reads the probes' ring buffer through libbpf and never loads libbcc
and its LLVM.

What the probes need from the machine, and what is done when it is missing:
- tracefs (tracepoint ids): mounted on /sys/kernel/tracing when no tracefs is there (`ip netns exec`
  gives each command a fresh /sys without it).
- kernel headers for bcc's compile: when /lib/modules/$(uname -r)/build is missing, the newest
  Debian headers package installed (linux-headers-amd64 → /usr/src/linux-headers-<ver>-<arch>, and
  its -common twin) is linked as build/source. Tracepoint and uprobe programs only need the generic
  headers; every kernel structure member they read is located through the running kernel's BTF
  (/sys/kernel/btf/vmlinux), passed to the compiler as -D offsets, never by the headers' layout.
- no kprobes here: attribution uses tracepoints (see probes/sock.c), libraries use uprobes.

The BPF C text lives in probes/*.c; this module only joins the files and chooses -D flags (`probe_cflags`).
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
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from dlcsniff.decoders.formats.probe_events import (NCCL_COMM_INIT_FUNCTIONS, NCCL_FUNCTIONS, RINGBUF_KIND_COUNT, Kind,
                                                    layout_cflags)
from dlcsniff.decoders.protocols import ZMTP_KEPT_BODIES
from dlcsniff.sniffer import procnet

PROBES_DIR = Path(__file__).resolve().parent / "probes"
# One program, one compile, one ring buffer: the daemon reads every probe's events in one time-ordered
# stream. The files are joined in this order (bcc only generates tracepoint argument structs for
# TRACEPOINT_PROBEs of the main text, so they cannot be #included).
PROGRAM_FILES = tuple(PROBES_DIR / name for name in ("common.h", "sock.c", "libs.c", "zmq.c", "nccl.c", "zmtp_snap.c"))
SNAP_FUNCTION = "zmtp_snap"       # the socket filter in probes/zmtp_snap.c: loaded only when the daemon cuts
SNAP_MAX_FRAMES = 32              # ZMTP frames the filter parses per packet (a bounded loop)
SNAP_COUNTERS = ("cut_packets", "cut_bytes", "full_flows")   # snap_counts indices in probes/zmtp_snap.c
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
ZMQ_REQUIRED = ("zmq_msg_send", "zmq_msg_recv", "zmq_atomic_counter_new")   # the last: libzmq >= 4.2
# symbol -> (entry program, return program or None)
ZMQ_PROBES = {
    "zmq_msg_send": ("zmq_msg_send_enter", "zmq_send_return"),
    "zmq_send": ("zmq_send_enter", "zmq_send_return"),
    "zmq_msg_recv": ("zmq_msg_recv_enter", "zmq_recv_return"),
    "zmq_recv": ("zmq_recv_enter", "zmq_recv_return"),
}
NCCL_PROBES = {
    **{name: (f"nccl_{name.removeprefix('nccl').lower()}", None) for name in NCCL_FUNCTIONS},
    **{name: ("nccl_comm_init_enter", "nccl_comm_init_return") for name in NCCL_COMM_INIT_FUNCTIONS},
}
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 2, 4, 8
_PR_SET_PDEATHSIG = 1
ATTACH_REPLY_TIMEOUT_S = 30.0     # symbol lookup in a 150 MB library (libmxnet.so) takes a fraction of that
HELPER_START_TIMEOUT_S = 300.0    # the compile: seconds, longer when several daemons start on 2 cores
HELPER_EXIT_WAIT_S = 1.0


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


def probe_cflags(*, netns: int | None, offsets: dict[str, int], link_header_bytes: int = 0,
                 port_ranges: Iterable[tuple[int, int]] = ()) -> list[str]:
    """Compiler flags for the program. Without BTF offsets the probes watch every namespace and report
    thread names: the daemon says so. `link_header_bytes` and `port_ranges` (--ports: the snap filter
    drops every other packet) are for the snap filter (probes/zmtp_snap.c)."""
    defines: dict[str, object] = {
        **layout_cflags(), **offsets, "RINGBUF_PAGES": RINGBUF_PAGES, "SNAP_LINK_HEADER_LEN": link_header_bytes,
        "SNAP_KEPT_FIRST_FRAMES": ZMTP_KEPT_BODIES.first_frames, "SNAP_KEPT_BODY_MAX": ZMTP_KEPT_BODIES.max_body_bytes,
        "SNAP_MAX_FRAMES": SNAP_MAX_FRAMES}
    if netns is not None and offsets:
        defines["NETNS_INUM"] = netns
    ranges = " || ".join(f"((port) >= {low} && (port) <= {high})" for low, high in port_ranges)
    if ranges:
        defines["SNAP_PORT_WANTED(port)"] = f"({ranges})"
    return [f"-D{name}={value}" for name, value in sorted(defines.items())]


def program_text() -> str:
    return "".join(f"// ==== probes/{path.name} ====\n{path.read_text()}\n" for path in PROGRAM_FILES)


def program_listing(cflags: list[str]) -> str:
    """What `--print-bpf` shows: the compiler flags, then the program text bcc compiles."""
    return "\n".join(["// compiled by bcc with:", *(f"//   {flag}" for flag in cflags), program_text()])


# -- the loaded probes --------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class LibraryProbes:
    path: str
    library: str                 # "libzmq" or "libnccl"
    functions: tuple[str, ...]   # symbols probed


_ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_ELF_SECTION = struct.Struct("<IIQQQQIIQQ")
_ELF_SYMBOL = struct.Struct("<IBBHQQ")
_SHT_SYMTAB, _SHT_DYNSYM = 2, 11
_STT_FUNC, _STT_GNU_IFUNC = 2, 10
PROBED_SYMBOL_PREFIXES = (b"zmq_", b"nccl")


def elf_function_symbols(path: str, prefixes: tuple[bytes, ...] = PROBED_SYMBOL_PREFIXES) -> set[str]:
    """Names of the functions a 64-bit little-endian ELF file defines (.dynsym and .symtab) starting with
    one of `prefixes`; empty for anything else. Most shared objects a job opens are ruled out by one
    search of their string tables, without reading their symbols."""
    try:
        with open(path, "rb") as file:
            return _elf_function_symbols(file, prefixes)
    except (OSError, ValueError, struct.error):
        return set()


def _read_at(file, offset: int, size: int) -> bytes:
    file.seek(offset)
    data = file.read(size)
    if len(data) != size:
        raise ValueError("ELF file shorter than its headers say")
    return data


def _elf_function_symbols(file, prefixes: tuple[bytes, ...]) -> set[str]:
    ident, *_, section_offset, _, _, _, _, section_size, section_count, _ = _ELF_HEADER.unpack(
        _read_at(file, 0, _ELF_HEADER.size))
    if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1 or section_size != _ELF_SECTION.size:
        return set()
    sections = list(_ELF_SECTION.iter_unpack(_read_at(file, section_offset, section_count * section_size)))
    found = set()
    for _, kind, _, _, offset, size, link, _, _, entry_size in sections:
        if kind not in (_SHT_SYMTAB, _SHT_DYNSYM) or entry_size != _ELF_SYMBOL.size or link >= len(sections):
            continue
        strings = _read_at(file, sections[link][4], sections[link][5])
        if not any(b"\0" + prefix in strings for prefix in prefixes):
            continue
        for name_offset, info, _, section_index, _, _ in _ELF_SYMBOL.iter_unpack(_read_at(file, offset, size)):
            if section_index and info & 0xF in (_STT_FUNC, _STT_GNU_IFUNC) and strings.startswith(prefixes, name_offset):
                found.add(strings[name_offset:strings.index(b"\0", name_offset)].decode())
    return found


def classify_library(symbols: set[str]) -> tuple[str, dict[str, tuple[str, str | None]]] | None:
    """("libzmq" | "libnccl", {symbol: (entry program, return program)}) for a file exporting those
    symbols, or None. libzmq older than 4.2 is not probed (probes/zmq.c reads 4.2+'s zmq_msg_t)."""
    if all(name in symbols for name in ZMQ_REQUIRED):
        return "libzmq", {name: probe for name, probe in ZMQ_PROBES.items() if name in symbols}
    nccl = {name: probe for name, probe in NCCL_PROBES.items() if name in symbols}
    if nccl:
        return "libnccl", nccl
    return None


class ProbeSession:
    """The compiled program with its tracepoints attached (bcc). Lives in the probe helper only."""

    def __init__(self, cflags: list[str], *, snap: bool = False) -> None:
        try:
            from bcc import BPF  # noqa: PLC0415 - the one bcc import, in the probe helper only
        except ImportError as exc:
            raise EbpfUnavailable(f"bcc is not importable ({exc}): install python3-bpfcc") from None
        try:
            self._bpf = BPF(text=program_text().encode(), cflags=cflags)
        except Exception as exc:   # bcc raises bare Exception for compile and load failures
            raise EbpfUnavailable(f"BPF program did not load: {exc}") from None
        self.events_fd = self._bpf["events"].map_fd
        self.lost_fd = self._bpf["lost"].map_fd
        self.snap_fds: list[int] = []      # the socket filter program and its counters (snap=True)
        self.snap_error: str | None = None  # why the snap filter did not load (the probes still run)
        if snap:
            try:
                program = self._bpf.load_func(SNAP_FUNCTION.encode(), BPF.SOCKET_FILTER)
                self.snap_fds = [program.fd, self._bpf["snap_counts"].map_fd]
            except Exception as exc:   # noqa: BLE001 - bcc raises bare Exception (the verifier's log)
                self.snap_error = f"the snap filter did not load: {exc}"
        self._attached: dict[int, list[bytes]] = {}     # pid -> bcc uprobe events attached for it

    def attach_library(self, path: str, pid: int = -1) -> LibraryProbes | None:
        """Attach the libzmq or libnccl probes to `path` in process `pid` (-1: in every process mapping it,
        now or later). Per process, the breakpoints exist only in that process: other programs using the
        same library (the other nodes' processes, here) do not trap at all."""
        found = classify_library(elf_function_symbols(path))
        if found is None:
            return None
        library, probes = found
        before = set(self._bpf.uprobe_fds)
        for symbol, (entry, exit_) in probes.items():
            try:
                self._bpf.attach_uprobe(name=path.encode(), sym=symbol.encode(), fn_name=entry.encode(), pid=pid)
                if exit_ is not None:
                    self._bpf.attach_uretprobe(name=path.encode(), sym=symbol.encode(), fn_name=exit_.encode(),
                                               pid=pid)
            except Exception as exc:   # noqa: BLE001 - bcc raises bare Exception
                raise EbpfUnavailable(f"cannot attach to {symbol} in {path}: {exc}") from None
        self._attached.setdefault(pid, []).extend(set(self._bpf.uprobe_fds) - before)
        return LibraryProbes(path, library, tuple(sorted(probes)))

    def detach_exited(self) -> list[int]:
        """Release the probes of processes that are gone; returns their pids."""
        gone = [pid for pid in self._attached if pid != -1 and not Path(f"/proc/{pid}").exists()]
        for pid in gone:
            for event in self._attached.pop(pid):
                self._bpf.detach_uprobe_event(event)
        return gone


# -- the daemon's side: reading the ring buffer without bcc -------------------------------------------------

def _libbpf() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    except OSError as exc:
        raise EbpfUnavailable(f"libbpf is missing ({exc}): install libbpf1") from None
    lib.bpf_map_lookup_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.bpf_obj_get_info_by_fd.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint32)]
    return lib


# The kernel's BPF ring buffer as user space maps it (kernel/bpf/ringbuf.c, the layout libbpf reads):
# page 0 holds the consumer position (the reader writes it), page 1 the producer position, then the data
# pages, mapped twice in a row so that a record that wraps around is contiguous. Each record: a u32 length
# with BUSY (still being written) and DISCARD bits, a u32 page offset, the payload, padding to 8 bytes.
_RINGBUF_BUSY = 1 << 31
_RINGBUF_DISCARD = 1 << 30
_RINGBUF_HEADER = struct.Struct("<I")
_RINGBUF_HEADER_BYTES = 8
_POSITION = struct.Struct("<Q")
_MAP_INFO_BYTES = 96            # struct bpf_map_info (type, id, key_size, value_size, max_entries, ...)
_MAP_INFO_MAX_ENTRIES = struct.Struct("<I")
_MAP_INFO_MAX_ENTRIES_OFFSET = 16


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


def percpu_total(lib: ctypes.CDLL, map_fd: int, index: int) -> int:
    """The sum over CPUs of a u64 per-CPU array slot (0 when the lookup fails)."""
    values = (ctypes.c_uint64 * lib.libbpf_num_possible_cpus())()
    key = ctypes.c_uint32(index)
    return sum(values) if lib.bpf_map_lookup_elem(map_fd, ctypes.byref(key), values) == 0 else 0


SO_ATTACH_BPF = 50


class SnapFilter:
    """The snap filter (probes/zmtp_snap.c) as the daemon holds it: the program's descriptor, to attach
    to its own packet socket (no privilege needed), and its counters."""

    def __init__(self, program_fd: int, counts_fd: int) -> None:
        self._lib = _libbpf()
        self.program_fd = program_fd
        self.counts_fd = counts_fd

    def attach(self, packet_socket_fd: int) -> None:
        """Make the filter the packet socket's only filter (it replaces libpcap's, if any)."""
        with socket.fromfd(packet_socket_fd, socket.AF_PACKET, socket.SOCK_RAW) as packet_socket:
            try:
                packet_socket.setsockopt(socket.SOL_SOCKET, SO_ATTACH_BPF, struct.pack("i", self.program_fd))
            except OSError as exc:
                raise EbpfUnavailable(f"cannot attach the snap filter: {exc.strerror}") from None

    def counts(self) -> dict[str, int]:
        """cut_packets, cut_bytes (bytes of packets not copied) and full_flows since the start."""
        return {name: percpu_total(self._lib, self.counts_fd, index) for index, name in enumerate(SNAP_COUNTERS)}

    def close(self) -> None:
        for fd in (self.program_fd, self.counts_fd):
            os.close(fd)


class RingReader:
    """The probes' ring buffer and lost counters, read from map descriptors the helper handed over: the
    daemon never loads bcc and LLVM (a few hundred MB). The ring is mapped and walked here rather than
    through libbpf's ring_buffer__consume, whose per-event callback into Python (ctypes) cost several
    microseconds an event; walking the records in place costs a fraction of one (`make bench`, capture)."""

    def __init__(self, events_fd: int, lost_fd: int) -> None:
        self._lib = _libbpf()
        self._lost_fd = lost_fd
        info = ctypes.create_string_buffer(_MAP_INFO_BYTES)
        length = ctypes.c_uint32(_MAP_INFO_BYTES)
        if self._lib.bpf_obj_get_info_by_fd(events_fd, info, ctypes.byref(length)) != 0:
            raise EbpfUnavailable(f"bpf_obj_get_info_by_fd: {os.strerror(ctypes.get_errno())}")
        self.size = _MAP_INFO_MAX_ENTRIES.unpack_from(info.raw, _MAP_INFO_MAX_ENTRIES_OFFSET)[0]
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
        totals = ((kind.name, percpu_total(self._lib, self._lost_fd, int(kind))) for kind in Kind
                  if kind < RINGBUF_KIND_COUNT)
        return {name: total for name, total in totals if total}

    def close(self) -> None:
        if self._data is not None:
            self._data.release()
            self._data = None
            self._producer.close()
            self._consumer.close()


# -- the probe helper: the root part --------------------------------------------------------------------------

class BadLibrary(EbpfUnavailable):
    """A library named on the command line exports nothing to probe."""


class ProbeHelper:
    """Privilege separation. A child forked before anything of bcc is loaded compiles the program, attaches
    the tracepoints, hands the ring buffer and lost-counter maps to the daemon (SCM_RIGHTS), and then
    keeps root for one thing only: attaching uprobes to the libraries the daemon names while the job runs
    (the uprobe PMU wants CAP_SYS_ADMIN on these kernels). It exits when the daemon closes the socket or
    dies. The daemon drops every privilege and never maps LLVM.

    Requests are (pid, path as that process named it); the helper resolves the path through
    /proc/<pid>/root (or cwd), inspects each distinct file once, and answers with what it attached."""

    def __init__(self, cflags: list[str], libraries: Iterable[str] = (), close_in_child: Iterable[int] = (),
                 *, snap: bool = False) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            ours.close()
            for fd in close_in_child:
                os.close(fd)
            _helper_main(cflags, list(libraries), theirs, snap)
        theirs.close()
        self.pid = pid
        self._socket = ours
        self._socket.settimeout(HELPER_START_TIMEOUT_S)
        try:
            message, fds, _, _ = socket.recv_fds(self._socket, 1 << 16, 4)
            hello = json.loads(message or b'{"error": "the probe helper exited"}')
        except (OSError, ValueError) as exc:
            self.close()
            raise EbpfUnavailable(f"the probe helper did not start: {exc}") from None
        if "error" in hello:
            self.close()
            raise (BadLibrary if hello.get("bad_library") else EbpfUnavailable)(hello["error"])
        self.events_fd, self.lost_fd, *snap_fds = fds
        # the snap filter (asked for with snap=True): its program and counters, or why it is missing
        self.snap = SnapFilter(*snap_fds) if snap_fds else None
        self.snap_error: str | None = hello.get("snap_error")
        self.libraries = [LibraryProbes(item["path"], item["library"], tuple(item["functions"]))
                          for item in hello["libraries"]]
        self._socket.settimeout(ATTACH_REPLY_TIMEOUT_S)

    def attach(self, pid: int | None, path: str) -> LibraryProbes | None:
        """Probe the library `path` (as process `pid` sees it; None: as this process does), if it is
        libzmq or libnccl and was not inspected before. Raises EbpfUnavailable when attaching failed."""
        try:
            self._socket.send(json.dumps({"pid": pid, "path": path}).encode())
            reply = json.loads(self._socket.recv(1 << 16) or b'{"error": "the probe helper exited"}')
        except (OSError, ValueError) as exc:
            raise EbpfUnavailable(f"the probe helper (pid {self.pid}) stopped answering: {exc}") from None
        if "error" in reply:
            raise EbpfUnavailable(reply["error"])
        attached = reply.get("attached")
        return None if attached is None else LibraryProbes(attached["path"], attached["library"],
                                                           tuple(attached["functions"]))

    def close(self) -> None:
        """Closing the socket tells the helper to exit. Its exit can take seconds (the kernel unregisters
        each uprobe with an RCU grace period), and nothing of the capture depends on it: wait briefly,
        then leave it to finish on its own (the daemon, no longer root, could not kill it anyway)."""
        self._socket.close()
        deadline = time.monotonic() + HELPER_EXIT_WAIT_S
        while os.waitpid(self.pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
            time.sleep(0.01)


def _helper_main(cflags: list[str], libraries: list[str], requests: socket.socket, snap: bool) -> None:
    """The helper child's whole life; never returns."""
    code = 0
    try:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)     # the daemon decides when to stop: it closes the socket
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        attached = []
        try:
            session = ProbeSession(cflags, snap=snap)
            for library in libraries:
                found = session.attach_library(library)
                if found is None:
                    raise BadLibrary(f"--lib {library}: exports neither libzmq (>= 4.2) nor libnccl symbols")
                attached.append({"path": found.path, "library": found.library, "functions": list(found.functions)})
        except Exception as exc:   # noqa: BLE001 - whatever it is, the daemon reports it and goes on without probes
            reason = str(exc) if isinstance(exc, EbpfUnavailable) else f"probe helper failed: {exc!r}"
            requests.send(json.dumps({"error": reason, "bad_library": isinstance(exc, BadLibrary)}).encode())
            return
        # What the compiler held on to is garbage now: give it back (~80 MB).
        ctypes.CDLL(None).malloc_trim(0)
        socket.send_fds(requests, [json.dumps({"libraries": attached, "snap_error": session.snap_error}).encode()],
                        [session.events_fd, session.lost_fd, *session.snap_fds])
        probed = {(status.st_dev, status.st_ino, -1) for status in map(os.stat, libraries)}   # (file, pid)
        probeable: dict[tuple[int, int], bool] = {}       # file -> exports what the probes want
        while request := requests.recv(1 << 16):
            asked = json.loads(request)
            pid, path = asked["pid"] or -1, asked["path"]
            local = path if pid == -1 else str(procnet.path_seen_by(pid, path))
            reply: dict = {"attached": None}
            try:
                gone = set(session.detach_exited())
                probed = {key for key in probed if key[2] not in gone}     # the pid may be reused
                status = os.stat(local)
                file = (status.st_dev, status.st_ino)
                if (*file, -1) not in probed and (*file, pid) not in probed and probeable.get(file, True):
                    attached = session.attach_library(local, pid)
                    probeable[file] = attached is not None
                    if attached is not None:
                        probed.add((*file, pid))
                        reply["attached"] = {"path": path, "library": attached.library,
                                             "functions": list(attached.functions)}
            except FileNotFoundError:
                pass                                  # gone, or a name the process failed to open
            except (OSError, EbpfUnavailable) as exc:
                reply = {"error": f"{path}: {exc}"}
            requests.send(json.dumps(reply).encode())
    except BaseException:   # noqa: BLE001 - a child of the daemon must never return into its code
        code = 1
    finally:
        os._exit(code)
