"""Captures of one job → the decode tables: each capture decoded on its own (decoders.capture_decoder, in
forked processes when it pays: decoders.fork_pool), then what only the whole job reveals (each protocol's job
step, decoders.protocols.JOB_STEPS; processes from capture daemons: decoders.processes; the job's timeline, each
message once: decoders.timeline) and the summary, with each protocol's counters (their `summary` hooks).

The summary counts the job's messages once (`messages`, `messages_by_protocol`, `incomplete_messages`...: the
timeline's events) and every capture's sighting of them apart (`observations`, `observations_by_protocol`);
it says what each protocol lost (`losses_by_protocol`: decoders.losses) and warns of what the captures could
not hold (`capture_limits`: decoders.capture_limits)."""
from __future__ import annotations

import collections

import dataclasses
import datetime
import gc
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from dlcsniff.decoders.capture_decoder import CaptureResult, decode_capture
from dlcsniff.decoders.errors import CaptureError
from dlcsniff.decoders.fork_pool import FORK_MIN_BYTES, decode_forked
from dlcsniff.decoders.inputs.capture_set import CaptureInput, ProgressFn, capture_start, expand_inputs
from dlcsniff.decoders.inputs.pcap_filter import PcapFilter
from dlcsniff.decoders.inputs.selection import PacketSelection
from dlcsniff.decoders.packet import LINKTYPE_ETHERNET

if TYPE_CHECKING:
    import pyarrow as pa

    from dlcsniff.decoders.timeline import JobTimeline


FLOW_ID_CAPTURE_SHIFT = 32   # flow_id = (capture index << 32) + stream number: unique without coordination
# Captures of one job run together; groups of captures this far apart in time were not made of one job.
FAR_APART_NS = 60 * 1_000_000_000
_HOSTS_SHOWN = 4


@dataclass
class DecodedJob:
    """A job's decode tables (decoders.schema; the timeline's are written from `view` by decoders.output), its
    summary, and its timeline (`with_job_view`); input_sha256: the sha256 of every file read, in the order of the
    captures' files (None: a stream)."""
    tables: dict[str, pa.Table]
    summary: dict
    view: JobTimeline | None = None
    input_sha256: list[str | None] = dataclasses.field(default_factory=list)


def _concat(results: list[CaptureResult], table: str) -> dict[str, list]:
    """Concatenate one table's column lists over captures, adding the `capture` column; a column some
    captures lack is null in their rows."""
    names = {name for res in results for name in res.tables.get(table, {})} - {"capture"}
    out: dict[str, list] = {name: [] for name in names | {"capture"}}
    for res in results:
        cols = res.tables.get(table, {})
        n = len(next(iter(cols.values()))) if cols else 0
        for name in names:
            out[name].extend(cols.get(name, [None] * n))
        out["capture"].extend([res.capture] * n)
    return out


def _append_columns(first: dict[str, list], *more: dict[str, list]) -> dict[str, list]:
    """Rows of each of `more` after those of `first`; a column one of them lacks is null in its rows."""
    for second in more:
        n, m = (len(next(iter(cols.values()))) if cols else 0 for cols in (first, second))
        first = {name: first.get(name, [None] * n) + second.get(name, [None] * m)
                 for name in first.keys() | second.keys()}
    return first


def build_dataset(results: list[CaptureResult]) -> DecodedJob:
    """Merge per-capture results into the contract tables, then run every protocol's job step
    (decoders.protocols.JOB_STEPS: what only the whole job reveals)."""
    from dlcsniff.decoders.protocols import job_hooks
    from dlcsniff.decoders.protocols.job_step import JobColumns
    from dlcsniff.decoders.schema import COLUMN_TABLES, MESSAGES, STREAMS, table_from_columns

    job = JobColumns(_concat(results, "streams"), _concat(results, "messages"),
                     capture_table=lambda name: _concat(results, name))
    # a capture with none of a protocol's traffic (or no capture at all) still has every column
    for table, schema in ((job.streams, STREAMS), (job.messages, MESSAGES)):
        rows = len(table.get("capture", ()))
        for name in schema.names:
            table.setdefault(name, [None] * rows)
    for resolve_job in job_hooks("resolve_job"):
        resolve_job(job)
    built = {"streams": job.streams, "messages": job.messages, **job.tables}
    columns = {name: built[name] if name in built else _concat(results, name) for name in COLUMN_TABLES}
    columns["collectives"] = _append_columns(columns["collectives"], *job.collectives)
    tables = {name: table_from_columns(name, columns[name]) for name in COLUMN_TABLES}
    from dlcsniff.decoders.job_summary import job_summary

    summary = job_summary(results, tables)
    summary.update(job.summary)
    apart, summary["jobs"] = two_jobs_evidence(results, tables["streams"])
    summary["warnings"] += same_capture_twice(results, tables["streams"]) + apart
    return DecodedJob(tables=tables, summary=summary, input_sha256=[digest for r in results for digest in r.sha256])


