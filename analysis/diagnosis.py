"""`dlcsniff diagnose`: which rank, which collective, which link — stragglers, hangs and the links' limits of a
decoded job, judged from the wire alone (no tool inside the job's processes needed), against the job's own spread.

The judgements are analysis/stragglers.py, analysis/hangs.py and analysis/link_health.py over the ranks'
arrivals (analysis/arrivals.py); this module puts them together, as the `--json` keys (`stragglers`, `hangs`,
`links`: the contract) and a short verdict, for the CLI, the statistics' summary and the report.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from dlcsniff.analysis.arrivals import job_arrivals
from dlcsniff.analysis.hangs import HANG, STREAM_COLUMNS as HANG_STREAM_COLUMNS, UNFINISHED, job_hangs
from dlcsniff.analysis.link_health import STREAM_COLUMNS as LINK_STREAM_COLUMNS, link_health
from dlcsniff.analysis.job_model import JobModel, jobs_mixed
from dlcsniff.analysis.load import AnalysisError, WireView
from dlcsniff.analysis.names import capture_label, node_label, rank_label
from dlcsniff.analysis.operations import Trace, pslite_trace
from dlcsniff.analysis.outputs import claim, label
from dlcsniff.analysis.overheads import key_overheads
from dlcsniff.analysis.roce_paths import STREAM_COLUMNS as ROCE_STREAM_COLUMNS
from dlcsniff.analysis.size_distributions import FLOW_KEY
from dlcsniff.analysis.stats_schema import ARRIVALS, LINK_HEALTH
from dlcsniff.analysis.stragglers import job_stragglers

# every streams.parquet column the judgements and the network behaviour read
WIRE_STREAM_COLUMNS = tuple(dict.fromkeys((*LINK_STREAM_COLUMNS, *ROCE_STREAM_COLUMNS, *FLOW_KEY,
                                           *HANG_STREAM_COLUMNS)))
STRAGGLER_KEYS = ("rank", "role", "seq", "kind", "late_s", "capture", "protocol", "pg", "threshold_s")
HANG_KEYS = ("rank", "role", "seq", "kind", "waiting_ranks", "since_s", "waited_s", "protocol", "pg", "threshold_s")
LINK_KEYS = ("node", "ip", "direction", "limited_by", "rate_gb_per_s", "peers_rate_gb_per_s", "slow_links",
             "explained_by", "retransmitted_bytes", "retransmitted_fraction", "zero_windows", "zero_window_s",
             "naks", "cnps", "roce_retransmitted_packets")


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """A job's stragglers, hangs and links (the flagged rows of link_health), with what they were judged on."""

    stragglers: pd.DataFrame
    missing: pd.DataFrame          # analysis/hangs.py: the hangs, and the ranks missing when the captures ended
    link_health: pd.DataFrame
    arrivals: pd.DataFrame
    source: str
    captures: dict[str, str] = field(default_factory=dict)     # capture → its file, as the verdict names it
    jobs: list[list[str]] = field(default_factory=list)        # the captures of each job, when several were decoded

    @property
    def hangs(self) -> pd.DataFrame:
        return self.missing[self.missing["status"] == HANG]

    @property
    def unfinished(self) -> pd.DataFrame:
        return self.missing[self.missing["status"] == UNFINISHED]

    @property
    def links(self) -> pd.DataFrame:
        return self.link_health[self.link_health["limited_by"] != ""]

    def judged(self) -> dict:
        """What the verdict rests on: operations and sync rounds whose arrivals were seen, ranks, hosts."""
        arrivals = self.arrivals
        collectives = arrivals[arrivals["role"] == "rank"]
        rounds = arrivals[arrivals["role"] == "worker"]
        return {"collectives": int(collectives.groupby(["protocol", "pg", "kind", "seq"]).ngroups),
                "ranks": int(collectives["rank"].nunique()),
                "sync_rounds": int(rounds["seq"].nunique()), "workers": int(rounds["rank"].nunique()),
                "hosts": int(self.link_health["ip"].nunique()), "jobs": max(len(self.jobs), 1)}

    def basis(self) -> str:
        """What was judged, in words: "12 collectives over 4 ranks, 4 hosts"."""
        judged = self.judged()
        parts = [f"{judged['collectives']} collectives over {judged['ranks']} ranks" if judged["collectives"] else "",
                 f"{judged['sync_rounds']} sync rounds of {judged['workers']} workers" if judged["sync_rounds"] else "",
                 f"{judged['hosts']} hosts"]
        return ", ".join(part for part in parts if part)

    def as_json(self) -> dict:
        """The `--json` document: stragglers, hangs, links (the contract's keys first in each), unfinished (the
        ranks missing from an operation the captures ended in), judged."""
        def rows(frame: pd.DataFrame, keys: tuple[str, ...]) -> list[dict]:
            return [{key: _plain(row[key]) for key in keys} for row in frame.to_dict(orient="records")]

        links = rows(self.links, LINK_KEYS)
        for link in links:
            link["limited_by"] = link["limited_by"].split(", ")
        return {"stragglers": rows(self.stragglers, STRAGGLER_KEYS), "hangs": rows(self.hangs, HANG_KEYS),
                "links": links, "unfinished": rows(self.unfinished, HANG_KEYS), "judged": self.judged()}

    def verdict(self) -> list[str]:
        """A few lines a person reads first: each straggler, hang and limited link, or that there is none."""
        lines = [hang_line(row) for row in self.hangs.to_dict(orient="records")]
        lines += [straggler_line(row, self.captures) for row in self.stragglers.to_dict(orient="records")]
        lines += [link_line(row) for row in self.links.to_dict(orient="records")]
        lines += [unfinished_line(row) for row in self.unfinished.to_dict(orient="records")]
        basis = self.basis()
        said = ([*lines, f"(judged on {basis})"] if lines
                else [f"no straggler, no hang, no limited link (judged on {basis})"])
        mixed = jobs_mixed(self.jobs, self.captures)
        return [mixed, *said] if mixed else said


