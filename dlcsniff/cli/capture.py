"""`dlcsniff capture`: the capture daemon."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from dlcsniff.cli.app import Flag, command, err


@command()
def capture(
    iface: Annotated[Optional[str], typer.Option("--iface", "-i", help="Interface to capture on (`any`: all).")] = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", "-o", help="Capture directory (created 0700; a "
                                                    "restart adds a new file set).")] = None,
    filter_text: Annotated[Optional[str], typer.Option("--filter", help="pcap filter expression.")] = None,
    ports: Annotated[Optional[str], typer.Option("--ports", help="Only these TCP ports, e.g. 9091,9100-9200.")] = None,
    # ranges are checked by the daemon's options (sniffer/options.py), with its exit code for bad options
    snaplen: Annotated[int, typer.Option("--snaplen", metavar="BYTES",
                                         help="Bytes kept per packet (0: whole packets).")] = 0,
    rotate_mb: Annotated[int, typer.Option("--rotate-mb", metavar="MB",
                                           help="Start a new capture file every N MB.")] = 100,
    max_disk_mb: Annotated[Optional[int], typer.Option(
        "--max-disk-mb", metavar="MB",
        help="Disk budget of the directory in MB, never exceeded: the capture stops when it is used up.")] = None,
    duration: Annotated[Optional[float], typer.Option("--duration", metavar="SECONDS",
                                                      help="Stop after this many seconds.")] = None,
    no_ebpf: Annotated[bool, typer.Option("--no-ebpf", **Flag, help="Packets only: no eBPF probes.")] = False,
    user: Annotated[Optional[str], typer.Option("--user", help="User to run as once the capture is open "
                                                "(default: tcpdump, else nobody).")] = None,
    lib: Annotated[Optional[list[Path]], typer.Option("--lib", help="Also probe this libzmq/libnccl (or a library "
                                                      "embedding it) from the start; repeatable.")] = None,
    buffer_mb: Annotated[int, typer.Option("--buffer-mb", metavar="MIB", help="Kernel capture ring in MiB.")] = 64,
    full_payload: Annotated[bool, typer.Option("--full-payload", **Flag, help="Record every byte of every packet. By "
                                               "default an eBPF filter cuts the values of large ZMTP data "
                                               "frames (over 64 KiB) in the kernel; decoding needs none of "
                                               "them.")] = False,
    zmq_events: Annotated[str, typer.Option(
        "--zmq-events", metavar="none|sends|calls",
        help="libzmq calls to record, for each message's send time (decode: api_ts_ns, send_queue_delay_ns). Each "
             "probed call traps into the kernel, once per frame: on the 5-node MXNet MLP job `sends` (entry of the "
             "send calls) and `calls` (entry and return of sends and receives) cost up to about 7 and 10 points "
             "of training time more than `none` here (make bench; README: what it costs); `none` records "
             "none.")] = "none",
    print_bpf: Annotated[bool, typer.Option("--print-bpf", **Flag, help="Print the eBPF program and its compiler flags "
                                            "as they would be used here, and exit.")] = False,
) -> None:
    """Capture packets and eBPF probe events beside a running job, until Ctrl-C / SIGTERM (root).

    Example: dlcsniff capture --iface eth0 --out /var/lib/dlcsniff/job1 --ports 9000-9300 --max-disk-mb 20000
    """
    from dlcsniff.sniffer.options import CaptureOptions, DaemonError, check_options, exec_daemon
    from dlcsniff.sniffer.probe_recorder import print_bpf_program

    options = CaptureOptions(interface=iface or "", out_dir=out_dir or Path(), filter=filter_text, ports=ports,
                             snaplen=snaplen, rotate_mb=rotate_mb, max_disk_mb=max_disk_mb, duration_s=duration,
                             ebpf=not no_ebpf, user=user, libraries=tuple(lib or ()), buffer_mb=buffer_mb,
                             full_payload=full_payload, zmq_events=zmq_events)
    if print_bpf:
        print(print_bpf_program(options))
        return
    if iface is None or out_dir is None:
        err.print("[bold red]error:[/] capture needs --iface and --out", highlight=False)
        raise typer.Exit(2)
    try:
        check_options(options)
    except DaemonError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(exc.exit_code) from None
    # The daemon runs as a process of its own, without this command line's libraries (sniffer/__main__.py);
    # it prints plain stderr lines, and after the switch to an unprivileged user it needs nothing (a lazily
    # imported module) it can no longer read.
    exec_daemon(options)
