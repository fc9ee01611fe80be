"""The one API of a protocol decoder: what the capture decoder (decoders.capture_decoder) offers it and what it
hands back. Each protocol module under decoders/protocols/ has one class that offers this API, registered in
decoders.protocols.REGISTRY.

Sans-IO, in h11's shape: the capture decoder feeds bytes, gaps and ends of TCP directions (and packets that are
no TCP segments), and pulls events with `next_event()` until it answers `NEED_DATA`:

    claim(direction, prefix)                 is this TCP direction mine? True, False, None (show me more bytes)
    claim_fallback(direction, prefix, data)  asked once nobody claimed the direction (weak evidence only)
    release(stream_id)                       give a direction claimed by claim_fallback up, if nothing was said
                                             of it yet (True): another decoder's evidence came later
    receive_data(stream_id, data, ts_ns)     bytes of a claimed direction, in stream order, from its start
    receive_gap(stream_id, size, ts_ns, lost)  bytes the capture lost (or cut short: lost=False)
    receive_end(stream_id, ts_ns)            the direction ended (FIN, RST or the end of the capture)
    receive_packet(packet)                   a packet that is no TCP segment; True when it was this protocol's
    receive_capturing_host(addresses)        the IP addresses the capturing host sent from, where the link layer
                                             tells (Linux cooked captures; else empty), before end_of_capture
    end_of_capture()                         no more input: whatever is still pending becomes events
    next_event()                             Row | StreamColumns | ExtraStream | Count | NEED_DATA

plus, for the batch TCP driver, `skippable_bytes(stream_id)` / `skip(stream_id, size, ts_ns)`: how many of a
direction's next bytes the decoder need not see (payload it would only count). Inside, a protocol decoder reads
each direction with a stream decoder of the same shape without the stream_id (decoders.sansio.StreamDecoder).

Events are rows of the decode tables (decoders.schema), named by column: a row that names a TCP direction does
so by the reassembler's stream number (`stream_id`, or `<name>_stream_id` for another direction it refers
to), which the capture decoder turns into flow ids; a non-TCP stream the decoder reports (`ExtraStream`) is
named in message rows by its `extra_stream` index.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol, Union, runtime_checkable

from dlcsniff.decoders.sansio import NEED_DATA, Sentinel

if TYPE_CHECKING:
    import pandas as pd

    from dlcsniff.decoders.tcp import StreamKey


UNLIMITED_SKIP_BYTES = 1 << 62          # skippable_bytes of a direction no decoder reads (any more)


class Packet(Protocol):
    """A captured packet as the capture readers give it (decoders.inputs.capture_file.Packet), named here so that
    the protocols need nothing of the inputs (whose probe records read libnccl's API from decoders.protocols.nccl)."""
    ts_ns: int
    linktype: int
    data: bytes | memoryview
    orig_len: int


@dataclass(frozen=True, slots=True)
class TcpDirection:
    """One direction of a TCP connection as the capture decoder offers it."""
    stream_id: int
    key: StreamKey            # (src ip bytes, src port, dst ip bytes, dst port)
    syn_seen: bool            # the capture saw the connection open (False: it started mid-connection)


@dataclass(frozen=True, slots=True)
class Row:
    """One row of a decode table: messages, zmtp, or a capture-level table of the protocol's own (ps-lite's node
    lists, Gloo's sequence spaces) that its job step reads."""
    table: str
    values: dict


@dataclass(frozen=True, slots=True)
class StreamColumns:
    """Columns that extend or override the streams.parquet row of one TCP direction."""
    stream_id: int
    values: dict


@dataclass(frozen=True, slots=True)
class ExtraStream:
    """A streams.parquet row that is no TCP direction (RoCE: one per source, destination and queue pair),
    named `index` in the decoder's message rows (`extra_stream`)."""
    index: int
    values: dict


@dataclass(frozen=True, slots=True)
class Count:
    """A per-capture counter for the decode summary (e.g. ZMTP messages that were not ps-lite)."""
    name: str
    value: int


ProtocolEvent = Union[Row, StreamColumns, ExtraStream, Count]


@dataclass(frozen=True, slots=True)
class LossCounter:
    """Something a protocol lost that it counts per stream, in a streams.parquet column: the decode summary
    reports it under the protocol's name ("{n:,} {says}") and says it in the warnings about capture limits.
    Counts of messages (`messages`) count a connection once, as the capture that lost most of it; bytes and
    packets are the captures' own, summed over them."""
    column: str
    says: str
    messages: bool = False


@runtime_checkable
class ProtocolDecoder(Protocol):
    """What a protocol decoder offers the capture decoder (see the module doc)."""

    name: ClassVar[str]

    def claim(self, direction: TcpDirection, prefix: bytes) -> bool | None: ...
    def claim_fallback(self, direction: TcpDirection, prefix: bytes, seen_data: bool) -> bool: ...
    def release(self, stream_id: int) -> bool: ...
    def receive_data(self, stream_id: int, data: memoryview, ts_ns: int) -> None: ...
    def receive_gap(self, stream_id: int, size: int, ts_ns: int, lost: bool) -> None: ...
    def receive_end(self, stream_id: int, ts_ns: int) -> None: ...
    def receive_packet(self, packet: Packet) -> bool: ...
    def receive_capturing_host(self, addresses: frozenset[bytes]) -> None: ...
    def skippable_bytes(self, stream_id: int) -> int: ...
    def skip(self, stream_id: int, size: int, ts_ns: int, cut: int) -> None: ...
    def end_of_capture(self) -> None: ...
    def next_event(self) -> ProtocolEvent | Sentinel: ...


class ProtocolDecoderBase:
    """Defaults of the API for decoders that need them: no fallback claims (nothing to release), no packets, no
    use for the capturing host, no skipping, and an event queue (`_emit`). `losses`: the LossCounters of the
    streams it claims, by their streams.protocol (besides its incomplete messages, which the summary counts for
    every protocol)."""

    name: ClassVar[str] = ""
    losses: ClassVar[dict[str, tuple[LossCounter, ...]]] = {}

    def __init__(self) -> None:
        self._events: deque[ProtocolEvent] = deque()

    def claim_fallback(self, direction: TcpDirection, prefix: bytes, seen_data: bool) -> bool:
        return False

    def release(self, stream_id: int) -> bool:
        return False

    def receive_packet(self, packet: Packet) -> bool:
        return False

    def receive_capturing_host(self, addresses: frozenset[bytes]) -> None:
        pass

    def skippable_bytes(self, stream_id: int) -> int:
        return 0

    def skip(self, stream_id: int, size: int, ts_ns: int, cut: int) -> None:
        raise AssertionError(f"{self.name} never offered bytes to skip")

    def next_event(self) -> ProtocolEvent | Sentinel:
        return self._events.popleft() if self._events else NEED_DATA

    def _emit(self, event: ProtocolEvent) -> None:
        self._events.append(event)

    def _emit_rows(self, rows: CaptureRows) -> None:
        """A capture's worth of rows, built at its end, as events."""
        for index, values in enumerate(rows.extra_streams):
            self._emit(ExtraStream(index, values))
        for stream_id, values in rows.streams.items():
            self._emit(StreamColumns(stream_id, values))
        for values in rows.messages:
            self._emit(Row("messages", values))
        for table, table_rows in rows.tables.items():
            for values in table_rows:
                self._emit(Row(table, values))


@dataclass(slots=True)
class CaptureRows:
    """Rows a decoder that resolves a capture as a whole (ranks from a rendezvous, queue pairs matched to their
    set-up) builds at its end; `ProtocolDecoderBase._emit_rows` hands them back as events.

    messages: rows for messages.parquet; each names its TCP direction by "stream_id" or, for non-TCP traffic,
        its stream by "extra_stream".
    streams: stream_id -> columns that extend or override that TCP direction's streams.parquet row.
    extra_streams: streams.parquet rows that are not TCP directions.
    tables: rows of the protocol's own capture tables, by name, for its job step (JobColumns.capture_table).
    """
    messages: list[dict] = field(default_factory=list)
    streams: dict[int, dict] = field(default_factory=dict)
    extra_streams: list[dict] = field(default_factory=list)
    tables: dict[str, list[dict]] = field(default_factory=dict)


def frame_rows(frame: pd.DataFrame) -> list[dict]:
    """A DataFrame as row dicts of plain values, missing ones None (pyarrow refuses pandas' NA)."""
    return frame.astype(object).where(frame.notna(), None).to_dict("records")
