"""The decode summary's counts of a job (decoders.job): its captures, its streams and messages as the captures saw
them, what no decoder claimed, each protocol's counters (their `summary` hooks, decoders.protocols.job_step); and,
from the timeline, the job's messages each once (`message_counts`)."""
from __future__ import annotations

import collections
from typing import TYPE_CHECKING

import numpy as np

from dlcsniff.decoders.arrow_numpy import filled, valid
from dlcsniff.decoders.protocols import job_hooks

if TYPE_CHECKING:
    import pyarrow as pa

    from dlcsniff.decoders.capture_decoder import CaptureResult

TOP_PORTS = 5


def _true(mask: np.ndarray) -> int:
    """How many rows are marked."""
    return int(np.count_nonzero(mask))


def _total(table: pa.Table, name: str, rows: np.ndarray) -> int:
    """The sum of a column of counts over the rows marked (null: 0)."""
    return int(filled(table[name], 0)[rows].astype(np.int64).sum())


def _protocols(table: pa.Table) -> np.ndarray:
    return np.array(table["protocol"].to_pylist(), dtype=object)


def _counts(*columns) -> dict:
    """How many rows hold each value (a tuple of values, given several columns), by value; rows with a null
    left out."""
    found = collections.Counter(row for row in zip(*(column.to_pylist() for column in columns))
                                if None not in row)
    return {(values if len(columns) > 1 else values[0]): n for values, n in sorted(found.items())}


def _unclaimed(results: list[CaptureResult], streams: pa.Table, tcp: np.ndarray) -> dict:
    """What no protocol decoder claimed: TCP connections and UDP datagrams by service port (the lower port),
    the busiest first, and packets that are neither (non-IP, ICMP...). `tcp`: which streams are TCP
    directions."""
    plain = tcp & (_protocols(streams) == "tcp")
    connections: set = set()
    tcp_ports: dict[int, int] = {}
    for capture, src, src_port, dst, dst_port in zip(*(np.array(streams[name].to_pylist(), dtype=object)[plain]
                                                       for name in ("capture", "src_ip", "src_port", "dst_ip",
                                                                    "dst_port"))):
        ends = tuple(sorted(((src, src_port), (dst, dst_port))))
        if (capture, ends) not in connections:
            connections.add((capture, ends))
            ports = [port for port in (src_port, dst_port) if port is not None]
            if ports:
                tcp_ports[min(ports)] = tcp_ports.get(min(ports), 0) + 1
    declined = job_hooks("unclaimed")     # what a protocol took at first and gave back (decoders.protocols.job_step)
    udp: dict[int, int] = {}
    other = 0
    for result in results:
        other += result.unclaimed_packets
        for ports, packets in [(result.unclaimed_udp, 0)] + [hook(result.counts) for hook in declined]:
            for port, n in ports.items():
                udp[port] = udp.get(port, 0) + n
            other += packets
    return {
        "tcp_connections": len(connections),
        "tcp_bytes": _total(streams, "bytes", plain),
        # the busiest first, the lower port first among equals
        "tcp_ports": dict(sorted(tcp_ports.items(), key=lambda item: (-item[1], item[0]))[:TOP_PORTS]),
        "udp_datagrams": sum(udp.values()),
        "udp_ports": dict(sorted(udp.items(), key=lambda item: -item[1])[:TOP_PORTS]),
        "other_packets": other,
    }


def job_summary(results: list[CaptureResult], tables: dict[str, pa.Table]) -> dict:
    """The summary of the captures' results and the job's tables (decoders.job.build_dataset), each protocol's
    counters (its `summary` hook) among them."""
    streams = tables["streams"]
    tcp = valid(streams["syn_seen"])      # TCP directions (RoCE rows have no handshake)
    protocols = tables["messages"]["protocol"]
    collectives = tables["collectives"]
    # rows of a protocol's own table (ZMTP's messages and commands, ps-lite's nodes...)
    own_rows = any(table.num_rows for name, table in tables.items() if name not in ("streams", "messages"))
    summary = {
        "captures": [
            {"capture": r.capture, "path": r.path, "packets": r.packets, "packets_decoded": r.packets_decoded,
             "non_tcp_packets": r.non_tcp_packets, "ts_first_ns": r.first_ts_ns, "ts_last_ns": r.last_ts_ns,
             "files": r.files, "warnings": r.warnings, "parse": r.parse_stats,
             "undecoded_messages": r.counts.get("undecoded_messages", 0)}
            for r in results
        ],
        "packets": sum(r.packets for r in results),
        "packets_decoded": sum(r.packets_decoded for r in results),
        "flows_by_protocol": _counts(streams["protocol"]),
        "tcp_bytes": _total(streams, "bytes", tcp),
        "missing_bytes": _total(streams, "missing_bytes", tcp),
        "uncaptured_bytes": _total(streams, "uncaptured_bytes", tcp),
        "retransmitted_bytes": _total(streams, "retransmitted_bytes", tcp),
        "streams_with_holes": _true(tcp & (filled(streams["missing_bytes"], 0) > 0)),
        # directions whose data began before the capture did (a reset answering a SYN carries none)
        "midstream_streams": _true(tcp & ~filled(streams["syn_seen"], True) & valid(streams["bytes"])
                                   & valid(streams["missing_bytes"])
                                   & (filled(streams["bytes"], 0).astype(np.int64)
                                      + filled(streams["missing_bytes"], 0) > 0)),
        # every capture's sighting of a message (a message seen at both ends: two); the job's messages once:
        # message_counts, from the timeline
        "observations": len(protocols),
        "observations_by_protocol": _counts(protocols),
        "collectives_by_kind": {f"{protocol}/{kind}": n for (protocol, kind), n in
                                _counts(collectives["protocol"], collectives["kind"]).items()},
        "undecoded_messages": sum(r.counts.get("undecoded_messages", 0) for r in results),
        "unclaimed": _unclaimed(results, streams, tcp),
        # anything of a protocol dlcsniff decodes: flows or packets a decoder claimed, or messages
        "dl_traffic": bool(len(protocols) or own_rows
                           or _true(_protocols(streams) != "tcp")),
        "nodes": tables["nodes"].num_rows,
        "warnings": [w for r in results for w in r.warnings]
                    + [w for hook in job_hooks("warnings") for r in results for w in hook(r.capture, r.counts)],
    }
    for counters in job_hooks("summary"):
        summary.update(counters(streams, tables))
    return summary


def message_counts(events: pa.Table) -> dict:
    """The summary's counts of the job's messages, each once (events.parquet)."""
    counts = {
        "messages": events.num_rows,
        "messages_by_protocol": _counts(events["protocol"]),
        "incomplete_messages": _true(~filled(events["complete"], False)),
        "control_messages": _true(valid(events["control_cmd"])),
    }
    for counters in job_hooks("event_summary"):
        counts.update(counters(events))
    return counts
