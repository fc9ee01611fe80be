"""`dlcsniff export`: a decode output for Perfetto / chrome://tracing and for ASTRA-sim (Chakra)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.table import Table

from dlcsniff.cli.app import DecodeDir, Force, Json, command, fail, out, print_losses, step


@command(renamed={"-f": "-F"})
def export(
    decode_dir: DecodeDir,
    export_format: Annotated[Literal["chrome", "chakra"], typer.Option(
        "--format", "-F", help="chrome: one JSON file for Perfetto / chrome://tracing; chakra: one "
        "<job>.<rank>.et file per rank for ASTRA-sim.")],
    out_path: Annotated[Path, typer.Option("--out", "-o", help="The JSON file (chrome) or the directory of .et "
                                           "files (chakra).")],
    force: Force = False,
    as_json: Json = False,
) -> None:
    """Export a decoded job for other tools: a Chrome trace (one timeline of every node) or Chakra traces.

    Examples: dlcsniff export out/mxnet_sync --format chrome --out out/mxnet_sync/trace.json;
    dlcsniff export out/mxnet_sync --format chakra --out out/mxnet_sync/chakra
    """
    with step("loaded the analysis"):
        from dlcsniff.analysis import AnalysisError, load_job_model
        from dlcsniff.analysis.export_chakra import CHAKRA_LOSSES, write_chakra_traces
        from dlcsniff.analysis.export_chrome import write_chrome_trace

    try:
        with step(f"wrote the {export_format} export", f"writing the {export_format} export"):
            job = load_job_model(decode_dir)
            if export_format == "chrome":
                found = write_chrome_trace(job, out_path, force=force)
            else:
                written = write_chakra_traces(job, out_path, force=force)
    except AnalysisError as exc:
        fail(str(exc))
    if as_json:
        if export_format == "chrome":
            result = {"out": str(out_path), "message_events": found.message_events, "flows": found.flows,
                      "iterations": found.iterations, "collective_operations": found.collective_operations,
                      "losses": found.losses}
        else:
            result = {"out": str(out_path), "prefix": str(written.prefix), "losses": written.losses,
                      "losses_explained": {name: CHAKRA_LOSSES[name] for name in written.losses}, "files": [
                {"file": file.path.name, "node": file.node, "nodes": file.nodes, "send_recv": file.comm_nodes,
                 "compute": file.comp_nodes, "collective": file.coll_nodes} for file in written.files]}
        print(json.dumps(result, indent=2, default=str))
        return
    if export_format == "chrome":
        shown = [f"{found.message_events:,} message events", f"{found.flows:,} flows"]
        if found.iterations:
            shown.append(f"{found.iterations:,} worker iterations")
        if found.collective_operations:
            shown.append(f"{found.collective_operations:,} collective operations (one per rank)")
        out.print(f"wrote {out_path}: {', '.join(shown)} (open it in Perfetto or chrome://tracing)")
        losses, explained = found.losses, {}
    else:
        table = Table(title=f"Chakra traces in {out_path} (ASTRA-sim workload prefix {written.prefix})",
                      title_justify="left")
        for col in ("file", "node", "nodes", "send/recv", "compute", "collective"):
            table.add_column(col, justify="left" if col in ("file", "node") else "right")
        for file in written.files:
            table.add_row(file.path.name, file.node, f"{file.nodes:,}", f"{file.comm_nodes:,}",
                          f"{file.comp_nodes:,}", f"{file.coll_nodes:,}")
        out.print(table)
        losses, explained = written.losses, CHAKRA_LOSSES
    print_losses(losses, explained)
