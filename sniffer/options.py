"""The capture daemon's options (`dlcsniff capture`), checked before anything touches the system, and its
error."""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import pwd
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

MB = 1_000_000                     # sizes as the daemon shows them, and the deprecated --rotate-mb's unit (tcpdump -C)
MIB = 1 << 20
MAX_SNAPLEN = 262144               # libpcap's largest


EXIT_OK, EXIT_FAILED, EXIT_BAD_OPTIONS, EXIT_DISK_FULL = 0, 1, 2, 3
# Bytes before the network header in what the packet socket sees, per pcap link type: the cooked `any`
# socket (SOCK_DGRAM) starts at the network header, an Ethernet one (SOCK_RAW) at the Ethernet header
# (a VLAN tag is never in it on Linux). Other link types are captured whole.
DLT_EN10MB, DLT_LINUX_SLL, DLT_LINUX_SLL2 = 1, 113, 276
LINK_HEADER_BYTES = {DLT_EN10MB: 14, DLT_LINUX_SLL: 0, DLT_LINUX_SLL2: 0}
DEFAULT_USERS = ("tcpdump", "nobody")
# --zmq-events: which libzmq calls the probes see. Each probed call traps into the kernel (a uprobe), and a
# ZeroMQ job calls them for every frame: what each choice cost the MXNet MLP job is in the README
# (Capturing: what it costs), measured by `make bench` (tests/bench/capture.py).
ZMQ_EVENTS = ("none", "sends", "calls")


class DaemonError(RuntimeError):
    """A capture cannot start or had to stop; `exit_code` says which kind."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def bad_option(message: str) -> DaemonError:
    return DaemonError(message, EXIT_BAD_OPTIONS)


@dataclass(frozen=True, slots=True)
class CaptureOptions:
    interface: str
    out_dir: Path
    filter: str | None = None
    ports: str | None = None                 # "9091,9100-9200"
    snaplen: int = MAX_SNAPLEN
    rotate_bytes: int = 100 * MB
    max_disk_bytes: int | None = None
    duration_s: float | None = None
    ebpf: bool = True
    user: str | None = None                  # None: the first of DEFAULT_USERS that exists
    libraries: tuple[Path, ...] = ()         # probed from the start, beside those found in processes
    buffer_bytes: int = 64 * MIB             # kernel capture ring
    full_payload: bool = False               # True: every byte of every packet (no ZMTP cut)
    zmq_events: str = "none"                 # libzmq calls probed: none, sends, calls (sniffer/uprobes.py)


def options_json(options: CaptureOptions) -> str:
    fields = dataclasses.asdict(options)
    fields.update(out_dir=str(options.out_dir), libraries=[str(path) for path in options.libraries])
    return json.dumps(fields)


def options_from_json(text: str) -> CaptureOptions:
    try:
        fields = json.loads(text)
        fields.update(out_dir=Path(fields["out_dir"]), libraries=tuple(map(Path, fields["libraries"])))
        return CaptureOptions(**fields)
    except (ValueError, TypeError, KeyError) as exc:
        raise bad_option(f"options not understood: {exc}") from None


def exec_daemon(options: CaptureOptions) -> None:
    """Become the daemon: this process is replaced by `python -m dlcsniff.sniffer` (sniffer/__main__.py)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", "dlcsniff.sniffer", options_json(options)])


def parse_ports(text: str) -> list[tuple[int, int]]:
    """"9091,9100-9200" -> [(9091, 9091), (9100, 9200)]."""
    ranges = []
    for item in text.split(","):
        item = item.strip()
        found = re.fullmatch(r"(\d{1,5})(?:-(\d{1,5}))?", item)
        if not found:
            raise bad_option(f"--ports: {item!r} is not a port or a range like 9000-9100")
        low, high = int(found.group(1)), int(found.group(2) or found.group(1))
        if not 1 <= low <= high <= 65535:
            raise bad_option(f"--ports: {item!r} is not within 1-65535 (low-high)")
        ranges.append((low, high))
    return ranges


