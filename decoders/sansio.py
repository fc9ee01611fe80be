"""What every sans-IO decoder here shares (h11's shape): bytes or gaps in, events out.

A stream decoder reads one direction of one stream and has one shape, `StreamDecoder`: it is fed captured bytes
(`receive_data`), the sizes of the ranges the capture did not record (`receive_gap`) and the stream's end
(`receive_end`), never reads a file or a clock, and hands back typed events from `next_event()` until it answers
`NEED_DATA`. Needing more bytes is that return value, never an exception. Stream decoders that lose their
footing report it with the two events below instead of raising.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


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


class StreamDecoder(Protocol):
    """One direction of a stream, decoded: the shape every stream decoder under decoders/protocols/ has.

    The capture's losses are part of the input, not an error: a stream decoder is told what it did not see
    (`receive_gap`) and decides what that costs; the end of the stream is said (`receive_end`), never encoded
    in the data. tests/decoders/test_stream_decoder_shape.py holds each decoder to this.
    """

    def receive_data(self, data: bytes | memoryview, ts_ns: int) -> None:
        """The stream's next captured bytes, captured at ts_ns. An empty chunk changes nothing. The caller does
        not change a chunk once passed (a decoder may keep views of it)."""

    def receive_gap(self, size: int, ts_ns: int, *, lost: bool = True) -> None:
        """The stream's next `size` bytes are not in the capture: lost (never seen), or (lost False) seen and cut
        short on purpose by the snaplen. ts_ns: when the capture showed them missing."""

    def receive_end(self, ts_ns: int) -> None:
        """The stream ended (FIN, RST, or the end of the capture): what was cut short comes out as its final
        events (incomplete, or counted as lost). Nothing is fed after it; a second end changes nothing."""

    def next_event(self) -> object:
        """The next event the input allows, or NEED_DATA. Never raises on bad input."""
