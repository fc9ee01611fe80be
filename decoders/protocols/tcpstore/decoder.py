"""PyTorch's TCPStore protocol (the rendezvous of torch.distributed), decoded sans-IO.

Wire format (torch/csrc/distributed/c10d/TCPStore*.cpp; query numbers checked on captures of torch 2.13,
whose TCPStoreBackend.hpp lists 0..18). Integers are native (little-endian); a string or byte vector is
`u64 length` + bytes. A client sends `u8 query` + arguments and, for the queries that have one, reads the
response before sending the next query, so responses are matched to requests in order:

| query | request arguments | response |
|---|---|---|
| 0 VALIDATE | u32 magic 0x3C85F7CE (first on every connection) | none |
| 1 SET | key, value | none |
| 2 COMPARE_SET | key, expected value, new value | value |
| 3 GET | key | value |
| 4 ADD | key, i64 amount | i64 new value |
| 5 CHECK | u64 n, n keys | u8 (0 ready, 1 not ready) |
| 6 WAIT | u64 n, n keys | u8 (0 stop waiting), sent once every key exists |
| 7 GETNUMKEYS | - | i64 |
| 8 DELETE_KEY | key | i64 keys deleted |
| 9 APPEND | key, value | none |
| 10 MULTI_GET | u64 n, n keys | n values |
| 11 MULTI_SET | u64 n, n (key, value) | none |
| 12 CANCEL_WAIT | - | u8 (1 wait canceled) |
| 13 PING | u32 nonce | u32 nonce |
| 14 QUEUE_PUSH | key, value | none |
| 15 QUEUE_POP | key | i64 length, then a value if length > 0 |
| 16 QUEUE_LEN | key | i64 |
| 17 LIST_KEYS | - | i64 n, n keys |
| 18 BARRIER | key, i64 world size | u8 (0 stop waiting) |

Each direction of a client connection has its stream decoder, in the one shape (decoders.sansio.StreamDecoder):
`StoreRequestDecoder` reads the client's requests, `StoreResponseDecoder` the store's responses. Responses are
not self-describing (a response's layout is its query's), so the response decoder is told the request decoder's
events; `TcpStoreConnection` is that step, and hands back `StoreExchange`s (a request with its response). Both
directions stay stream decoders fed like any other, rather than one decoder of two directions, so that the
caller feeds, gaps and ends each direction as the capture does. A message is decoded once it is whole; messages
are small (keys and rank addresses), and one beyond `MAX_MESSAGE_BYTES` stops the decoding of its connection.

Lost data costs only the messages it hit. The client writes each request whole (TCPStore.cpp buffers a
query's fields and sends them at once) and waits for its response before the next query, and the server
writes each response whole: after lost request bytes, requests resume at the next captured chunk that
holds whole requests from its first byte to its last; once any byte was lost, a response is a chunk that
answers the last request sent before it (by capture time), and the requests still waiting before that
one lost theirs.
"""
from __future__ import annotations

import bisect
import enum
import json
import struct
from collections import deque
from dataclasses import dataclass

from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.sansio import NEED_DATA, DecodeFailed, Sentinel

VALIDATION_MAGIC = 0x3C85F7CE
MAX_MESSAGE_BYTES = 1 << 26
MAX_KEYS = 1 << 20

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_I64 = struct.Struct("<q")


class Query(enum.IntEnum):
    VALIDATE = 0
    SET = 1
    COMPARE_SET = 2
    GET = 3
    ADD = 4
    CHECK = 5
    WAIT = 6
    GETNUMKEYS = 7
    DELETE_KEY = 8
    APPEND = 9
    MULTI_GET = 10
    MULTI_SET = 11
    CANCEL_WAIT = 12
    PING = 13
    QUEUE_PUSH = 14
    QUEUE_POP = 15
    QUEUE_LEN = 16
    LIST_KEYS = 17
    BARRIER = 18


# torchelastic's rendezvous keys (torch/distributed/elastic/agent/server/api.py _assign_worker_ranks)
TORCHELASTIC_ASSIGNED_RANKS = "torchelastic/assigned_ranks/"
TORCHELASTIC_ROLE_INFO = "torchelastic/role_info/"

