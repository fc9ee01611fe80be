"""dlcsniff: thin typer commands over sniffer/, decoders/ and analysis/."""
from __future__ import annotations

import gc
import json
import sys
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from dlcsniff import __version__

app = typer.Typer(
    help="See what a distributed deep-learning job puts on the network, per tensor, without touching the job.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)

PROGRESS_MIN_BYTES = 8 << 20   # show a progress bar from this much input on


def _fail(message: str) -> None:
    err.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def _version(value: bool) -> None:
    if value:
        out.print(f"dlcsniff {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True,
                                                    help="Print the version and exit.")] = None,
) -> None:
    """Capture, decode and analyse distributed deep-learning traffic."""


Engine = Annotated[Literal["pandas", "dask"], typer.Option(
    "--engine", help="pandas: this machine's processes; dask: a Dask cluster (a local one unless --scheduler).")]
SchedulerAddress = Annotated[Optional[str], typer.Option(
    "--scheduler", help="Address of a running Dask scheduler (e.g. tcp://10.0.0.5:8786), for --engine dask; "
    "its workers must see the same files under the same absolute paths.")]


def _check_engine(engine: str, scheduler: Optional[str]) -> None:
    if scheduler is not None and engine != "dask":
        _fail("--scheduler needs --engine dask")


@app.command()
def decode(
    captures: Annotated[list[Path], typer.Argument(help="Capture files (pcap/pcapng, optionally .gz) or "
                                                   "directories of them: every node of one job.")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Output directory for the Parquet tables.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    progress: Annotated[Optional[bool], typer.Option("--progress/--no-progress",
                                                     help="Progress bar (default: on large inputs).")] = None,
    engine: Engine = "pandas",
    scheduler: SchedulerAddress = None,
    workers: Annotated[Optional[int], typer.Option(
        "--workers", help="Processes decoding captures in parallel (pandas: forked, 0 = none; dask: the local "
        "cluster's workers). Default: one per core, when it pays.")] = None,
) -> None:
    """Decode captures into streams.parquet, zmtp.parquet, messages.parquet and nodes.parquet.

    Examples: dlcsniff decode pcaps/mxnet_sync --out out/mxnet_sync;
    dlcsniff decode pcaps/mxnet_sync --out out/mxnet_sync --engine dask --workers 2 (one Dask task per capture)
    """
    from dlcsniff.decoders.dask_cluster import ClusterError
    from dlcsniff.decoders.dask_decode import decode_paths_dask
    from dlcsniff.decoders.errors import CaptureError
    from dlcsniff.decoders.job import decode_paths

    _check_engine(engine, scheduler)

    bar = None

    def progress_total(total: int):
        nonlocal bar
        show = progress if progress is not None else total >= PROGRESS_MIN_BYTES
        if not show:
            return None
        bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                       TransferSpeedColumn(), TimeRemainingColumn(), console=err, transient=True)
        bar.start()
        task = bar.add_task("decoding", total=total)
        return lambda n: bar.advance(task, n)

    try:
        if engine == "dask":
            dataset = decode_paths_dask(captures, scheduler=scheduler, workers=workers, progress_total=progress_total)
        else:
            dataset = decode_paths(captures, progress_total=progress_total, workers=workers)
    except (CaptureError, ClusterError) as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"{exc.filename or ''}: {exc.strerror or exc}")
    finally:
        if bar is not None:
            bar.stop()
    from dlcsniff.decoders.output import OutputError, write_decode_output
    try:
        # The tables, and one timeline for the job: a message seen at both ends becomes one event
        # (events.parquet), and every capture's clock is aligned to a reference capture (clocks.parquet).
        job = write_decode_output(dataset, out_dir, inputs=captures, command=sys.argv)
    except OutputError as exc:
        _fail(str(exc))
    summary = dataset.summary
    summary["out"] = str(out_dir)
    summary["job_view"] = job
    if as_json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        _print_decode_summary(summary, dataset.tables)
    # What is left is the interpreter's exit: spare its last garbage collection the walk over every object
    # the decode made (a quarter of a second on a large capture).
    gc.freeze()


