"""RoCEv2: the paths a job's queue pairs can take, and the congestion and loss signals each collective met.

ECMP spreads RoCEv2 traffic over a fabric's paths by hashing the UDP source port (the rest of the 5-tuple is
fixed: the two addresses, UDP, port 4791), which the NIC (Linux rxe: from the QP number) sets per queue pair. Per
host pair: its queue pairs, the source ports its packets used, and their Shannon entropy weighted by packets, as
a fraction of its most, log2(queue pairs) bits (each QP its own port, equally busy); 0 when every packet hashes
alike.

Per collective: the CNPs, NAKs and retransmitted packets the captures saw (decoders/protocols/roce/decoder.py keeps
when each was seen) while the collective was in flight at the capture that saw them (collectives.parquet: the
first to last byte of the operation there), each stream's counted once however many captures saw them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from dlcsniff.analysis.stats_schema import ROCE_COLLECTIVES, ROCE_PATHS
from dlcsniff.decoders.clocks import align

ROCE_PATH_COLUMNS = ROCE_PATHS.names
ROCE_COLLECTIVE_COLUMNS = ROCE_COLLECTIVES.names
STREAM_COLUMNS = ("capture", "protocol", "src_ip", "dst_ip", "dest_qp", "packets", "udp_src_ports",
                  "udp_src_port_packets", "cnp_times_ns", "nak_times_ns", "retransmitted_times_ns")
SIGNALS = {"cnp_times_ns": "cnps", "nak_times_ns": "naks", "retransmitted_times_ns": "retransmitted_packets"}
STREAM = ["src_ip", "dst_ip", "dest_qp"]


def _roce(streams: pd.DataFrame) -> pd.DataFrame:
    return streams[(streams["protocol"].astype(object) == "roce").to_numpy()]


def roce_paths(streams: pd.DataFrame) -> pd.DataFrame:
    """ROCE_PATH_COLUMNS: one row per (source, destination) host pair with RoCEv2 streams."""
    roce = _roce(streams)
    if not len(roce):
        return ROCE_PATHS.schema.empty_table().to_pandas()
    fullest = roce.sort_values("packets", ascending=False, kind="stable").drop_duplicates(STREAM)
    ports = fullest[["src_ip", "dst_ip", "dest_qp", "udp_src_ports", "udp_src_port_packets"]].explode(
        ["udp_src_ports", "udp_src_port_packets"]).dropna(subset=["udp_src_ports"])
    per_port = ports.groupby(["src_ip", "dst_ip", "udp_src_ports"])["udp_src_port_packets"].sum().astype(np.float64)
    share = per_port / per_port.groupby(["src_ip", "dst_ip"]).transform("sum")
    entropy_bits = (-share * np.log2(share)).groupby(["src_ip", "dst_ip"]).sum()
    pairs = fullest.groupby(["src_ip", "dst_ip"]).agg(queue_pairs=("dest_qp", "nunique"), packets=("packets", "sum"))
    out = pairs.join(per_port.groupby(["src_ip", "dst_ip"]).size().rename("src_ports")).join(
        entropy_bits.rename("entropy_bits")).reset_index()
    out["src_ports"] = out["src_ports"].fillna(0).astype(np.int64)
    most = np.log2(out["queue_pairs"].to_numpy(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        out["port_entropy_ratio"] = np.where(most > 0, out["entropy_bits"].fillna(0).to_numpy() / most, np.nan)
    return out[list(ROCE_PATH_COLUMNS)]


def roce_collective_signals(streams: pd.DataFrame, collectives: pd.DataFrame | None,
                            clocks: pd.DataFrame | None) -> pd.DataFrame:
    """ROCE_COLLECTIVE_COLUMNS: per collective operation met by any CNP, NAK or retransmitted packet, their counts."""
    roce = _roce(streams)
    if collectives is None or not len(collectives) or not len(roce):
        return ROCE_COLLECTIVES.schema.empty_table().to_pandas()
    signals = []
    for column, name in SIGNALS.items():
        found = roce[["capture", *STREAM, column]].explode(column).dropna(subset=[column])
        signals.append(found.rename(columns={column: "ts_ns"}).assign(signal=name))
    seen = pd.concat(signals, ignore_index=True)
    if not len(seen):
        return ROCE_COLLECTIVES.schema.empty_table().to_pandas()
    ts = seen["ts_ns"].astype(np.int64)
    seen["ts_ns"] = align(ts, seen["capture"], clocks).to_numpy(np.int64) if clocks is not None else ts
    operations = collectives[["protocol", "kind", "seq", "capture", "ts_first_ns", "ts_last_ns"]]
    hits = seen.merge(operations, on="capture")
    hits = hits[(hits["ts_ns"] >= hits["ts_first_ns"]).to_numpy() & (hits["ts_ns"] <= hits["ts_last_ns"]).to_numpy()]
    per_capture = hits.groupby(["protocol", "kind", "seq", *STREAM, "capture", "signal"]).size()
    per_stream = per_capture.groupby(["protocol", "kind", "seq", *STREAM, "signal"]).max()
    counts = per_stream.groupby(["protocol", "kind", "seq", "signal"]).sum().unstack("signal", fill_value=0)
    out = counts.reindex(columns=list(SIGNALS.values()), fill_value=0).reset_index()
    return out.astype({name: np.int64 for name in SIGNALS.values()})[list(ROCE_COLLECTIVE_COLUMNS)]
