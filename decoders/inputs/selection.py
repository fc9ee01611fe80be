"""Which packets of a capture to decode: a pcap filter expression (decoders.inputs.pcap_filter) and a time
window, applied between the reader and the TCP decoder, to a whole batch at once.

`PacketSelection` is what the user asked for (plain data: it goes to worker processes and Dask tasks);
`PacketSelector` applies it to one capture's records. A window bound is an epoch time, or a time after the
start of the capture (`relative`): the earliest first packet of the job's inputs (`origin_ns`), or, when the
selection was made without knowing it (a stream), the capture's own first packet. The window is
[start, end): a packet at `end` is left out.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

import numpy as np

from dlcsniff.decoders.inputs.capture_file import Packet, RecordBatch, first_last_ts_ns
from dlcsniff.decoders.inputs.pcap_filter import PcapFilter
from dlcsniff.decoders.quantities import parse_duration


@dataclass(frozen=True)
class TimeBound:
    ns: int                   # epoch ns; relative: ns after the start of the capture
    relative: bool = False
    text: str | None = None   # as the user wrote it

    def at(self, origin_ns: int) -> int:
        return origin_ns + self.ns if self.relative else self.ns


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def parse_time_bound(text: str) -> TimeBound:
    """A window bound as a user writes it: epoch seconds, an ISO 8601 time (without a zone: local time, as
    editcap -A/-B), or +duration after the start of the capture (decoders.quantities: a unit is needed, +2.8s,
    +720ms). Raises ValueError when it is none of those."""
    given = text.strip()
    if given.startswith("+"):
        try:
            return TimeBound(round(parse_duration(given[1:]) * 1e9), True, text)
        except ValueError as exc:
            raise ValueError(str(exc).replace(repr(given[1:]), repr(given), 1)) from None
    try:
        return TimeBound(int(Decimal(given) * 1_000_000_000), False, text)
    except InvalidOperation:
        pass
    try:
        moment = datetime.datetime.fromisoformat(given)
    except ValueError:
        raise ValueError(f"{text!r}: not a time (epoch seconds, ISO 8601 like 2024-05-01T12:00:00Z, or +5s after "
                         f"the start of the capture)") from None
    if moment.tzinfo is None:
        moment = moment.astimezone()
    return TimeBound((moment - _EPOCH) // datetime.timedelta(microseconds=1) * 1000, False, text)


def packet_selection(filter_expr: str | None = None, start: str | None = None, end: str | None = None
                     ) -> PacketSelection | None:
    """The selection a filter expression and window bounds (parse_time_bound's forms) ask for; None for all
    packets. Raises ValueError for a bound that is no time, or an end not after the start."""
    window = tuple(None if text is None else parse_time_bound(text) for text in (start, end))
    if None not in window and window[0].relative == window[1].relative and window[1].ns <= window[0].ns:
        raise ValueError(f"the end {end!r} is not after the start {start!r}")
    if filter_expr is None and window == (None, None):
        return None
    return PacketSelection(filter_expr, *window)


@dataclass(frozen=True)
class PacketSelection:
    filter: str | None = None
    start: TimeBound | None = None
    end: TimeBound | None = None
    origin_ns: int | None = None      # the start relative bounds count from, when known before decoding

    @property
    def relative(self) -> bool:
        return any(bound is not None and bound.relative for bound in (self.start, self.end))

    def summary(self) -> dict:
        """What the decode summary records of it."""
        def bound(b: TimeBound | None) -> dict | None:
            if b is None:
                return None
            return {"given": b.text, "ts_ns": b.at(self.origin_ns) if self.origin_ns is not None or not b.relative
                    else None, "after_capture_start_ns": b.ns if b.relative else None}
        return {"filter": self.filter, "start": bound(self.start), "end": bound(self.end)}


class PacketSelector:
    """A selection at work on one capture: `select` keeps what passes, `selected` counts it."""

    def __init__(self, selection: PacketSelection):
        self.selection = selection
        self.filter = PcapFilter(selection.filter) if selection.filter is not None else None
        self.origin_ns = selection.origin_ns
        self.selected = 0
        self._window: tuple[int | None, int | None] | None = None

    def _bounds(self, first_ts_ns: int) -> tuple[int | None, int | None]:
        if self._window is None:
            origin = self.origin_ns if self.origin_ns is not None else first_ts_ns
            self._window = tuple(None if b is None else b.at(origin) for b in (self.selection.start,
                                                                                self.selection.end))
        return self._window

    def select(self, item: RecordBatch | Packet) -> RecordBatch | Packet | None:
        """The records of `item` the selection keeps (None: none of them)."""
        start, end = self._bounds(first_last_ts_ns(item)[0])
        if item.__class__ is Packet:
            keep = self._keeps(item, start, end)
            self.selected += keep
            return item if keep else None
        columns = item.columns()
        if columns is None:          # timestamps beyond int64 arithmetic: one packet at a time
            keep = np.fromiter((self._keeps(packet, start, end) for packet in item.packets()), dtype=bool,
                               count=len(item))
        else:
            keep = np.ones(len(item), dtype=bool)
            if start is not None:
                keep &= columns.ts_ns >= start
            if end is not None:
                keep &= columns.ts_ns < end
            if self.filter is not None:
                rows = np.flatnonzero(keep)
                keep[rows] = self.filter.keep(item.buf, columns, rows)
        kept = int(keep.sum())
        self.selected += kept
        if kept == len(item):
            return item
        return item.subset(keep) if kept else None

    def _keeps(self, packet: Packet, start: int | None, end: int | None) -> bool:
        return ((start is None or packet.ts_ns >= start) and (end is None or packet.ts_ns < end)
                and (self.filter is None or self.filter.matches(packet.linktype, packet.data, packet.orig_len)))

    def close(self) -> None:
        if self.filter is not None:
            self.filter.close()
