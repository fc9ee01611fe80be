"""Dropping root for good: the daemon as soon as its capture socket is open (keeping no capability), its root
helper once the probes are loaded (keeping the few it answers with: sniffer/root_helper.py); neither can regain
any other."""
from __future__ import annotations

import ctypes
import os
import pwd
import struct
from collections.abc import Iterable
from pathlib import Path

# (linux/capability.h)
CAP_DAC_READ_SEARCH = 2           # read any file, traverse any directory
CAP_SETPCAP = 8                   # drop capabilities from the bounding set
CAP_SYS_PTRACE = 19               # read other users' /proc/PID entries (and trace their processes)
CAP_CHECKPOINT_RESTORE = 40       # open /proc/PID/map_files entries
_PR_SET_KEEPCAPS = 8
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
_CAPABILITY_VERSION_3 = 0x20080522
_CAP_HEADER = struct.Struct("<Ii")          # version, pid (0: this thread)
_CAP_DATA = struct.Struct("<III")           # effective, permitted, inheritable: bits 0-31, then 32-63
CAP_LAST_CAP = Path("/proc/sys/kernel/cap_last_cap")


def drop_privileges(user: pwd.struct_passwd, keep: Iterable[int] = ()) -> bool:
    """Become `user` for good, with only the capabilities in `keep` (permitted and effective). Everything the
    daemon uses is an open descriptor (the capture socket, the probes' maps and programs, the directory, the
    libraries the root helper opened), and none of it needs a capability: attaching a uprobe link or a socket
    filter, reading a map, writing a file it holds. Every other capability goes, the bounding set included
    (nothing executed later gets one back), and no_new_privs is set (no setuid program either). Returns whether
    it did (not when not root, nor for user root)."""
    if os.geteuid() != 0 or user.pw_uid == 0:
        return False
    keep = set(keep)
    for capability in range(int(CAP_LAST_CAP.read_text()) + 1):
        if capability not in keep:
            _prctl(_PR_CAPBSET_DROP, capability)
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    _prctl(_PR_SET_KEEPCAPS, 1 if keep else 0)          # through setuid: the permitted set stays
    os.setgroups([])
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)
    mask = sum(1 << capability for capability in keep)
    _capset(mask)
    _prctl(_PR_SET_KEEPCAPS, 0)
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    return True


def drop_kept(kept: Iterable[int]) -> None:
    """Give up the capabilities `drop_privileges` kept, from the bounding set too (CAP_SETPCAP, which that takes,
    last)."""
    for capability in sorted(set(kept), key=lambda capability: capability == CAP_SETPCAP):
        _prctl(_PR_CAPBSET_DROP, capability)
    _capset(0)


_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(*args: int) -> None:
    if _libc.prctl(*args, *(0,) * (5 - len(args))) != 0:
        raise OSError(ctypes.get_errno(), f"prctl{args}: {os.strerror(ctypes.get_errno())}")


def _capset(mask: int) -> None:
    """This thread's permitted and effective capabilities: `mask` (no inheritable ones)."""
    low, high = mask & 0xFFFFFFFF, mask >> 32
    header = ctypes.create_string_buffer(_CAP_HEADER.pack(_CAPABILITY_VERSION_3, 0))
    data = ctypes.create_string_buffer(_CAP_DATA.pack(low, low, 0) + _CAP_DATA.pack(high, high, 0))
    if _libc.syscall(_SYS_CAPSET[os.uname().machine], header, data) != 0:
        raise OSError(ctypes.get_errno(), f"capset: {os.strerror(ctypes.get_errno())}")