def _print_decode_summary(summary: dict, tables: dict) -> None:
    for warning in summary["warnings"]:
        err.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    table = Table(title="capture", title_justify="left")
    for col in ("capture", "packets", "non-TCP", "undecoded msgs"):
        table.add_column(col, justify="right" if col != "capture" else "left")
    for cap in summary["captures"]:
        table.add_row(cap["capture"], f"{cap['packets']:,}", f"{cap['non_tcp_packets']:,}",
                      f"{cap['undecoded_messages']:,}")
    out.print(table)
    flows = ", ".join(f"{proto} {n}" for proto, n in sorted(summary["flows_by_protocol"].items())) or "none"
    out.print(f"flows (TCP directions) by protocol: {flows}")
    out.print(f"TCP payload {summary['tcp_bytes']:,} B; capture holes {summary['missing_bytes']:,} B in "
              f"{summary['streams_with_holes']} flows; cut by the snaplen {summary['uncaptured_bytes']:,} B; retransmitted {summary['retransmitted_bytes']:,} B; "
              f"{summary['midstream_streams']} flows started before the capture; "
              f"ZMTP resync skipped {summary['zmtp_lost_bytes']:,} B")
    out.print(f"ZMTP: {summary['zmtp_messages']:,} messages, {summary['zmtp_commands']:,} commands")
    by_protocol = ", ".join(f"{proto} {n:,}" for proto, n in sorted(summary["messages_by_protocol"].items()))
    out.print(f"messages by protocol: {by_protocol or 'none'} ({summary['incomplete_messages']:,} incomplete; "
              f"ps-lite: {summary['control_messages']:,} control, {summary['nodes']} nodes, "
              f"{summary['messages_without_node_ids']:,} without a sender or receiver id)")
    if "processes" in summary:
        procs = summary["processes"]
        out.print(f"capture daemons: {procs['flows_with_pid']:,} flows with their process, "
                  f"{procs['messages_with_api_time']:,} messages with their libzmq call time")
        for warning in procs["warnings"]:
            err.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    if summary["roce"]:
        out.print("RoCE: " + ", ".join(f"{name.replace('_', ' ')} {n:,}" for name, n in summary["roce"].items()))
    if summary["collectives_by_kind"]:
        out.print("collectives: " + ", ".join(f"{kind} {n:,}" for kind, n in summary["collectives_by_kind"].items()))
    messages = tables["messages"].select(
        ["protocol", "control_cmd", "keys", "push", "pull", "request", "sender_role", "recver_role", "size_bytes",
         "tensor_key"]).to_pandas()
    kv = messages[(messages["protocol"] == "pslite") & messages["control_cmd"].isna()
                  & messages["keys"].map(lambda keys: keys is not None and len(keys) > 0)]
    if len(kv):
        kinds = Table(title="ps-lite KV traffic", title_justify="left")
        for col in ("sender", "recver", "kind", "messages", "bytes", "tensors"):
            kinds.add_column(col, justify="left" if col in ("sender", "recver", "kind") else "right")
        kind = (kv["push"].map({True: "push", False: ""}) + kv["pull"].map({True: "+pull", False: ""})).str.strip(
            "+").where(lambda s: s != "", "other") + kv["request"].map({True: " request", False: " response"})
        grouped = kv.assign(kind=kind).groupby(["sender_role", "recver_role", "kind"], dropna=False).agg(
            messages=("size_bytes", "size"), bytes=("size_bytes", "sum"), tensors=("tensor_key", "nunique"))
        for (snd, rcv, k), row in grouped.iterrows():
            kinds.add_row(str(snd), str(rcv), k, f"{row['messages']:,}", f"{row['bytes']:,}", f"{row['tensors']:,}")
        out.print(kinds)
    job = summary["job_view"]
    if job["events"]:
        losses = job["losses"]
        out.print(f"job view: {job['events']:,} events from {losses['observations']:,} observations "
                  f"({losses['events_seen_at_both_ends']:,} seen at both ends); clocks aligned to "
                  f"{job['reference']}: " + ", ".join(
                      f"{c['capture']} {c['offset_ns'] / 1000:+.1f} µs ±{c['error_bound_ns'] / 1000:.1f}"
                      for c in job["clocks"] if c["aligned"] and c["capture"] != job["reference"]))
    out.print(f"wrote {', '.join(f'{n}.parquet' for n in (*tables, 'events', 'clocks'))} and manifest.json to "
              f"{summary['out']}")