def prepare_inputs(inputs: Iterable[Path], selection: PacketSelection | None = None
                   ) -> tuple[list[CaptureInput], PacketSelection | None]:
    """The captures the inputs name (decoders.inputs.capture_set), and the selection made ready for them
    before any decoding: its filter compiled for their link types (a bad one is a CaptureError here), its
    relative window bounds counted from the earliest first packet of all of them."""
    captures = expand_inputs(inputs)
    if selection is None:
        return captures, None
    needs_start = selection.filter is not None or selection.relative
    starts = [capture_start(capture) for capture in captures if needs_start and not capture.stream]
    if selection.filter is not None:
        check = PcapFilter(selection.filter)
        try:
            for linktype in sorted({lt for linktypes, _ in starts for lt in linktypes} or {LINKTYPE_ETHERNET}):
                check.program(linktype)
        finally:
            check.close()
    if selection.relative and starts:
        if len(starts) < len(captures):
            raise CaptureError("a window relative to the capture start (+N) cannot be placed with a stream "
                               "among other inputs: give absolute times (epoch seconds or ISO)")
        firsts = [first for _, first in starts if first is not None]
        selection = dataclasses.replace(selection, origin_ns=min(firsts, default=None))
    return captures, selection


def decode_paths(inputs: Iterable[Path], *, progress_total: Callable[[int | None], ProgressFn] | None = None,
                 workers: int | None = None, selection: PacketSelection | None = None,
                 meanwhile: Callable[[], None] | None = None) -> DecodedJob:
    """Decode captures (files or directories of them, streams) of one job into one dataset; `selection`: only
    the packets it keeps (a pcap filter, a time window).

    Captures are decoded in `workers` forked processes (default: one per core, when the input is large
    enough for it to pay; 0: in this process), while this one loads what building the tables needs and runs
    `meanwhile` (the caller's next imports)."""
    paths, selection = prepare_inputs(inputs, selection)
    sizes = [capture.size_bytes for capture in paths]
    known = sum(size for size in sizes if size is not None)
    total = known if None not in sizes else None        # a stream: progress without a total
    if not hasattr(os, "fork"):
        workers = 0
    elif workers is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        workers = min(len(paths), cores) if _workers_pay(total) else 0
    jobs = [(capture, index << FLOW_ID_CAPTURE_SHIFT) for index, capture in enumerate(paths)]
    if workers <= 0:
        progress = progress_total(total) if progress_total else None
        results = []
        # What exists now (modules, the CLI's objects) lives to the end: frozen, the collections below walk only
        # what the decoders made (a full collection over the rest took 15 ms a capture).
        gc.freeze()
        try:
            for path, base in jobs:
                results.append(decode_capture(path, flow_id_base=base, progress=progress, selection=selection))
                # A capture's decoders leave reference cycles holding read buffers (tens of MB on a large
                # capture): collected now, they add neither to the next capture's memory nor to the tables'.
                gc.collect()
        finally:
            gc.unfreeze()
    else:
        def load_next() -> None:
            _load_table_builders()
            if meanwhile is not None:
                meanwhile()
        results = decode_forked(jobs, [size or 0 for size in sizes], total, workers, progress_total, selection,
                                meanwhile=load_next)
    return finish_job(results, paths, selection)


