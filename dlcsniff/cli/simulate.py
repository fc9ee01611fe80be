"""`dlcsniff simulate`: replay a decoded job on a network simulator, as captured or on another network."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from rich.table import Table

from dlcsniff.cli.app import DecodeDir, Flag, Force, command, detail, err, fail, out

_RATE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgt]?)(?:bit|b)?(?:/s|ps)?\s*$", re.IGNORECASE)
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(ns|us|µs|ms|s)?\s*$", re.IGNORECASE)
_RATE_UNITS = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, None: 1.0}


def parse_rate(text: str) -> float:
    """"100Mbit", "1.6G", "2.5gbit/s", "1e9" (bit/s) → bit/s."""
    found = _RATE.match(text)
    if not found or float(found.group(1)) <= 0:
        raise typer.BadParameter(f"{text!r} is not a rate: a positive number of bit/s with an optional k, M, G or T "
                                 "(e.g. 100Mbit, 1.6G, 10Gbit/s)")
    return float(found.group(1)) * _RATE_UNITS[found.group(2).lower()]


def parse_duration(text: str) -> float:
    """"50us", "0.2ms", "1e-4" (seconds) → seconds."""
    found = _DURATION.match(text)
    if not found:
        raise typer.BadParameter(f"{text!r} is not a duration: a number of seconds, or with ns, us, ms or s "
                                 "(e.g. 50us, 0.2ms)")
    unit = found.group(2).lower() if found.group(2) else None
    return float(found.group(1)) * _DURATION_UNITS[unit]


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1e3:,.2f} ms"


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f} %"


@command()
def simulate(
    decode_dir: DecodeDir,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Directory for summary.json and the tables.")],
    bandwidth: Annotated[Optional[str], typer.Option(
        "--bandwidth", metavar="RATE", help="What-if: every node's link rate, each way (e.g. 100Mbit, 1.6G). "
        "Default: the links the capture shows.")] = None,
    latency: Annotated[Optional[str], typer.Option(
        "--latency", metavar="DURATION", help="What-if: one-way latency between two nodes (e.g. 50us, 1ms). "
        "Default: the capture's.")] = None,
    servers: Annotated[Optional[int], typer.Option(
        "--servers", min=1, metavar="M", help="What-if: parameter servers (keys placed as MXNet places them).")] = None,
    workers: Annotated[Optional[int], typer.Option(
        "--workers", min=1, metavar="N", help="What-if: workers (each computes as a captured worker did).")] = None,
    engine: Annotated[Literal["simgrid", "ns3"], typer.Option(
        "--engine", help="simgrid: flow-level TCP (fast); ns3: packet-level TCP (slower).")] = "simgrid",
    captured_bandwidth: Annotated[Optional[str], typer.Option(
        "--captured-bandwidth", metavar="RATE", help="The link rate the capture was taken at, if known: nodes that "
        "moved data well below it were limited by their hosts, and keep that limit in what-ifs.")] = None,
    force: Force = False,
    as_json: Annotated[bool, typer.Option("--json", **Flag, help="Print summary.json instead of the table.")] = False,
) -> None:
    """Replay a decoded job on a network simulator (SimGrid or ns-3): without what-if options, on the network the
    capture shows (it reproduces the captured iteration time); with them, on another network or job shape.

    Writes summary.json (iteration_s_mean, measured_iteration_s_mean, communication time and overlap ratio per
    worker, the parameters used), iterations.parquet (simulated, as `stats` computes them),
    measured_iterations.parquet, keys.parquet (parameter servers), messages.parquet and manifest.json.
    Examples: dlcsniff simulate out/mxnet_sync --out out/mxnet_sync/sim;
    dlcsniff simulate out/mxnet_sync --out out/mxnet_sync/sim10g --bandwidth 10G --workers 4
    """
    try:
        rate = None if bandwidth is None else parse_rate(bandwidth)
        delay = None if latency is None else parse_duration(latency)
        captured = None if captured_bandwidth is None else parse_rate(captured_bandwidth)
    except typer.BadParameter as exc:
        fail(str(exc))
    from dlcsniff.analysis import AnalysisError
    from dlcsniff.analysis.simulate import WhatIf, write_simulation

    what_if = WhatIf(bandwidth_bit_s=rate, latency_s=delay, workers=workers, servers=servers)
    try:
        with err.status(f"simulating on {engine}"):
            result = write_simulation(decode_dir, out_dir, what_if, force=force, engine=engine,
                                      captured_rate_bit_s=captured)
    except AnalysisError as exc:
        fail(str(exc))
    summary = result.summary
    detail(f"{summary['simulation']['messages']:,} messages replayed in {summary['simulation']['wall_s']:.2f} s")
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    changes = [text for text, given in ((f"every link {bandwidth} each way", bandwidth),
                                         (f"latency {latency}", latency), (f"{workers} workers", workers),
                                         (f"{servers} servers", servers)) if given is not None]
    title = f"what-if ({', '.join(changes)})" if changes else "replay of the captured network"
    out.print(f"{title} on {engine}: {decode_dir}", soft_wrap=True)
    table = Table()
    for col in ("", "simulated", "captured"):
        table.add_column(col, justify="left" if not col else "right")
    table.add_row("mean iteration time", _ms(summary["iteration_s_mean"]), _ms(summary["measured_iteration_s_mean"]))
    table.add_row("mean communication time", _ms(summary["communication_s_mean"]),
                  _ms(summary["measured_communication_s_mean"]))
    table.add_row("mean overlap ratio", _percent(summary["overlap_ratio_mean"]),
                  _percent(summary["measured_overlap_ratio_mean"]))
    out.print(table)
    unit = "rank" if summary["model"]["kind"] == "collectives" else "worker"
    workers_table = Table(title=f"per {unit}", title_justify="left")
    for col in (unit, "iteration", "communication", "overlap", "captured iteration"):
        workers_table.add_column(col, justify="right")
    for row in summary["per_worker"]:
        workers_table.add_row(str(row["worker_rank"]), _ms(row["iteration_s_mean"]), _ms(row["communication_s_mean"]),
                              _percent(row["overlap_ratio_mean"]), _ms(row.get("measured_iteration_s_mean")))
    out.print(workers_table)
    out.print(f"wrote summary.json and the tables to {out_dir}")
