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

`TcpStoreConnection` reads both directions of one client connection and returns `StoreExchange`s (a
request with its response). A message is decoded once it is whole; messages are small (keys and rank
addresses), and one beyond `MAX_MESSAGE_BYTES` stops the decoding of its connection.

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
from dlcsniff.decoders.sansio import NEED_DATA, Sentinel

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


class _Direction:
    """Bytes of one direction not decoded yet, with the capture time of each chunk."""

    __slots__ = ("buf", "offset", "chunk_ends", "chunk_ts", "need", "resync")

    def __init__(self):
        self.buf = bytearray()
        self.offset = 0                      # stream offset of buf[0]
        self.chunk_ends: list[int] = []      # stream offset after each buffered chunk...
        self.chunk_ts: list[int] = []        # ...and its capture time
        self.need = 1                        # bytes the buffer must hold before parsing is worth a try
        self.resync = False                  # after lost bytes: the next chunk must hold whole messages

    def append(self, data: bytes | memoryview, ts_ns: int) -> None:
        self.buf += data
        self.chunk_ends.append(self.offset + len(self.buf))
        self.chunk_ts.append(ts_ns)

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


class TcpStoreConnection:
    """Both directions of one TCPStore client connection (sans-IO).

    Public state: `failed` (why decoding stopped, or None), `lost_bytes` (bytes not decoded).

    Until the capture loses bytes of the connection, responses are paired with requests in order. After
    that (and the reassembly of a direction with a hole may hand over its later bytes after the other
    direction's), each response chunk is paired in time, once the requests sent before it are known: it
    must hold one whole response to the last request sent before it, with no lost request in between.
    """

    def __init__(self, *, midstream: bool = False):
        """`midstream`: the connection's first bytes are not in the capture (no VALIDATE to expect;
        requests are taken from the first chunk that holds whole ones, responses paired in time)."""
        self.failed: str | None = None
        self.lost_bytes = 0
        self._validated = midstream
        self._requests = _Direction()
        self._responses = _Direction()
        self._requests.resync = midstream
        self._awaiting: deque[StoreRequest] = deque()
        self._timed = midstream              # responses paired in time (bytes were lost)
        self._response_chunks: deque[tuple[bytes, int, int]] = deque()   # timed: (bytes, offset, ts_ns)
        # Capture time of the last request chunk, and of the last one before each loss of request bytes:
        # a lost request was sent after it.
        self._last_request_ns = -1
        self._request_losses: list[int] = []
        self._request_times: list[int] = []  # timed: when each request decoded since was sent
        self._exchanges: deque[StoreExchange] = deque()

    def receive_request_data(self, data: bytes | memoryview, ts_ns: int) -> None:
        self._receive(self._requests, data, ts_ns)

    def receive_response_data(self, data: bytes | memoryview, ts_ns: int) -> None:
        if self._timed and self.failed is None:
            self._response_chunks.append((bytes(data), self._responses.offset, ts_ns))
            self._responses.offset += len(data)
            self._pair_responses(final=False)
            return
        self._receive(self._responses, data, ts_ns)

    def receive_request_gap(self, size: int, ts_ns: int) -> None:
        """`size` request bytes the capture lost: the request they belong to is lost."""
        if self.failed is not None:
            self.lost_bytes += size
            return
        self._go_timed()
        bisect.insort(self._request_losses, self._last_request_ns)
        self.lost_bytes += size + self._requests.discard()
        self._requests.offset += size
        self._requests.resync = True

    def receive_response_gap(self, size: int, ts_ns: int) -> None:
        """`size` response bytes the capture lost: the response they belong to is lost."""
        if self.failed is not None:
            self.lost_bytes += size
            return
        self._go_timed()
        self._responses.offset += size
        self.lost_bytes += size

    def receive_end(self, ts_ns: int) -> None:
        """The connection ended: requests still waiting are reported without a response."""
        if self._timed and self.failed is None:
            self._pair_responses(final=True)
        self._exchanges.extend(StoreExchange(request, None) for request in self._awaiting)
        self._awaiting.clear()
        self.lost_bytes += self._requests.discard() + self._responses.discard()
        self.lost_bytes += sum(len(chunk) for chunk, _, _ in self._response_chunks)
        self._response_chunks.clear()

    def next_event(self) -> StoreExchange | Sentinel:
        """The next query with its response (None: none came), or NEED_DATA."""
        return self._exchanges.popleft() if self._exchanges else NEED_DATA

    # -- decoding ---------------------------------------------------------------------------------
    def _receive(self, direction: _Direction, data: bytes | memoryview, ts_ns: int) -> None:
        if self.failed is not None:
            self.lost_bytes += len(data)
            return
        direction.append(data, ts_ns)
        if direction is self._requests:
            self._last_request_ns = ts_ns
            if direction.resync:
                self._resync_requests()
        if len(direction.buf) >= direction.need:
            try:
                self._decode()
            except DecodeError as exc:
                self._fail(str(exc))
                return
        if self._timed:
            self._pair_responses(final=False)

    def _go_timed(self) -> None:
        """From now on pair responses in time: the response bytes held become chunks of their own."""
        if self._timed:
            return
        self._timed = True
        responses = self._responses
        start = responses.offset
        for end, ts_ns in zip(responses.chunk_ends, responses.chunk_ts):
            self._response_chunks.append((bytes(responses.buf[start - responses.offset:end - responses.offset]),
                                          start, ts_ns))
            start = end
        held = len(responses.buf)
        responses.discard()
        responses.offset -= held           # the chunks keep their offsets; new bytes follow them

    def _resync_requests(self) -> None:
        """The buffer is a chunk that follows lost bytes: take it if it holds whole requests exactly."""
        requests = self._requests
        found = []
        reader = _Reader(requests.buf)
        try:
            while reader.pos < len(requests.buf):
                start = reader.pos
                parsed = _parse_request(reader)
                found.append((reader.pos - start, parsed))
        except (_Short, DecodeError):
            self.lost_bytes += requests.discard()
            return
        requests.resync = False
        self._validated = True
        for size, (query, keys, values, number) in found:
            offset, first_ns, last_ns = requests.consume(size)
            self._take_request(StoreRequest(offset, first_ns, last_ns, size, query, keys, values, number))

    def _take_request(self, request: StoreRequest) -> None:
        if self._timed:
            bisect.insort(self._request_times, request.ts_first_ns)
        if request.query in NO_RESPONSE_QUERIES:
            self._exchanges.append(StoreExchange(request, None))
        else:
            self._awaiting.append(request)

    def _pair_responses(self, *, final: bool) -> None:
        """Timed pairing of the response chunks whose requests are known (all of them when `final`)."""
        exchanges = self._exchanges
        chunks = self._response_chunks
        while chunks:
            data, offset, ts_ns = chunks[0]
            if not final and ts_ns > self._last_request_ns:
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

    def _decode(self) -> None:
        requests, responses = self._requests, self._responses
        progress = True
        while progress:
            progress = False
            if requests.buf and len(requests.buf) >= requests.need and not requests.resync:
                reader = _Reader(requests.buf)
                try:
                    query, keys, values, number = _parse_request(reader)
                except _Short as short:
                    requests.need = short.args[0]
                else:
                    if not self._validated and (query != Query.VALIDATE or number != VALIDATION_MAGIC):
                        raise DecodeError(f"connection starts with {query.name}, not VALIDATE + magic")
                    self._validated = True
                    offset, first_ns, last_ns = requests.consume(reader.pos)
                    self._take_request(StoreRequest(offset, first_ns, last_ns, reader.pos, query, keys, values,
                                                    number))
                    progress = True
            if not self._timed and responses.buf and len(responses.buf) >= responses.need and self._awaiting:
                reader = _Reader(responses.buf)
                try:
                    values, number = _parse_response(reader, self._awaiting[0])
                except _Short as short:
                    responses.need = short.args[0]
                else:
                    offset, first_ns, last_ns = responses.consume(reader.pos)
                    response = StoreResponse(offset, first_ns, last_ns, reader.pos, values, number)
                    self._exchanges.append(StoreExchange(self._awaiting.popleft(), response))
                    progress = True

    def _fail(self, reason: str) -> None:
        if self.failed is None:
            self.failed = reason
        self.receive_end(0)


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