# The first bytes of every client connection: VALIDATE and the magic.
VALIDATE_PREFIX = _U8.pack(Query.VALIDATE) + _U32.pack(VALIDATION_MAGIC)
NO_RESPONSE_QUERIES = frozenset((Query.VALIDATE, Query.SET, Query.APPEND, Query.MULTI_SET, Query.QUEUE_PUSH))


@dataclass(frozen=True, slots=True)
class StoreRequest:
    offset: int                      # stream offset of the query byte
    ts_first_ns: int
    ts_last_ns: int
    size_bytes: int
    query: Query
    keys: tuple[str, ...]
    values: tuple[bytes, ...]        # SET, APPEND, QUEUE_PUSH: the value; COMPARE_SET: expected, new;
    #                                  MULTI_SET: one per key
    number: int | None               # VALIDATE magic, PING nonce, ADD amount, BARRIER world size


@dataclass(frozen=True, slots=True)
class StoreResponse:
    offset: int
    ts_first_ns: int
    ts_last_ns: int
    size_bytes: int
    values: tuple[bytes, ...]        # GET, COMPARE_SET, QUEUE_POP: the value; MULTI_GET: one per key;
    #                                  LIST_KEYS: the key names
    number: int | None               # PING nonce, ADD/GETNUMKEYS/DELETE_KEY/QUEUE_LEN result, QUEUE_POP
    #                                  and LIST_KEYS count, CHECK/WAIT/CANCEL_WAIT/BARRIER status byte


@dataclass(frozen=True, slots=True)
class StoreExchange:
    request: StoreRequest
    response: StoreResponse | None   # None: the query has no response, or the capture holds none


class _Short(Exception):
    """The buffer ends inside the message being parsed; args[0]: the bytes the message needs at least."""


