"""Captures of one job → the decode tables: each capture decoded on its own (decoders.capture_decoder, in
forked processes when it pays: decoders.fork_pool), then what only the whole job reveals (ps-lite nodes and
tensors: decoders.pslite_job; processes from capture daemons: decoders.processes) and the summary."""
from __future__ import annotations

import gc
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

from dlcsniff.decoders.capture_decoder import CaptureResult, decode_capture
from dlcsniff.decoders.fork_pool import FORK_MIN_BYTES, decode_forked
from dlcsniff.decoders.inputs.capture_set import CaptureInput, ProgressFn, expand_inputs

if TYPE_CHECKING:
    import pyarrow as pa

FLOW_ID_CAPTURE_SHIFT = 32   # flow_id = (capture index << 32) + stream number: unique without coordination


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


def build_dataset(results: list[CaptureResult]) -> DecodedJob:
    """Merge per-capture results into the contract tables, resolving ps-lite nodes job-wide."""
    from dlcsniff.decoders.pslite_job import resolve_pslite
    from dlcsniff.decoders.schema import MESSAGES_SCHEMA, table_from_columns

    streams = _concat(results, "streams")
    messages = _concat(results, "messages")
    for name in MESSAGES_SCHEMA.names:       # a capture with no ps-lite at all still has every column
        messages.setdefault(name, [None] * len(messages["capture"]))
    nodes, unattributed = resolve_pslite(streams, messages, *(_concat(results, table) for table in (
        "pslite_nodes", "pslite_announced", "pslite_routed")))
    tables = {
        "streams": table_from_columns("streams", streams),
        "zmtp": table_from_columns("zmtp", _concat(results, "zmtp")),
        "messages": table_from_columns("messages", messages),
        "nodes": table_from_columns("nodes", nodes),
        "collectives": table_from_columns("collectives", _concat(results, "collectives")),
    }
    summary = _summary(results, tables)
    summary["unattributed_messages"] = unattributed
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
    return {
        "tcp_connections": int(len(connections)),
        "tcp_bytes": int(plain["bytes"].sum()),
        "tcp_ports": {int(port): int(n) for port, n in tcp_ports.head(TOP_PORTS).items()},
        "udp_datagrams": sum(udp.values()),
        "udp_ports": dict(sorted(udp.items(), key=lambda item: -item[1])[:TOP_PORTS]),
        "other_packets": sum(r.unclaimed_packets for r in results),
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
            {"capture": r.capture, "path": r.path, "packets": r.packets, "non_tcp_packets": r.non_tcp_packets,
             "warnings": r.warnings, "parse": r.parse_stats,
             "undecoded_messages": r.counts.get("undecoded_messages", 0)}
            for r in results
        ],
        "packets": sum(r.packets for r in results),
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


def decode_paths(inputs: Iterable[Path], *, progress_total: Callable[[int], ProgressFn] | None = None,
                 workers: int | None = None) -> DecodedJob:
    """Decode captures (files or directories of them) of one job into one dataset.

    Captures are decoded in `workers` forked processes (default: one per core, when the input is large
    enough for it to pay; 0: in this process), while this one loads what building the tables needs."""
    paths = expand_inputs(inputs)
    sizes = [capture.size_bytes for capture in paths]
    if not hasattr(os, "fork"):
        workers = 0
    elif workers is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        workers = min(len(paths), cores) if sum(sizes) >= FORK_MIN_BYTES else 0
    jobs = [(capture, index << FLOW_ID_CAPTURE_SHIFT) for index, capture in enumerate(paths)]
    if workers <= 0:
        progress = progress_total(sum(sizes)) if progress_total else None
        results = []
        for path, base in jobs:
            results.append(decode_capture(path, flow_id_base=base, progress=progress))
            # A capture's decoders leave reference cycles holding read buffers (tens of MB on a large capture):
            # collected now, they add neither to the next capture's memory nor to the tables' (pyarrow, pandas).
            gc.collect()
    else:
        results = decode_forked(jobs, sizes, workers, progress_total)
    return with_processes(build_dataset(results), paths)


def with_processes(dataset: DecodedJob, captures: list[CaptureInput]) -> DecodedJob:
    """Captures from a capture daemon's directories: who owned each connection, and when libzmq was
    handed each message (decoders.processes)."""
    if all(c.directory is None for c in captures):
        return dataset
    from dlcsniff.decoders.processes import join_processes
    return join_processes(dataset, captures)
