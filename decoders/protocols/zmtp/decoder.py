"""ZMTP, the ZeroMQ wire protocol (1.0, 2.0 = RFC 15, 3.0 = RFC 23, 3.1 = RFC 37), decoded sans-IO.

One `ZmtpDecoder` reads one direction of one TCP connection, a `decoders.sansio.StreamDecoder`: it is fed the
captured bytes with their capture timestamps (`receive_data`), the sizes of byte ranges the capture lost
(`receive_gap`) and the end of the stream (`receive_end`), and returns typed events from `next_event()` until
it answers `NEED_DATA`:

    Greeting -> Command* (handshake) -> (Message | Command)*     [+ Resync, DecodeFailed]

Payloads are never copied unless asked for: the body of a data frame is kept (as a memoryview of the
caller's chunk when it lies in one, else joined) only when `keep_body(frame_index, size_bytes)` says
so; otherwise the decoder just counts it down chunk by chunk, and a caller holding many chunks may
`skip` them unseen, up to `skippable_bytes()`. Lost bytes that hit a frame header, or a
capture that starts mid-connection (`midstream=True`), make the decoder scan forward for the next
plausible frame boundary (see `_ZmtpScanner`) and report a `Resync`; it never raises on bad input.

The caller must not mutate a chunk after passing it: kept bodies may be views of it.
"""
from __future__ import annotations

import enum
import re
import struct
from collections import deque
from dataclasses import dataclass
from typing import Callable

from dlcsniff.decoders.compiled import compiled_module
from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.protocols import ZMTP_KEPT_BODIES
from dlcsniff.decoders.protocols.base import UNLIMITED_SKIP_BYTES
from dlcsniff.decoders.sansio import NEED_DATA, Sentinel, DecodeFailed, Resync

# -- wire format ----------------------------------------------------------------------------------

FLAG_MORE = 0x01        # another frame of the same message follows
FLAG_LONG = 0x02        # 2.0/3.x: the size is 8 bytes big-endian (libzmq: exactly when size > 255)
FLAG_COMMAND = 0x04     # 3.x: a command frame, not message data
_V3_RESERVED_FLAGS = 0xF8
_V2_RESERVED_FLAGS = 0xF8 | FLAG_COMMAND
_V1_LONG_LENGTH = 0xFF  # 1.0: this length byte announces an 8-byte big-endian length

_SIGNATURE_SIZE = 10                    # 0xFF, 8 bytes padding, 0x7F
_SIGNATURE_END = 0x7F                   # byte 9 of a versioned greeting
_GREETING_V2 = struct.Struct(">B8xBBB")             # 0xFF, padding, 0x7F, revision, socket type
_GREETING_V3 = struct.Struct(">B8xBBB20sB31x")      # 0xFF, padding, 0x7F, major, minor, mechanism, as-server
_FRAME_SHORT = struct.Struct(">BB")     # 2.0/3.x: flags, size
_FRAME_LONG = struct.Struct(">BQ")      # 2.0/3.x: flags, size (FLAG_LONG)
_V1_FRAME_SHORT = struct.Struct(">BB")  # 1.0: length (flags byte + body), flags
_V1_FRAME_LONG = struct.Struct(">xQB")  # 1.0: 0xFF, length, flags
_PROPERTY_VALUE_SIZE = struct.Struct(">I")
_HEADER_MAX = max(_FRAME_LONG.size, _V1_FRAME_LONG.size)

# ZMTP 1.0/2.0 greetings carry the socket type as a number (libzmq's ZMQ_PAIR ... ZMQ_STREAM).
_SOCKET_TYPES = ("PAIR", "PUB", "SUB", "REQ", "REP", "DEALER", "ROUTER", "PULL", "PUSH", "XPUB", "XSUB",
                 "STREAM")
_MECHANISM_PREFIX = re.compile(rb"[A-Z0-9_-]+\x00*")
_ENCRYPTING_MECHANISMS = frozenset({"CURVE", "GSSAPI"})
_COMMAND_NAME = re.compile(rb"[A-Za-z]+")
# Commands whose data is a metadata property list when the mechanism does not encrypt it.
_METADATA_COMMANDS = frozenset({"READY", "INITIATE"})
_KNOWN_COMMANDS = frozenset({b"READY", b"ERROR", b"HELLO", b"WELCOME", b"INITIATE", b"MESSAGE", b"PING",
                             b"PONG", b"SUBSCRIBE", b"CANCEL", b"JOIN", b"LEAVE"})

DEFAULT_KEPT_BODY_BYTES = ZMTP_KEPT_BODIES.max_body_bytes
COMMAND_BODY_CAP_BYTES = 64 * 1024      # larger command bodies are named and sized, not parsed
_ENCRYPTED_NAME_PREFIX_BYTES = 1 + 255  # an encrypted frame is read only as far as its command name

