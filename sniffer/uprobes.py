"""Uprobes on the libraries jobs load (libzmq, libnccl) and on the dynamic loader, attached by the daemon itself
as BPF links of programs the root helper loaded (sniffer/libbpf.py): no privilege is needed for that, so
libraries a job loads long after the daemon gave up root are probed too. A job's files are read and attached
through descriptors the root helper opened (/proc/self/fd/N): the daemon needs no access to their directories.

Which functions are probed, and when: the loader's hook always (a trap per change to a process's list of
loaded objects, none on the data path: probes/libs.c); libnccl's API calls (one trap per call, entry only:
NCCL calls enqueue GPU work, thousands a second at most); libzmq's send and receive calls only as
--zmq-events asks, since a ZeroMQ job calls them for every frame (sniffer/options.py says what each costs).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dlcsniff.decoders.protocols.nccl import probes as nccl_api
from dlcsniff.sniffer import libbpf
from dlcsniff.sniffer.procnet import MappedFile
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
    **{name: (f"nccl_{name.removeprefix('nccl').lower()}", None) for name in nccl_api.FUNCTIONS},
    **{name: ("nccl_comm_init_enter", "nccl_comm_init_return") for name in nccl_api.COMM_INIT_FUNCTIONS},
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


def descriptor_path(fd: int) -> str:
    """A path the kernel resolves to the file of our descriptor `fd`, whatever directories lie above it."""
    return f"/proc/self/fd/{fd}"


# (pid, paths it loaded or maps) -> each file it maps executable under one of them, and a descriptor of it (the
# root helper's `open`)
FileOpener = Callable[[int, list[str]], list[tuple[MappedFile, int]]]


@dataclass(frozen=True, slots=True)
class _Plan:
    """What to attach to one library file: its kind, the functions probed, and (file offset, entry program,
    return program) per function."""
    library: str
    functions: tuple[str, ...]
    links: tuple[tuple[int, str, str | None], ...]


class Uprobes:
    """The uprobes the daemon attached: links on the loader and on --lib files for every process, and per
    process on the libraries it loaded (only that process traps: the other nodes' processes sharing a
    library file are not slowed). A file's symbols are read once, and a descriptor of each libzmq/libnccl file
    kept, whatever the number of processes that map it."""

    def __init__(self, programs: dict[str, int], zmq_events: str) -> None:
        self._programs = programs
        self._zmq_events = zmq_events
        self._links: dict[int, list[int]] = {}                 # pid (0: every process) -> link descriptors
        self._everywhere: set[tuple[int, int]] = set()         # (st_dev, st_ino) of files probed in every process
        self._plans: dict[tuple[int, int], _Plan | None] = {}  # a mapping's (device, inode) -> what to attach there
        self._kept: dict[tuple[int, int], int] = {}            # ... and a descriptor of the file, where there is
        self._probed: set[tuple[tuple[int, int], int]] = set() # (a mapping's (device, inode), pid)

    def attach_loader(self, loader: Loader) -> None:
        self._link(0, loader.path, loader.debug_state.file_offset, LOADER_PROGRAM, returns=False)

    def _plan(self, path: str) -> _Plan | None:
        symbols = elf_symbols(path)
        found = classify_library(symbols, self._zmq_events)
        if found is None or not found[1]:
            return None
        library, probes = found
        return _Plan(library, tuple(sorted(probes)),
                     tuple((symbols[symbol].file_offset, entry, exit_) for symbol, (entry, exit_) in probes.items()))

    def _attach(self, plan: _Plan, path: str, pid: int) -> None:
        for offset, entry, exit_ in plan.links:
            self._link(pid, path, offset, entry, returns=False)
            if exit_ is not None:
                self._link(pid, path, offset, exit_, returns=True)

    def attach_library(self, path: str) -> LibraryProbes | None:
        """Probe `path` in every process if it is libzmq or libnccl; raises libbpf.BpfError when the kernel
        refuses a link."""
        plan = self._plan(path)
        if plan is None:
            return None
        self._attach(plan, path, 0)
        status = os.stat(path)
        self._everywhere.add((status.st_dev, status.st_ino))
        return LibraryProbes(path, plan.library, plan.functions)

    def known(self, key: tuple[int, int]) -> bool:
        """Whether the file of this mapping's (device, inode) was looked into already."""
        return key in self._plans

    def probe_files(self, pid: int, paths: list[str], open_files: FileOpener) -> list[LibraryProbes]:
        """Probe, in process `pid`, the files it maps executable under these paths that are libzmq or libnccl (but
        those probed in every process): each file read once, and probed once per process. Returns what was
        attached, named by the paths the process maps."""
        attached, opened = [], open_files(pid, paths)
        try:
            while opened:
                mapped, fd = opened.pop(0)
                if mapped.key not in self._plans:
                    status = os.fstat(fd)
                    everywhere = (status.st_dev, status.st_ino) in self._everywhere
                    self._plans[mapped.key] = None if everywhere else self._plan(descriptor_path(fd))
                    if self._plans[mapped.key] is not None:
                        self._kept[mapped.key], fd = fd, None
                if fd is not None:
                    os.close(fd)
                plan = self._plans[mapped.key]
                if plan is None or (mapped.key, pid) in self._probed:
                    continue
                self._attach(plan, descriptor_path(self._kept[mapped.key]), pid)
                self._probed.add((mapped.key, pid))
                attached.append(LibraryProbes(mapped.path, plan.library, plan.functions))
        finally:
            for _, fd in opened:               # a link refused: the files not looked into yet
                os.close(fd)
        return attached

    def _link(self, pid: int, path: str, offset: int, program: str, *, returns: bool) -> None:
        fd = libbpf.attach_uprobes(self._programs[program], path, [offset], pid=pid, returns=returns)
        self._links.setdefault(pid, []).append(fd)

    def detach_exited(self) -> list[int]:
        """Close the links of processes that are gone; returns their pids."""
        gone = [pid for pid in self._links if pid and not Path(f"/proc/{pid}").exists()]
        for pid in gone:
            for fd in self._links.pop(pid):
                os.close(fd)
        self._probed = {key for key in self._probed if key[1] not in gone}     # the pid may be reused
        return gone

    def close(self) -> None:
        for fd in [fd for fds in self._links.values() for fd in fds] + list(self._kept.values()):
            os.close(fd)
        self._links, self._kept = {}, {}
