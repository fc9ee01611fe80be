"""Uprobes on the libraries jobs load (libzmq, libnccl) and on the dynamic loader, attached by the daemon itself
as BPF links of programs the probe helper loaded (sniffer/libbpf.py): no privilege is needed for that, so
libraries a job loads long after the daemon gave up root are probed too.

Which functions are probed, and when: the loader's hook always (a trap per change to a process's list of
loaded objects, none on the data path: probes/libs.c); libnccl's API calls (one trap per call, entry only:
NCCL calls enqueue GPU work, thousands a second at most); libzmq's send and receive calls only as
--zmq-events asks, since a ZeroMQ job calls them for every frame (sniffer/options.py says what each costs).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dlcsniff.decoders.formats.probe_events import NCCL_COMM_INIT_FUNCTIONS, NCCL_FUNCTIONS
from dlcsniff.sniffer import libbpf, procnet
from dlcsniff.sniffer.elf_symbols import LOADER_SYMBOLS, Symbol, elf_symbols, interpreter

ZMQ_REQUIRED = ("zmq_msg_send", "zmq_msg_recv", "zmq_atomic_counter_new")   # the last: libzmq >= 4.2
# --zmq-events (sniffer/options.py ZMQ_EVENTS) -> symbol -> (entry program, return program or None), in probes/zmq.c
ZMQ_PROBES = {
    "none": {},
    "sends": {"zmq_msg_send": ("zmq_msg_send_sent", None), "zmq_send": ("zmq_send_sent", None)},
    "calls": {
        "zmq_msg_send": ("zmq_msg_send_enter", "zmq_send_return"),
        "zmq_send": ("zmq_send_enter", "zmq_send_return"),
        "zmq_msg_recv": ("zmq_msg_recv_enter", "zmq_recv_return"),
        "zmq_recv": ("zmq_recv_enter", "zmq_recv_return"),
    },
}
NCCL_PROBES = {
    **{name: (f"nccl_{name.removeprefix('nccl').lower()}", None) for name in NCCL_FUNCTIONS},
    **{name: ("nccl_comm_init_enter", "nccl_comm_init_return") for name in NCCL_COMM_INIT_FUNCTIONS},
}
LOADER_PROGRAM = "ldso_debug_state"      # probes/libs.c


def uprobe_programs(zmq_events: str, *, loader: bool) -> list[str]:
    """The uprobe programs the helper loads for this --zmq-events (and the loader hook)."""
    names = {program for probes in (ZMQ_PROBES[zmq_events], NCCL_PROBES) for pair in probes.values()
             for program in pair if program}
    return sorted(names | ({LOADER_PROGRAM} if loader else set()))


def classify_library(symbols: dict[str, Symbol] | set[str],
                     zmq_events: str = "calls") -> tuple[str, dict[str, tuple[str, str | None]]] | None:
    """("libzmq" | "libnccl", {symbol: (entry program, return program)}) for a file exporting those symbols,
    or None. libzmq older than 4.2 is not probed (probes/zmq.c reads 4.2+'s zmq_msg_t); libzmq is probed
    only as --zmq-events says (its table may be empty)."""
    if all(name in symbols for name in ZMQ_REQUIRED):
        return "libzmq", {name: probe for name, probe in ZMQ_PROBES[zmq_events].items() if name in symbols}
    nccl = {name: probe for name, probe in NCCL_PROBES.items() if name in symbols}
    if nccl:
        return "libnccl", nccl
    return None


@dataclass(frozen=True, slots=True)
class Loader:
    """The dynamic loader the daemon's own program uses (jobs on the same filesystem use it too)."""
    path: str
    debug_state: Symbol            # _dl_debug_state: where the hook is attached
    r_debug_address: int           # _r_debug: the head of the list of loaded objects


def find_loader(executable: str = "/proc/self/exe") -> Loader | None:
    """glibc's loader as `executable` names it, with its hook's symbols; None when there is none (musl, a
    static program)."""
    named = interpreter(executable)
    if named is None:
        return None
    path = os.path.realpath(named)
    symbols = elf_symbols(path, LOADER_SYMBOLS, objects=True)
    debug_state, r_debug = symbols.get("_dl_debug_state"), symbols.get("_r_debug")
    if debug_state is None or r_debug is None or debug_state.file_offset < 0:
        return None
    return Loader(path, debug_state, r_debug.address)


@dataclass(frozen=True, slots=True)
class LibraryProbes:
    path: str
    library: str                 # "libzmq" or "libnccl"
    functions: tuple[str, ...]   # symbols probed


class Uprobes:
    """The uprobes the daemon attached: links on the loader and on --lib files for every process, and per
    process on the libraries it loaded (only that process traps: the other nodes' processes sharing a
    library file are not slowed)."""

    def __init__(self, programs: dict[str, int], zmq_events: str) -> None:
        self._programs = programs
        self._zmq_events = zmq_events
        self._links: dict[int, list[int]] = {}                 # pid (0: every process) -> link descriptors
        self._probed: set[tuple[int, int, int]] = set()        # (device, inode, pid)
        self._probeable: dict[tuple[int, int], bool] = {}      # (device, inode) -> exports what is probed

    def attach_loader(self, loader: Loader) -> None:
        self._link(0, loader.path, loader.debug_state.file_offset, LOADER_PROGRAM, returns=False)

    def attach_library(self, path: str, pid: int = 0) -> LibraryProbes | None:
        """Probe `path` (in process `pid`, 0: in every process) if it is libzmq or libnccl; raises
        libbpf.BpfError when the kernel refuses a link."""
        symbols = elf_symbols(path)
        found = classify_library(symbols, self._zmq_events)
        if found is None or not found[1]:
            return None
        library, probes = found
        for symbol, (entry, exit_) in probes.items():
            offset = symbols[symbol].file_offset
            self._link(pid, path, offset, entry, returns=False)
            if exit_ is not None:
                self._link(pid, path, offset, exit_, returns=True)
        return LibraryProbes(path, library, tuple(sorted(probes)))

    def probe_loaded(self, pid: int, path: str) -> LibraryProbes | None:
        """A library process `pid` loaded (its path as that process named it): probed once per file and
        process, files that export nothing probed looked at once."""
        if not path.startswith("/"):
            return None                                        # relative to a cwd the daemon may not see
        local = self._local_path(pid, path)
        try:
            status = os.stat(local)
        except OSError:
            return None                                        # gone, or not visible from here
        file = (status.st_dev, status.st_ino)
        if (*file, 0) in self._probed or (*file, pid) in self._probed or not self._probeable.get(file, True):
            return None
        attached = self.attach_library(local, pid)
        self._probeable[file] = attached is not None
        if attached is None:
            return None
        self._probed.add((*file, pid))
        return LibraryProbes(path, attached.library, attached.functions)

    def note_probed_everywhere(self, path: str) -> None:
        status = os.stat(path)
        self._probed.add((status.st_dev, status.st_ino, 0))

    @staticmethod
    def _local_path(pid: int, path: str) -> str:
        """The path through the process's root when the daemon may look there (another mount namespace of
        a process of its own user), else as named (the same filesystem: jobs on the host or in network
        namespaces only)."""
        seen = procnet.path_seen_by(pid, path)
        try:
            os.stat(seen)
        except OSError:
            return path
        return str(seen)

    def _link(self, pid: int, path: str, offset: int, program: str, *, returns: bool) -> None:
        fd = libbpf.attach_uprobes(self._programs[program], path, [offset], pid=pid, returns=returns)
        self._links.setdefault(pid, []).append(fd)

    def detach_exited(self) -> list[int]:
        """Close the links of processes that are gone; returns their pids."""
        gone = [pid for pid in self._links if pid and not Path(f"/proc/{pid}").exists()]
        for pid in gone:
            for fd in self._links.pop(pid):
                os.close(fd)
        self._probed = {key for key in self._probed if key[2] not in gone}     # the pid may be reused
        return gone

    def close(self) -> None:
        for fds in self._links.values():
            for fd in fds:
                os.close(fd)
        self._links = {}
