"""The capture's root helpers: the processes that do, for the unprivileged daemon, the little that needs
privileges once packets are being captured.

The daemon forks two of them as root right after opening its capture socket, and gives up root itself at once:
the packets are captured from then on, whatever the helpers do. Both load an object built once
(sniffer/bpf_objects.py) and hand its descriptors over (SCM_RIGHTS), side by side, so that neither waits for
the other:
- the cut's (sniffer/snap_filter.py): it loads the ZMTP snap filter (the larger program for the verifier),
  sends it and exits;
- the probes' (sniffer/ebpf.py): it loads the probes (milliseconds), attaches their tracepoint, lists the
  namespace's TCP sockets and the processes holding them (procnet.socket_owners: the owners of connections
  opened before the tracepoint), sends all that, and gives up root for good (the daemon's user, no_new_privs,
  a bounding set of HELPER_CAPABILITIES). It then answers the daemon's requests on its socket, about processes
  of the daemon's network namespace only, until the daemon closes the socket or exits:
  - pids: the processes of the namespace;
  - files: the files given processes map executable (procnet.executable_files), asked for a few at a time (a
    message holds at most the socket's buffer, ~200 kB);
  - open: descriptors of some of those files, named by their paths (a process's loader reports each object it
    loads), opened through /proc/PID/map_files: the mapping's own file, checked to be a regular file and an
    ELF file (procnet.open_mapped_files). The daemon reads their symbols and attaches uprobes through
    /proc/self/fd/N, which needs no access to the directories they lie in.

Why this is safe: the daemon, which parses packets and runs for the whole capture, holds no capability at all
(it used to keep CAP_DAC_READ_SEARCH, which reads every file of the node). The probes' helper keeps what
reading other users' /proc entries and their mapped files takes (CAP_SYS_PTRACE, CAP_CHECKPOINT_RESTORE for
map_files, CAP_DAC_READ_SEARCH for a library in a directory closed to its user), parses nothing but /proc's
text and an ELF file's first bytes, takes requests only from the daemon's end of a socket pair, and hands out
only files that a process of the namespace has mapped executable: a compromised daemon can get a job's
libraries, not a key file or another job's data.
"""
from __future__ import annotations

import ctypes
import json
import os
import pwd
import select
import signal
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from dlcsniff.sniffer import snap_filter
from dlcsniff.sniffer.first_use import on_first_use
from dlcsniff.sniffer.privileges import (CAP_CHECKPOINT_RESTORE, CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE,
                                         drop_privileges)

# what only loading the probes needs: each helper loads it for itself once told to go (sniffer/first_use.py)
bpf_objects = on_first_use("dlcsniff.sniffer.bpf_objects")
ebpf = on_first_use("dlcsniff.sniffer.ebpf")
procnet = on_first_use("dlcsniff.sniffer.procnet")

HELPER_CAPABILITIES = (CAP_DAC_READ_SEARCH, CAP_SYS_PTRACE, CAP_CHECKPOINT_RESTORE)
CLOSE_WAIT_S = 1.0
REQUEST_TIMEOUT_S = 10.0          # an answer reads /proc: milliseconds, longer on a busy machine
MAX_FDS_PER_MESSAGE = 64          # the kernel takes up to 253 (SCM_MAX_FD)
_MESSAGE_BYTES = 1 << 20
_PR_SET_PDEATHSIG = 1


class HelperGone(RuntimeError):
    """The root helper exited or did not answer: the reason."""


@dataclass
class Loaded:
    """A helper's first message: the probes (with the sockets open when they attached) or the cut, or why not
    (`error`), and what the helper did to get there (`notes`: a mount, an object built)."""
    what: str                                  # "probes" or "snap"
    probes: ebpf.LoadedProbes | None = None
    open_sockets: list[procnet.SocketOwner] = field(default_factory=list)
    open_sockets_mono_ns: int = 0              # (the time the tracepoint was attached)
    snap: snap_filter.SnapFilter | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)


