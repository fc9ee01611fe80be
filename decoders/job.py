"""Captures of one job → the decode tables: each capture decoded on its own (decoders.capture_decoder, in
forked processes when it pays: decoders.fork_pool), then what only the whole job reveals (ps-lite nodes and
tensors: decoders.pslite_job; NCCL collectives: decoders.nccl_collectives; processes from capture daemons:
decoders.processes) and the summary."""
from __future__ import annotations

import dataclasses
import datetime
import gc
import os
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
from dlcsniff.decoders.protocols.roce import ROCE_V2_UDP_PORT

if TYPE_CHECKING:
    import pyarrow as pa

FLOW_ID_CAPTURE_SHIFT = 32   # flow_id = (capture index << 32) + stream number: unique without coordination
# Captures of one job run together; groups of captures this far apart in time were not made of one job.
FAR_APART_NS = 60 * 1_000_000_000
_HOSTS_SHOWN = 4


@dataclass
class DecodedJob:
    """A job's decode tables (decoders.schema, before the timeline is added by decoders.output) and its summary."""
    tables: dict[str, pa.Table]
    summary: dict


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


def _append_columns(first: dict[str, list], second: dict[str, list]) -> dict[str, list]:
    """Rows of `second` after those of `first`; a column one of them lacks is null in its rows."""
    n, m = (len(next(iter(cols.values()))) if cols else 0 for cols in (first, second))
    return {name: first.get(name, [None] * n) + second.get(name, [None] * m) for name in first.keys() | second.keys()}


def build_dataset(results: list[CaptureResult]) -> DecodedJob:
    """Merge per-capture results into the contract tables, resolving ps-lite nodes job-wide."""
    from dlcsniff.decoders.nccl_collectives import collective_columns
    from dlcsniff.decoders.pslite_job import resolve_pslite
    from dlcsniff.decoders.schema import MESSAGES, STREAMS, table_from_columns

    streams = _concat(results, "streams")
    messages = _concat(results, "messages")
    # a capture with no ps-lite at all (or no capture at all) still has every column
    for table, schema in ((streams, STREAMS), (messages, MESSAGES)):
        rows = len(table.get("capture", ()))
        for name in schema.names:
            table.setdefault(name, [None] * rows)
    nodes, unattributed = resolve_pslite(streams, messages, *(_concat(results, table) for table in (
        "pslite_nodes", "pslite_announced", "pslite_routed")))
    tables = {
        "streams": table_from_columns("streams", streams),
        "zmtp": table_from_columns("zmtp", _concat(results, "zmtp")),
        "messages": table_from_columns("messages", messages),
        "nodes": table_from_columns("nodes", nodes),
        "collectives": table_from_columns("collectives", _append_columns(_concat(results, "collectives"),
                                                                         collective_columns(messages, streams))),
    }
    summary = _summary(results, tables)
    summary["unattributed_messages"] = unattributed
    summary["warnings"] += two_jobs_evidence(results, tables["streams"])
    return DecodedJob(tables=tables, summary=summary)


ROCE_COUNTERS = ("packets", "bytes", "bad_icrc", "cnp", "retransmitted_packets", "naks", "lost_packets")
TOP_PORTS = 5


def _unclaimed(results: list[CaptureResult], tcp) -> dict:
    """What no protocol decoder claimed: TCP connections and UDP datagrams by service port (the lower port),
    the busiest first, and packets that are neither (non-IP, ICMP...)."""
    plain = tcp[tcp["protocol"] == "tcp"]
    pairs = plain.assign(low=plain[["src_port", "dst_port"]].min(axis=1),
                         ends=[tuple(sorted(((s, sp), (d, dp)))) for s, sp, d, dp in
                               zip(plain["src_ip"], plain["src_port"], plain["dst_ip"], plain["dst_port"])])
    connections = pairs.drop_duplicates(["capture", "ends"])
    tcp_ports = connections.groupby("low").size().sort_values(ascending=False, kind="stable")
    udp: dict[int, int] = {}
    for result in results:
        for port, n in result.unclaimed_udp.items():
            udp[port] = udp.get(port, 0) + n
        # RoCE packets none of whose stream's packets passed the ICRC check (decoders.protocols.roce)
        unproven = result.counts.get("roce_v2_datagrams_unproven", 0)
        if unproven:
            udp[ROCE_V2_UDP_PORT] = udp.get(ROCE_V2_UDP_PORT, 0) + unproven
    return {
        "tcp_connections": int(len(connections)),
        "tcp_bytes": int(plain["bytes"].sum()),
        "tcp_ports": {int(port): int(n) for port, n in tcp_ports.head(TOP_PORTS).items()},
        "udp_datagrams": sum(udp.values()),
        "udp_ports": dict(sorted(udp.items(), key=lambda item: -item[1])[:TOP_PORTS]),
        "other_packets": sum(r.unclaimed_packets + r.counts.get("roce_v1_packets_unproven", 0) for r in results),
    }