# Resynchronisation: what a frame found by scanning must look like to be believed.
RESYNC_MAX_FRAME_BYTES = 1 << 32        # larger sizes are taken for payload bytes
MIN_MAX_BUFFER = 4096                   # the scan window must hold several short frames
RESYNC_CHAIN_FRAMES = 4                 # consecutive plausible frame headers checked, when buffered
VALIDATOR_PREFIX_BYTES = 64 * 1024      # at most this much of a candidate's first body is validated
                                        # (less if max_buffer is smaller)
_SCAN_START = re.compile(rb"(?=[\x01-\x07]|\x00[^\x00])")   # flags bytes worth judging (not "00 00")
# The candidate search in C (decoders/protocols/zmtp_scan.c), _ZmtpScanner's judging its twin; its verdicts:
_COMPILED_SCAN = compiled_module("dlcsniff.decoders.protocols._zmtp_scan")
_SCAN_NONE, _SCAN_FOUND, _SCAN_NEED, _SCAN_VALIDATE = range(4)


def keep_small_bodies(frame_index: int, size_bytes: int) -> bool:
    """The default `keep_body`: keep data frame bodies of at most 64 KiB."""
    return size_bytes <= DEFAULT_KEPT_BODY_BYTES


# -- events ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Greeting:
    """The peer's greeting. ZMTP < 3.0 has no mechanisms: mechanism "NULL", as_server False (libzmq
    4.3.5 also leaves the 3.x as-server byte 0 on servers). socket_type is in the greeting only for
    1.0-with-revision/2.0; for 3.x it comes with READY (decoder state)."""
    version: str
    mechanism: str
    as_server: bool
    socket_type: str | None
    ts_ns: int


@dataclass(frozen=True, slots=True)
class Command:
    """A ZMTP 3.x command frame. size_bytes is the frame body size. properties holds the metadata of
    READY/INITIATE (NULL, PLAIN) and the user name of a PLAIN HELLO, never a password; it is empty
    for other commands and for encrypted ones. name is "" when a capture gap took it."""
    name: str
    ts_first_ns: int
    ts_last_ns: int
    size_bytes: int
    properties: dict[str, bytes]
    complete: bool


@dataclass(frozen=True, slots=True)
class Message:
    """A multipart message: one entry per frame. frames[i] is the body when kept and intact, else None.
    complete is False when a capture gap touched it, the stream ended inside it, or it is the first
    message after a resynchronisation that no frame_validator vouched for."""
    ts_first_ns: int
    ts_last_ns: int
    frame_sizes: tuple[int, ...]
    frames: tuple[bytes | memoryview | None, ...]
    complete: bool


ZmtpEvent = Greeting | Command | Message | Resync | DecodeFailed


# -- input buffer ---------------------------------------------------------------------------------

class _Barrier(enum.Enum):
    GAP = "gap"
    END = "end"


