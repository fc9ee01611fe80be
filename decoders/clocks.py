"""Clock offset and drift between captures, from messages seen at both ends (minimum-delay estimation).

Each capture timestamps with its own clock. A message sent from capture A's host and received at capture B's
gives a one-way "delay" d_AB = recv_ts_B - send_ts_A = transit + theta, theta = clock_B - clock_A. Transits
are never negative, so theta(t) <= every d_AB and theta(t) >= every -d_BA (messages the other way): the lower
envelope (lower convex hull) of each direction's delays over time bounds the clock difference from one side.
As in NTP and in passive one-way-delay measurement (Moon, Skelly & Towsley 1999; Zhang, Liu & Xia 2002),
with a linear clock model theta(t) = theta0 + s * t (offset and drift):

    theta(t) = (hull_AB(t) - hull_BA(t)) / 2          error bound(t) = (hull_AB(t) + hull_BA(t)) / 2

where hull_AB and hull_BA are support lines of the two hulls, hull_AB with slope s and hull_BA with slope -s
(the drift shows with opposite signs in the two directions); s is chosen to maximise the half-sum, i.e. the
minimum round trip. That line theta(t) is the one as far from both envelopes as possible: every sample's
aligned one-way delay is at least that half-sum, so aligned transits are never negative when the data admit
a linear clock at all (a pair that does not is flagged `consistent` false). The error bound reported is
rigorous for a linear clock: with S the interval of slopes the samples allow, the true theta(t) lies below
the highest value at t of hull_AB's support lines with slopes in S, and above minus the same for hull_BA;
the distance from the estimate is convex in t, so its maximum over the time the samples span, and the two
captures' own spans when known, is at one end. Both the first and the last byte of each message are samples
(each is the same packet at both ends, so each is a valid one-way delay). Capture timestamps' own
resolution (a microsecond for pcap) comes on top.

Every capture of a job (decoders.timeline: the captures linked by messages they both saw; another job's
captures never move its clocks) is then aligned to the job's reference along the shortest-path tree over the
pairs weighted by their bounds, composing the pairs' affine maps; bounds add up along the path. In
clocks.parquet (CLOCK_COLUMNS):

    aligned_ns = ts_ns + offset_ns + round(drift_ppm * 1e-6 * (ts_ns - epoch_ts_ns))

with one epoch_ts_ns per job. Both offset_ns and drift_ppm are corrections (added): a capture whose clock runs
20 ppm fast gets drift_ppm ~ -20. A capture linked to the reference by no chain of pairs with samples in both
directions is not aligned: offset_ns, drift_ppm and error_bound_ns are null, `reason` says why, and its times
stay on its own clock.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

import numpy as np
import pyarrow as pa

from dlcsniff.decoders.column_values import column_values
from dlcsniff.decoders.schema import CLOCKS

if TYPE_CHECKING:
    import pandas as pd

CLOCK_COLUMNS = CLOCKS.names
SAMPLE_COLUMNS = ("send_capture", "send_ts_ns", "recv_capture", "recv_ts_ns")
MAX_DRIFT_PPM = 1000.0        # a clock off by more than 0.1 % is broken; no fit goes beyond
BISECTION_STEPS = 48          # the slope to ~1e-17: a tenth of a nanosecond over a day
TIE_NS = 1.0                  # points within a nanosecond of the envelope count as on it
BUCKET_NS = 1_000_000         # the thinning of samples (see Envelopes.of)


@dataclass(frozen=True, slots=True)
class Envelopes:
    """Sums of lower envelopes, one sum per group: F_g(s) = sum over the parts p of group g of
    min over the samples i of part p of (y_i - s * z_i), for slopes |s| <= the max_slope it was made for.
    Each F_g is concave in s. Samples are sorted by part; every part has samples."""

    starts: np.ndarray          # per part: its first sample
    sizes: np.ndarray           # per part: its number of samples
    group: np.ndarray           # per part: its group
    z: np.ndarray
    y: np.ndarray
    groups: int

    @classmethod
    def of(cls, part: np.ndarray, group: np.ndarray, z: np.ndarray, y: np.ndarray, groups: int,
           max_slope: float) -> Envelopes:
        """From unsorted samples. A sample more than max_slope * BUCKET_NS above the lowest of its part
        within the same BUCKET_NS of z is never the lowest at an allowed slope: it is dropped (a busy
        capture has thousands of messages per bucket)."""
        bucket = np.floor(z / BUCKET_NS).astype(np.int64)
        order = np.lexsort([bucket, part])
        part, bucket, z, y = part[order], bucket[order], z[order], y[order]
        new_bucket = np.diff(part, prepend=-1) != 0
        new_bucket[1:] |= np.diff(bucket) != 0
        floor = np.minimum.reduceat(y, np.flatnonzero(new_bucket))
        keep = y <= floor[np.cumsum(new_bucket) - 1] + max_slope * BUCKET_NS + TIE_NS
        part, z, y = part[keep], z[keep], y[keep]
        starts = np.flatnonzero(np.diff(part, prepend=-1) != 0)
        return cls(starts=starts, sizes=np.diff(np.append(starts, len(part))), group=group, z=z, y=y, groups=groups)

    def at(self, slope: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """F_g(slope_g), and the ends of its supergradient interval (-sum of the lowest points' z)."""
        height = self.y - np.repeat(slope[self.group], self.sizes) * self.z
        lowest = np.minimum.reduceat(height, self.starts)
        on = height <= np.repeat(lowest, self.sizes) + TIE_NS
        z_min = np.minimum.reduceat(np.where(on, self.z, np.inf), self.starts)
        z_max = np.maximum.reduceat(np.where(on, self.z, -np.inf), self.starts)
        per_group = lambda v: np.bincount(self.group, weights=v, minlength=self.groups)  # noqa: E731
        return per_group(lowest), -per_group(z_max), -per_group(z_min)

    def maximise(self, low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(slope, F) at the maximum of each F_g over [low_g, high_g], by bisection on the supergradient."""
        low, high = low.astype(np.float64).copy(), high.astype(np.float64).copy()
        for _ in range(BISECTION_STEPS):
            slope = (low + high) / 2
            _, rising_least, rising_most = self.at(slope)
            low = np.where(rising_least > 0, slope, np.where(rising_most < 0, low, slope))
            high = np.where(rising_most < 0, slope, np.where(rising_least > 0, high, slope))
        slope = (low + high) / 2
        return slope, self.at(slope)[0]

    def crossing(self, inside: np.ndarray, outside: np.ndarray) -> np.ndarray:
        """Per group, where F_g falls to zero between a slope where F_g >= 0 and one where F_g < 0."""
        inside, outside = inside.astype(np.float64).copy(), outside.astype(np.float64).copy()
        for _ in range(BISECTION_STEPS):
            slope = (inside + outside) / 2
            positive = self.at(slope)[0] >= 0
            inside = np.where(positive, slope, inside)
            outside = np.where(positive, outside, slope)
        return inside


def pair_clocks(samples: Mapping, epoch_ns: int, spans: Mapping[str, tuple[int, int]] | None = None
                ) -> dict[str, np.ndarray]:
    """Per unordered pair of captures (a < b by name) that exchanged messages both ways: the clock
    difference theta = clock_b - clock_a = theta0_ns + slope * (t_a - epoch_ns), its error bound, whether
    a linear clock fits every sample (`consistent`), and the samples per direction. `samples` has
    SAMPLE_COLUMNS (columns by name): one row per one-way delay. The bound holds over the samples' time span and
    over both captures' `spans` (capture → (first_ns, last_ns), each on its own clock) when given. Returns the
    pairs' columns: a, b, theta0_ns, slope, error_bound_ns, consistent, samples_ab, samples_ba."""
    # captures as codes in name order, so that "a < b" compares codes
    n = len(samples["send_capture"])
    names, codes = np.unique(np.array([str(c) for c in (*samples["send_capture"], *samples["recv_capture"])],
                                      dtype=object), return_inverse=True)
    send, recv = codes[:n], codes[n:]
    between = send != recv
    send, recv = send[between], recv[between]
    send_ts = np.asarray(samples["send_ts_ns"], dtype=np.int64)[between]
    recv_ts = np.asarray(samples["recv_ts_ns"], dtype=np.int64)[between]
    forward = send < recv
    unordered = np.where(forward, send, recv) * len(names) + np.where(forward, recv, send)
    # only pairs with messages both ways bound the clock difference from both sides
    ways = np.zeros((len(names) ** 2, 2), dtype=np.int64)
    np.add.at(ways, (unordered, forward.astype(np.int64)), 1)
    keep = (ways[unordered] > 0).all(axis=1)
    pair_ids, pair = np.unique(unordered[keep], return_inverse=True)
    pairs = len(pair_ids)
    forward = forward[keep]
    # time on a's clock; delay in the direction of travel
    x = (np.where(forward, send_ts[keep], recv_ts[keep]) - epoch_ns).astype(np.float64)
    delay = (recv_ts[keep] - send_ts[keep]).astype(np.float64)
    direction = pair * 2 + ~forward                      # part: (pair, direction)
    # min(d_AB - s x) + min(d_BA + s x): twice the smallest aligned one-way delay with slope s
    max_slope = np.full(pairs, MAX_DRIFT_PPM * 1e-6)
    band = Envelopes.of(direction, np.arange(2 * pairs) // 2, np.where(forward, x, -x), delay, pairs,
                        MAX_DRIFT_PPM * 1e-6)
    slope, width = band.maximise(-max_slope, max_slope)
    consistent = width >= 0
    low = np.where(consistent & (band.at(-max_slope)[0] < 0), band.crossing(slope, -max_slope), -max_slope)
    high = np.where(consistent & (band.at(max_slope)[0] < 0), band.crossing(slope, max_slope), max_slope)
    low, high = np.where(consistent, low, slope), np.where(consistent, high, slope)
    lowest = np.full(2 * pairs, np.inf)
    np.minimum.at(lowest, direction, delay - slope[pair] * np.where(forward, x, -x))
    upper, lower = lowest[0::2], -lowest[1::2]                   # theta0 lies in [lower, upper]
    theta0 = (upper + lower) / 2
    x_lo, x_hi = np.full(pairs, np.inf), np.full(pairs, -np.inf)
    np.minimum.at(x_lo, pair, x)
    np.maximum.at(x_hi, pair, x)
    if spans is not None:
        known = [spans.get(name, (np.nan, np.nan)) for name in names]
        first = np.array([span[0] for span in known], dtype=np.float64) - epoch_ns
        last = np.array([span[1] for span in known], dtype=np.float64) - epoch_ns
        a, b = pair_ids // len(names), pair_ids % len(names)
        # b's span read on a's clock: minus theta (its slope's share over a span is second order)
        x_lo = np.fmin(x_lo, np.fmin(first[a], first[b] - theta0 - slope * first[b]))
        x_hi = np.fmax(x_hi, np.fmax(last[a], last[b] - theta0 - slope * last[b]))
    bound = np.zeros(pairs)
    for end in (x_lo, x_hi):
        # the highest theta(end) any allowed slope permits (hull_AB) and the lowest (minus hull_BA)
        at_end = x - end[pair]
        hull = Envelopes.of(direction, np.arange(2 * pairs), np.where(forward, at_end, -at_end), delay, 2 * pairs,
                            MAX_DRIFT_PPM * 1e-6)
        _, support = hull.maximise(np.repeat(low, 2), np.repeat(high, 2))
        estimate = theta0 + slope * end
        bound = np.fmax(bound, np.fmax(support[0::2] - estimate, estimate + support[1::2]))
    bound = np.where(consistent, bound, np.abs(width) / 2)
    return {
        "a": np.asarray(names, dtype=object)[pair_ids // len(names)],
        "b": np.asarray(names, dtype=object)[pair_ids % len(names)],
        "theta0_ns": theta0, "slope": slope, "error_bound_ns": bound, "consistent": consistent,
        "samples_ab": np.bincount(pair[forward], minlength=pairs),
        "samples_ba": np.bincount(pair[~forward], minlength=pairs),
    }


def _shortest_path_tree(pairs: dict[str, np.ndarray], reference: str) -> dict[str, tuple[str, int]]:
    """capture → (its parent towards the reference, row of the pair linking them), minimising the summed
    error bounds (Dijkstra over captures: as many steps as captures, not messages)."""
    links: dict[str, list[tuple[float, str, int]]] = {}
    for row, (a, b, bound) in enumerate(zip(pairs["a"].tolist(), pairs["b"].tolist(),
                                            pairs["error_bound_ns"].tolist())):
        links.setdefault(a, []).append((bound, b, row))
        links.setdefault(b, []).append((bound, a, row))
    best = {reference: 0.0}
    parent: dict[str, tuple[str, int]] = {}
    queue = [(0.0, reference)]
    while queue:
        distance, capture = heapq.heappop(queue)
        if distance > best[capture]:
            continue
        for bound, other, row in links.get(capture, ()):
            if distance + bound < best.get(other, np.inf):
                best[other] = distance + bound
                parent[other] = (capture, row)
                heapq.heappush(queue, (distance + bound, other))
    return parent


def linked_groups(captures: list[str], links: Sequence[tuple[str, str]]) -> list[list[str]]:
    """The captures in groups linked by `links` ((a, b): two captures that saw one message), each group sorted
    by name, the groups in the order of their first capture."""
    root = {capture: capture for capture in captures}

    def find(capture: str) -> str:
        while root[capture] != capture:
            root[capture] = root[root[capture]]
            capture = root[capture]
        return capture
    for a, b in links:
        top_a, top_b = find(a), find(b)
        if top_a != top_b:
            root[max(top_a, top_b)] = min(top_a, top_b)
    groups: dict[str, list[str]] = {}
    for capture in sorted(captures):
        groups.setdefault(find(capture), []).append(capture)
    return list(groups.values())


def estimate_clocks(samples: Mapping, captures: list[str], reference: str | None = None,
                    spans: Mapping[str, tuple[int, int]] | None = None) -> pa.Table:
    """clocks.parquet rows of one job: how to align every capture in `captures` with the reference
    (CLOCK_COLUMNS). A capture no chain of pairs with samples both ways links to the reference is listed
    with null offset and drift and the `reason`.

    `samples`: SAMPLE_COLUMNS by name (a pyarrow table's, a DataFrame's or numpy arrays). The reference defaults
    to the first capture. `spans` (capture → (first_ns, last_ns): each capture's first and last timestamp) widens the time over which the bounds hold from the samples' to the captures'.
    Affine maps are kept relative to epoch_ns (the earliest sample time of the job), so float64 keeps
    sub-nanosecond precision whatever the absolute times, and nothing outside the job moves them."""
    captures = [str(c) for c in captures]
    reference = captures[0] if reference is None else reference
    samples = {name: column_values(samples[name]) for name in SAMPLE_COLUMNS}
    times = np.concatenate([np.asarray(samples["send_ts_ns"], dtype=np.int64),
                            np.asarray(samples["recv_ts_ns"], dtype=np.int64)])
    epoch_ns = int(times.min()) if len(times) else 0
    pairs = pair_clocks(samples, epoch_ns, spans)
    parent = _shortest_path_tree(pairs, reference)
    # map to the reference: aligned - E = m * (ts - E) + k; with the summed bound and the edges' consistency
    maps: dict[str, tuple[float, float, float, bool]] = {reference: (1.0, 0.0, 0.0, True)}

    def resolve(capture: str) -> tuple[float, float, float, bool]:
        if capture not in maps:
            up, row = parent[capture]
            m_up, k_up, bound_up, consistent_up = resolve(up)
            pair = {name: values[row] for name, values in pairs.items()}
            theta0, slope = float(pair["theta0_ns"]), float(pair["slope"])
            # pair: clock_b - clock_a = theta0 + slope * (t_a - E); the map capture → up
            if capture == pair["b"]:
                m, k = 1.0 / (1.0 + slope), -theta0 / (1.0 + slope)
            else:
                m, k = 1.0 + slope, theta0
            maps[capture] = (m_up * m, m_up * k + k_up, bound_up + float(pair["error_bound_ns"]),
                             consistent_up and bool(pair["consistent"]))
        return maps[capture]

    rows = []
    for capture in captures:
        if capture != reference and capture not in parent:
            rows.append(unaligned_row(capture, reference, epoch_ns, _why_unlinked(capture, samples, pairs,
                                                                                  reference)))
            continue
        m, k, bound, consistent = resolve(capture)
        via, used = (None, (0, 0)) if capture not in parent else (parent[capture][0], _samples_via(
            {name: values[parent[capture][1]] for name, values in pairs.items()}, capture))
        rows.append({"capture": capture, "reference": reference, "aligned": True, "via": via,
                     "offset_ns": int(round(k)), "drift_ppm": (m - 1.0) * 1e6, "epoch_ts_ns": epoch_ns,
                     "error_bound_ns": int(round(bound)), "consistent": consistent,
                     "messages_used": (used[0] + used[1]) // 2, "samples_from_via": used[0],
                     "samples_to_via": used[1], "reason": None})
    return clock_table(rows)


def unaligned_row(capture: str, reference: str, epoch_ns: int, reason: str) -> dict:
    """The clocks.parquet row of a capture that could not be aligned: no offset, no drift, no bound (its
    times stay on its own clock), and why."""
    return {"capture": capture, "reference": reference, "aligned": False, "via": None, "offset_ns": None,
            "drift_ppm": None, "epoch_ts_ns": epoch_ns, "error_bound_ns": None, "consistent": None,
            "messages_used": 0, "samples_from_via": 0, "samples_to_via": 0, "reason": reason}


def clock_table(rows: list[dict]) -> pa.Table:
    """clocks.parquet rows as a table (CLOCKS)."""
    return CLOCKS.from_columns({name: [row[name] for row in rows] for name in CLOCK_COLUMNS})


def _why_unlinked(capture: str, samples: dict[str, list], pairs: dict[str, np.ndarray], reference: str) -> str:
    """Why no chain of pairs with samples both ways links `capture` to the reference."""
    sent = sum(str(name) == capture for name in samples["send_capture"])
    received = sum(str(name) == capture for name in samples["recv_capture"])
    partners = sorted({*pairs["b"][pairs["a"] == capture], *pairs["a"][pairs["b"] == capture]})
    if not sent and not received:
        return ("no message it sent or received was seen by the capture at the other end (it saw others' "
                "messages only, or its peers' captures are missing)")
    if not partners:
        return (f"the messages seen at both ends go one way only ({sent} one-way delays from it, {received} to "
                f"it): they bound its clock from one side only")
    return (f"it exchanged messages both ways only with {', '.join(partners)}, and no messages both ways link "
            f"those to {reference}")


def _samples_via(pair: dict, capture: str) -> tuple[int, int]:
    """(samples from the parent to `capture`, samples from `capture` to the parent)."""
    if capture == pair["b"]:
        return int(pair["samples_ab"]), int(pair["samples_ba"])
    return int(pair["samples_ba"]), int(pair["samples_ab"])


def aligned_ns(ts_ns: np.ndarray, seen: np.ndarray, captures: Sequence[str | None], clocks) -> np.ndarray:
    """Times on the reference clock of each capture's job (int64 ns): each row's `ts_ns` read with its capture's
    clock (clocks.parquet's columns by name); a capture the table does not know, or could not align (null
    offset), keeps its own clock. Where `seen` is false the result is the capture's epoch: no time."""
    known = {capture: (offset or 0, drift or 0.0, epoch or 0) for capture, offset, drift, epoch in zip(
        *(column_values(clocks[name]) for name in ("capture", "offset_ns", "drift_ppm", "epoch_ts_ns")))}
    found = [known.get(capture, (0, 0.0, 0)) for capture in captures]
    offset = np.array([clock[0] for clock in found], dtype=np.int64)
    drift = np.array([clock[1] for clock in found], dtype=np.float64)
    epoch = np.array([clock[2] for clock in found], dtype=np.int64)
    raw = np.where(seen, np.asarray(ts_ns, dtype=np.int64), epoch)
    return raw + offset + np.rint(drift * 1e-6 * (raw - epoch).astype(np.float64)).astype(np.int64)


def align(ts_ns: np.ndarray | pd.Series, capture: np.ndarray | pd.Series, clocks) -> pd.arrays.IntegerArray:
    """`aligned_ns` for pandas (analysis/): times as a nullable Int64 array, null times staying null; `clocks` a
    DataFrame or a pyarrow table of clocks.parquet."""
    from dlcsniff.decoders.arrow_without_pandas import pandas
    pd = pandas()

    ts = pd.array(ts_ns, dtype="Int64")
    names = [None if name is None else str(name) for name in column_values(pd.Series(capture, dtype=object))]
    missing = ts.isna()
    shifted = aligned_ns(ts.to_numpy(dtype=np.int64, na_value=0), ~missing, names, clocks)
    return pd.arrays.IntegerArray(shifted, missing.copy())