def _plain(value):
    """A JSON value: numpy scalars as Python, NaN as null."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, np.ndarray)):
        return [_plain(item) for item in value]
    return value


def who_label(role: str, rank: int) -> str:
    return rank_label(rank) if role == "rank" else node_label(role, rank)


def _whom(role: str, ranks: list[int]) -> str:
    """The waiting: "rank 0", "ranks 0, 1, 2", "worker rank 1", "worker ranks 0, 1"."""
    plural = "s" if len(ranks) > 1 else ""
    return ("" if role == "rank" else "worker ") + f"rank{plural} " + ", ".join(str(rank) for rank in ranks)


def operation_label(row: dict) -> str:
    return f"round {row['seq']}" if row["protocol"] == "pslite" else f"{row['kind']} #{row['seq']}"


def straggler_line(row: dict, captures: dict[str, str]) -> str:
    seen = ", ".join(capture_label(name, captures) for name in str(row["capture"]).split(", "))
    if row["role"] == "server":
        return (f"straggler: {who_label('server', row['rank'])} answered {operation_label(row)} "
                f"{row['late_s']:.2f} s later than its usual update (capture {seen})")
    what = "pushed in" if row["protocol"] == "pslite" else "entered"
    return (f"straggler: {who_label(row['role'], row['rank'])} {what} {operation_label(row)} "
            f"{row['late_s']:.2f} s after the others (capture {seen})")


def hang_line(row: dict) -> str:
    waiting = _whom("rank" if row["role"] == "rank" else "worker", row["waiting_ranks"])
    gave_up = np.isfinite(row["waited_s"]) and row["since_s"] - row["waited_s"] > row["threshold_s"]
    how_long = (f"waited {row['waited_s']:.2f} s, then their connections went quiet (the captures go on "
                f"{row['since_s']:.2f} s)" if gave_up else f"waited {row['since_s']:.2f} s, to the captures' end")
    if row["role"] == "server":
        return (f"hang: {who_label('server', row['rank'])} answered none of {operation_label(row)}; {waiting} "
                f"{how_long}")
    return f"hang: {who_label(row['role'], row['rank'])} never joined {operation_label(row)}; {waiting} {how_long}"


def unfinished_line(row: dict) -> str:
    waiting = _whom("rank" if row["role"] == "rank" else "worker", row["waiting_ranks"])
    return (f"unfinished: the captures end {row['since_s']:.2f} s after {waiting} entered {operation_label(row)}, "
            f"{who_label(row['role'], row['rank'])} not yet in (late or hung: the captures cannot tell)")


def link_line(row: dict) -> str:
    found = []
    for reason in row["limited_by"].split(", "):
        if reason == "rate":
            found.append(f"rate {row['rate_gb_per_s'] * 8:.3g} Gbit/s against its peers' "
                         f"{row['peers_rate_gb_per_s'] * 8:.3g} ({row['slow_links']})")
        elif reason == "retransmissions":
            found.append(f"retransmissions {row['retransmitted_fraction'] * 100:.1f} % of its bytes")
        elif reason == "zero_windows":
            found.append(f"{row['zero_windows']} zero windows, {row['zero_window_s']:.2f} s at zero window")
        else:
            count = {"naks": row["naks"], "cnps": row["cnps"],
                     "roce_retransmissions": row["roce_retransmitted_packets"]}
            found.append(f"{count[reason]} {reason.replace('_', ' ')}")
    return f"link: {row['node']} {row['direction']} limited by {'; '.join(found)}"


def diagnose(wire: WireView, trace: Trace | None, captures: dict[str, str] | None = None,
             jobs: list[list[str]] | None = None) -> Diagnosis:
    """The diagnosis of a job from its wire view and its ps-lite trace (None: no ps-lite traffic); `captures`
    names each capture by its file (analysis/names.py: capture_labels); `jobs`: the captures of each job where
    the decode held several (the verdict says they were judged as one)."""
    arrivals = job_arrivals(wire.events, wire.collectives, trace)
    keys = key_overheads(trace) if trace is not None else None
    return Diagnosis(stragglers=job_stragglers(arrivals, keys, trace),
                     missing=job_hangs(arrivals, wire.events, trace, wire.streams, wire.clocks),
                     link_health=link_health(wire.streams, wire.events), arrivals=arrivals, source=wire.source,
                     captures=captures or {}, jobs=jobs or [])


def diagnosis_of(job: JobModel) -> Diagnosis:
    """The diagnosis of a job."""
    return diagnose(job.wire(WIRE_STREAM_COLUMNS), pslite_trace(job.pslite), job.captures, job.jobs)


def write_diagnosis(job: JobModel, out_dir: str | Path, *, force: bool = False) -> Diagnosis:
    """`dlcsniff diagnose --out DIR`: DIR/diagnosis.json (the --json document and its verdict) and the tables it
    was judged on, arrivals.parquet and link_health.parquet (and manifest.json)."""
    out_dir = claim(out_dir, job.path, kind="diagnose", force=force)
    diagnosis = diagnosis_of(job)
    written = [out_dir / "diagnosis.json", out_dir / "arrivals.parquet", out_dir / "link_health.parquet"]
    try:
        written[0].write_text(json.dumps({**diagnosis.as_json(), "verdict": diagnosis.verdict()}, indent=2) + "\n")
        pq.write_table(ARRIVALS.from_frame(diagnosis.arrivals), written[1])
        pq.write_table(LINK_HEALTH.from_frame(diagnosis.link_health), written[2])
    except OSError as exc:
        raise AnalysisError(f"cannot write to {out_dir}: {exc.strerror or exc}") from exc
    label(out_dir, "diagnose", job, written)
    return diagnosis
