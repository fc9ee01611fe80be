"""Dropping root once the capture and the probes are open: the daemon runs on as an unprivileged user, keeping at
most one capability it cannot do without, and none it could regain others with."""
from __future__ import annotations

import ctypes
import os
import pwd
import struct
from collections.abc import Iterable
from pathlib import Path

CAP_DAC_READ_SEARCH = 2           # read any file, traverse any directory (linux/capability.h)
_PR_SET_KEEPCAPS = 8
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_SYS_CAPSET = {"x86_64": 126, "aarch64": 91}
_CAPABILITY_VERSION_3 = 0x20080522
_CAP_HEADER = struct.Struct("<Ii")          # version, pid (0: this thread)
_CAP_DATA = struct.Struct("<III")           # effective, permitted, inheritable: bits 0-31, then 32-63
CAP_LAST_CAP = Path("/proc/sys/kernel/cap_last_cap")


def drop_privileges(user: pwd.struct_passwd, keep: Iterable[int] = ()) -> None:
    """Become `user` for good, with only the capabilities in `keep` (permitted and effective). Everything the
    daemon uses is an open descriptor (the capture socket, the probes' maps and programs, the directory),
    and none of it needs a capability: attaching a uprobe link or a socket filter, reading a map, writing a
    file it holds. What may need one is reading the libraries jobs load, where their directories are closed
    to `user` (a job run as root from /root): CAP_DAC_READ_SEARCH, kept while the probes run. Every other
    capability goes, the bounding set included (nothing executed later gets one back), and no_new_privs is
    set (no setuid program either)."""
    if os.geteuid() != 0 or user.pw_uid == 0:
        return
    keep = set(keep)
    libc = ctypes.CDLL(None, use_errno=True)

    def prctl(*args: int) -> None:
        if libc.prctl(*args, *(0,) * (5 - len(args))) != 0:
            raise OSError(ctypes.get_errno(), f"prctl{args}: {os.strerror(ctypes.get_errno())}")

    for capability in range(int(CAP_LAST_CAP.read_text()) + 1):
        if capability not in keep:
            prctl(_PR_CAPBSET_DROP, capability)
    prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL)
    prctl(_PR_SET_KEEPCAPS, 1 if keep else 0)          # through setuid: the permitted set stays
    os.setgroups([])
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)
    mask = sum(1 << capability for capability in keep)
    low, high = mask & 0xFFFFFFFF, mask >> 32
    header = ctypes.create_string_buffer(_CAP_HEADER.pack(_CAPABILITY_VERSION_3, 0))
    data = ctypes.create_string_buffer(_CAP_DATA.pack(low, low, 0) + _CAP_DATA.pack(high, high, 0))
    if libc.syscall(_SYS_CAPSET[os.uname().machine], header, data) != 0:
        raise OSError(ctypes.get_errno(), f"capset: {os.strerror(ctypes.get_errno())}")
    prctl(_PR_SET_KEEPCAPS, 0)
    prctl(_PR_SET_NO_NEW_PRIVS, 1)