def capture_filter(filter_text: str | None, ports: str | None) -> str | None:
    """The pcap filter expression: --filter and --ports combined (both must hold)."""
    parts = []
    if filter_text and filter_text.strip():
        parts.append(f"({filter_text.strip()})")
    if ports:
        terms = [f"tcp port {low}" if low == high else f"tcp portrange {low}-{high}" for low, high in parse_ports(ports)]
        parts.append(f"({' or '.join(terms)})")
    return " and ".join(parts) or None


def full_payload_reason(options: CaptureOptions, linktype: int) -> str | None:
    """Why packets must be recorded whole (None: the ZMTP snap filter may cut them)."""
    if options.full_payload:
        return "--full-payload"
    if not options.ebpf:
        return "--no-ebpf: the cut is an eBPF socket filter"
    if options.filter:
        return "--filter: the pcap expression stays libpcap's filter, and a socket has only one"
    if options.snaplen not in (0, MAX_SNAPLEN):
        return f"--snaplen {options.snaplen}"
    if linktype not in LINK_HEADER_BYTES:
        return f"link type {linktype}: the cut knows Ethernet and Linux cooked headers only"
    return None


def resolve_user(name: str | None) -> pwd.struct_passwd:
    names = (name,) if name else DEFAULT_USERS
    for candidate in names:
        try:
            return pwd.getpwnam(candidate)
        except KeyError:
            continue
    raise bad_option(f"--user: no such user {names[0]!r}" if name else f"none of the users {DEFAULT_USERS} exists: "
                      "give --user")


def check_options(options: CaptureOptions) -> None:
    """Everything about the options that can be checked without touching the system."""
    if not options.interface or "/" in options.interface:
        raise bad_option(f"--iface: {options.interface!r} is not an interface name")
    if options.interface != "any":
        try:
            socket.if_nametoindex(options.interface)
        except OSError:
            raise bad_option(f"--iface: no interface {options.interface!r} here") from None
    if not 0 <= options.snaplen <= MAX_SNAPLEN:
        raise bad_option(f"--snaplen: {options.snaplen} is not within 0-{MAX_SNAPLEN} (0: whole packets)")
    if options.rotate_bytes < MB:
        raise bad_option(f"--rotate-size must be at least 1 MB (not {options.rotate_bytes:,} bytes)")
    if options.max_disk_bytes is not None and options.max_disk_bytes < MB:
        raise bad_option(f"--max-disk must be at least 1 MB (not {options.max_disk_bytes:,} bytes)")
    if options.duration_s is not None and not options.duration_s > 0:
        raise bad_option("--duration must be more than 0 seconds")
    if not MIB <= options.buffer_bytes <= 4096 * MIB:
        raise bad_option(f"--buffer-size must be within 1 MiB-4 GiB (not {options.buffer_bytes:,} bytes)")
    if options.libraries and not options.ebpf:
        raise bad_option("--lib needs the eBPF probes (drop --no-ebpf)")
    if options.zmq_events not in ZMQ_EVENTS:
        raise bad_option(f"--zmq-events: {options.zmq_events!r} is not one of {', '.join(ZMQ_EVENTS)}")
    if options.zmq_events != "none" and not options.ebpf:
        raise bad_option("--zmq-events needs the eBPF probes (drop --no-ebpf)")
    for library in options.libraries:
        if not library.is_file():
            raise bad_option(f"--lib: {library} is not a file")
    capture_filter(options.filter, options.ports)


def write_error(path: Path, code: int) -> DaemonError:
    if code in (errno.ENOSPC, errno.EDQUOT):
        return DaemonError(f"disk full writing {path}: capture stopped", EXIT_DISK_FULL)
    return DaemonError(f"cannot write {path}: {os.strerror(code)}")