def _workers_pay(total: int | None) -> bool:
    """Whether forked workers pay: for a large input (or a stream), and for any input while this process has yet
    to import what builds the job's tables (a fresh `dlcsniff decode`: those imports, ~0.04 s, then overlap the
    workers' decoding instead of following it, and a job's small captures decode side by side); a process that has
    them (a test's, a caller's second decode) decodes a small input itself."""
    return total is None or total >= FORK_MIN_BYTES or "dlcsniff.decoders.timeline" not in sys.modules


def finish_job(results: list[CaptureResult], captures: list[CaptureInput],
               selection: PacketSelection | None) -> DecodedJob:
    """The captures' results (in the order of `captures`) → the job's tables, timeline and summary: what both
    engines (forked processes, Dask tasks) do once their captures are decoded."""
    dataset = with_selection(with_processes(build_dataset(results), captures), selection)
    _record_daemon_drops(dataset.summary["captures"], captures)
    return with_job_view(dataset)


def _record_daemon_drops(summary_captures: list[dict], captures: list[CaptureInput]) -> None:
    """The packets a capture daemon's kernel dropped while each file was written (its capture.json), into the
    summary's files (`dropped`), read where the caller is (a Dask worker may not see the directory)."""
    from dlcsniff.decoders.formats.capture_dir import recorded_drops

    for entry, capture in zip(summary_captures, captures):
        if capture.directory is not None:
            drops = recorded_drops(capture.directory)
            for file in entry["files"]:
                file["dropped"] = drops.get(Path(file["path"]).name, file["dropped"])


def with_job_view(dataset: DecodedJob) -> DecodedJob:
    """The job's timeline (decoders.timeline.job_timeline: each message once, the captures' clocks aligned), and
    what the summary says from it: the job's messages once, each protocol's losses, the capture limits."""
    import pyarrow as pa

    from dlcsniff.decoders.arrow_numpy import as_arrow
    from dlcsniff.decoders.capture_limits import capture_limits
    from dlcsniff.decoders.job_summary import message_counts
    from dlcsniff.decoders.losses import protocol_losses
    from dlcsniff.decoders.timeline import job_timeline

    tables = dataset.tables
    streams = tables["streams"]
    view = job_timeline(tables["messages"], streams, tables["nodes"])
    if view.message_events is not None:      # each sighting names its message
        column = tables["messages"].schema.get_field_index("event_id")
        tables["messages"] = tables["messages"].set_column(column, "event_id",
                                                           as_arrow(view.message_events, pa.int64()))
    limits, warnings = capture_limits(dataset.summary["captures"], streams, view.events)
    dataset.summary.update(message_counts(view.events))
    dataset.summary.update(losses_by_protocol=protocol_losses(streams, view.events), capture_limits=limits)
    dataset.summary["warnings"] += warnings + view.warnings
    dataset.view = view
    return dataset


def _load_table_builders() -> None:
    """Import what build_dataset, the timeline and the summary use, e.g. while workers decode: the job steps, and
    every protocol's decoder class (the summary asks each for its loss counters)."""
    from dlcsniff.decoders import capture_limits, job_summary, schema, timeline  # noqa: F401
    from dlcsniff.decoders.protocols import JOB_STEPS, REGISTRY

    for entry in JOB_STEPS:
        entry.hooks()
    for protocol in REGISTRY:
        protocol.decoder_class()
    import pyarrow as pa

    pa.array([0])            # pyarrow's first conversion of a list loads its pandas shim (and dateutil) once


def with_selection(dataset: DecodedJob, selection: PacketSelection | None) -> DecodedJob:
    """The summary says which packets were decoded."""
    dataset.summary["selection"] = None if selection is None else selection.summary()
    return dataset


