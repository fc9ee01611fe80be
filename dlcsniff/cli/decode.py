"""`dlcsniff decode`: captures to the decode tables, and the summary it prints."""
from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from dlcsniff.cli.app import (Engine, Flag, Force, Json, SchedulerAddress, as_program, check_engine, command, err,
                              fail, out, step, took, warn)


PROGRESS_MIN_BYTES = 8 << 20   # show a progress bar from this much input on (and always for a stream: no size)


@command(renamed={"--workers": "--processes"})
def decode(
    captures: Annotated[list[Path], typer.Argument(
        metavar="CAPTURE...", help="Capture files (pcap/pcapng, optionally gzip, xz or zstd compressed; the pieces "
        "of a rotated or split capture become one node's capture), directories of them, - (standard input) or "
        "fifos: every node of one job.")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Output directory for the Parquet tables.")],
    as_json: Json = False,
    progress: Annotated[Optional[bool], typer.Option("--progress/--no-progress", **Flag,
                                                     help="Progress bar (default: on large inputs).")] = None,
    engine: Engine = "pandas",
    scheduler: SchedulerAddress = None,
    processes: Annotated[Optional[int], typer.Option(
        "--processes", min=0, metavar="N", help="Processes decoding captures in parallel (pandas: forked, 0 = "
        "none; dask: the local cluster's workers). Default: one per core, when it pays.")] = None,
    filter_expr: Annotated[Optional[str], typer.Option(
        "--filter", "-f", metavar="EXPR", help="Decode only the packets this pcap filter expression (tcpdump's "
        "syntax, compiled by libpcap) keeps, e.g. 'tcp port 9000 or udp port 4791'.")] = None,
    start: Annotated[Optional[str], typer.Option(
        "--start", metavar="TIME", help="Decode only packets from this time on: epoch seconds, ISO 8601 (no zone: "
        "local time), or a duration after the start of the capture (its earliest first packet), with its unit: "
        "+2.8s, +720ms (ns, us, ms, s, min, h).")] = None,
    end: Annotated[Optional[str], typer.Option(
        "--end", metavar="TIME", help="Decode only packets before this time (same forms as --start; +N counts from "
        "the start of the capture too).")] = None,
    force: Force = False,
) -> None:
    """Decode captures into streams.parquet, zmtp.parquet, messages.parquet and nodes.parquet.

    Examples: dlcsniff decode pcaps/mxnet_sync --out out/mxnet_sync;
    dlcsniff decode pcaps/mxnet_sync --out out/mxnet_sync --engine dask --processes 2 (one Dask task per capture);
    dlcsniff decode pcaps/mxnet_sync --out out/window --filter 'tcp port 9100' --start +2.8s --end +3s;
    gzip -dc pcaps/zmq/client.pcap.gz | dlcsniff decode - --out out/stdin
    """
    # Before pyarrow loads: its default pool (mimalloc) kept 5-12 MB more resident than the C library's malloc,
    # for the few MB of tables a decode holds; a user's own ARROW_DEFAULT_MEMORY_POOL wins.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    with step("loaded the decoders"):
        from dlcsniff.decoders.decode_run import decode_to_dir
        from dlcsniff.decoders.errors import CaptureError, ClusterError
        from dlcsniff.decoders.inputs.selection import packet_selection
        from dlcsniff.decoders.output_dir import OutputError

    check_engine(engine, scheduler)
    if engine == "pandas" and as_program():
        # the program's own process, whose decoders hand pyarrow no pandas object (Dask's do; a caller's may)
        from dlcsniff.decoders.arrow_without_pandas import skip_pandas
        skip_pandas()
    try:
        selection = packet_selection(filter_expr, start, end)
    except ValueError as exc:
        fail(f"--start/--end: {exc}")
    if any(str(path) == "-" for path in captures) and sys.stdin.isatty():
        fail("-: standard input is a terminal; pipe a capture into it (tcpdump -w - ... | dlcsniff decode -)")

    bar = None

    def progress_total(total: int | None):
        nonlocal bar
        show = progress if progress is not None else total is None or total >= PROGRESS_MIN_BYTES
        if not show:
            return None
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn
        bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                       TransferSpeedColumn(), TimeRemainingColumn(), console=err, transient=True)
        bar.start()
        task = bar.add_task("decoding", total=total)
        return lambda n: bar.advance(task, n)

    try:
        # the output is claimed before any decoding; the tables, and one timeline for the job (a message seen at
        # both ends becomes one event, every capture's clock aligned to a reference capture), after it
        run = decode_to_dir(captures, out_dir, force=force, engine=engine, scheduler=scheduler, workers=processes,
                            selection=selection, progress_total=progress_total, command=sys.argv,
                            meanwhile=_load_summary_printer)
    except (CaptureError, ClusterError, OutputError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{exc.filename or ''}: {exc.strerror or exc}")
    finally:
        if bar is not None:
            bar.stop()
    took(f"decoded {run.dataset.summary['packets']:,} packets", run.decode_s)
    took("wrote the tables, the job's timeline and the manifest", run.write_s)
    summary = run.dataset.summary
    summary["out"] = str(run.out_dir)
    summary["job_view"] = run.job_view
    with step("printed the summary"):
        if as_json:
            print(json.dumps(summary, indent=2, default=str))
        else:
            _print_decode_summary(summary, run.dataset)
    # What is left is the interpreter's exit: spare its last garbage collection the walk over every object
    # the decode made (a quarter of a second on a large capture).
    gc.freeze()


def _load_summary_printer() -> None:
    """Import what printing the summary uses, e.g. while workers decode."""
    import rich.table  # noqa: F401

    from dlcsniff.decoders import losses  # noqa: F401


def _print_decode_summary(summary: dict, dataset) -> None:
    from rich.table import Table

    from dlcsniff.decoders.arrow_numpy import take_rows
    from dlcsniff.decoders.losses import says_losses
    from dlcsniff.decoders.protocols import protocol_says, protocol_summary_tables

    for warning in summary["warnings"]:
        warn(warning)
    selection = summary["selection"]
    pieces = any(len(cap["files"]) > 1 for cap in summary["captures"])
    table = Table(title="capture", title_justify="left")
    for col in ("capture", *(["files"] if pieces else []), "packets", *(["decoded"] if selection else []),
                "non-TCP", "undecoded msgs"):
        table.add_column(col, justify="right" if col != "capture" else "left")
    for cap in summary["captures"]:
        table.add_row(cap["capture"], *([f"{len(cap['files'])}"] if pieces else []), f"{cap['packets']:,}",
                      *([f"{cap['packets_decoded']:,}"] if selection else []), f"{cap['non_tcp_packets']:,}",
                      f"{cap['undecoded_messages']:,}")
    out.print(table)
    if selection:
        window = " ".join(f"{name} {bound['given']}" for name, bound in (("from", selection["start"]),
                                                                          ("to", selection["end"])) if bound)
        what = "; ".join(filter(None, [f"filter {selection['filter']!r}" if selection["filter"] is not None else "",
                                       f"window {window}" if window else ""]))
        out.print(f"decoded {summary['packets_decoded']:,} of {summary['packets']:,} packets ({what})")
    says = protocol_says(summary)       # each protocol's words (decoders.protocols.job_step)
    flows = ", ".join(f"{proto} {n}" for proto, n in sorted(summary["flows_by_protocol"].items())) or "none"
    kinds = "TCP directions" + "".join(says["flow_kinds"])
    out.print(f"flows ({kinds}) by protocol: {flows}")
    out.print(f"TCP payload {summary['tcp_bytes']:,} B; capture holes {summary['missing_bytes']:,} B in "
              f"{summary['streams_with_holes']} flows; cut by the snaplen {summary['uncaptured_bytes']:,} B; "
              f"retransmitted {summary['retransmitted_bytes']:,} B; "
              f"{summary['midstream_streams']} flows started before the capture")
    for line in says["framing"]:
        out.print(line)
    by_protocol = ", ".join(f"{proto} {n:,}" for proto, n in sorted(summary["messages_by_protocol"].items()))
    if by_protocol:
        observations = ", ".join(f"{proto} {n:,}" for proto, n in sorted(summary["observations_by_protocol"].items()))
        out.print(f"messages by protocol, each once: {by_protocol} ({summary['incomplete_messages']:,} "
                  f"incomplete{''.join(says['messages'])}); seen by the captures {summary['observations']:,} times "
                  f"({observations})")
    elif not summary["dl_traffic"]:
        out.print("no deep-learning traffic found (no ZMTP/ps-lite, Gloo, TCPStore, NCCL or RoCE)")
    if summary["losses_by_protocol"]:
        out.print(f"losses by protocol: {says_losses(summary['losses_by_protocol'])}")
    _print_unclaimed(summary["unclaimed"])
    if "processes" in summary:
        procs = summary["processes"]
        out.print(f"capture daemons: {procs['flows_with_pid']:,} flows with their process, "
                  f"{procs['messages_with_api_time']:,} messages with their libzmq call time")
        for warning in procs["warnings"]:
            warn(warning)
    for line in says["counters"]:
        out.print(line)
    if summary["collectives_by_kind"]:
        out.print("collectives: " + ", ".join(f"{kind} {n:,}" for kind, n in summary["collectives_by_kind"].items()))
    # the job's messages once: each event's fields, from the observation it takes them from
    once = take_rows(dataset.tables["messages"], dataset.view.events["message_row"].to_numpy())
    for said in protocol_summary_tables(once):
        table = Table(title=said.title, title_justify="left")
        for name, left in said.columns:
            table.add_column(name, justify="left" if left else "right")
        for row in said.rows:
            table.add_row(*row)
        out.print(table)
    job = summary["job_view"]
    if job["events"]:
        losses = job["losses"]
        by_reference: dict[str, list[str]] = {job["reference"]: []}      # one reference per job
        for c in job["clocks"]:
            if c["aligned"] and c["capture"] != c["reference"]:
                by_reference.setdefault(c["reference"], []).append(
                    # analysis.display's unit (µs), its digits grouped: a capture seconds off reads +3,999,659.3 µs
                    f"{c['capture']} {c['offset_ns'] / 1000:+,.1f} µs ±{c['error_bound_ns'] / 1000:,.1f} µs")
        aligned = [f"to {reference}: {', '.join(shown)}" for reference, shown in by_reference.items() if shown]
        # a reference nothing was aligned to (one capture alone, or a job of one capture) keeps its own clock
        alone = [f"{reference} on its own clock (no other capture to align with it)"
                 for reference, shown in by_reference.items() if not shown]
        out.print(f"job view: {job['events']:,} events from {losses['observations']:,} observations "
                  f"({losses['events_seen_at_both_ends']:,} seen at both ends); "
                  + "; ".join((["clocks aligned " + "; ".join(aligned)] if aligned else []) + alone))
    out.print(f"wrote {', '.join(f'{n}.parquet' for n in (*dataset.tables, 'events', 'clocks'))} and manifest.json to "
              f"{summary['out']}")


def _print_unclaimed(unclaimed: dict) -> None:
    def ports(counts: dict) -> str:
        return ", ".join(f"{port} ×{n:,}" for port, n in counts.items())

    seen = []
    if unclaimed["tcp_connections"]:
        seen.append(f"{unclaimed['tcp_connections']:,} TCP connections ({unclaimed['tcp_bytes']:,} B; service ports "
                    f"{ports(unclaimed['tcp_ports'])})")
    if unclaimed["udp_datagrams"]:
        seen.append(f"{unclaimed['udp_datagrams']:,} UDP datagrams (ports {ports(unclaimed['udp_ports'])})")
    if unclaimed["other_packets"]:
        seen.append(f"{unclaimed['other_packets']:,} other packets (neither TCP nor UDP)")
    if seen:
        out.print("not of any protocol dlcsniff decodes: " + "; ".join(seen))