def _summary(results: list[CaptureResult], tables: dict[str, pa.Table]) -> dict:
    streams = tables["streams"].to_pandas()
    tcp = streams[streams["syn_seen"].notna()]              # TCP directions (RoCE rows have no handshake)
    roce = streams[streams["protocol"] == "roce"]
    messages = tables["messages"].select(["protocol", "complete", "control_cmd", "sender_id", "recver_id"]).to_pandas()
    pslite = messages[messages["protocol"] == "pslite"]
    zmtp = tables["zmtp"].select(["command", "complete"]).to_pandas()
    collectives = tables["collectives"].select(["protocol", "kind"]).to_pandas()
    return {
        "captures": [
            {"capture": r.capture, "path": r.path, "packets": r.packets, "packets_decoded": r.packets_decoded,
             "non_tcp_packets": r.non_tcp_packets, "ts_first_ns": r.first_ts_ns, "ts_last_ns": r.last_ts_ns,
             "files": r.files, "warnings": r.warnings, "parse": r.parse_stats,
             "undecoded_messages": r.counts.get("undecoded_messages", 0)}
            for r in results
        ],
        "packets": sum(r.packets for r in results),
        "packets_decoded": sum(r.packets_decoded for r in results),
        "flows_by_protocol": streams.groupby("protocol").size().to_dict() if len(streams) else {},
        "tcp_bytes": int(tcp["bytes"].sum()),
        "missing_bytes": int(tcp["missing_bytes"].sum()),
        "uncaptured_bytes": int(tcp["uncaptured_bytes"].sum()),
        "retransmitted_bytes": int(tcp["retransmitted_bytes"].sum()),
        "streams_with_holes": int((tcp["missing_bytes"] > 0).sum()),
        # directions whose data began before the capture did (a reset answering a SYN carries none)
        "midstream_streams": int(((tcp["syn_seen"] == False) & (tcp["bytes"] + tcp["missing_bytes"] > 0)).sum()),  # noqa: E712
        "zmtp_lost_bytes": int(tcp["lost_bytes"].sum()),
        "roce": {name: int(roce[name].sum()) for name in ROCE_COUNTERS} if len(roce) else {},
        "zmtp_messages": int(zmtp["command"].isna().sum()),
        "zmtp_commands": int(zmtp["command"].notna().sum()),
        "messages": len(messages),
        "messages_by_protocol": messages.groupby("protocol").size().to_dict() if len(messages) else {},
        "incomplete_messages": int((~messages["complete"].fillna(False).astype(bool)).sum()),
        "control_messages": int(messages["control_cmd"].notna().sum()),
        # ps-lite messages whose sender or receiver no identity, routing frame, announcement or address named
        "messages_without_node_ids": int((pslite["sender_id"].isna() | pslite["recver_id"].isna()).sum()),
        "collectives_by_kind": {f"{protocol}/{kind}": n for (protocol, kind), n in
                                collectives.groupby(["protocol", "kind"]).size().items()},
        "undecoded_messages": sum(r.counts.get("undecoded_messages", 0) for r in results),
        "unclaimed": _unclaimed(results, tcp),
        # anything of a protocol dlcsniff decodes: flows or packets a decoder claimed, or messages
        "dl_traffic": bool(len(messages) or len(zmtp) or (streams["protocol"] != "tcp").any()),
        "nodes": tables["nodes"].num_rows,
        "warnings": [w for r in results for w in r.warnings],
    }


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
        workers = min(len(paths), cores) if total is None or total >= FORK_MIN_BYTES else 0
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
    return with_selection(with_processes(build_dataset(results), paths), selection)


def _load_table_builders() -> None:
    """Import what build_dataset and its summary use (pandas the largest), e.g. while workers decode."""
    import pandas  # noqa: F401

    from dlcsniff.decoders import nccl_collectives, pslite_job, schema  # noqa: F401


def with_selection(dataset: DecodedJob, selection: PacketSelection | None) -> DecodedJob:
    """The summary says which packets were decoded."""
    dataset.summary["selection"] = None if selection is None else selection.summary()
    return dataset


def _utc(ts_ns: int) -> str:
    return datetime.datetime.fromtimestamp(ts_ns / 1e9, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _hosts(hosts: set[str]) -> str:
    shown = sorted(hosts)[:_HOSTS_SHOWN]
    return ", ".join(shown) + (f" and {len(hosts) - len(shown)} more" if len(hosts) > len(shown) else "")


def two_jobs_evidence(results: list[CaptureResult], streams: pa.Table) -> list[str]:
    """Warnings when the captures look like the captures of more than one job: groups of captures whose
    hosts never talk to a host of another group (the hosts of the flows a deep-learning protocol claimed,
    or of all flows when none was), or groups far apart in time (FAR_APART_NS)."""
    warnings = []
    frame = streams.select(["capture", "src_ip", "dst_ip", "protocol"]).to_pandas()
    if (frame["protocol"] != "tcp").any():
        frame = frame[frame["protocol"] != "tcp"]
    hosts = {capture: set(group["src_ip"].dropna()) | set(group["dst_ip"].dropna())
             for capture, group in frame.groupby("capture", observed=True)}
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
    return warnings


def with_processes(dataset: DecodedJob, captures: list[CaptureInput]) -> DecodedJob:
    """Captures from a capture daemon's directories: who owned each connection, and when libzmq was
    handed each message (decoders.processes)."""
    if all(c.directory is None for c in captures):
        return dataset
    from dlcsniff.decoders.processes import join_processes
    return join_processes(dataset, captures)
