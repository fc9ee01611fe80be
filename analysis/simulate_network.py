"""The network a capture shows, calibrated for the replay: every node's link (each way), the one-way latency,
and the hosts' own throughput when the capture shows that they, not the network, limited the transfers.

Input: `ends`, one row per message as a node's own capture saw it leave or arrive (END_COLUMNS: the node,
whether it sent it, the message's first and last byte there, its size), and `pairs`, one row per message seen
at both ends (PAIR_COLUMNS: sender, receiver, size, the sender's first byte, the receiver's last byte).

A node's *throughput* one way is the bytes of the large messages (at least LARGE_MESSAGE_BYTES) its own capture
saw leave (or arrive) over the union of their intervals: what it moved while it moved something. A node moves
less than its link when its peers are the bottleneck (workers pushing into one server share the server's
link): when a node moved less than every peer it exchanged large messages with, its link is taken to be at
least as fast as the slowest of them. Rate = throughput / efficiency, where efficiency is what a TCP payload
gets of an Ethernet link (MSS over frame bytes at MTU 1500 with TCP timestamps). A direction without large
messages takes the node's other direction, else the median of the nodes.

A what-if changes the calibrated network by what the user changed. The calibration absorbs what the
simulator does not model (a shaper's bursts, TCP's dynamics beside the framing EFFICIENCY covers), so a stated
rate is not put in place of a calibrated link. With `captured_rate_bit_s` (the link rate the capture was taken
at, when known: the links' `anchor_bit_s`), every link was that rate: each gets it, or what the links
carried (every node's bytes both ways over their busy seconds) when that is more (a shaper that let bursts through), and a what-if at rate R scales it
by R / the captured rate, so that the captured rate gives back the replay. (Links that carried less than the
rate, TCP's own pace, get the rate: the simulators model that pace themselves.) If even the busiest node moved less than HOST_LIMITED_SHARE of what the link carries, the
hosts (CPU, copies), not the links, limited the transfers: every link is the captured rate, and each node keeps
a host link of its own rate (the calibration's, shared by both ways) in series with its network link, in every
what-if. Without a captured rate, a what-if's rate replaces every calibrated link (the calibrated links are
taken for the rates the capture was taken at).

Latency: per pair of nodes, the least time any message of at most one segment took from the sender's first
byte to the receiver's last; the median over the pairs.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pandas as pd

END_COLUMNS = ("node", "sent", "first_ns", "last_ns", "size_bytes")
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
    """Per node, its link to a non-blocking switch, each way (bit/s of link bytes), and its host's own limit
    (UNLIMITED_BIT_S when none); the one-way latency between two nodes; the link rate they were calibrated at,
    when known (`anchor_bit_s`: see the module doc)."""

    up_bit_s: np.ndarray
    down_bit_s: np.ndarray
    host_bit_s: np.ndarray
    latency_s: float
    efficiency: float = EFFICIENCY
    anchor_bit_s: float | None = None

    def with_nodes(self, copy_of: np.ndarray) -> Links:
        """Links of another set of nodes, node i taking node copy_of[i]'s."""
        return replace(self, up_bit_s=self.up_bit_s[copy_of], down_bit_s=self.down_bit_s[copy_of],
                       host_bit_s=self.host_bit_s[copy_of])

    def with_rate(self, rate_bit_s: float | None) -> Links:
        """Every link at rate_bit_s each way: the calibrated links scaled by rate_bit_s / anchor_bit_s, or (no
        anchor) rate_bit_s itself; the hosts keep their limits."""
        if rate_bit_s is None:
            return self
        if self.anchor_bit_s is not None:
            scale = float(rate_bit_s) / self.anchor_bit_s
            return replace(self, up_bit_s=self.up_bit_s * scale, down_bit_s=self.down_bit_s * scale)
        rate = np.full(len(self.up_bit_s), float(rate_bit_s))
        return replace(self, up_bit_s=rate, down_bit_s=rate.copy())

    def with_latency(self, latency_s: float | None) -> Links:
        if latency_s is None:
            return self
        return replace(self, latency_s=float(latency_s))


