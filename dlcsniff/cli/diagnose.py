"""`dlcsniff diagnose`: stragglers, hangs and the links' limits of a decoded job, from the wire."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from dlcsniff.cli.app import DecodeDir, Force, Json, command, fail, out, step


@command()
def diagnose(
    decode_dir: DecodeDir,
    as_json: Json = False,
    out_dir: Annotated[Optional[Path], typer.Option("--out", "-o", help="Also write diagnosis.json and the tables "
                                                    "it was judged on (arrivals, link_health) to this directory.")
                       ] = None,
    force: Force = False,
) -> None:
    """Which rank, which collective, which link: the ranks that entered a collective late (a sync round's slow
    worker, a server slow to answer), the ranks that never joined one while the others waited, and what limited
    each host's link (retransmissions, RoCE NAKs and CNPs, a rate far below its peers'), judged against the
    job's own spread.

    --json prints {"stragglers": [...], "hangs": [...], "links": [...], "judged": {...}} on stdout.
    Examples: dlcsniff diagnose out/gloo_straggler; dlcsniff diagnose out/mxnet_sync --json;
    dlcsniff diagnose out/gloo_hang --out out/gloo_hang/diagnosis
    """
    if force and out_dir is None:
        fail("--force needs --out")
    with step("loaded the analysis"):
        from dlcsniff.analysis import AnalysisError, load_job_model
        from dlcsniff.analysis.diagnosis import diagnosis_of, write_diagnosis
    try:
        with step("judged the arrivals and the links", "judging the arrivals and the links"):
            job = load_job_model(decode_dir)
            found = diagnosis_of(job) if out_dir is None else write_diagnosis(job, out_dir, force=force)
    except AnalysisError as exc:
        fail(str(exc))
    if as_json:
        print(json.dumps(found.as_json(), indent=2))
        return
    for line in found.verdict():
        out.print(line, highlight=False, soft_wrap=True)
    if out_dir is not None:
        out.print(f"wrote diagnosis.json, arrivals.parquet and link_health.parquet to {out_dir}")
