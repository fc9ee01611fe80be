"""`dlcsniff decode`: captures to the decode tables, and the summary it prints."""
from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from dlcsniff.cli.app import (Engine, Flag, Force, Json, SchedulerAddress, check_engine, command, detail, err, fail,
                              out, warn)


PROGRESS_MIN_BYTES = 8 << 20   # show a progress bar from this much input on


@command()
def decode(
    captures: Annotated[list[Path], typer.Argument(metavar="CAPTURE...", help="Capture files (pcap/pcapng, "
                                                   "optionally .gz) or directories of them: every node of one job.")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Output directory for the Parquet tables.")],
    as_json: Json = False,
    progress: Annotated[Optional[bool], typer.Option("--progress/--no-progress", **Flag,
                                                     help="Progress bar (default: on large inputs).")] = None,
    engine: Engine = "pandas",
    scheduler: SchedulerAddress = None,
    workers: Annotated[Optional[int], typer.Option(
        "--workers", min=0, metavar="N", help="Processes decoding captures in parallel (pandas: forked, 0 = none; "
        "dask: the local cluster's workers). Default: one per core, when it pays.")] = None,
    force: Force = False,
) -> None:
    """Decode captures into streams.parquet, zmtp.parquet, messages.parquet and nodes.parquet.

    Examples: dlcsniff decode pcaps/mxnet_sync --out out/mxnet_sync;
    dlcsniff decode pcaps/mxnet_sync --out out/mxnet_sync --engine dask --workers 2 (one Dask task per capture)
    """
    from dlcsniff.decoders.dask_cluster import ClusterError
    from dlcsniff.decoders.errors import CaptureError
    from dlcsniff.decoders.inputs.capture_set import expand_inputs
    from dlcsniff.decoders.job import decode_paths
    from dlcsniff.decoders.output_dir import InputDigests, OutputError, claim_output_dir

    check_engine(engine, scheduler)
    try:
        # everything about the output is checked before any decoding
        out_dir = claim_output_dir(out_dir, captures, force=force)
        digests = InputDigests([file for capture in expand_inputs(captures) for file in capture.files])
    except (CaptureError, OutputError) as exc:
        fail(str(exc))

    bar = None

    def progress_total(total: int):
        nonlocal bar
        show = progress if progress is not None else total >= PROGRESS_MIN_BYTES
        if not show:
            return None
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn
        bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                       TransferSpeedColumn(), TimeRemainingColumn(), console=err, transient=True)
        bar.start()
        task = bar.add_task("decoding", total=total)
        return lambda n: bar.advance(task, n)

    began = time.monotonic()
    try:
        if engine == "dask":
            from dlcsniff.decoders.dask_decode import decode_paths_dask
            dataset = decode_paths_dask(captures, scheduler=scheduler, workers=workers, progress_total=progress_total)
        else:
            dataset = decode_paths(captures, progress_total=progress_total, workers=workers)
    except (CaptureError, ClusterError) as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{exc.filename or ''}: {exc.strerror or exc}")
    finally:
        if bar is not None:
            bar.stop()
    detail(f"decoded {dataset.summary['packets']:,} packets in {time.monotonic() - began:.2f} s")
    from dlcsniff.decoders.output import write_decode_output
    began = time.monotonic()
    try:
        # The tables, and one timeline for the job: a message seen at both ends becomes one event
        # (events.parquet), and every capture's clock is aligned to a reference capture (clocks.parquet).
        job = write_decode_output(dataset, out_dir, inputs=digests.result(), command=sys.argv)
    except OutputError as exc:
        fail(str(exc))
    detail(f"wrote the tables, the job's timeline and the manifest in {time.monotonic() - began:.2f} s")
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
    from rich.table import Table

    for warning in summary["warnings"]:
        warn(warning)
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
              f"{summary['streams_with_holes']} flows; cut by the snaplen {summary['uncaptured_bytes']:,} B; "
              f"retransmitted {summary['retransmitted_bytes']:,} B; "
              f"{summary['midstream_streams']} flows started before the capture; "
              f"ZMTP resync skipped {summary['zmtp_lost_bytes']:,} B")
    if summary["zmtp_messages"] or summary["zmtp_commands"]:
        out.print(f"ZMTP: {summary['zmtp_messages']:,} messages, {summary['zmtp_commands']:,} commands")
    by_protocol = ", ".join(f"{proto} {n:,}" for proto, n in sorted(summary["messages_by_protocol"].items()))
    if by_protocol:
        pslite = (f"; ps-lite: {summary['control_messages']:,} control, {summary['nodes']} nodes, "
                  f"{summary['messages_without_node_ids']:,} without a sender or receiver id"
                  if "pslite" in summary["messages_by_protocol"] else "")
        out.print(f"messages by protocol: {by_protocol} ({summary['incomplete_messages']:,} incomplete{pslite})")
    elif not summary["dl_traffic"]:
        out.print("no deep-learning traffic found (no ZMTP/ps-lite, Gloo, TCPStore, NCCL or RoCE)")
    _print_unclaimed(summary["unclaimed"])
    if "processes" in summary:
        procs = summary["processes"]
        out.print(f"capture daemons: {procs['flows_with_pid']:,} flows with their process, "
                  f"{procs['messages_with_api_time']:,} messages with their libzmq call time")
        for warning in procs["warnings"]:
            warn(warning)
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