# --- analysis (issue 3): DLC traces, SketchDLC statistics, the HTML report ---------------------------------

DecodeDir = Annotated[Path, typer.Argument(help="The --out directory of `dlcsniff decode`.")]


@app.command()
def dlc(
    decode_dir: DecodeDir,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Directory for the trace files.")],
) -> None:
    """Write every node's DLC trace (SketchDLC format): worker<rank>.txt, server<rank>.txt, scheduler.txt.

    Example: dlcsniff dlc out/mxnet_sync --out out/mxnet_sync/dlc
    """
    from dlcsniff.analysis import AnalysisError, write_dlc_traces

    try:
        with err.status("building the DLC traces"):
            trace, files = write_dlc_traces(decode_dir, out_dir)
    except AnalysisError as exc:
        _fail(str(exc))
    table = Table(title=f"DLC traces in {out_dir} (kvstore {trace.mode})", title_justify="left")
    for col in ("file", "node", "records", "seen from"):
        table.add_column(col, justify="right" if col == "records" else "left")
    for written in files:
        seen = f"own capture {written.captures}" if written.vantage == "own" else f"peers: {written.captures}"
        table.add_row(written.path.name, written.node, f"{written.records:,}", seen)
    out.print(table)


@app.command()
def stats(
    decode_dir: DecodeDir,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Directory for the statistics tables.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print summary.json instead of the tables.")] = False,
    engine: Engine = "pandas",
    scheduler: SchedulerAddress = None,
    workers: Annotated[Optional[int], typer.Option(
        "--workers", help="Workers of the local Dask cluster (--engine dask; default: one per core, at most "
        "3, the statistics' parallel branches).")] = None,
) -> None:
    """Per-iteration phases, per-key server overheads and the communication pattern (SketchDLC's statistics);
    time, bandwidth, skew, traffic matrices and overlap of collective operations.

    Writes iterations.parquet, keys.parquet, sizes.parquet, traffic.parquet, volume_iterations.parquet,
    volume_keys.parquet (ps-lite jobs), collective_stats.parquet, collective_ranks.parquet,
    collective_traffic.parquet, collective_concurrency.parquet, collective_overlap.parquet (collective jobs)
    and summary.json. Examples: dlcsniff stats out/mxnet_sync --out out/mxnet_sync/stats;
    dlcsniff stats out/gloo --out out/gloo/stats; dlcsniff stats out/mxnet_sync --out out/mxnet_sync/stats --engine dask
    """
    from dlcsniff.analysis import AnalysisError, headline, summary_json, write_statistics
    from dlcsniff.analysis.collective_stats import KIND_TABLE_HEADER, collective_headline, collective_kind_rows
    from dlcsniff.analysis.dask_stats import write_statistics_dask
    from dlcsniff.decoders.dask_cluster import ClusterError

    _check_engine(engine, scheduler)
    if workers is not None and engine != "dask":
        _fail("--workers needs --engine dask (the pandas statistics run in this process)")
    try:
        with err.status("computing the statistics"):
            if engine == "dask":
                result = write_statistics_dask(decode_dir, out_dir, scheduler=scheduler, workers=workers)
            else:
                result = write_statistics(decode_dir, out_dir)
    except (AnalysisError, ClusterError) as exc:
        _fail(str(exc))
    if as_json:
        print(summary_json(result))
        return
    if "statistics" in result.summary:
        figures = Table(title=f"SketchDLC figures of {decode_dir}", title_justify="left")
        figures.add_column("metric")
        figures.add_column("value", justify="right")
        for metric, value in headline(result.summary):
            figures.add_row(metric, value)
        out.print(figures)
        spread = Table(title="distribution", title_justify="left")
        for col in ("statistic", "count", "mean", "p50", "p99", "max"):
            spread.add_column(col, justify="left" if col == "statistic" else "right")
        for name, found in result.summary["statistics"].items():
            if found is None:
                spread.add_row(name, "0", "n/a", "n/a", "n/a", "n/a")
            else:
                spread.add_row(name, str(found["count"]), *(f"{found[k]:.4g}" for k in ("mean", "p50", "p99", "max")))
        out.print(spread)
    if "collectives" in result.summary:
        collectives = Table(title=f"collectives of {decode_dir}", title_justify="left")
        collectives.add_column("metric")
        collectives.add_column("value", justify="right")
        for metric, value in collective_headline(result.summary["collectives"]):
            collectives.add_row(metric, value)
        out.print(collectives)
        kinds = Table(title="per kind (busbw as nccl-tests; skew across ranks)", title_justify="left")
        for col in KIND_TABLE_HEADER:
            kinds.add_column(col, justify="left" if col == "kind" else "right")
        for row in collective_kind_rows(result.summary["collectives"]):
            kinds.add_row(*row)
        out.print(kinds)
    losses = ", ".join(f"{name.replace('_', ' ')} {value:,}" for name, value in result.summary["losses"].items())
    out.print(f"{losses}\nwrote the tables and summary.json to {out_dir}")