class _ChunkQueue:
    """Undecoded input in stream order: captured chunks (memoryviews; `own` copies them) and gap markers.

    Each item is [view, size, ts_ns]; view None marks `size` bytes the capture did not record: lost
    (never seen) or cut (seen, cut short by the snaplen), told apart by the item's fourth element.
    """
    __slots__ = ("_items", "_pos", "_gaps", "offset", "last_ts_ns", "ended", "buffered_bytes")

    def __init__(self) -> None:
        self._items: deque[list] = deque()
        self._pos = 0                 # bytes of the first item already consumed
        self._gaps = 0                # gap markers queued
        self.offset = 0               # stream offset of the next undecoded byte
        self.last_ts_ns = 0           # timestamp of the chunk holding the last consumed byte
        self.ended = False
        self.buffered_bytes = 0       # captured bytes held (gaps excluded)

    def push(self, view: memoryview, ts_ns: int) -> None:
        self._items.append([view, len(view), ts_ns])
        self.buffered_bytes += len(view)

    def push_gap(self, size: int, ts_ns: int, lost: bool) -> None:
        self._items.append([None, size, ts_ns, lost])
        self._gaps += 1

    def own(self) -> None:
        """Copy the queued chunks out of the buffers they view: a view keeps its whole read buffer alive."""
        for item in self._items:
            if item[0].__class__ is memoryview:
                item[0] = bytes(item[0])

    def gap_lost(self) -> bool:
        """Is the gap at the current position bytes the capture never saw (not a snaplen cut)?"""
        return self._items[0][3]

    def buffered(self) -> bool:
        """Is anything (bytes or a gap) queued and not consumed?"""
        return bool(self._items)

    def skip(self, size: int, ts_ns: int) -> None:
        """Consume `size` bytes that were never queued (the queue is empty), the last captured at ts_ns."""
        self.offset += size
        self.last_ts_ns = ts_ns

    def head_ts_ns(self) -> int:
        return self._items[0][2] if self._items else self.last_ts_ns

    def at_end(self) -> bool:
        return self.ended and not self._items

    def barrier(self) -> _Barrier | None:
        """What stops the captured bytes available now: a gap, the end, or (None) the lack of data."""
        if self._gaps:
            for item in self._items:
                if item[0] is None:
                    return _Barrier.GAP
        return _Barrier.END if self.ended else None

    def contiguous_at_least(self, n: int) -> bool:
        """Are n captured bytes available before any gap?"""
        if not self._gaps:
            return self.buffered_bytes >= n
        have = -self._pos
        for item in self._items:
            view, size = item[0], item[1]
            if view is None:
                return False
            have += size
            if have >= n:
                return True
        return False

    def peek(self, n: int) -> bytes:
        """Up to n bytes from the current position (fewer at a gap or when no more are buffered)."""
        parts = []
        pos = self._pos
        for item in self._items:
            view, size = item[0], item[1]
            if view is None or n <= 0:
                break
            take = min(size - pos, n)
            parts.append(view[pos:pos + take])
            n -= take
            pos = 0
        return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)

    def read(self, n: int, pieces: list | None) -> int:
        """Consume up to n captured bytes (stopping at a gap); append their views to pieces if given."""
        done = 0
        items = self._items
        while done < n and items:
            item = items[0]
            view = item[0]
            if view is None:
                break
            avail = item[1] - self._pos
            take = avail if avail <= n - done else n - done
            if pieces is not None:
                pieces.append(view[self._pos:self._pos + take])
            done += take
            self.last_ts_ns = item[2]
            if take == avail:
                items.popleft()
                self._pos = 0
            else:
                self._pos += take
        self.offset += done
        self.buffered_bytes -= done
        return done

    def read_gap(self, n: int | None = None) -> int:
        """Consume up to n bytes (default: all) of the gap at the current position."""
        item = self._items[0]
        take = item[1] if n is None else min(n, item[1])
        item[1] -= take
        if not item[1]:
            self._items.popleft()
            self._gaps -= 1
        self.offset += take
        self.last_ts_ns = item[2]
        return take

    def drop_all(self) -> int:
        """Forget everything queued; return how many stream bytes that was."""
        dropped = self.buffered_bytes + sum(item[1] for item in self._items if item[0] is None)
        self.offset += dropped
        self._items.clear()
        self._pos = self._gaps = self.buffered_bytes = 0
        return dropped


# -- the decoder ----------------------------------------------------------------------------------

class _State(enum.Enum):
    MIDSTREAM_START = "midstream start"
    GREETING = "greeting"
    FRAME_HEADER = "frame header"
    FRAME_BODY = "frame body"
    RESYNC = "resync"
    DONE = "done"
    FAILED = "failed"


class _Framing(enum.Enum):
    V1 = "1.0"      # length (counts the flags byte), flags, body
    V2 = "2.0"      # flags, size, body
    V3 = "3.x"      # as 2.0, plus command frames


class _FrameKind(enum.Enum):
    IDENTITY = "identity"   # 1.0/2.0: the first frame is the peer's identity, not a message
    DATA = "data"
    COMMAND = "command"     # 3.x command frames, and every frame of an encrypted stream


