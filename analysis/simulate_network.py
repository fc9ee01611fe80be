"""The network a capture shows, calibrated for the replay: every node's link rate, the one-way latency, and the
hosts' own throughput when the capture shows that they, not the network, limited a transfer.

Input: `ends`, one row per message as a node's own capture saw it leave or arrive (END_COLUMNS: the node,
the message's first and last byte there, its size), and `pairs`, one row per message seen at both ends
(PAIR_COLUMNS: sender, receiver, size, the sender's first byte, the receiver's last byte). A node's *busy time*
is the union of the intervals its own capture saw large messages (at least LARGE_MESSAGE_BYTES) leave or
arrive; its *throughput* is their bytes over that time: what the node moved while it moved something.

- Without `captured_rate_bit_s`: the throughput is taken as the node's link, the network the capture ran on
  (rate = throughput / efficiency); the hosts are not limited.
- With it (the link rate the capture was taken at, when known): every link is that rate; a node whose
  throughput stayed below HOST_LIMITED_SHARE of what the link carries was limited by its own host (CPU,
  copies): it keeps a host link of its throughput in every what-if, in series with its network link.

Latency: per pair of nodes, the least time any message of at most one segment took from the sender's first
byte to the receiver's last; the median over the pairs. Efficiency: what a TCP payload gets of an Ethernet link
(MSS over frame bytes at MTU 1500 with TCP timestamps).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

END_COLUMNS = ("node", "first_ns", "last_ns", "size_bytes")
PAIR_COLUMNS = ("src", "dst", "size_bytes", "send_ns", "recv_ns")
LARGE_MESSAGE_BYTES = 64 * 1024
SEGMENT_BYTES = 1448                 # MSS at MTU 1500: 1500 - 20 (IP) - 32 (TCP with timestamps)
FRAME_BYTES = 1514                   # what a link carries for it: + 14 (Ethernet header)
EFFICIENCY = SEGMENT_BYTES / FRAME_BYTES
HOST_LIMITED_SHARE = 0.85
DEFAULT_LATENCY_S = 50e-6
UNLIMITED_BIT_S = 1e12               # a link or host nothing limited


@dataclass(frozen=True, slots=True)
class Links:
    """One link per node to a non-blocking switch (bit/s each way), and per node its host's own limit
    (bit/s of link bytes, UNLIMITED_BIT_S when none); the one-way latency between two nodes."""

    rates_bit_s: np.ndarray
    host_bit_s: np.ndarray
    latency_s: float
    efficiency: float = EFFICIENCY

    def with_nodes(self, copy_of: np.ndarray) -> Links:
        """Links of another set of nodes, node i taking node copy_of[i]'s."""
        return Links(self.rates_bit_s[copy_of], self.host_bit_s[copy_of], self.latency_s, self.efficiency)

    def with_rate(self, rate_bit_s: float | None) -> Links:
        if rate_bit_s is None:
            return self
        return Links(np.full(len(self.rates_bit_s), float(rate_bit_s)), self.host_bit_s, self.latency_s,
                     self.efficiency)

    def with_latency(self, latency_s: float | None) -> Links:
        return self if latency_s is None else Links(self.rates_bit_s, self.host_bit_s, float(latency_s),
                                                    self.efficiency)


@dataclass(frozen=True, slots=True)
class Calibration:
    """What the capture showed of the network (figures for summary.json) and the links it gives."""

    links: Links
    throughput_bit_s: np.ndarray                # payload bit/s per node while busy (NaN: never busy)
    busy_s: np.ndarray
    host_limited: np.ndarray                    # bool per node
    latency_pairs: int
    captured_rate_bit_s: float | None = None
    notes: list[str] = field(default_factory=list)

    def summary(self, names: list[str]) -> dict:
        return {
            "captured_rate_bit_s": self.captured_rate_bit_s,
            "latency_s": self.links.latency_s, "latency_pairs": self.latency_pairs,
            "efficiency": self.links.efficiency,
            "nodes": [{"node": name, "link_bit_s": float(rate), "throughput_bit_s": _finite(throughput),
                       "busy_s": float(busy), "host_limited": bool(limited),
                       "host_bit_s": None if host >= UNLIMITED_BIT_S else float(host)}
                      for name, rate, throughput, busy, limited, host in zip(
                          names, self.links.rates_bit_s, self.throughput_bit_s, self.busy_s, self.host_limited,
                          self.links.host_bit_s)],
            "notes": list(self.notes),
        }


