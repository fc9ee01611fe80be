"""dlcsniff: thin typer commands over sniffer/, decoders/ and analysis/."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

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


@app.command()
def decode(
    captures: Annotated[list[Path], typer.Argument(help="Capture files (pcap/pcapng, optionally .gz) or "
                                                   "directories of them: every node of one job.")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Output directory for the Parquet tables.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    progress: Annotated[Optional[bool], typer.Option("--progress/--no-progress",
                                                     help="Progress bar (default: on large inputs).")] = None,
) -> None:
    """Decode captures into streams.parquet, zmtp.parquet, messages.parquet and nodes.parquet.

    Example: dlcsniff decode pcaps/mxnet_sync --out out/mxnet_sync
    """
    from decoders.capture import CaptureError
    from decoders.dataset import write_dataset
    from decoders.pipeline import decode_paths

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
        dataset = decode_paths(captures, progress_total=progress_total)
    except CaptureError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"{exc.filename or ''}: {exc.strerror or exc}")
    finally:
        if bar is not None:
            bar.stop()
    try:
        write_dataset(dataset.tables, out_dir)
    except OSError as exc:
        _fail(f"cannot write to {out_dir}: {exc.strerror or exc}")
    summary = dataset.summary
    summary["out"] = str(out_dir)
    if as_json:
        print(json.dumps(summary, indent=2, default=str))
        return
    _print_decode_summary(summary, dataset.tables)


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
              f"{summary['streams_with_holes']} flows; retransmitted {summary['retransmitted_bytes']:,} B; "
              f"{summary['midstream_streams']} flows started before the capture; "
              f"ZMTP resync skipped {summary['zmtp_lost_bytes']:,} B")
    out.print(f"ZMTP: {summary['zmtp_messages']:,} messages, {summary['zmtp_commands']:,} commands")
    out.print(f"ps-lite: {summary['messages']:,} messages ({summary['control_messages']:,} control, "
              f"{summary['incomplete_messages']:,} incomplete) between {summary['nodes']} nodes")
    messages = tables["messages"].to_pandas()
    kv = messages[messages["control_cmd"].isna() & messages["keys"].map(len).gt(0)]
    if len(kv):
        kinds = Table(title="ps-lite KV traffic", title_justify="left")
        for col in ("sender", "recver", "kind", "messages", "bytes", "tensors"):
            kinds.add_column(col, justify="left" if col in ("sender", "recver", "kind") else "right")
        kind = (kv["push"].map({True: "push", False: ""}) + kv["pull"].map({True: "pull", False: ""})).where(
            lambda s: s != "", "other") + kv["request"].map({True: " request", False: " response"})
        grouped = kv.assign(kind=kind).groupby(["sender_role", "recver_role", "kind"], dropna=False).agg(
            messages=("size_bytes", "size"), bytes=("size_bytes", "sum"), tensors=("tensor_key", "nunique"))
        for (snd, rcv, k), row in grouped.iterrows():
            kinds.add_row(str(snd), str(rcv), k, f"{row['messages']:,}", f"{row['bytes']:,}", f"{row['tensors']:,}")
        out.print(kinds)
    out.print(f"wrote {', '.join(f'{n}.parquet' for n in tables)} to {summary['out']}")