def _utc(ts_ns: int) -> str:
    return datetime.datetime.fromtimestamp(ts_ns / 1e9, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _hosts(hosts: set[str]) -> str:
    shown = sorted(hosts)[:_HOSTS_SHOWN]
    return ", ".join(shown) + (f" and {len(hosts) - len(shown)} more" if len(hosts) > len(shown) else "")


def same_capture_twice(results: list[CaptureResult], streams: pa.Table) -> list[str]:
    """Warnings for captures holding the same packets (a capture and its copy, compressed or renamed, given
    together): each is decoded as a node of its own, so every message it saw is seen once per copy, and the
    copies' clocks, seeing none of each other's messages, cannot be aligned. The same packet count, first and
    last timestamp and TCP payload bytes: two nodes' captures never agree on all four."""
    tcp_bytes: dict[str, int] = {}
    for capture, n in zip(streams["capture"].to_pylist(), streams["bytes"].to_pylist()):
        tcp_bytes[capture] = tcp_bytes.get(capture, 0) + (n or 0)
    alike: dict[tuple, list[str]] = collections.defaultdict(list)
    for r in results:
        if r.packets:
            alike[(r.packets, r.first_ts_ns, r.last_ts_ns, int(tcp_bytes.get(r.capture, 0)))].append(r.capture)
    return [f"captures {', '.join(sorted(captures))} hold the same packets ({packets:,}, from {_utc(first)} to "
            f"{_utc(last)}): one capture given {len(captures)} times? Each is decoded as a node of its own, so "
            f"its messages are counted once per copy; decode one of them"
            for (packets, first, last, _), captures in alike.items() if len(captures) > 1]


def two_jobs_evidence(results: list[CaptureResult], streams: pa.Table) -> tuple[list[str], list[list[str]]]:
    """Warnings when the captures look like the captures of more than one job: groups of captures whose
    hosts never talk to a host of another group (the hosts of the flows a deep-learning protocol claimed,
    or of all flows when none was), or groups far apart in time (FAR_APART_NS); and the jobs' captures (the
    finer of the two groupings; empty for one job)."""
    warnings = []
    rows = list(zip(*(streams[name].to_pylist() for name in ("capture", "src_ip", "dst_ip", "protocol"))))
    if any(protocol != "tcp" for *_, protocol in rows):
        rows = [row for row in rows if row[3] != "tcp"]
    hosts: dict[str, set[str]] = {}
    for capture, src, dst, _ in rows:
        if capture is not None:
            hosts.setdefault(capture, set()).update(ip for ip in (src, dst) if ip is not None)
    hosts = {capture: found for capture, found in hosts.items() if found}
    groups: list[tuple[list[str], set[str]]] = []        # captures joined by a host in common
    for capture in [r.capture for r in results if r.capture in hosts]:
        joined = [g for g in groups if g[1] & hosts[capture]]
        merged = ([capture] + [c for g in joined for c in g[0]], hosts[capture].union(*(g[1] for g in joined)))
        groups = [g for g in groups if g not in joined] + [merged]
    if len(groups) > 1:
        warnings.append(f"the inputs look like {len(groups)} jobs: no host in common between " + "; ".join(
            f"captures {', '.join(sorted(captures))} (hosts {_hosts(found)})" for captures, found in groups))
    spans = sorted((r.first_ts_ns, r.last_ts_ns, r.capture) for r in results if r.first_ts_ns is not None)
    clusters: list[list] = []
    for first, last, capture in spans:
        if clusters and first <= clusters[-1][1] + FAR_APART_NS:
            clusters[-1][1] = max(clusters[-1][1], last)
            clusters[-1][2].append(capture)
        else:
            clusters.append([first, last, [capture]])
    if len(clusters) > 1:
        apart = min(b[0] - a[1] for a, b in zip(clusters, clusters[1:]))
        warnings.append(f"the inputs look like {len(clusters)} jobs: their captures were made at times "
                        f"{apart / 1e9:,.0f} s or more apart: " + "; ".join(
                            f"captures {', '.join(sorted(captures))} from {_utc(first)} to {_utc(last)}"
                            for first, last, captures in clusters))
    jobs = max(([sorted(captures) for captures, _ in groups], [sorted(captures) for _, _, captures in clusters]),
               key=len)
    return warnings, jobs if len(jobs) > 1 else []


def with_processes(dataset: DecodedJob, captures: list[CaptureInput]) -> DecodedJob:
    """Captures from a capture daemon's directories: who owned each connection, and when libzmq was
    handed each message (decoders.processes)."""
    if all(c.directory is None for c in captures):
        return dataset
    from dlcsniff.decoders.processes import join_processes
    return join_processes(dataset, captures)
