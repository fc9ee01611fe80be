"""What every sans-IO decoder here shares (h11's shape): bytes or gaps in, events out.

A decoder is fed with `receive_data(data, ts_ns)` (and, where a capture can lose bytes, `receive_gap`), never
reads a file or a clock, and hands back typed events from `next_event()` until it answers `NEED_DATA`. Needing
more bytes is that return value, never an exception. Stream decoders that lose their footing report it with
the two events below instead of raising.
"""
from __future__ import annotations

from dataclasses import dataclass


class Sentinel:
    """A named marker value (NEED_DATA)."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __repr__(self) -> str:
        return self._name


NEED_DATA = Sentinel("NEED_DATA")
"""Returned by `next_event` when no event can be produced from the bytes received so far."""


@dataclass(frozen=True, slots=True)
class Resync:
    """A stream decoder resumed at stream offset `offset` after `lost_bytes` bytes it could not decode
    (a capture hole over a header, or a capture that started mid-stream)."""
    offset: int
    lost_bytes: int
    ts_ns: int
    reason: str


@dataclass(frozen=True, slots=True)
class DecodeFailed:
    """The stream stopped making sense at `offset`; later bytes are only counted (lost_bytes)."""
    offset: int
    reason: str