@app.command()
def report(
    decode_dir: DecodeDir,
    out_path: Annotated[Path, typer.Option("--out", "-o", help="The HTML file to write.")],
    figures_dir: Annotated[Optional[Path], typer.Option("--figures", help="Also write every figure as "
                                                        "FIGURES/<name>.png.")] = None,
) -> None:
    """One self-contained HTML report (figures embedded) of a decoded job.

    Example: dlcsniff report out/mxnet_sync --out out/mxnet_sync/report.html
    """
    from dlcsniff.analysis import AnalysisError, write_html_report

    try:
        with err.status("drawing the report"):
            written = write_html_report(decode_dir, out_path, figures_dir)
    except AnalysisError as exc:
        _fail(str(exc))
    out.print(f"wrote {written}")


@app.command()
def capture(
    iface: Annotated[Optional[str], typer.Option("--iface", "-i", help="Interface to capture on (`any`: all).")] = None,
    out_dir: Annotated[Optional[Path], typer.Option("--out", "-o", help="Capture directory (created 0700; a "
                                                    "restart adds a new file set).")] = None,
    filter_text: Annotated[Optional[str], typer.Option("--filter", help="pcap filter expression.")] = None,
    ports: Annotated[Optional[str], typer.Option("--ports", help="Only these TCP ports, e.g. 9091,9100-9200.")] = None,
    snaplen: Annotated[int, typer.Option("--snaplen", help="Bytes kept per packet (0: whole packets).")] = 0,
    rotate_mb: Annotated[int, typer.Option("--rotate-mb", help="Start a new capture file every N MB.")] = 100,
    max_disk_mb: Annotated[Optional[int], typer.Option("--max-disk-mb", help="Disk budget of the directory in MB, "
                                                       "never exceeded: the capture stops when it is used up.")] = None,
    duration: Annotated[Optional[float], typer.Option("--duration", help="Stop after this many seconds.")] = None,
    no_ebpf: Annotated[bool, typer.Option("--no-ebpf", help="Packets only: no eBPF probes.")] = False,
    user: Annotated[Optional[str], typer.Option("--user", help="User to run as once the capture is open "
                                                "(default: tcpdump, else nobody).")] = None,
    lib: Annotated[Optional[list[Path]], typer.Option("--lib", help="Also probe this libzmq/libnccl (or a library "
                                                      "embedding it) from the start; repeatable.")] = None,
    buffer_mb: Annotated[int, typer.Option("--buffer-mb", help="Kernel capture ring in MiB.")] = 64,
    full_payload: Annotated[bool, typer.Option("--full-payload", help="Record every byte of every packet. By "
                                               "default an eBPF filter cuts the values of large ZMTP data "
                                               "frames (over 64 KiB) in the kernel; decoding needs none of "
                                               "them.")] = False,
    print_bpf: Annotated[bool, typer.Option("--print-bpf", help="Print the eBPF program and its compiler flags "
                                            "as they would be used here, and exit.")] = False,
) -> None:
    """Capture packets and eBPF probe events beside a running job, until Ctrl-C / SIGTERM (root).

    Example: dlcsniff capture --iface eth0 --out /var/lib/dlcsniff/job1 --ports 9000-9300 --max-disk-mb 20000
    """
    from dlcsniff.sniffer.daemon import CaptureError, CaptureOptions, print_bpf_program, run_capture

    if print_bpf:
        print(print_bpf_program())
        return
    if iface is None or out_dir is None:
        err.print("[bold red]error:[/] capture needs --iface and --out", highlight=False)
        raise typer.Exit(2)
    options = CaptureOptions(interface=iface, out_dir=out_dir, filter=filter_text, ports=ports, snaplen=snaplen,
                             rotate_mb=rotate_mb, max_disk_mb=max_disk_mb, duration_s=duration, ebpf=not no_ebpf,
                             user=user, libraries=tuple(lib or ()), buffer_mb=buffer_mb, full_payload=full_payload)
    try:
        # The daemon's own plain stderr lines: after the switch to an unprivileged user it must not need
        # anything (a lazily imported module) it can no longer read.
        result = run_capture(options)
    except CaptureError as exc:
        err.print(f"[bold red]error:[/] {exc}", highlight=False)
        raise typer.Exit(exc.exit_code) from None
    except OSError as exc:
        _fail(f"{exc.filename or ''}: {exc.strerror or exc}")
    raise typer.Exit(result.exit_code)