class ZmtpDecoder:
    """Decoder for one direction of a ZMTP connection; see the module docstring for the contract.

    Visible state: version ("1.0", "2.0", "3.0", "3.1" or None when no greeting was seen), mechanism,
    as_server, socket_type, identity (bytes or None), encrypted, properties (READY/INITIATE metadata),
    and the counters messages, commands, frames (data frames in messages), lost_bytes (stream bytes
    whose framing is unknown: skipped while resynchronising, after a failure, or cut off at the end)
    and resyncs.
    """

    def __init__(self, *, keep_body: Callable[[int, int], bool] | None = None, midstream: bool = False,
                 frame_validator: Callable[[bytes], bool] | None = None, max_buffer: int = 1 << 20):
        if max_buffer < MIN_MAX_BUFFER:
            raise ValueError(f"max_buffer must be at least {MIN_MAX_BUFFER} bytes (frame chains must fit)")
        self._keep_body = keep_body if keep_body is not None else keep_small_bodies
        self._frame_validator = frame_validator
        self._max_buffer = max_buffer
        self._queue = _ChunkQueue()
        self._events: deque = deque()
        self._steps = {
            _State.MIDSTREAM_START: self._step_midstream_start,
            _State.GREETING: self._step_greeting,
            _State.FRAME_HEADER: self._step_frame_header,
            _State.FRAME_BODY: self._step_frame_body,
            _State.RESYNC: self._step_resync,
            _State.DONE: self._step_stopped,
            _State.FAILED: self._step_stopped,
        }
        self._state = _State.MIDSTREAM_START if midstream else _State.GREETING
        # Midstream: no greeting, so assume 3.x framing (2.0 framing plus command frames).
        self._framing = _Framing.V3
        self._expect_identity = False
        # the message being assembled
        self._msg_sizes: list[int] = []
        self._msg_bodies: list = []
        self._msg_ts_first_ns = 0
        self._msg_complete = True
        self._trust_next_message = True
        # the frame being read
        self._frame_offset = 0
        self._frame_kind = _FrameKind.DATA
        self._frame_flags = 0
        self._frame_size = 0
        self._frame_ts_first_ns = 0
        self._frame_remaining = 0
        self._frame_collect = 0
        self._frame_pieces: list | None = None
        self._frame_complete = True
        # resynchronisation
        self._lost_from = 0
        self._resync_reason = ""
        self._resync_need = 0
        # visible state
        self.version: str | None = None
        self.mechanism: str | None = None
        self.as_server: bool | None = None
        self.socket_type: str | None = None
        self.identity: bytes | None = None
        self.encrypted = False
        self.signature = False          # the stream began with ZMTP's signature (2.0 and later, or a talk-down)
        self.identity_flags: int | None = None   # 1.0/2.0: the flags byte of the identity frame
        self.properties: dict[str, bytes] = {}
        self.messages = 0
        self.commands = 0
        self.frames = 0
        self.lost_bytes = 0
        self.resyncs = 0

    @property
    def evidence(self) -> bool:
        """Whether the bytes read so far show ZMTP rather than merely parse as it. Any stream whose first byte
        is not 0xFF parses as unversioned ZMTP 1.0 for a while, so there it takes an identity frame with the
        flags 1.0 peers send (0) and a whole message after it, without a decoding failure; a signature or
        a frame found by resynchronising is evidence enough (the scanner checks chains of frames)."""
        if self.signature or self.version is None:
            return self.signature or self.messages > 0 or self.commands > 0
        return self.identity_flags == 0 and self.messages > 0 and self._state is not _State.FAILED

    @property
    def buffered_bytes(self) -> int:
        """Captured bytes received but not yet decoded (below max_buffer whenever NEED_DATA is returned)."""
        return self._queue.buffered_bytes

    # -- input ----------------------------------------------------------------------------------

    def receive_data(self, data: bytes | memoryview, ts_ns: int) -> None:
        """Buffer captured bytes of the stream (after a failure or the end: only counted)."""
        if not data:
            return
        if self._state is _State.FAILED or self._queue.ended:
            self.lost_bytes += len(data)
            return
        view = data if isinstance(data, memoryview) else memoryview(data)
        if view.format != "B" or view.ndim != 1:
            view = view.cast("B")
        self._queue.push(view, ts_ns)

    def receive_gap(self, size: int, ts_ns: int, *, lost: bool = True) -> None:
        """Record that `size` bytes of the stream, at this point, were not captured: lost, or (lost False)
        cut on purpose by the snaplen. A cut inside a frame body that is not kept leaves the frame whole."""
        if size <= 0:
            return
        if self._state is _State.FAILED or self._queue.ended:
            self.lost_bytes += size
            return
        self._queue.push_gap(size, ts_ns, lost)

    def receive_end(self, ts_ns: int) -> None:
        """The stream ended: a message or frame it cut short comes out incomplete, bytes left unread are lost."""
        self._queue.ended = True

    def skippable_bytes(self) -> int:
        """How many of the stream's next bytes `skip` may account for unseen: the rest of a frame body it
        does not keep, but its last byte (that one ends the frame), or any number once decoding stopped."""
        if self._state is _State.FAILED or self._queue.ended:
            return UNLIMITED_SKIP_BYTES
        if self._state is _State.FRAME_BODY and not self._frame_collect and not self._queue.buffered():
            return max(self._frame_remaining - 1, 0)
        return 0

    def skip(self, size: int, ts_ns: int) -> None:
        """Account for `size` captured bytes (at most skippable_bytes()), the last of them captured at
        ts_ns, exactly as receive_data of them followed by next_event would (which returns NEED_DATA)."""
        if self._state is _State.FAILED or self._queue.ended:
            self.lost_bytes += size
            return
        self._queue.skip(size, ts_ns)
        self._frame_remaining -= size

    def next_event(self) -> ZmtpEvent | Sentinel:
        """The next event, or NEED_DATA. Never raises on bad input."""
        events = self._events
        while not events:
            try:
                if self._steps[self._state]() is NEED_DATA:
                    self._own_waiting_bytes()
                    return NEED_DATA
            except DecodeError as exc:
                self._lose_sync(str(exc), self._frame_offset)
        return events.popleft()

    def _own_waiting_bytes(self) -> None:
        """Waiting for more input, keep no view of it: a view keeps the reader's whole buffer (MBs) alive."""
        self._queue.own()
        pieces = self._frame_pieces
        if pieces and (len(pieces) > 1 or pieces[0].__class__ is memoryview):
            self._frame_pieces = [b"".join(pieces)]
        bodies = self._msg_bodies
        if bodies:
            self._msg_bodies = [bytes(body) if body.__class__ is memoryview else body for body in bodies]

    # -- greeting -------------------------------------------------------------------------------

    def _step_midstream_start(self):
        # A capture may start mid-connection yet right at the greeting: its signature cannot be a
        # frame header (0xFF has reserved flag bits set).
        q = self._queue
        head = q.peek(_SIGNATURE_SIZE)
        if len(head) < _SIGNATURE_SIZE and q.barrier() is None:
            return NEED_DATA
        if len(head) == _SIGNATURE_SIZE and head[0] == 0xFF and head[9] == _SIGNATURE_END:
            self._state = _State.GREETING
        else:
            self._start_resync("capture started mid-stream", q.offset)
        return None

    def _step_greeting(self):
        q = self._queue
        head = q.peek(_GREETING_V3.size)
        decision = _classify_greeting(head)
        if decision is None:
            barrier = q.barrier()
            if barrier is None:
                return NEED_DATA
            if barrier is _Barrier.GAP:
                self._start_resync("gap in the greeting", q.offset)
                return None
            self.lost_bytes += q.read(len(head), None)
            self._state = _State.DONE
            return None
        framing, greeting_size = decision
        ts_ns = q.head_ts_ns()
        q.read(greeting_size, None)
        if greeting_size:
            ts_ns = q.last_ts_ns
        self.signature = greeting_size > 0
        self._framing = framing
        if framing is _Framing.V3:
            _, _, _, minor, mechanism, as_server = _GREETING_V3.unpack(head)
            self.version = "3.0" if minor == 0 else "3.1"   # libzmq reads any minor >= 1 as 3.1
            self.mechanism = mechanism.rstrip(b"\x00").decode("ascii")
            self.as_server = bool(as_server)
            self.encrypted = self.mechanism in _ENCRYPTING_MECHANISMS
        else:
            self.version = framing.value
            self.mechanism = "NULL"
            self.as_server = False
            self._expect_identity = True
            if greeting_size:
                _, _, _, socket_type = _GREETING_V2.unpack_from(head)
                self.socket_type = (_SOCKET_TYPES[socket_type] if socket_type < len(_SOCKET_TYPES)
                                    else str(socket_type))
        self._events.append(Greeting(self.version, self.mechanism, self.as_server, self.socket_type, ts_ns))
        self._state = _State.FRAME_HEADER
        return None

    # -- frames ---------------------------------------------------------------------------------

    def _step_frame_header(self):
        q = self._queue
        self._frame_offset = q.offset
        head = q.peek(_HEADER_MAX)
        parsed = self._parse_header(head)
        if parsed is None:
            barrier = q.barrier()
            if barrier is None:
                return NEED_DATA
            if barrier is _Barrier.GAP:
                self._lose_sync("gap in a frame header", q.offset)
                return None
            self.lost_bytes += q.read(len(head), None)   # a header cut off by the end of the stream
            self._flush_message(complete=False)
            self._state = _State.DONE
            return None
        flags, size, header_size = parsed
        ts_first_ns = q.head_ts_ns()
        q.read(header_size, None)
        self._frame_flags = flags
        self._frame_size = self._frame_remaining = size
        self._frame_ts_first_ns = ts_first_ns
        self._frame_complete = True
        if self._expect_identity:
            kind, collect = _FrameKind.IDENTITY, min(size, COMMAND_BODY_CAP_BYTES)
            self.identity_flags = flags
        elif self.encrypted:
            kind, collect = _FrameKind.COMMAND, min(size, _ENCRYPTED_NAME_PREFIX_BYTES)
        elif flags & FLAG_COMMAND:
            kind, collect = _FrameKind.COMMAND, min(size, COMMAND_BODY_CAP_BYTES)
        else:
            kind = _FrameKind.DATA
            if not self._msg_sizes:
                self._msg_ts_first_ns = ts_first_ns
                self._msg_complete = self._trust_next_message
                self._trust_next_message = True
            collect = size if self._keep_body(len(self._msg_sizes), size) else -1
        self._frame_kind = kind
        self._frame_collect = max(collect, 0)
        self._frame_pieces = [] if collect >= 0 else None
        self._state = _State.FRAME_BODY
        return None

    def _parse_header(self, head: bytes) -> tuple[int, int, int] | None:
        """(flags, body size, header size), or None until the whole header is there."""
        if not head:
            return None
        if self._framing is _Framing.V1:
            if head[0] == _V1_LONG_LENGTH:
                if len(head) < _V1_FRAME_LONG.size:
                    return None
                length, flags = _V1_FRAME_LONG.unpack_from(head)
                header_size = _V1_FRAME_LONG.size
            else:
                if len(head) < _V1_FRAME_SHORT.size:
                    return None
                length, flags = _V1_FRAME_SHORT.unpack_from(head)
                header_size = _V1_FRAME_SHORT.size
            if length == 0:
                raise DecodeError("ZMTP 1.0 frame of length 0 (it must count its flags byte)")
            # libzmq's own identity frame to an unversioned peer has flags 0x7F: only MORE matters there.
            if flags & ~FLAG_MORE and not self._expect_identity:
                raise DecodeError(f"reserved flag bits set in ZMTP 1.0 flags {flags:#04x}")
            return flags, length - 1, header_size
        flags = head[0]
        reserved = _V3_RESERVED_FLAGS if self._framing is _Framing.V3 else _V2_RESERVED_FLAGS
        if flags & reserved:
            raise DecodeError(f"reserved flag bits set in frame flags {flags:#04x}")
        header = _FRAME_LONG if flags & FLAG_LONG else _FRAME_SHORT
        if len(head) < header.size:
            return None
        _, size = header.unpack_from(head)
        return flags, size, header.size

    def _step_frame_body(self):
        q = self._queue
        while self._frame_remaining:
            if self._frame_collect:
                n = q.read(min(self._frame_remaining, self._frame_collect), self._frame_pieces)
                self._frame_collect -= n
            else:
                n = q.read(self._frame_remaining, None)
            if n:
                self._frame_remaining -= n
                continue
            barrier = q.barrier()
            if barrier is None:
                return NEED_DATA
            if barrier is _Barrier.GAP and not self._frame_collect and not q.gap_lost():
                # Value bytes the capture cut on purpose, in a body not kept: nothing of the frame is lost.
                self._frame_remaining -= q.read_gap(self._frame_remaining)
                continue
            # Lost or missing body bytes: the frame's end is still known, its body is not whole.
            self._frame_complete = False
            self._frame_collect = 0
            if barrier is _Barrier.GAP:
                self._frame_remaining -= q.read_gap(self._frame_remaining)
            else:
                self._frame_remaining = 0
        self._finish_frame()
        return None

    def _finish_frame(self) -> None:
        self._state = _State.FRAME_HEADER
        pieces = self._frame_pieces
        body = None if pieces is None else pieces[0] if len(pieces) == 1 else b"".join(pieces)
        kind = self._frame_kind
        if kind is _FrameKind.DATA:
            self.frames += 1
            self._msg_sizes.append(self._frame_size)
            self._msg_bodies.append(body if self._frame_complete else None)
            self._msg_complete = self._msg_complete and self._frame_complete
            if not self._frame_flags & FLAG_MORE:
                self._flush_message(complete=self._msg_complete)
        elif kind is _FrameKind.COMMAND:
            self._emit_command(bytes(body) if body is not None else b"")
        else:
            self._expect_identity = False
            self.identity = bytes(body) if body is not None and self._frame_complete else None

    def _flush_message(self, *, complete: bool) -> None:
        """Emit the message being assembled, if any (complete=False: its end was never seen)."""
        if not self._msg_sizes:
            return
        self._events.append(Message(self._msg_ts_first_ns, self._queue.last_ts_ns, tuple(self._msg_sizes),
                                    tuple(self._msg_bodies), complete))
        self.messages += 1
        self._msg_sizes = []
        self._msg_bodies = []

    def _emit_command(self, body: bytes) -> None:
        complete = self._frame_complete
        name_size = body[0] if body else 0
        name_bytes = body[1:1 + name_size]
        if not name_size or len(name_bytes) < name_size or not _COMMAND_NAME.fullmatch(name_bytes):
            if complete:
                raise DecodeError("malformed command name")
            name = ""
        else:
            name = name_bytes.decode("ascii")
        if self.encrypted and complete and name_bytes not in _KNOWN_COMMANDS:
            raise DecodeError(f"unexpected command {name!r} on an encrypted stream")
        properties: dict[str, bytes] = {}
        parseable = complete and len(body) == self._frame_size and not self.encrypted
        if parseable and name in _METADATA_COMMANDS:
            properties = _parse_metadata(body, 1 + name_size)
            self._learn_metadata(properties)
        elif parseable and name == "HELLO" and self.mechanism == "PLAIN":
            properties = _plain_hello_username(body, 1 + name_size)
        self.commands += 1
        self._events.append(Command(name, self._frame_ts_first_ns, self._queue.last_ts_ns, self._frame_size,
                                    properties, complete))

    def _learn_metadata(self, properties: dict[str, bytes]) -> None:
        self.properties.update(properties)
        for name, value in properties.items():
            key = name.lower()      # ZMTP property names are case-insensitive
            if key == "socket-type":
                self.socket_type = value.decode("latin-1")
            elif key == "identity":
                self.identity = value

    # -- losing and regaining sync --------------------------------------------------------------

    def _lose_sync(self, reason: str, from_offset: int) -> None:
        """Framing is lost from `from_offset` (the last frame boundary known) on."""
        self._flush_message(complete=False)
        if self._framing is _Framing.V1:
            self._fail(f"{reason} (ZMTP 1.0 streams are not resynchronised)", from_offset)
        else:
            self._start_resync(reason, from_offset)

    def _start_resync(self, reason: str, from_offset: int) -> None:
        self._state = _State.RESYNC
        self._lost_from = from_offset
        self._resync_reason = reason
        self._resync_need = 0
        self._expect_identity = False

    def _fail(self, reason: str, offset: int) -> None:
        self._events.append(DecodeFailed(offset, reason))
        self.lost_bytes += self._queue.offset - offset + self._queue.drop_all()
        self._state = _State.FAILED

    def _step_resync(self):
        q = self._queue
        scanner = _ZmtpScanner(self._framing, self.encrypted, self._frame_validator, self._max_buffer)
        while True:
            need = self._resync_need
            if need and not q.contiguous_at_least(need) and q.barrier() is None:
                return NEED_DATA
            window = q.peek(self._max_buffer)
            capped = len(window) == self._max_buffer
            barrier = None if capped else q.barrier()
            found, position, self._resync_need = scanner.scan(window, final=barrier is not None)
            q.read(position, None)
            if found:
                lost = q.offset - self._lost_from
                self.lost_bytes += lost
                self.resyncs += 1
                self._events.append(Resync(q.offset, lost, q.head_ts_ns(), self._resync_reason))
                self._trust_next_message = self._frame_validator is not None
                self._state = _State.FRAME_HEADER
                return None
            if self._resync_need or capped:
                continue
            if barrier is _Barrier.GAP:
                q.read_gap()
            elif barrier is _Barrier.END:
                self.lost_bytes += q.offset - self._lost_from
                self._state = _State.DONE
                return None
            else:
                return NEED_DATA

    def _step_stopped(self):
        return NEED_DATA


