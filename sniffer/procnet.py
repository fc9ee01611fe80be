"""What /proc tells about a network namespace at one moment: its TCP sockets and who holds them, its
processes, and the files they map executable. The probes see what happens after they attached; this module
covers what was already there, and opens the libraries to probe.

/proc/net/tcp{,6} list the sockets of the reading task's namespace; a socket belongs to every process
holding a descriptor on its inode (/proc/<pid>/fd/* -> "socket:[inode]").
"""
from __future__ import annotations

import os
import socket
import stat
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
# /proc/net/tcp prints each 32-bit word of an address as a native-endian integer in hex.
_WORD = struct.Struct("<I" if sys.byteorder == "little" else ">I")


@dataclass(frozen=True, slots=True)
class ProcSocket:
    family: int
    local_ip: str
    local_port: int
    remote_ip: str
    remote_port: int
    state: int          # TCP_* number (include/net/tcp_states.h)
    inode: int


@dataclass(frozen=True, slots=True)
class SocketOwner:
    socket: ProcSocket
    pid: int | None
    comm: str | None


def _address(hex_address: str, family: int) -> str:
    raw = b"".join(_WORD.pack(int(hex_address[i:i + 8], 16)) for i in range(0, len(hex_address), 8))
    return socket.inet_ntop(family, raw)


def parse_proc_net_tcp(text: str, family: int) -> list[ProcSocket]:
    """The rows of /proc/net/tcp (family AF_INET) or /proc/net/tcp6 (AF_INET6)."""
    sockets = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
        local_ip, local_port = local.split(":")
        remote_ip, remote_port = remote.split(":")
        sockets.append(ProcSocket(family, _address(local_ip, family), int(local_port, 16),
                                  _address(remote_ip, family), int(remote_port, 16), int(state, 16), int(inode)))
    return sockets


def tcp_sockets(proc: Path = PROC) -> list[ProcSocket]:
    """TCP sockets of the caller's network namespace."""
    found = []
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            found += parse_proc_net_tcp((proc / "self" / "net" / name).read_text(), family)
        except FileNotFoundError:      # no IPv6 in this kernel
            continue
    return found


def pids(proc: Path = PROC) -> list[int]:
    return sorted(int(entry.name) for entry in proc.iterdir() if entry.name.isdigit())


def netns_of(pid: int, proc: Path = PROC) -> int | None:
    try:
        return os.stat(proc / str(pid) / "ns" / "net").st_ino
    except OSError:        # gone, or not ours to look at
        return None


def pids_in_netns(netns: int, proc: Path = PROC) -> list[int]:
    return [pid for pid in pids(proc) if netns_of(pid, proc) == netns]


def socket_inodes(pid: int, proc: Path = PROC) -> set[int]:
    inodes = set()
    fd_dir = proc / str(pid) / "fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(fd_dir / name)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def parent_of(pid: int, proc: Path = PROC) -> int | None:
    try:
        return int((proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def comm_of(pid: int, proc: Path = PROC) -> str | None:
    try:
        return (proc / str(pid) / "comm").read_text().rstrip("\n")
    except OSError:
        return None


def process_info(pid: int, proc: Path = PROC) -> dict | None:
    """comm, cmdline and cgroup (the cgroup v2 path, else the first hierarchy's) of a live process."""
    base = proc / str(pid)
    try:
        comm = (base / "comm").read_text().rstrip("\n")
        cmdline = (base / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        cgroups = (base / "cgroup").read_text().splitlines()
    except OSError:
        return None
    unified = [line.split(":", 2)[2] for line in cgroups if line.startswith("0::")]
    cgroup = unified[0] if unified else (cgroups[0].split(":", 2)[2] if cgroups else None)
    return {"comm": comm, "cmdline": [arg.decode("utf-8", "replace") for arg in cmdline if arg], "cgroup": cgroup}


def socket_owners(netns: int, proc: Path = PROC) -> list[SocketOwner]:
    """Every TCP socket of the caller's namespace (which must be `netns`), with a process holding it."""
    by_inode: dict[int, int] = {}
    for pid in pids_in_netns(netns, proc):
        for inode in socket_inodes(pid, proc):
            by_inode.setdefault(inode, pid)
    owners = []
    for sock in tcp_sockets(proc):
        pid = by_inode.get(sock.inode)
        owners.append(SocketOwner(sock, pid, comm_of(pid, proc) if pid is not None else None))
    return owners


@dataclass(frozen=True, slots=True)
class MappedFile:
    """A file a process maps executable: where (the address range names it in /proc/PID/map_files), and what."""
    path: str
    device: int          # st_dev as /proc/PID/maps shows it
    inode: int
    addresses: str       # "start-end", hex

    @property
    def key(self) -> tuple[int, int]:
        return self.device, self.inode


def parse_maps(text: str) -> list[MappedFile]:
    """The files /proc/PID/maps shows mapped executable, each once (its first executable range)."""
    found: dict[tuple[int, int], MappedFile] = {}
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and "x" in fields[1] and fields[5].startswith("/") and fields[4] != "0":
            major, minor = fields[3].split(":")
            mapped = MappedFile(fields[5], os.makedev(int(major, 16), int(minor, 16)), int(fields[4]), fields[0])
            found.setdefault(mapped.key, mapped)
    return list(found.values())


def executable_files(pid: int, proc: Path = PROC) -> list[MappedFile]:
    """The files a live process maps executable (its program, its shared objects); [] when it is gone."""
    try:
        return parse_maps((proc / str(pid) / "maps").read_text())
    except OSError:
        return []


ELF_MAGIC = b"\x7fELF"


def open_mapped_files(pid: int, paths: list[str], proc: Path = PROC) -> list[tuple[MappedFile, int]]:
    """Read-only descriptors of the files process `pid` maps executable under these paths (as its loader named
    them: a link to a file it maps counts, found by inode), each opened through /proc/PID/map_files: the
    mapping's own file, whatever its path names now, once per file. Only regular files that start as an ELF file
    does; the mapping's path is the one /proc shows."""
    mapped = executable_files(pid, proc)
    by_path = {item.path: item for item in mapped}
    by_inode = {item.inode: item for item in mapped}
    opened, seen = [], set()
    for path in dict.fromkeys(paths):
        item = by_path.get(path)
        if item is None and path.startswith("/"):
            # (an absolute link on the way resolves against our root: jobs on the node's filesystem)
            try:
                item = by_inode.get(os.stat(proc / str(pid) / "root" / path.lstrip("/")).st_ino)
            except OSError:
                continue
        if item is None or item.key in seen:
            continue
        seen.add(item.key)
        try:
            fd = os.open(proc / str(pid) / "map_files" / item.addresses, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        if stat.S_ISREG(os.fstat(fd).st_mode) and os.pread(fd, len(ELF_MAGIC), 0) == ELF_MAGIC:
            opened.append((item, fd))
        else:
            os.close(fd)
    return opened