class RootHelper:
    """The daemon's end of a helper: its load message when it comes (`poll`), then requests answered in turn."""

    def __init__(self, pid: int, channel: socket.socket, what: str) -> None:
        self.pid = pid
        self.what = what
        self._channel = channel
        self._programs: tuple[str, ...] = ()
        self.exit_status: int | None = None

    def fileno(self) -> int:
        return self._channel.fileno()

    def go(self, settings: dict[str, bytes], programs: tuple[str, ...] = ()) -> None:
        """Let the helper load, with these settings (the object's read-only data) and `programs` for uprobes: it
        waits for this, so that it never holds the capture's own start up."""
        self._programs = programs
        try:
            self._channel.send(json.dumps({"go": {name: value.hex() for name, value in settings.items()},
                                           "programs": list(programs)}).encode())
        except OSError:
            pass                         # gone: poll() says so

    def poll(self) -> Loaded | None:
        """The load message when it is there (never blocks); HelperGone when the helper exited before sending it."""
        if not select.select([self._channel], [], [], 0)[0]:
            return None
        message, fds = self._receive()
        return _loaded(json.loads(message), fds, self._programs)

    def request(self, **request) -> tuple[dict, list[int]]:
        """One request answered (after the load message): the reply and the descriptors it carries (ours to
        close)."""
        try:
            self._channel.sendall(json.dumps(request).encode())
        except OSError as exc:
            raise HelperGone(f"the root helper is gone ({exc.strerror})") from None
        if not select.select([self._channel], [], [], REQUEST_TIMEOUT_S)[0]:
            raise HelperGone(f"the root helper did not answer within {REQUEST_TIMEOUT_S:g} s")
        message, fds = self._receive()
        reply = json.loads(message)
        if "error" in reply:
            for fd in fds:
                os.close(fd)
            raise HelperGone(f"the root helper failed: {reply['error']}")
        return reply, fds

    def _receive(self) -> tuple[bytes, list[int]]:
        try:
            message, fds, _, _ = socket.recv_fds(self._channel, _MESSAGE_BYTES, MAX_FDS_PER_MESSAGE)
        except OSError as exc:
            raise HelperGone(f"the root helper is gone ({exc.strerror})") from None
        if not message:
            self.reap()
            raise HelperGone("the root helper exited" + (f" ({self.exit_status})" if self.exit_status else ""))
        return message, fds

    def reap(self) -> bool:
        """Whether the helper has exited (its status collected)."""
        if self.exit_status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pid, status = self.pid, 0
            if pid == 0:
                return False
            self.exit_status = os.waitstatus_to_exitcode(status)
        return True

    def close(self) -> None:
        """Closing the socket ends the helper: it exits on end of file (collected here if within
        CLOSE_WAIT_S), or, while it loads, by its parent-death signal when the daemon exits."""
        self._channel.close()
        deadline = time.monotonic() + CLOSE_WAIT_S
        while not self.reap() and time.monotonic() < deadline:
            time.sleep(0.01)


def _loaded(reply: dict, fds: list[int], programs: tuple[str, ...]) -> Loaded:
    loaded = Loaded(reply["what"], error=reply.get("error"), notes=reply.get("notes", []))
    if loaded.error is None and loaded.what == "probes":
        events_fd, lost_fd, *rest = fds
        loaded.probes = ebpf.LoadedProbes(events_fd, lost_fd, dict(zip(programs, rest)), rest[len(programs):])
        loaded.open_sockets = [procnet.SocketOwner(procnet.ProcSocket(**owner["socket"]), owner["pid"], owner["comm"])
                               for owner in reply["sockets"]]
        loaded.open_sockets_mono_ns = reply["sockets_mono_ns"]
    elif loaded.error is None and loaded.what == "snap":
        loaded.snap = snap_filter.SnapFilter(*fds)
    return loaded


def start_probes_helper(user: pwd.struct_passwd, close_in_child: Iterable[int] = ()) -> RootHelper:
    """Fork the probes' helper (as root): at `go` it loads the probes with the settings and uprobe programs it is
    given, then serves requests as `user`. `close_in_child`: descriptors it must not hold (the capture socket)."""
    return _fork("probes", _load_probes, user, close_in_child)


def start_snap_helper(close_in_child: Iterable[int] = ()) -> RootHelper:
    """Fork the cut's helper (as root): at `go` it loads the snap filter with the settings it is given, sends it and
    exits."""
    return _fork("snap", _load_snap, None, close_in_child)


Load = Callable[[dict[str, bytes], tuple[str, ...]], tuple[dict, list[int]]]


def _fork(what: str, load: Load, serve_as: pwd.struct_passwd | None, close_in_child: Iterable[int]) -> RootHelper:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        ours.close()
        for fd in close_in_child:
            os.close(fd)
        _helper_main(what, load, serve_as, parent, theirs)
    theirs.close()
    return RootHelper(pid, ours, what)


