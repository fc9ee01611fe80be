"""The one error the decoders raise internally, and the recovery event stream decoders share; boundaries
turn errors into an event or a one-line message."""
from __future__ import annotations

from dataclasses import dataclass


class DecodeError(Exception):
    """Bytes that do not make sense as the format being decoded."""


@dataclass(frozen=True, slots=True)
class Resync:
    """A stream decoder resumed at stream offset `offset` after `lost_bytes` bytes it could not decode
    (a capture hole over a header, or a capture that started mid-stream)."""
    offset: int
    lost_bytes: int
    ts_ns: int
    reason: str
