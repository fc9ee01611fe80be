"""`dlcsniff simulate`: replay a decoded job on a network simulator, as captured or on another network."""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Annotated, Literal, Optional

import typer
from rich.table import Table

from dlcsniff.cli.app import DecodeDir, Flag, Force, command, fail, out, step, took, warn
from dlcsniff.decoders.quantities import (DURATION_UNITS, RATE_UNITS, format_duration, format_rate, parse_duration,
                                   parse_rate)


@command(renamed={"--workers": "--training-workers", "--engine": "--simulator"})
def simulate(
    decode_dir: DecodeDir,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Directory for summary.json and the tables.")],
    bandwidth: Annotated[Optional[float], typer.Option(
        "--bandwidth", metavar="RATE", parser=parse_rate, help="What-if: every node's link rate, each way (e.g. "
        "100Mbit, 1.6G, 10GB/s): with --captured-bandwidth, the calibrated links scaled by RATE / that rate; "
        f"without, RATE in their place. Default: the links the capture shows. Units: {RATE_UNITS}.")] = None,
    latency: Annotated[Optional[float], typer.Option(
        "--latency", metavar="DURATION", parser=parse_duration, help="What-if: one-way latency between two nodes "
        f"(e.g. 50us, 1ms). Default: the capture's. Units: {DURATION_UNITS}.")] = None,
    servers: Annotated[Optional[int], typer.Option(
        "--servers", min=1, metavar="M", help="What-if: parameter servers (keys placed as MXNet places them).")] = None,
    training_workers: Annotated[Optional[int], typer.Option(
        "--training-workers", min=1, metavar="N", help="What-if: training workers (each computes as a captured "
        "worker did).")] = None,
    simulator: Annotated[Literal["simgrid", "ns3"], typer.Option(
        "--simulator", help="simgrid: flow-level TCP (fast); ns3: packet-level TCP (slower).")] = "simgrid",
    captured_bandwidth: Annotated[Optional[float], typer.Option(
        "--captured-bandwidth", metavar="RATE", parser=parse_rate, help="The link rate the capture was taken at, if "
        "known (units as --bandwidth): --bandwidth at this rate gives back the replay; nodes that moved data well "
        "below it were limited by their hosts, and keep that limit in what-ifs.")] = None,
    force: Force = False,
    as_json: Annotated[bool, typer.Option("--json", **Flag, help="Print summary.json instead of the table.")] = False,
) -> None:
    """Replay a decoded job on a network simulator (SimGrid or ns-3): without what-if options, on the network the
    capture shows (it reproduces the captured iteration time); with them, on another network or job shape.

    Writes summary.json (iteration_s_mean, measured_iteration_s_mean, communication time and overlap ratio per
    worker, the parameters used), iterations.parquet (simulated, as `stats` computes them),
    measured_iterations.parquet, keys.parquet (parameter servers), messages.parquet and manifest.json.
    Examples: dlcsniff simulate out/mxnet_sync --out out/mxnet_sync/sim;
    dlcsniff simulate out/mxnet_sync --out out/mxnet_sync/sim10g --bandwidth 10Gbit --training-workers 4
    """
    with step("loaded the analysis"):
        from dlcsniff.analysis import AnalysisError, load_job_model
        from dlcsniff.analysis.display import duration, percent
        from dlcsniff.analysis.simulate import WhatIf, write_simulation

    what_if = WhatIf(bandwidth_bit_s=bandwidth, latency_s=latency, workers=training_workers, servers=servers)
    try:
        with step(f"modelled the job, simulated it on {simulator} and wrote the tables", f"simulating on {simulator}"):
            job = load_job_model(decode_dir)
            result = write_simulation(job, out_dir, what_if, force=force, engine=simulator,
                                      captured_rate_bit_s=captured_bandwidth)
    except AnalysisError as exc:
        fail(str(exc))
    if mixed := job.jobs_mixed():
        warn(mixed)
    summary = result.summary
    took(f"  of which replayed {summary['simulation']['messages']:,} messages on {simulator}",
         summary["simulation"]["wall_s"])
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    changes = [text for text, given in ((f"every link {format_rate(bandwidth or 0)} each way", bandwidth),
                                         (f"latency {format_duration(latency or 0)}", latency),
                                         (f"{training_workers} workers", training_workers),
                                         (f"{servers} servers", servers)) if given is not None]
    title = f"what-if ({', '.join(changes)})" if changes else "replay of the captured network"
    out.print(f"{title} on {simulator}: {decode_dir}", soft_wrap=True)
    table = Table()
    for col in ("", "simulated", "captured"):
        table.add_column(col, justify="left" if not col else "right")
    table.add_row("mean iteration time", duration(summary["iteration_s_mean"]),
                  duration(summary["measured_iteration_s_mean"]))
    table.add_row("mean communication time", duration(summary["communication_s_mean"]),
                  duration(summary["measured_communication_s_mean"]))
    table.add_row("mean overlap ratio", percent(summary["overlap_ratio_mean"]),
                  percent(summary["measured_overlap_ratio_mean"]))
    out.print(table)
    unit = "rank" if summary["model"]["kind"] == "collectives" else "worker"
    workers_table = Table(title=f"per {unit}", title_justify="left")
    for col in (unit, "iteration", "communication", "overlap", "captured iteration"):
        workers_table.add_column(col, justify="right")
    for row in summary["per_worker"]:
        workers_table.add_row(str(row["worker_rank"]), duration(row["iteration_s_mean"]),
                              duration(row["communication_s_mean"]), percent(row["overlap_ratio_mean"]),
                              duration(row.get("measured_iteration_s_mean")))
    out.print(workers_table)
    if summary["model"].get("collectives_repeat") is False:
        out.print("no run of collectives repeats (no training loop in the capture): each collective is taken as a "
                  "step, the time between them as computation", soft_wrap=True)
    for note in summary["model"].get("notes", []) + summary["network"]["notes"]:
        out.print(note, highlight=False, soft_wrap=True)
    if bandwidth is not None:
        out.print(_links_line(summary, bandwidth), highlight=False, soft_wrap=True)
    out.print(f"wrote summary.json and the tables to {out_dir}")


def _links_line(summary: dict, bandwidth_bit_s: float) -> str:
    """What a --bandwidth what-if did to the calibrated links."""
    from dlcsniff.analysis.display import link_rate

    network, parameters = summary["network"], summary["parameters"]
    calibrated = statistics.median([node[way] for node in network["nodes"] for way in ("up_bit_s", "down_bit_s")])
    used = statistics.median(parameters["up_bit_s"] + parameters["down_bit_s"])
    captured = network["captured_rate_bit_s"]
    if captured is None:
        return (f"links: {link_rate(used)} each way in place of the {link_rate(calibrated)} (median) calibrated "
                "from the capture; if it was taken on links of a known rate, --captured-bandwidth RATE scales "
                "the calibrated links instead")
    return (f"links: {link_rate(used)} each way, the {link_rate(calibrated)} calibrated from the capture "
            f"scaled by {link_rate(bandwidth_bit_s)} / the captured {link_rate(captured)}")
