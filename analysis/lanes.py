"""Spans that overlap, put on as few rows as hold them apart: the report's timeline and the Chrome trace's
tracks (a trace viewer draws slices on one track only when they nest, and binds a flow to the slice around it)."""
from __future__ import annotations

import heapq

import numpy as np


def packed_lanes(starts: np.ndarray, ends: np.ndarray, *, touching: bool = True) -> np.ndarray:
    """Interval partitioning (earliest start first, into the lane freed earliest): the fewest lanes in which no
    two spans overlap; with touching=False not even in an instant (a span may start where the lane's last one
    ended only when touching). Sequential by nature, O(n log n)."""
    lanes = np.zeros(len(starts), dtype=np.int64)
    free: list[tuple[int, int]] = []            # (end of the lane's last span, lane)
    for index in np.argsort(starts, kind="stable"):
        if free and (free[0][0] <= starts[index] if touching else free[0][0] < starts[index]):
            _, lane = heapq.heappop(free)
        else:
            lane = len(free)
        lanes[index] = lane
        heapq.heappush(free, (int(ends[index]), lane))
    return lanes


def lanes_per_track(frame, by: list[str], start: str = "start_ns", end: str = "end_ns", *,
                    touching: bool = False) -> np.ndarray:
    """packed_lanes within each group of `frame` (a DataFrame) by the columns `by`: the lane of every row on its
    track (by default never touching: a flow at the instant two slices meet would lie in both)."""
    lanes = np.zeros(len(frame), dtype=np.int64)
    for rows in frame.groupby(by, sort=False).indices.values():
        lanes[rows] = packed_lanes(frame[start].to_numpy()[rows], frame[end].to_numpy()[rows], touching=touching)
    return lanes
