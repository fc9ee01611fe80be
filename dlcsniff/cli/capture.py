"""`dlcsniff capture`: the capture daemon."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dlcsniff.cli.app import EXIT_CODES, EXIT_USAGE, Flag, command, fail, step, warn
from dlcsniff.decoders.quantities import DURATION_UNITS, SIZE_UNITS, format_size, parse_duration, parse_size

_MB, _MIB = 1_000_000, 1 << 20
_OLD = dict(hidden=True, min=1)          # the --*-mb spellings: still read, with a deprecation warning


@command(epilog=EXIT_CODES.removesuffix(".") + "; capture: 2 also for options the daemon refuses, 3 the disk "
         "budget or the disk ran out.")
def capture(
    iface: Annotated[Optional[str], typer.Option("--iface", "-i", help="Interface to capture on (`any`: all).")] = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", "-o", help="Capture directory (created 0700; a "
                                                    "restart adds a new file set).")] = None,
    filter_text: Annotated[Optional[str], typer.Option("--filter", "-f", metavar="EXPR", help="Capture only the "
                                                       "packets this pcap filter expression keeps (tcpdump's "
                                                       "syntax).")] = None,
    ports: Annotated[Optional[str], typer.Option("--ports", help="Only these TCP ports, e.g. 9091,9100-9200.")] = None,
    # ranges are checked by the daemon's options (sniffer/options.py), with its exit code for bad options
    snaplen: Annotated[int, typer.Option(
        "--snaplen", metavar="SIZE", parser=parse_size,
        help=f"Bytes kept per packet, e.g. 96B (0: whole packets). Sizes: {SIZE_UNITS}.")] = 0,
    rotate_size: Annotated[Optional[int], typer.Option(
        "--rotate-size", metavar="SIZE", parser=parse_size,
        help="Start a new capture file every SIZE (default 100MB; was --rotate-mb N).")] = None,
    max_disk: Annotated[Optional[int], typer.Option(
        "--max-disk", metavar="SIZE", parser=parse_size, help="Disk budget of the directory (e.g. 20GB), never "
        "exceeded: the capture stops when it is used up (was --max-disk-mb N).")] = None,
    duration: Annotated[Optional[float], typer.Option(
        "--duration", metavar="DURATION", parser=parse_duration,
        help=f"Stop after this long (e.g. 90s, 30min; {DURATION_UNITS}).")] = None,
    no_ebpf: Annotated[bool, typer.Option("--no-ebpf", **Flag, help="Packets only: no eBPF probes.")] = False,
    user: Annotated[Optional[str], typer.Option("--user", help="User to run as once the capture is open "
                                                "(default: tcpdump, else nobody).")] = None,
    lib: Annotated[Optional[list[Path]], typer.Option("--lib", help="Also probe this libzmq/libnccl (or a library "
                                                      "embedding it) from the start; repeatable.")] = None,
    buffer_size: Annotated[Optional[int], typer.Option(
        "--buffer-size", metavar="SIZE", parser=parse_size,
        help="Kernel capture ring (default 64MiB; was --buffer-mb N).")] = None,
    full_payload: Annotated[bool, typer.Option("--full-payload", **Flag, help="Record every byte of every packet. By "
                                               "default an eBPF filter cuts the values of large ZMTP data "
                                               "frames (over 64 KiB) in the kernel; decoding needs none of "
                                               "them.")] = False,
    zmq_events: Annotated[str, typer.Option(
        "--zmq-events", metavar="none|sends|calls",
        help="libzmq calls to record, for each message's send time (decode: api_ts_ns, send_queue_delay_ns): "
             "`sends` (entry of the send calls), `calls` (entry and return of sends and receives) or `none`. Each "
             "probed call traps into the kernel, once per frame, and costs the job training time (README: what "
             "it costs).")] = "none",
    print_bpf: Annotated[bool, typer.Option("--print-bpf", **Flag, help="Print the eBPF objects' sources and build "
                                            "flags, and the settings they would be loaded with here, and exit.")] = False,
    rotate_mb: Annotated[Optional[int], typer.Option("--rotate-mb", **_OLD)] = None,
    max_disk_mb: Annotated[Optional[int], typer.Option("--max-disk-mb", **_OLD)] = None,
    buffer_mb: Annotated[Optional[int], typer.Option("--buffer-mb", **_OLD)] = None,
) -> None:
    """Capture packets and eBPF probe events beside a running job, until Ctrl-C / SIGTERM (root).

    Example: dlcsniff capture --iface eth0 --out /var/lib/dlcsniff/job1 --ports 9000-9300 --max-disk 20GB
    """
    with step("loaded the capture daemon's options"):
        from dlcsniff.sniffer.options import CaptureOptions, DaemonError, check_options, exec_daemon
        from dlcsniff.sniffer.probe_recorder import print_bpf_program

    rotate_bytes = _size("--rotate-size", rotate_size, "--rotate-mb", rotate_mb, _MB, 100 * _MB)
    max_disk_bytes = _size("--max-disk", max_disk, "--max-disk-mb", max_disk_mb, _MB, None)
    buffer_bytes = _size("--buffer-size", buffer_size, "--buffer-mb", buffer_mb, _MIB, 64 * _MIB)
    options = CaptureOptions(interface=iface or "", out_dir=out_dir or Path(), filter=filter_text, ports=ports,
                             snaplen=snaplen, rotate_bytes=rotate_bytes, max_disk_bytes=max_disk_bytes,
                             duration_s=duration, ebpf=not no_ebpf, user=user, libraries=tuple(lib or ()),
                             buffer_bytes=buffer_bytes,
                             full_payload=full_payload, zmq_events=zmq_events)
    if print_bpf:
        with step("read the eBPF objects"):
            program = print_bpf_program(options)
        print(program)
        return
    if iface is None or out_dir is None:
        fail("capture needs --iface and --out", EXIT_USAGE)
    try:
        with step("checked the options"):
            check_options(options)
    except DaemonError as exc:
        fail(str(exc), exc.exit_code)
    # The daemon runs as a process of its own, without this command line's libraries (sniffer/__main__.py);
    # it prints plain stderr lines, and after the switch to an unprivileged user it needs nothing (a lazily
    # imported module) it can no longer read.
    exec_daemon(options)


def _size(name: str, size: int | None, old_name: str, old_value: int | None, old_unit: int,
          default: int | None) -> int | None:
    """A size option's bytes, from its own spelling or from the deprecated one in a fixed unit."""
    if old_value is None:
        return default if size is None else size
    if size is not None:
        fail(f"{name} and {old_name} are the same option: give {name} only", EXIT_USAGE)
    warn(f"{old_name} is deprecated: give {name} {format_size(old_value * old_unit)}")
    return old_value * old_unit