class _Reader:
    """Reads one message from a buffer; _Short when the buffer ends first."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytearray, pos: int = 0):
        self.buf = buf
        self.pos = pos

    def _take(self, size: int) -> int:
        start = self.pos
        if start + size > len(self.buf):
            if start + size > MAX_MESSAGE_BYTES:
                raise DecodeError(f"a TCPStore message longer than {MAX_MESSAGE_BYTES} bytes")
            raise _Short(start + size)
        self.pos = start + size
        return start

    def fixed(self, layout: struct.Struct) -> int:
        return layout.unpack_from(self.buf, self._take(layout.size))[0]

    def vector(self) -> bytes:
        size = self.fixed(_U64)
        start = self._take(size)
        return bytes(self.buf[start:start + size])

    def string(self) -> str:
        return self.vector().decode("utf-8", "replace")

    def count(self) -> int:
        n = self.fixed(_U64)
        if n > MAX_KEYS:
            raise DecodeError(f"{n} keys in one TCPStore query")
        return n


def _parse_request(reader: _Reader) -> tuple[Query, tuple[str, ...], tuple[bytes, ...], int | None]:
    code = reader.fixed(_U8)
    try:
        query = Query(code)
    except ValueError:
        raise DecodeError(f"TCPStore query {code} unknown") from None
    keys: tuple[str, ...] = ()
    values: tuple[bytes, ...] = ()
    number = None
    if query in (Query.VALIDATE, Query.PING):
        number = reader.fixed(_U32)
    elif query in (Query.SET, Query.APPEND, Query.QUEUE_PUSH):
        keys, values = (reader.string(),), (reader.vector(),)
    elif query == Query.COMPARE_SET:
        keys = (reader.string(),)
        values = (reader.vector(), reader.vector())
    elif query in (Query.GET, Query.DELETE_KEY, Query.QUEUE_POP, Query.QUEUE_LEN):
        keys = (reader.string(),)
    elif query in (Query.ADD, Query.BARRIER):
        keys = (reader.string(),)
        number = reader.fixed(_I64)
    elif query in (Query.CHECK, Query.WAIT, Query.MULTI_GET):
        keys = tuple(reader.string() for _ in range(reader.count()))
    elif query == Query.MULTI_SET:
        pairs = [(reader.string(), reader.vector()) for _ in range(reader.count())]
        keys = tuple(key for key, _ in pairs)
        values = tuple(value for _, value in pairs)
    return query, keys, values, number


def _parse_response(reader: _Reader, request: StoreRequest) -> tuple[tuple[bytes, ...], int | None]:
    query = request.query
    if query in (Query.GET, Query.COMPARE_SET):
        return (reader.vector(),), None
    if query == Query.MULTI_GET:
        return tuple(reader.vector() for _ in request.keys), None
    if query == Query.PING:
        return (), reader.fixed(_U32)
    if query in (Query.ADD, Query.GETNUMKEYS, Query.DELETE_KEY, Query.QUEUE_LEN):
        return (), reader.fixed(_I64)
    if query == Query.QUEUE_POP:
        length = reader.fixed(_I64)
        return ((reader.vector(),) if length > 0 else ()), length
    if query == Query.LIST_KEYS:
        n = reader.fixed(_I64)
        if not 0 <= n <= MAX_KEYS:
            raise DecodeError(f"LIST_KEYS answered with {n} keys")
        return tuple(reader.vector() for _ in range(n)), n
    return (), reader.fixed(_U8)           # CHECK, WAIT, CANCEL_WAIT, BARRIER


# Queries whose request starts with a key: a client caught after its first bytes is recognised by one.
_KEYED_QUERIES = frozenset((Query.SET, Query.COMPARE_SET, Query.GET, Query.ADD, Query.DELETE_KEY, Query.APPEND,
                            Query.QUEUE_PUSH, Query.QUEUE_POP, Query.QUEUE_LEN, Query.BARRIER))
_KEY_COUNT_QUERIES = frozenset((Query.CHECK, Query.WAIT, Query.MULTI_GET, Query.MULTI_SET))
MAX_KEY_BYTES = 4096
_KEY_PREVIEW_BYTES = 8


def looks_like_request(prefix: bytes) -> bool | None:
    """Whether a TCP direction caught after its first bytes starts with TCPStore requests: any VALIDATE or
    PING (query byte, u32), then one that names a key (query byte, [u64 key count 1..MAX_KEYS,] u64 key
    length 1..MAX_KEY_BYTES, printable key); None while the prefix is too short to tell."""
    at = 0
    while at < len(prefix) and prefix[at] in (Query.VALIDATE, Query.PING):
        at += _U8.size + _U32.size
    if at >= len(prefix):
        return None
    try:
        query = Query(prefix[at])
    except ValueError:
        return False
    at += _U8.size
    if query in _KEY_COUNT_QUERIES:
        if len(prefix) < at + _U64.size:
            return None
        if not 1 <= _U64.unpack_from(prefix, at)[0] <= MAX_KEYS:
            return False
        at += _U64.size
    elif query not in _KEYED_QUERIES:
        return False
    if len(prefix) < at + _U64.size:
        return None
    key_bytes = _U64.unpack_from(prefix, at)[0]
    if not 1 <= key_bytes <= MAX_KEY_BYTES:
        return False
    key = prefix[at + _U64.size:at + _U64.size + min(key_bytes, _KEY_PREVIEW_BYTES)]
    if len(key) < min(key_bytes, _KEY_PREVIEW_BYTES):
        return None
    return all(0x20 <= byte < 0x7F for byte in key)


class _Buffer:
    """Bytes of one direction not decoded yet, with the capture time of each chunk."""

    __slots__ = ("buf", "offset", "chunk_ends", "chunk_ts", "need")

    def __init__(self):
        self.buf = bytearray()
        self.offset = 0                      # stream offset of buf[0]
        self.chunk_ends: list[int] = []      # stream offset after each buffered chunk...
        self.chunk_ts: list[int] = []        # ...and its capture time
        self.need = 1                        # bytes the buffer must hold before parsing is worth a try

    def append(self, data: bytes | memoryview, ts_ns: int) -> None:
        self.buf += data
        self.chunk_ends.append(self.offset + len(self.buf))
        self.chunk_ts.append(ts_ns)

    def ready(self) -> bool:
        """Whether a parse may find a whole message (the buffer holds what the last try found missing)."""
        return bool(self.buf) and len(self.buf) >= self.need

    def ts_at(self, offset: int) -> int:
        """Capture time of the chunk holding the byte at stream offset `offset`."""
        return self.chunk_ts[bisect.bisect_right(self.chunk_ends, offset)]

    def consume(self, size: int) -> tuple[int, int, int]:
        """Drop a decoded message of `size` bytes; return its offset and first and last chunk times."""
        start = self.offset
        times = (self.ts_at(start), self.ts_at(start + size - 1))
        del self.buf[:size]
        self.offset += size
        consumed_chunks = bisect.bisect_right(self.chunk_ends, self.offset)
        del self.chunk_ends[:consumed_chunks]
        del self.chunk_ts[:consumed_chunks]
        self.need = 1
        return start, times[0], times[1]

    def discard(self) -> int:
        """Drop every byte held (the rest of the stream cannot be decoded); return how many."""
        held = len(self.buf)
        self.offset += held
        self.buf.clear()
        self.chunk_ends.clear()
        self.chunk_ts.clear()
        self.need = 1
        return held


# -- the client's direction -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RequestsSeen:
    """A chunk of the client's, captured at ts_ns, after the requests it completes: the requests sent before a
    response captured by then are all known (decoded or lost)."""
    ts_ns: int


@dataclass(frozen=True, slots=True)
class RequestsLost:
    """Request bytes the capture lost, after the client's chunk captured at sent_after_ns (-1: none yet)."""
    sent_after_ns: int


