"""Dropping root once the capture and the probes are open: the daemon runs on as an unprivileged user."""
from __future__ import annotations

import os
import pwd


def drop_privileges(user: pwd.struct_passwd) -> None:
    """Become `user` for good: root's uid, groups and every capability are gone (setuid from root to
    another uid clears them all). The open capture handle, BPF ring buffer and files stay usable."""
    if os.geteuid() != 0 or user.pw_uid == 0:
        return
    os.setgroups([])
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)