@dataclass(frozen=True, slots=True)
class Calibration:
    """What the capture showed of the network (figures for summary.json) and the links it gives."""

    links: Links
    up_throughput_bit_s: np.ndarray             # payload bit/s per node while busy (NaN: never busy that way)
    down_throughput_bit_s: np.ndarray
    latency_pairs: int
    captured_rate_bit_s: float | None = None
    host_limited: bool = False
    notes: list[str] = field(default_factory=list)

    def summary(self, names: list[str]) -> dict:
        links = self.links
        return {
            "captured_rate_bit_s": self.captured_rate_bit_s, "host_limited": self.host_limited,
            "latency_s": links.latency_s, "latency_pairs": self.latency_pairs, "efficiency": links.efficiency,
            "nodes": [{"node": name, "up_bit_s": float(up), "down_bit_s": float(down),
                       "up_throughput_bit_s": _finite(up_seen), "down_throughput_bit_s": _finite(down_seen),
                       "host_bit_s": None if host >= UNLIMITED_BIT_S else float(host)}
                      for name, up, down, up_seen, down_seen, host in zip(
                          names, links.up_bit_s, links.down_bit_s, self.up_throughput_bit_s,
                          self.down_throughput_bit_s, links.host_bit_s)],
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


def busy(ends: pd.DataFrame, nodes: int, sent: bool) -> tuple[np.ndarray, np.ndarray]:
    """(payload bytes of the large messages, seconds busy moving them) per node one way."""
    large = ends[(ends["size_bytes"] >= LARGE_MESSAGE_BYTES) & (ends["sent"] == sent) & (ends["node"] >= 0)
                 & (ends["node"] < nodes)].dropna()
    moved, seconds = np.zeros(nodes), np.zeros(nodes)
    for node, mine in large.groupby("node"):
        seconds[int(node)] = union_seconds(mine["first_ns"].to_numpy(np.int64), mine["last_ns"].to_numpy(np.int64))
        moved[int(node)] = mine["size_bytes"].sum()
    return moved, seconds


def throughput(ends: pd.DataFrame, nodes: int, sent: bool) -> np.ndarray:
    """Payload bit/s per node one way while busy (NaN: no large message that way)."""
    moved, seconds = busy(ends, nodes, sent)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(seconds > 0, moved * 8 / np.where(seconds > 0, seconds, 1.0), np.nan)


def carried_bit_s(ends: pd.DataFrame, nodes: int) -> float:
    """Payload bit/s the links carried while busy, over every node both ways (all their bytes over all their busy
    seconds; 0 without a large message): what links of one rate carried, a shaper's bursts included. Steadier
    than a median of the nodes' rates, which a burst that one node rode and another missed moves by a third."""
    moved, seconds = (np.concatenate(way) for way in zip(busy(ends, nodes, True), busy(ends, nodes, False)))
    total = float(seconds.sum())
    return float(moved.sum()) * 8 / total if total > 0 else 0.0


def _slowest_peer(pairs: pd.DataFrame, nodes: int, peer_throughput: np.ndarray, node: str, peer: str) -> np.ndarray:
    large = pairs[(pairs["size_bytes"] >= LARGE_MESSAGE_BYTES) & (pairs[node] < nodes) & (pairs[peer] < nodes)]
    large = large[[node, peer]].drop_duplicates()
    slowest = pd.Series(peer_throughput[large[peer].to_numpy(np.int64)]).groupby(large[node].to_numpy(np.int64)).min()
    return slowest.reindex(np.arange(nodes)).to_numpy(np.float64)


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
    up_seen, down_seen = throughput(ends, nodes, True), throughput(ends, nodes, False)
    latency, latency_pairs = one_way_latency(pairs)
    notes = []
    # a node slower than every peer it exchanged with was not its own bottleneck: at least the slowest peer
    up = np.fmax(up_seen, _slowest_peer(pairs, nodes, down_seen, "src", "dst"))
    down = np.fmax(down_seen, _slowest_peer(pairs, nodes, up_seen, "dst", "src"))
    up, down = np.where(np.isfinite(up), up, down), np.where(np.isfinite(down), down, up)
    seen = np.concatenate([up[np.isfinite(up)], down[np.isfinite(down)]])
    fallback = float(np.median(seen)) if len(seen) else UNLIMITED_BIT_S * EFFICIENCY
    if not len(seen):
        notes.append(f"no message of {LARGE_MESSAGE_BYTES} bytes or more: the links are taken as unlimited")
    up = np.where(np.isfinite(up), up, fallback) / EFFICIENCY
    down = np.where(np.isfinite(down), down, fallback) / EFFICIENCY
    host = np.full(nodes, UNLIMITED_BIT_S)
    limited = False
    if captured_rate_bit_s is not None:
        busiest = float(np.nanmax(np.concatenate([up_seen, down_seen]))) if len(seen) else None
        if busiest is not None and busiest < HOST_LIMITED_SHARE * captured_rate_bit_s * EFFICIENCY:
            limited = True
            host = np.minimum(np.fmax(up, down), captured_rate_bit_s)
            notes.append(f"the busiest node moved {busiest / 1e6:.0f} Mbit/s, less than {HOST_LIMITED_SHARE:.0%} "
                         "of what its link carries: the hosts limited the transfers, and keep that limit")
            up = down = np.full(nodes, float(captured_rate_bit_s))
        else:
            # every link was that rate; one that carried more (a shaper's bursts) carries that in the replay
            carried = max(carried_bit_s(ends, nodes) / EFFICIENCY, captured_rate_bit_s)
            if carried > captured_rate_bit_s:
                notes.append(f"the links carried {carried / captured_rate_bit_s:.3f}× the captured rate (all the "
                             "nodes' bytes over their busy time): every link carries that in the replay, and a "
                             "what-if scales it")
            up = down = np.full(nodes, carried)
    return Calibration(Links(up.astype(np.float64), down.astype(np.float64), host.astype(np.float64), latency,
                             anchor_bit_s=captured_rate_bit_s),
                       up_seen, down_seen, latency_pairs, captured_rate_bit_s, limited, notes)