def _classify_greeting(head: bytes) -> tuple[_Framing, int] | None:
    """(framing that follows, greeting size) from the first bytes, or None until they decide it.

    Mirrors libzmq's receive side, plus what a libzmq >= 3 peer sends when it talks down (seen on
    real libzmq 4.3.5): to a 2.0 peer, revision 3 and its socket type, then 2.0 frames whose first,
    the identity frame, has flags 0 (byte 12); to an unversioned 1.0 peer, only its signature, which
    then reads as the header of a 1.0 long identity frame, and 1.0 frames from byte 10 on. Byte 10 is
    then a 1.0 length (>= 1), byte 12 a body byte or the next length (>= 1 when the first frame is
    empty). Left ambiguous: a talk-down to 1.0 whose first frame is 2 body bytes starting with 0 reads
    as a talk-down to 2.0.
    """
    if not head:
        return None
    unversioned = _Framing.V1, 0
    if head[0] != 0xFF:
        return unversioned
    if len(head) < _SIGNATURE_SIZE:
        return None
    if not head[9] & 0x01:              # a 1.0 long identity frame's flags, not the signature's 0x7F
        return unversioned
    if len(head) < 13:
        return None
    revision, identity_flags = head[10], head[12]
    if revision == 0:
        return _Framing.V1, _GREETING_V2.size
    if revision in (1, 3) and identity_flags == 0:
        return _Framing.V2, _GREETING_V2.size
    if revision == 1 or not _MECHANISM_PREFIX.fullmatch(head[12:32]):
        return unversioned
    if len(head) < _GREETING_V3.size:
        return None
    return _Framing.V3, _GREETING_V3.size