@dataclass(frozen=True, slots=True)
class RequestsEnded:
    """The client's direction ended: no more requests."""


RequestEvent = StoreRequest | RequestsSeen | RequestsLost | RequestsEnded | DecodeFailed


class StoreRequestDecoder:
    """The requests of one TCPStore client connection (the client's direction), a decoders.sansio.StreamDecoder.

    Events: `StoreRequest`s, and what pairing the responses needs to know of the client's direction: after the
    requests each chunk completes, `RequestsSeen` with its capture time; `RequestsLost` where the capture lost
    bytes; `RequestsEnded`. `DecodeFailed` when the bytes are no TCPStore requests, after which bytes are only
    counted. Public state: `lost_bytes` (bytes not decoded), `failed` (the reason).
    """

    def __init__(self, *, midstream: bool = False):
        """`midstream`: the connection's first bytes are not in the capture (no VALIDATE to expect; requests are
        taken from the first chunk that holds whole ones)."""
        self.lost_bytes = 0
        self.failed: str | None = None
        self._pending = _Buffer()
        self._validated = midstream
        self._resync = midstream             # after lost bytes: the next chunk must hold whole requests
        self._events: deque[RequestEvent] = deque()
        self._chunks_seen: deque[tuple[int, int]] = deque()    # (stream offset after, ts_ns) of chunks whose
        #                                                          RequestsSeen is still to come
        self._last_chunk_ns = -1             # capture time of the latest chunk
        self._ended = False
        self._end_reported = False

    def receive_data(self, data: bytes | memoryview, ts_ns: int) -> None:
        if not data:
            return
        if self.failed is not None or self._ended:
            self.lost_bytes += len(data)
            return
        pending = self._pending
        pending.append(data, ts_ns)
        self._last_chunk_ns = ts_ns
        if self._resync:
            self._resync_on_chunk()
            self._events.append(RequestsSeen(ts_ns))
        else:
            self._chunks_seen.append((pending.offset + len(pending.buf), ts_ns))

    def receive_gap(self, size: int, ts_ns: int, *, lost: bool = True) -> None:
        """`size` request bytes not in the capture (lost or cut: a request is decoded only whole): the request
        they belong to is lost."""
        while not self._ended and self._decode_one():    # the bytes before the gap are decoded first
            pass
        if self.failed is not None or self._ended:
            self.lost_bytes += size
            return
        self._events.append(RequestsLost(self._last_chunk_ns))
        pending = self._pending
        self.lost_bytes += size + pending.discard()
        pending.offset += size
        self._resync = True

    def receive_end(self, ts_ns: int) -> None:
        self._ended = True

    def next_event(self) -> RequestEvent | Sentinel:
        if not self._events:
            self._decode_one()
        return self._events.popleft() if self._events else NEED_DATA

    def _decode_one(self) -> bool:
        """Queue the next event the bytes held allow; False when there is none."""
        if self.failed is not None:
            return False
        pending, seen = self._pending, self._chunks_seen
        if not self._resync and pending.ready():
            reader = _Reader(pending.buf)
            request: tuple | DecodeError | None = None
            try:
                request = _parse_request(reader)
                if not self._validated and (request[0] != Query.VALIDATE or request[3] != VALIDATION_MAGIC):
                    raise DecodeError(f"connection starts with {request[0].name}, not VALIDATE + magic")
            except _Short as short:
                pending.need = short.args[0]
            except DecodeError as exc:
                request = exc
            if request is not None:
                if seen and pending.offset + reader.pos > seen[0][0]:
                    # a chunk that ended before the bytes deciding this request: seen first
                    self._events.append(RequestsSeen(seen.popleft()[1]))
                elif isinstance(request, DecodeError):
                    self._fail(str(request))
                else:
                    self._validated = True
                    self._take(reader.pos, *request)
                return True
        if seen:
            self._events.append(RequestsSeen(seen.popleft()[1]))
            return True
        if self._ended and not self._end_reported:
            self._end_reported = True
            self.lost_bytes += pending.discard()
            self._events.append(RequestsEnded())
            return True
        return False

    def _fail(self, reason: str) -> None:
        self.failed = reason
        self._events.append(DecodeFailed(self._pending.offset, reason))
        self.lost_bytes += self._pending.discard()
        self._chunks_seen.clear()

    def _take(self, size: int, query: Query, keys: tuple[str, ...], values: tuple[bytes, ...],
              number: int | None) -> None:
        offset, first_ns, last_ns = self._pending.consume(size)
        self._events.append(StoreRequest(offset, first_ns, last_ns, size, query, keys, values, number))

    def _resync_on_chunk(self) -> None:
        """The buffer is a chunk that follows lost bytes: take it if it holds whole requests exactly."""
        pending = self._pending
        found = []
        reader = _Reader(pending.buf)
        try:
            while reader.pos < len(pending.buf):
                start = reader.pos
                parsed = _parse_request(reader)
                found.append((reader.pos - start, parsed))
        except (_Short, DecodeError):
            self.lost_bytes += pending.discard()
            return
        self._resync = False
        self._validated = True
        for size, parsed in found:
            self._take(size, *parsed)