# -- the helpers' side ---------------------------------------------------------------------------------------

def _exit_with_parent(parent: int) -> None:
    ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:          # it died before the signal was asked for
        os._exit(0)


def _send(channel: socket.socket, reply: dict, fds: list[int] = ()) -> None:
    socket.send_fds(channel, [json.dumps(reply).encode()], list(fds))
    for fd in fds:
        os.close(fd)


def _load_probes(settings: dict[str, bytes], programs: tuple[str, ...]) -> tuple[dict, list[int]]:
    notes = [note for note in (ebpf.ensure_tracefs(),) if note]
    elf, built = bpf_objects.object_bytes(bpf_objects.PROBES)
    attached_mono_ns = time.monotonic_ns()
    probes = ebpf.load_probes(elf, settings, programs)
    # What the tracepoint did not see: the sockets already open (those opened since are in both).
    sockets = [asdict(owner) for owner in procnet.socket_owners(ebpf.netns_inode())]
    fds = [probes.events_fd, probes.lost_fd, *(probes.programs[name] for name in programs), *probes.tracepoint_fds]
    return {"what": "probes", "notes": notes + [built] * bool(built), "sockets": sockets,
            "sockets_mono_ns": attached_mono_ns}, fds


def _load_snap(settings: dict[str, bytes], _programs: tuple[str, ...]) -> tuple[dict, list[int]]:
    elf, built = bpf_objects.object_bytes(bpf_objects.SNAP)
    return {"what": "snap", "notes": [built] * bool(built)}, list(snap_filter.load_snap_filter(elf, settings))


def _answer(request: dict, netns: int) -> tuple[dict, list[int]]:
    """One request of the daemon, about processes of namespace `netns` only."""
    def in_namespace(pid: int) -> bool:
        return procnet.netns_of(pid) == netns

    if request["op"] == "pids":
        return {"pids": procnet.pids_in_netns(netns)}, []
    if request["op"] == "files":
        return {"files": {str(pid): [asdict(mapped) for mapped in procnet.executable_files(pid)]
                          for pid in request["pids"] if in_namespace(pid)}}, []
    if request["op"] == "open":
        opened = procnet.open_mapped_files(request["pid"], request["paths"][:MAX_FDS_PER_MESSAGE]) \
            if in_namespace(request["pid"]) else []
        return {"opened": [asdict(mapped) for mapped, _ in opened]}, [fd for _, fd in opened]
    raise ValueError(f"unknown request {request['op']!r}")


def _helper_main(what: str, load: Load, serve_as: pwd.struct_passwd | None, parent: int,
                 channel: socket.socket) -> None:
    """A helper's whole life; never returns."""
    code = 0
    try:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)     # the daemon decides: it closes the socket
        _exit_with_parent(parent)
        # A load is a burst of CPU (the verifier's): it waits until the daemon captures.
        if not (message := channel.recv(_MESSAGE_BYTES)):
            return                         # the daemon stopped before it captured
        go = json.loads(message)
        try:
            reply, fds = load({name: bytes.fromhex(value) for name, value in go["go"].items()},
                              tuple(go["programs"]))
        except Exception as exc:   # noqa: BLE001 - whatever it is, the daemon reports it and goes on without
            reply, fds = {"what": what, "error": str(exc) if isinstance(
                exc, (ebpf.EbpfUnavailable, snap_filter.SnapUnavailable, bpf_objects.BuildFailed))
                else f"{what}: {exc!r}"}, []
        _send(channel, reply, fds)
        if serve_as is None or "error" in reply:
            return                     # nothing (more) to do for the daemon
        netns = ebpf.netns_inode()
        drop_privileges(serve_as, keep=HELPER_CAPABILITIES)
        _exit_with_parent(parent)      # a change of user clears the parent-death signal
        while request := channel.recv(_MESSAGE_BYTES):
            try:
                reply, fds = _answer(json.loads(request), netns)
            except Exception as exc:   # noqa: BLE001 - the daemon reports it; the helper answers the next one
                reply, fds = {"error": repr(exc)}, []
            _send(channel, reply, fds)
    except BaseException:   # noqa: BLE001 - a child of the daemon must never return into its code
        code = 1
    finally:
        os._exit(code)
