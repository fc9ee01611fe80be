"""TCP reassembly, one direction of one connection at a time (sans-IO: fed Segments, returns events).

A *stream* is one direction of one TCP connection. Its bytes come out in order, each exactly once, as
`StreamData` at stream offsets (0 = the byte after the SYN, or the first byte seen when the capture
started mid-connection). Bytes the capture never saw come out as `StreamGap`, in their place in the
order, so a consumer can skip them:
- a segment cut by the capture's snaplen (or by the capture daemon's in-kernel cut of tensor values): the
  missing tail is known at once and is not lost: the packet was on the wire whole (`StreamGap.lost` False);
- a dropped segment: data buffered past the hole shows it, and the hole is declared lost once the other
  direction has acknowledged beyond it (the receiver got bytes this capture never saw) and a reorder
  window of capture time has passed since that acknowledgement (captures reorder packets: `-i any`
  merges per-CPU queues, and merged or edited captures shuffle them further), when the
  stream is reset or replaced by a new connection, at the end of input, or when the data buffered past
  it exceeds the per-stream bound. Until then it may still be filled by a reordered or retransmitted
  segment.

Sequence numbers are compared modulo 2^32 around the next expected byte, so wrap-around needs nothing
special; offsets are unbounded Python ints. In-order payload is passed through as the Segment's
memoryview, without a copy; only out-of-order data is copied into the per-stream buffer.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Literal

from dlcsniff.decoders.packet import ACK, FIN, RST, SYN, Segment

SEQ_MODULUS = 1 << 32
_SEQ_MASK = SEQ_MODULUS - 1
_SEQ_HALF = 1 << 31
DEFAULT_MAX_BUFFERED_BYTES_PER_STREAM = 4 << 20
# How long after an acknowledgement (in capture time) an unacknowledged-looking hole may still be filled by
# a segment the capture recorded out of order. Data buffered meanwhile stays within the per-stream bound.
REORDER_WINDOW_NS = 50_000_000

StreamKey = tuple[bytes, int, bytes, int]      # (src ip, src port, dst ip, dst port), ips packed


@dataclass(frozen=True, slots=True)
class StreamStarted:
    stream_id: int
    key: StreamKey
    ts_ns: int
    syn_seen: bool               # False: the capture started mid-connection (offset 0 = first byte seen)


@dataclass(frozen=True, slots=True)
class StreamData:
    stream_id: int
    ts_ns: int                   # capture time of the segment that carried these bytes
    offset: int
    data: memoryview


@dataclass(frozen=True, slots=True)
class StreamGap:
    stream_id: int
    ts_ns: int                   # capture time of the packet that showed the bytes are missing
    offset: int
    size: int
    lost: bool = True            # False: the packet was captured, cut short by the snaplen on purpose


@dataclass(frozen=True, slots=True)
class StreamEnded:
    stream_id: int
    ts_ns: int
    reason: Literal["fin", "rst", "eof"]    # eof: the capture holds no end (input ended, or a new SYN replaced it)


StreamEvent = StreamStarted | StreamData | StreamGap | StreamEnded


class TcpStream:
    """One direction's statistics (public) and reassembly state.

    `bytes` counts captured payload bytes delivered as StreamData, each once; `missing_bytes` those
    delivered as lost StreamGaps (segments the capture never saw), `uncaptured_bytes` those of segments it
    saw cut short (snaplen); so `bytes + missing_bytes + uncaptured_bytes` is how far the stream got. `retransmitted_bytes`
    counts payload bytes that repeated bytes already delivered, declared lost or buffered, and payload
    after the stream ended (for a stream whose start was not captured, also bytes before its first byte
    seen). `buffered_bytes` is out-of-order data waiting for a hole to fill. `zero_windows` counts the segments
    (without SYN/FIN/RST, as Wireshark's tcp.analysis.zero_window) in which this direction's sender advertised a
    zero receive window: its application stopped reading the other direction; `zero_window_ns` is how long it kept
    the window closed, from the first zero to the next segment advertising room (still closed: to its last segment).
    """

    __slots__ = ("stream_id", "key", "syn_seen", "first_ts_ns", "last_ts_ns", "packets", "bytes",
                 "missing_bytes", "uncaptured_bytes", "retransmitted_bytes", "fin_seen", "rst_seen", "ended", "buffered_bytes",
                 "zero_windows", "_zero_window_closed_ns", "_window_closed_since_ns",
                 "_isn", "_next_seq", "_next_offset", "_acked_offset", "_acked_ts_ns", "_fin_offset", "_fin_ts_ns",
                 "_pending")

    def __init__(self, stream_id: int, key: StreamKey, ts_ns: int, syn_seen: bool, next_seq: int):
        self.stream_id = stream_id
        self.key = key
        self.syn_seen = syn_seen
        self.first_ts_ns = ts_ns
        self.last_ts_ns = ts_ns
        self.packets = 0
        self.bytes = 0
        self.missing_bytes = 0
        self.uncaptured_bytes = 0
        self.retransmitted_bytes = 0
        self.fin_seen = False
        self.rst_seen = False
        self.ended = False
        self.buffered_bytes = 0
        self.zero_windows = 0
        self._zero_window_closed_ns = 0      # time the window was closed, closings that ended...
        self._window_closed_since_ns: int | None = None   # ...and since when it is closed now
        self._isn = (next_seq - 1) & _SEQ_MASK if syn_seen else None
        self._next_seq = next_seq            # sequence number of the next byte to deliver...
        self._next_offset = 0                # ...and its stream offset
        self._acked_offset = 0               # highest offset the other direction acknowledged...
        self._acked_ts_ns = 0                # ...first acknowledged past the next byte to deliver at this time
        self._fin_offset: int | None = None
        self._fin_ts_ns = 0
        # Out-of-order pieces, sorted and disjoint: (start offset, end offset, bytes or None = never
        # captured (snaplen), capture ts).
        self._pending: list[tuple[int, int, bytes | None, int]] = []

    def __repr__(self) -> str:
        return (f"TcpStream(id={self.stream_id}, packets={self.packets}, bytes={self.bytes}, "
                f"missing={self.missing_bytes}, uncaptured={self.uncaptured_bytes}, retransmitted={self.retransmitted_bytes}, "
                f"syn={self.syn_seen}, fin={self.fin_seen}, rst={self.rst_seen}, ended={self.ended})")

    @property
    def seq_base(self) -> int:
        """The sequence number of stream offset 0 (the byte after the SYN, or the first byte seen when the
        capture started mid-connection): every capture numbers the direction's bytes alike by it."""
        return (self._next_seq - self._next_offset) & _SEQ_MASK

    @property
    def zero_window_ns(self) -> int:
        closed_now = 0 if self._window_closed_since_ns is None else self.last_ts_ns - self._window_closed_since_ns
        return self._zero_window_closed_ns + closed_now

    @property
    def window_closed(self) -> bool:
        """The sender's last window advertisement was zero: its next segment may open it (the per-packet path)."""
        return self._window_closed_since_ns is not None

    def advertise_window(self, window: int, ts_ns: int) -> None:
        """A segment without SYN/FIN/RST advertised this receive window at ts_ns."""
        if window == 0:
            self.zero_windows += 1
            if self._window_closed_since_ns is None:
                self._window_closed_since_ns = ts_ns
        elif self._window_closed_since_ns is not None:
            self._zero_window_closed_ns += ts_ns - self._window_closed_since_ns
            self._window_closed_since_ns = None

    def offset_of(self, seq: int) -> int:
        """Stream offset of a sequence number, taken within 2^31 of the next expected byte."""
        rel = (seq - self._next_seq) & _SEQ_MASK
        return self._next_offset + (rel - SEQ_MODULUS if rel >= _SEQ_HALF else rel)

    # -- in bulk (decoders.tcp_driver): what runs of common segments do, without a feed() each ---------

    @property
    def next_seq(self) -> int:
        return self._next_seq

    @property
    def next_offset(self) -> int:
        return self._next_offset

    @property
    def acked_offset(self) -> int:
        return self._acked_offset

    def takes_bulk(self) -> bool:
        """Open, nothing buffered out of order, no FIN: a segment without SYN/FIN/RST whose whole payload
        starts at the next byte only moves counters, and acknowledging it resolves nothing."""
        return not self.ended and not self._pending and self._fin_offset is None

    def deliver_bulk(self, packets: int, size: int, captured: int, last_ts_ns: int) -> None:
        """What `packets` such segments, `size` payload bytes in all of which the capture holds `captured`
        (the rest cut by the snaplen), the last captured at last_ts_ns, do to the stream (their StreamData
        and StreamGap events aside)."""
        self.packets += packets
        self.last_ts_ns = last_ts_ns
        self.bytes += captured
        self.uncaptured_bytes += size - captured
        self._next_offset += size
        self._next_seq = (self._next_seq + size) & _SEQ_MASK

    def buffers_bulk(self) -> bool:
        """Open, no FIN, data buffered past a hole: a segment without SYN/FIN/RST, captured whole, whose payload
        starts at or after the end of what is buffered only adds a piece, until the per-stream bound or the
        reorder window (`TcpReassembler._resolve_acked`) gives the first hole up."""
        return not self.ended and bool(self._pending) and self._fin_offset is None

    @property
    def acked_ts_ns(self) -> int:
        return self._acked_ts_ns

    @property
    def hole_end_offset(self) -> int:
        """Where the first hole ends (while buffers_bulk)."""
        return self._pending[0][0]

    @property
    def buffered_end_offset(self) -> int:
        """Where the buffered data ends (while buffers_bulk)."""
        return self._pending[-1][1]

    def buffer_bulk(self, pieces: list[tuple[int, int, bytes, int]], packets: int, last_ts_ns: int) -> None:
        """What `packets` such segments do (while buffers_bulk): their payload, pieces (start offset, end
        offset, bytes, capture ts) in order past the buffered end, waits for the hole before it."""
        self._pending.extend(pieces)
        self.buffered_bytes += sum(end - start for start, end, _, _ in pieces)
        self.packets += packets
        self.last_ts_ns = last_ts_ns

    def acknowledge_bulk(self, acked_offset: int, rose_ts_ns: int | None) -> None:
        """The other direction's acknowledgements of a run: the highest offset, and (if any) the time of
        the last rise that started from at most the next byte to deliver (see TcpReassembler.feed)."""
        self._acked_offset = acked_offset
        if rose_ts_ns is not None:
            self._acked_ts_ns = rose_ts_ns


def _piece_start(piece: tuple) -> int:
    return piece[0]


class TcpReassembler:
    """Feed Segments in capture order; get back stream events. `streams[stream_id]` holds the statistics."""

    def __init__(self, max_buffered_bytes_per_stream: int = DEFAULT_MAX_BUFFERED_BYTES_PER_STREAM):
        self.max_buffered_bytes_per_stream = max_buffered_bytes_per_stream
        self.streams: list[TcpStream] = []
        self._by_key: dict[StreamKey, TcpStream] = {}

    def feed(self, seg: Segment) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        key = (seg.src, seg.sport, seg.dst, seg.dport)
        stream = self._by_key.get(key)
        flags = seg.flags
        ts_ns = seg.ts_ns
        if flags & SYN:
            if stream is None or stream.ended or stream._isn != seg.seq:   # not a retransmitted SYN
                if stream is not None and not stream.ended:
                    self._end_unseen(stream, ts_ns, events)
                stream = self._start(key, ts_ns, True, (seg.seq + 1) & _SEQ_MASK, events)
            seq = (seg.seq + 1) & _SEQ_MASK          # the SYN takes one sequence number
        else:
            if stream is None:
                stream = self._start(key, ts_ns, False, seg.seq, events)
            seq = seg.seq
        stream.packets += 1
        stream.last_ts_ns = ts_ns
        if not flags & (SYN | FIN | RST):
            stream.advertise_window(seg.window, ts_ns)
        if not stream.ended:
            size = seg.wire_payload_len
            if size:
                if seq == stream._next_seq and not stream._pending and stream._fin_offset is None:
                    # the common case: the next bytes, in order
                    self._deliver(stream, seg.payload, size, ts_ns, events)
                else:
                    self._accept(stream, stream.offset_of(seq), seg.payload, size, ts_ns, events)
            if flags & (FIN | RST):
                self._teardown(stream, flags, (seq + size) & _SEQ_MASK, ts_ns, events)
        elif seg.wire_payload_len:
            stream.retransmitted_bytes += seg.wire_payload_len
        if flags & ACK:
            other = self._by_key.get((seg.dst, seg.dport, seg.src, seg.sport))
            if other is not None and not other.ended:
                acked_offset = other.offset_of(seg.ack)
                if acked_offset > other._acked_offset:
                    if other._acked_offset <= other._next_offset:
                        other._acked_ts_ns = ts_ns      # a hole starts to look lost from now on
                    other._acked_offset = acked_offset
                self._resolve_acked(other, ts_ns, events)
        if stream._acked_offset > stream._next_offset:
            self._resolve_acked(stream, ts_ns, events)
        return events

    def stream(self, key: StreamKey) -> TcpStream | None:
        """The stream segments with this key go to now (the latest connection on it), if any."""
        return self._by_key.get(key)

    def finish(self) -> list[StreamEvent]:
        """End of input: deliver what is buffered (holes become gaps) and end every open stream."""
        events: list[StreamEvent] = []
        for stream in self._by_key.values():
            if not stream.ended:
                self._end_unseen(stream, stream.last_ts_ns, events)
        return events

    # -- stream lifetime -----------------------------------------------------------------------
    def _start(self, key: StreamKey, ts_ns: int, syn_seen: bool, next_seq: int,
               events: list[StreamEvent]) -> TcpStream:
        stream = TcpStream(len(self.streams), key, ts_ns, syn_seen, next_seq)
        self.streams.append(stream)
        self._by_key[key] = stream
        events.append(StreamStarted(stream.stream_id, key, ts_ns, syn_seen))
        return stream

    def _end_unseen(self, stream: TcpStream, ts_ns: int, events: list[StreamEvent]) -> None:
        """No more segments will come for this stream: every hole is lost; end it unless a FIN ends it."""
        self._flush(stream, None, ts_ns, events)
        if not stream.ended:
            self._end(stream, "eof", stream.last_ts_ns, events)

    def _end(self, stream: TcpStream, reason: str, ts_ns: int, events: list[StreamEvent]) -> None:
        stream.ended = True
        stream._pending = []          # anything buffered here lies beyond the FIN: not stream bytes
        stream.buffered_bytes = 0
        events.append(StreamEnded(stream.stream_id, ts_ns, reason))

    def _teardown(self, stream: TcpStream, flags: int, end_seq: int, ts_ns: int,
                  events: list[StreamEvent]) -> None:
        if flags & RST:
            stream.rst_seen = True    # the sender retransmits nothing after a reset
            self._flush(stream, None, ts_ns, events)
            if not stream.ended:
                self._end(stream, "rst", ts_ns, events)
        elif not stream.fin_seen:     # the FIN takes the sequence number after the segment's payload
            stream.fin_seen = True
            stream._fin_offset = max(stream.offset_of(end_seq), stream._next_offset)
            stream._fin_ts_ns = ts_ns
            self._check_fin(stream, events)
            self._resolve_acked(stream, ts_ns, events)

    def _check_fin(self, stream: TcpStream, events: list[StreamEvent]) -> None:
        if stream._fin_offset is not None and stream._next_offset >= stream._fin_offset:
            self._end(stream, "fin", stream._fin_ts_ns, events)

    # -- bytes ---------------------------------------------------------------------------------
    def _deliver(self, stream: TcpStream, payload: memoryview | bytes, size: int, ts_ns: int,
                 events: list[StreamEvent]) -> None:
        """`size` wire bytes at the next offset, of which `payload` (a prefix) was captured."""
        offset = stream._next_offset
        captured = len(payload)
        if captured:
            events.append(StreamData(stream.stream_id, ts_ns, offset,
                                     payload if payload.__class__ is memoryview else memoryview(payload)))
            stream.bytes += captured
        if captured < size:                 # snaplen cut the segment
            events.append(StreamGap(stream.stream_id, ts_ns, offset + captured, size - captured, lost=False))
            stream.uncaptured_bytes += size - captured
        stream._next_offset = offset + size
        stream._next_seq = (stream._next_seq + size) & _SEQ_MASK

    def _accept(self, stream: TcpStream, start: int, payload: memoryview, size: int, ts_ns: int,
                events: list[StreamEvent]) -> None:
        """A segment that is not simply the next bytes: old, overlapping, or beyond a hole."""
        next_offset = stream._next_offset
        if start < next_offset:             # retransmission: keep only what is new
            repeated = min(next_offset - start, size)
            stream.retransmitted_bytes += repeated
            payload = payload[repeated:]
            size -= repeated
            start = next_offset
            if not size:
                return
        if start == next_offset and not stream._pending:
            self._deliver(stream, payload, size, ts_ns, events)
            self._check_fin(stream, events)
            return
        captured_end = start + len(payload)
        self._buffer(stream, start, captured_end, payload, ts_ns)
        if captured_end < start + size:
            self._buffer(stream, captured_end, start + size, None, ts_ns)
        self._drain(stream, events)
        while stream.buffered_bytes > self.max_buffered_bytes_per_stream:
            self._skip_hole(stream, ts_ns, events)     # the bound: give up waiting for the first hole
        self._resolve_acked(stream, ts_ns, events)

    def _buffer(self, stream: TcpStream, start: int, end: int, data: memoryview | None, ts_ns: int) -> None:
        """Keep [start, end) until the bytes before it arrive, minus what is already buffered."""
        pending = stream._pending
        i = bisect.bisect_right(pending, start, key=_piece_start)
        if i and pending[i - 1][1] > start:
            i -= 1
        cursor = start
        new_pieces = []
        while i < len(pending) and pending[i][0] < end:
            piece_start, piece_end = pending[i][0], pending[i][1]
            if piece_start > cursor:
                new_pieces.append((cursor, piece_start))
            cursor = max(cursor, piece_end)
            i += 1
        if cursor < end:
            new_pieces.append((cursor, end))
        stream.retransmitted_bytes += (end - start) - sum(b - a for a, b in new_pieces)
        for a, b in new_pieces:
            # A copy: a view would pin the whole capture chunk behind it for as long as it waits here.
            piece_data = None if data is None else bytes(data[a - start:b - start])
            bisect.insort(pending, (a, b, piece_data, ts_ns), key=_piece_start)
            if piece_data is not None:
                stream.buffered_bytes += b - a

    def _drain(self, stream: TcpStream, events: list[StreamEvent]) -> None:
        """Deliver buffered pieces that now continue the stream, then end it if that reached the FIN."""
        pending = stream._pending
        stream_id = stream.stream_id
        taken = 0
        offset = stream._next_offset
        for start, end, data, ts_ns in pending:
            if start != offset:
                break
            if data is None:                # the cut tail of a segment that came out of order
                events.append(StreamGap(stream_id, ts_ns, start, end - start, lost=False))
                stream.uncaptured_bytes += end - start
            else:                           # the next bytes, whole (a piece holds what was captured)
                events.append(StreamData(stream_id, ts_ns, start, memoryview(data)))
                stream.buffered_bytes -= end - start
                stream.bytes += end - start
            offset = end
            taken += 1
        if taken:
            del pending[:taken]
            stream._next_seq = (stream._next_seq + offset - stream._next_offset) & _SEQ_MASK
            stream._next_offset = offset
        self._check_fin(stream, events)

    @staticmethod
    def _hole_end(stream: TcpStream) -> int | None:
        """Where the first hole ends: at the first buffered piece or the FIN, whichever comes first."""
        fin_offset = stream._fin_offset
        if stream._pending:
            start = stream._pending[0][0]
            return start if fin_offset is None or start < fin_offset else fin_offset
        return fin_offset

    def _skip_hole(self, stream: TcpStream, ts_ns: int, events: list[StreamEvent]) -> None:
        """Declare the first hole lost, and go on after it."""
        target = self._hole_end(stream)
        size = target - stream._next_offset
        events.append(StreamGap(stream.stream_id, ts_ns, stream._next_offset, size))
        stream.missing_bytes += size
        stream._next_offset = target
        stream._next_seq = (stream._next_seq + size) & _SEQ_MASK
        self._drain(stream, events)

    def _flush(self, stream: TcpStream, limit: int | None, ts_ns: int, events: list[StreamEvent]) -> None:
        """Skip every hole that ends at or before `limit` (None: all) and has buffered data or the FIN after it."""
        while not stream.ended:
            target = self._hole_end(stream)
            if target is None or (limit is not None and target > limit):
                return
            self._skip_hole(stream, ts_ns, events)

    def _resolve_acked(self, stream: TcpStream, ts_ns: int, events: list[StreamEvent]) -> None:
        """Holes wholly before what the other direction acknowledged will never be filled in this capture,
        once the reorder window after that acknowledgement has passed."""
        if (not stream.ended and stream._acked_offset > stream._next_offset
                and ts_ns - stream._acked_ts_ns >= REORDER_WINDOW_NS):
            self._flush(stream, stream._acked_offset, ts_ns, events)