# -- the store's direction --------------------------------------------------------------------------

class StoreResponseDecoder:
    """The store's responses on one client connection, a decoders.sansio.StreamDecoder told the client's requests.

    A response does not say which query it answers, nor (for most queries) how long it is: it is read as the
    answer to a request, so `receive_request_event` hands it every event of the connection's
    StoreRequestDecoder, in order, and in capture order with this decoder's own input (each request event
    before the response bytes, gaps and end captured after it). Events: `StoreExchange` (each request with its
    response, or None when it has none or the capture holds none) and `DecodeFailed`.

    Until the capture loses bytes of the connection, responses are read in order, each as the answer to the
    oldest request waiting for one. After that (and the reassembly of a direction with a hole may hand over its
    later bytes after the other direction's), each response chunk is paired in time, once the requests sent
    before it are known: it must hold one whole response to the last request sent before it, with no lost
    request in between. Public state: `lost_bytes` (bytes not decoded).
    """

    def __init__(self, *, midstream: bool = False):
        """`midstream`: the connection's first bytes are not in the capture (responses are paired in time)."""
        self.lost_bytes = 0
        self._pending = _Buffer()
        self._awaiting: deque[StoreRequest] = deque()
        self._timed = midstream              # responses paired in time (bytes were lost)
        self._chunks: deque[tuple[bytes, int, int]] = deque()   # timed: (bytes, offset, ts_ns)
        # Capture time of the client's latest chunk, and of the last one before each loss of request bytes:
        # a lost request was sent after it.
        self._requests_seen_ns = -1
        self._request_losses: list[int] = []
        self._request_times: list[int] = []  # timed: when each request decoded since was sent
        self._pair_due = False               # timed: a chunk came, of either direction, since the last pairing
        self._exchanges: deque[StoreExchange | DecodeFailed] = deque()
        self._ended = False
        self._requests_ended = False
        self._done = False                   # the exchanges are all out (or decoding failed)

    def receive_request_event(self, event: RequestEvent) -> None:
        """An event of the connection's StoreRequestDecoder."""
        if self._done:
            return
        cls = event.__class__
        if cls is StoreRequest:
            if self._timed:
                bisect.insort(self._request_times, event.ts_first_ns)
            if event.query in NO_RESPONSE_QUERIES:
                self._exchanges.append(StoreExchange(event, None))
            else:
                self._awaiting.append(event)
        elif cls is RequestsSeen:
            self._requests_seen_ns = event.ts_ns
            if self._timed:
                self._pair_due = True
        elif cls is RequestsLost:
            self._go_timed()
            bisect.insort(self._request_losses, event.sent_after_ns)
        elif cls is RequestsEnded:
            self._requests_ended = True
            if self._ended:
                self._finish(final_pairing=True)
        else:                                # DecodeFailed: nothing more of the connection can be paired
            self._finish(final_pairing=False)

    def receive_data(self, data: bytes | memoryview, ts_ns: int) -> None:
        if not data:
            return
        if self._done or self._ended:
            self.lost_bytes += len(data)
        elif self._timed:
            self._chunks.append((bytes(data), self._pending.offset, ts_ns))
            self._pending.offset += len(data)
            self._pair_due = True
        else:
            self._pending.append(data, ts_ns)

    def receive_gap(self, size: int, ts_ns: int, *, lost: bool = True) -> None:
        """`size` response bytes not in the capture: the response they belong to is lost."""
        if self._done or self._ended:
            self.lost_bytes += size
            return
        self._go_timed()
        self._pending.offset += size
        self.lost_bytes += size

    def receive_end(self, ts_ns: int) -> None:
        """The store's direction ended: once the client's has too, requests still waiting have no response."""
        self._ended = True
        if self._requests_ended:
            self._finish(final_pairing=True)

    def next_event(self) -> StoreExchange | DecodeFailed | Sentinel:
        if not self._exchanges and not self._done:
            if self._pair_due:
                self._pair_due = False
                self._pair_responses(final=False)
            elif not self._timed and self._awaiting and self._pending.ready():
                self._read_response()
        return self._exchanges.popleft() if self._exchanges else NEED_DATA

    def _read_response(self) -> None:
        """In order: the response to the oldest request waiting, if the bytes held have it whole."""
        pending = self._pending
        reader = _Reader(pending.buf)
        try:
            values, number = _parse_response(reader, self._awaiting[0])
        except _Short as short:
            pending.need = short.args[0]
        except DecodeError as exc:
            self._exchanges.append(DecodeFailed(pending.offset, str(exc)))
            self._finish(final_pairing=False)
        else:
            offset, first_ns, last_ns = pending.consume(reader.pos)
            response = StoreResponse(offset, first_ns, last_ns, reader.pos, values, number)
            self._exchanges.append(StoreExchange(self._awaiting.popleft(), response))

    def _finish(self, *, final_pairing: bool) -> None:
        """No more requests nor responses: the waiting requests go out without one, the bytes held are lost."""
        if self._done:
            return
        self._done = True
        if final_pairing and self._timed:
            self._pair_responses(final=True)
        self._exchanges.extend(StoreExchange(request, None) for request in self._awaiting)
        self._awaiting.clear()
        self.lost_bytes += self._pending.discard() + sum(len(chunk) for chunk, _, _ in self._chunks)
        self._chunks.clear()

    def _go_timed(self) -> None:
        """From now on pair responses in time: the response bytes held become chunks of their own."""
        if self._timed:
            return
        self._timed = True
        pending = self._pending
        start = pending.offset
        for end, ts_ns in zip(pending.chunk_ends, pending.chunk_ts):
            self._chunks.append((bytes(pending.buf[start - pending.offset:end - pending.offset]), start, ts_ns))
            start = end
        held = len(pending.buf)
        pending.discard()
        pending.offset -= held             # the chunks keep their offsets; new bytes follow them

    def _pair_responses(self, *, final: bool) -> None:
        """Timed pairing of the response chunks whose requests are known (all of them when `final`)."""
        exchanges = self._exchanges
        chunks = self._chunks
        while chunks:
            data, offset, ts_ns = chunks[0]
            if not final and ts_ns > self._requests_seen_ns:
                break                          # requests sent before it may still come
            chunks.popleft()
            # A client waits for each response before its next query: a request sent after this one's
            # (decoded, or lost after another) means its response came earlier.
            before = [request for request in self._awaiting if request.ts_first_ns <= ts_ns]
            sent = before[-1].ts_first_ns if before else None
            if sent is None or _any_between(self._request_losses, sent, ts_ns) \
                    or _any_between(self._request_times, sent, ts_ns):
                self.lost_bytes += len(data)
                continue
            reader = _Reader(bytearray(data))
            try:
                values, number = _parse_response(reader, before[-1])
            except (_Short, DecodeError):
                self.lost_bytes += len(data)
                continue
            if reader.pos != len(data):
                self.lost_bytes += len(data)
                continue
            while self._awaiting[0] is not before[-1]:
                exchanges.append(StoreExchange(self._awaiting.popleft(), None))
            exchanges.append(StoreExchange(self._awaiting.popleft(),
                                           StoreResponse(offset, ts_ns, ts_ns, len(data), values, number)))