def _finite(value: float) -> float | None:
    return float(value) if np.isfinite(value) else None


def union_seconds(first_ns: np.ndarray, last_ns: np.ndarray) -> float:
    """Length of the union of [first, last] intervals, in seconds."""
    if len(first_ns) == 0:
        return 0.0
    order = np.argsort(first_ns, kind="stable")
    first, last = first_ns[order].astype(np.int64), last_ns[order].astype(np.int64)
    reach = np.maximum.accumulate(last)
    # an interval opens a new stretch when it starts after everything before it ended
    opens = np.ones(len(first), dtype=bool)
    opens[1:] = first[1:] > reach[:-1]
    stretch = np.cumsum(opens) - 1
    starts = first[opens]
    ends = np.zeros(len(starts), dtype=np.int64)
    np.maximum.at(ends, stretch, last)
    return float((ends - starts).sum()) / 1e9


def node_throughput(ends: pd.DataFrame, nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """(payload bit/s while busy, busy seconds) per node, from the large messages it sent and received."""
    large = ends[(ends["size_bytes"] >= LARGE_MESSAGE_BYTES) & (ends["node"] >= 0) & (ends["node"] < nodes)].dropna()
    throughput = np.full(nodes, np.nan)
    busy = np.zeros(nodes)
    for node, mine in large.groupby("node"):
        seconds = union_seconds(mine["first_ns"].to_numpy(np.int64), mine["last_ns"].to_numpy(np.int64))
        busy[int(node)] = seconds
        if seconds > 0:
            throughput[int(node)] = mine["size_bytes"].sum() * 8 / seconds
    return throughput, busy


def one_way_latency(pairs: pd.DataFrame) -> tuple[float, int]:
    """(median over pairs of nodes of their least one-segment transit, pairs) — DEFAULT_LATENCY_S without any."""
    small = pairs[(pairs["size_bytes"] <= SEGMENT_BYTES)].dropna(subset=["send_ns", "recv_ns"])
    transit = (small["recv_ns"] - small["send_ns"]) / 1e9
    least = transit[transit >= 0].groupby([small["src"], small["dst"]]).min()
    if len(least) == 0:
        return DEFAULT_LATENCY_S, 0
    return max(float(least.median()), 1e-6), int(len(least))


def calibrate(ends: pd.DataFrame, pairs: pd.DataFrame, nodes: int, captured_rate_bit_s: float | None = None
              ) -> Calibration:
    throughput, busy = node_throughput(ends, nodes)
    latency, latency_pairs = one_way_latency(pairs)
    notes = []
    seen = throughput[np.isfinite(throughput)]
    if captured_rate_bit_s is None:
        fallback = float(np.median(seen)) / EFFICIENCY if len(seen) else UNLIMITED_BIT_S
        if not len(seen):
            notes.append(f"no message of {LARGE_MESSAGE_BYTES} bytes or more: the links are taken as unlimited")
        rates = np.where(np.isfinite(throughput), throughput / EFFICIENCY, fallback)
        limited = np.zeros(nodes, dtype=bool)
        host = np.full(nodes, UNLIMITED_BIT_S)
    else:
        rates = np.full(nodes, float(captured_rate_bit_s))
        limited = np.isfinite(throughput) & (throughput < HOST_LIMITED_SHARE * captured_rate_bit_s * EFFICIENCY)
        host = np.where(limited, throughput / EFFICIENCY, UNLIMITED_BIT_S)
        if limited.any():
            notes.append(f"{int(limited.sum())} of {nodes} nodes moved less than {HOST_LIMITED_SHARE:.0%} of what "
                         "their link carries while busy: their hosts limited them, and keep that limit")
    return Calibration(Links(rates.astype(np.float64), host.astype(np.float64), latency), throughput, busy,
                       limited, latency_pairs, captured_rate_bit_s, notes)