# --- exports (issue 6): Chrome trace event JSON, MLCommons Chakra execution traces --------------------------

@app.command()
def export(
    decode_dir: DecodeDir,
    export_format: Annotated[Literal["chrome", "chakra"], typer.Option(
        "--format", "-f", help="chrome: one JSON file for Perfetto / chrome://tracing; chakra: one "
        "<job>.<rank>.et file per rank for ASTRA-sim.")],
    out_path: Annotated[Path, typer.Option("--out", "-o", help="The JSON file (chrome) or the directory of .et "
                                           "files (chakra).")],
) -> None:
    """Export a decoded job for other tools: a Chrome trace (one timeline of every node) or Chakra traces.

    Examples: dlcsniff export out/mxnet_sync --format chrome --out out/mxnet_sync/trace.json;
    dlcsniff export out/mxnet_sync --format chakra --out out/mxnet_sync/chakra
    """
    from dlcsniff.analysis import AnalysisError
    from dlcsniff.analysis.export_chakra import write_chakra_traces
    from dlcsniff.analysis.export_chrome import write_chrome_trace

    try:
        with err.status(f"writing the {export_format} export"):
            if export_format == "chrome":
                found = write_chrome_trace(decode_dir, out_path)
            else:
                written = write_chakra_traces(decode_dir, out_path)
    except AnalysisError as exc:
        _fail(str(exc))
    if export_format == "chrome":
        out.print(f"wrote {out_path}: {found.message_events:,} message events, {found.flows:,} flows, "
                  f"{found.iterations:,} worker iterations (open it in Perfetto or chrome://tracing)")
        losses = found.losses
    else:
        table = Table(title=f"Chakra traces in {out_path} (ASTRA-sim workload prefix {written.prefix})",
                      title_justify="left")
        for col in ("file", "node", "nodes", "send/recv", "compute", "collective"):
            table.add_column(col, justify="left" if col in ("file", "node") else "right")
        for file in written.files:
            table.add_row(file.path.name, file.node, f"{file.nodes:,}", f"{file.comm_nodes:,}",
                          f"{file.comp_nodes:,}", f"{file.coll_nodes:,}")
        out.print(table)
        losses = written.losses
    out.print(", ".join(f"{name.replace('_', ' ')} {value:,}" for name, value in losses.items()))