# -- the pairing ------------------------------------------------------------------------------------

class TcpStoreConnection:
    """One TCPStore client connection: a stream decoder per direction (`requests`, `responses`, fed by the
    caller) and the step that hands the requests' events to the responses, whose `next_event` gives the
    connection's `StoreExchange`s. The caller drains it after each input to either direction: that hands the
    responses the requests' events in capture order.

    A direction that stops making sense stops the connection (its pairing could no longer be trusted): `failed`
    says why, and the bytes of both directions from there on are counted in `lost_bytes`.
    """

    def __init__(self, *, midstream: bool = False):
        """`midstream`: the connection's first bytes are not in the capture."""
        self.requests = StoreRequestDecoder(midstream=midstream)
        self.responses = StoreResponseDecoder(midstream=midstream)
        self.failed: str | None = None
        self._lost_after_failure = 0         # requests decoded after the responses failed

    @property
    def lost_bytes(self) -> int:
        return self.requests.lost_bytes + self.responses.lost_bytes + self._lost_after_failure

    def next_event(self) -> StoreExchange | Sentinel:
        """The next query with its response (None: none came), or NEED_DATA."""
        requests, responses = self.requests, self.responses
        while True:
            event = responses.next_event()
            if event.__class__ is StoreExchange:
                return event
            if event is not NEED_DATA:           # DecodeFailed
                self.failed = self.failed or event.reason
                continue
            event = requests.next_event()
            if event is NEED_DATA:
                return NEED_DATA
            if self.failed is not None:
                if event.__class__ is StoreRequest:
                    self._lost_after_failure += event.size_bytes
                continue
            if event.__class__ is DecodeFailed:
                self.failed = event.reason
            responses.receive_request_event(event)


def torchelastic_fields(key: str, value: bytes) -> dict:
    """What torchelastic's rendezvous tells about the node whose agent set or read `key`, as message-row
    columns: `assigned_ranks/<node>` holds the JSON list [base global rank, global world size, base role
    rank, role world size] (-> src_rank, world_size); `role_info/<node>` the JSON object {"role", "rank",
    "local_world_size"} (-> local_world_size: processes on that node). Anything else: nothing."""
    try:
        if TORCHELASTIC_ASSIGNED_RANKS in key:
            base_rank, world_size = json.loads(value)[:2]
            return {"src_rank": int(base_rank), "world_size": int(world_size)}
        if TORCHELASTIC_ROLE_INFO in key:
            return {"local_world_size": int(json.loads(value)["local_world_size"])}
    except (ValueError, TypeError, KeyError, IndexError):
        pass
    return {}


def _any_between(times: list[int], after: int, before: int) -> bool:
    """Whether the sorted `times` hold one strictly between `after` and `before`."""
    i = bisect.bisect_right(times, after)
    return i < len(times) and times[i] < before