def _parse_metadata(body: bytes, start: int) -> dict[str, bytes]:
    """ZMTP metadata: (name_size u8, name, value_size u32 BE, value)*; decoded as far as it is whole."""
    properties: dict[str, bytes] = {}
    pos, end = start, len(body)
    while pos < end:
        name_end = pos + 1 + body[pos]
        if name_end + _PROPERTY_VALUE_SIZE.size > end:
            break
        (value_size,) = _PROPERTY_VALUE_SIZE.unpack_from(body, name_end)
        value_start = name_end + _PROPERTY_VALUE_SIZE.size
        if value_start + value_size > end:
            break
        properties[body[pos + 1:name_end].decode("latin-1")] = body[value_start:value_start + value_size]
        pos = value_start + value_size
    return properties


def _plain_hello_username(body: bytes, start: int) -> dict[str, bytes]:
    """PLAIN HELLO = username_size u8, username, password_size u8, password: only the user name is kept."""
    if start >= len(body) or start + 1 + body[start] > len(body):
        return {}
    return {"Username": body[start + 1:start + 1 + body[start]]}


class _ZmtpScanner:
    """Finds the next believable frame boundary in a window of captured bytes (2.0/3.x framing).

    A candidate is believed when its flags have no reserved bits, its size is plausible (LONG only for
    sizes above 255, as libzmq writes it, and at most RESYNC_MAX_FRAME_BYTES), a command (or any frame of
    an encrypted stream) carries a known command name, frame_validator (if any) accepts the body of a
    data candidate, and the next frame headers (up to RESYNC_CHAIN_FRAMES in all) are plausible too,
    as far as they lie within max_buffer bytes and before a gap or the end; when fewer than two
    headers could be checked, only a first frame that is unlikely by chance (LONG, a command, or
    validated) is believed. Decisions depend only on the stream's bytes, never on how
    they were chunked: a candidate whose checks need bytes not yet received waits for them.
    """
    __slots__ = ("_reserved", "_named", "_validator", "_validated_bytes", "_reach")

    def __init__(self, framing: _Framing, encrypted: bool, validator, max_buffer: int):
        self._reserved = _V3_RESERVED_FLAGS if framing is _Framing.V3 else _V2_RESERVED_FLAGS
        self._named = encrypted
        self._validator = validator
        self._validated_bytes = min(VALIDATOR_PREFIX_BYTES, max_buffer - _FRAME_LONG.size)
        self._reach = max_buffer

    def scan(self, window: bytes, *, final: bool) -> tuple[bool, int, int]:
        """(found, position, bytes needed from position). Bytes before position are rejected.

        final: no byte after the window will ever join it (a gap or the end follows).
        """
        if _COMPILED_SCAN is not None:
            return self._scan_compiled(window, final)
        for match in _SCAN_START.finditer(window):
            i = match.start()
            verdict = self._judge(window, i, final)
            if verdict is True:
                return True, i, 0
            if verdict:
                return False, i, verdict
        # A trailing 0x00 may begin a candidate once its size byte arrives.
        keep = 1 if not final and window.endswith(b"\x00") else 0
        return False, len(window) - keep, 2 if keep else 0

    def _scan_compiled(self, window: bytes, final: bool) -> tuple[bool, int, int]:
        """`scan` with the candidates' framing judged in C: the validator sees only the first bodies of candidates
        whose chain of headers holds, each once."""
        start = 0
        validating = self._validator is not None
        while True:
            kind, i, a, b, after = _COMPILED_SCAN.scan(window, start, self._reserved, self._named, final, self._reach,
                                                       self._validated_bytes, validating)
            if kind == _SCAN_FOUND:
                return True, i, 0
            if kind == _SCAN_NEED:
                return False, i, a
            if kind == _SCAN_NONE:
                return False, i, a
            try:
                believed = self._validator(window[a:b])
            except DecodeError:
                believed = False
            if believed:
                return (True, i, 0) if after > 0 else (False, i, -after)
            start = i + 1

    def _judge(self, w: bytes, i: int, final: bool) -> bool | int:
        """True: believed; False: rejected; an int: the bytes needed from i to decide."""
        reach = i + self._reach
        j = i
        strong = False      # a first frame that is unlikely by chance: LONG, a named command, validated
        for checked in range(RESYNC_CHAIN_FRAMES):
            header = self._plausible_header(w, j)
            if header is False:
                return False
            if isinstance(header, int):     # the header is not all there
                if final or j + header > reach:
                    return checked >= 2 or strong
                return j + header - i
            header_size, size, is_data = header
            if not checked:
                strong = header_size == _FRAME_LONG.size or not is_data
                if is_data and self._validator is not None:
                    end = j + header_size + min(size, self._validated_bytes)
                    if end > len(w):
                        return False if final else end - i
                    try:
                        if not self._validator(w[j + header_size:end]):
                            return False
                    except DecodeError:
                        return False
                    strong = True
            j += header_size + size
        return True

    def _plausible_header(self, w: bytes, j: int) -> tuple[int, int, bool] | int | bool:
        """(header size, body size, is data), False if implausible, or the bytes from j it needs."""
        if j >= len(w):
            return 1
        flags = w[j]
        if flags & self._reserved:
            return False
        if flags & FLAG_LONG:
            if j + _FRAME_LONG.size > len(w):
                return _FRAME_LONG.size
            size = _FRAME_LONG.unpack_from(w, j)[1]
            if not 255 < size <= RESYNC_MAX_FRAME_BYTES:
                return False
            header_size = _FRAME_LONG.size
        else:
            if j + _FRAME_SHORT.size > len(w):
                return _FRAME_SHORT.size
            size = w[j + 1]
            header_size = _FRAME_SHORT.size
        if flags & FLAG_COMMAND or self._named:
            body = j + header_size
            if size < 2:
                return False
            if body >= len(w):
                return header_size + 1
            name_size = w[body]
            if not name_size or name_size >= size:
                return False
            if body + 1 + name_size > len(w):
                return header_size + 1 + name_size
            if w[body + 1:body + 1 + name_size] not in _KNOWN_COMMANDS:
                return False
            return header_size, size, False
        if size == 0 and not flags & FLAG_MORE:
            return False        # an empty single-frame message: rare, and what runs of zero bytes look like
        return header_size, size, True
