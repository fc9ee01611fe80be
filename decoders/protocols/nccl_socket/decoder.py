"""NCCL's TCP traffic: the net-socket transport (NCCL_NET=Socket), bootstrap messages, the connection handshake.

Wire format (NVIDIA/nccl src/misc/socket.cc, src/transport/net_socket.cc, src/bootstrap.cc, read at the
v2.15.5, v2.16.2, v2.22.3, v2.23.4, v2.27.3 tags and master; little-endian hosts):
- Handshake, since 2.16: the connecting side first writes `u64 magic, i32 ncclSocketType` (1 bootstrap,
  2 proxy, 3 net-socket, 4 net-IB set-up, 5 RAS). Net transports use NCCL_SOCKET_MAGIC (overridable by the
  environment since 2.30); bootstrap and proxy use the communicator's magic (random, or NCCL_COMM_ID_MAGIC).
  Before 2.16 there is no handshake at all.
- Net-socket connect: nSocks data sockets, then the control socket, each writing a `u8` index
  (index == nSocks marks the control socket). nSocks is 0 unless the NIC is AWS's (16) or GCP's (4) or
  NCCL_NSOCKS_PERTHREAD/NCCL_SOCKET_NTHREADS say otherwise. Data flows only from connector to acceptor.
- Per message the control socket carries `i32 size`; since 2.27 a payload of at most 128 bytes follows it
  inline. With nSocks == 0 any other payload follows on the control socket too. Otherwise it is cut into
  tasks of max(64 KiB, ceil(size / nSocks)) bytes, dealt round-robin over the data sockets starting where
  the previous message stopped. Data sockets carry no framing.
- Bootstrap messages are `i32 size, bytes`. A point-to-point bootstrapSend opens a connection per message
  and first sends the sender's rank and the tag: as two 4-byte messages up to 2.22, as one 8-byte message
  (`i32 rank, i32 tag`) since 2.23. Ring and root connections carry plain messages.
- LL and LL128 buffers travel as they are: LL lines are 16 bytes (`u32 data, u32 flag, u32 data, u32 flag`,
  half of the bytes are payload), LL128 lines 128 bytes whose last u64 is the flag (120/128 payload).

Whether a capture comes from before 2.27 (no inline payloads) cannot be read from any header: with data
sockets, the first message of at most 128 bytes forks two hypotheses, fed the same bytes, and the one whose
control and data sockets agree at the end is kept.

`NcclSocketCaptureDecoder` is the protocol decoder the capture decoder drives (decoders.protocols.base). Its
stream decoders have the one shape of decoders.sansio: `receive_data(data, ts_ns)`, `receive_gap(size, ts_ns,
lost=True)`, `receive_end(ts_ns)` in, typed events from `next_event()` out until NEED_DATA. A bootstrap
direction is read by a `BootstrapStream` (decoders.protocols.nccl_socket.bootstrap). A net-socket connection
spans sockets: each reading of it has a `_ControlSocket` and a `_DataSocket` per data socket, and
`_NetSocketConnection` couples them (it deals the control socket's messages over the data sockets and keeps
the reading that fits). It keeps no payload beyond the first bytes of each message (the LL/LL128 test, and a
digest of the first HEAD_DIGEST_BYTES: whether a rank forwarded what it received or reduced it).

Collectives are inferred job-wide from the messages by decoders.protocols.nccl.collectives (shared with
decoders.protocols.roce.decoder), which decoders.job runs once every capture is decoded.
"""
from __future__ import annotations

import collections
import copy
import struct
import zlib
from dataclasses import dataclass, field

from dlcsniff.decoders.packet import ip_to_str
from dlcsniff.decoders.protocols.base import CaptureRows, Count, ProtocolDecoderBase, TcpDirection
from dlcsniff.decoders.protocols.nccl_socket.bootstrap import (MAX_BOOTSTRAP_BYTES, BootstrapMessage, BootstrapPeer,
                                                              BootstrapStream)
from dlcsniff.decoders.sansio import NEED_DATA, DecodeFailed, Sentinel

NCCL_SOCKET_MAGIC = 0x564AB9F2FC4B9D6C     # net transports' handshake magic (src/include/socket.h)
NCCL_COMM_ID_MAGIC = 0x0280028002800280    # communicators created through NCCL_COMM_ID (src/include/comm.h)
SOCKET_TYPES = {1: "bootstrap", 2: "proxy", 3: "net_socket", 4: "net_ib", 5: "ras"}
TYPE_BOOTSTRAP, TYPE_PROXY, TYPE_NET_SOCKET, TYPE_RAS = 1, 2, 3, 5   # 4 (net-IB set-up): protocols.roce.decoder
MAX_SOCKETS = 64                 # net_socket.cc MAX_SOCKETS: highest index a connection can announce
MIN_TASK_BYTES = 64 << 10        # NCCL_SOCKET_MIN_TASKSIZE default
INLINE_MAX_BYTES = 128           # NCCL_SOCKET_INLINE default (2.27+)
MAX_RANK = 1 << 24
# Before 2.16 (no handshake) a net-socket message is one proxy step of at most NCCL_BUFFSIZE: a larger size
# in what would be a control socket's first bytes means it is not one.
MAX_LEGACY_MESSAGE_BYTES = 1 << 28
LEGACY_MIN_MESSAGES = 2          # whole messages a pre-2.16 control socket must show to be taken for NCCL
SAMPLE_BYTES = 256               # payload bytes kept per message to recognise LL / LL128 lines
HEAD_DIGEST_BYTES = 64           # first payload bytes digested per message (also RoCE's: protocols.roce.decoder)

HANDSHAKE = struct.Struct("<Qi")   # u64 magic, i32 ncclSocketType
HANDSHAKE_BYTES = HANDSHAKE.size
_I32 = struct.Struct("<i")
_LEGACY_RANK_HEADER = _I32.pack(4)           # up to 2.22 the rank and the tag travel as 4-byte messages
_LL_FLAGS = struct.Struct("<xxxxIxxxxI")   # one 16-byte LL line: the two flag words
_U64 = struct.Struct("<Q")
LL_LINE_BYTES = 16
LL128_LINE_BYTES = 128
_PROTOCOL_PAYLOAD_FRACTION = {"LL": (1, 2), "LL128": (120, 128), "Simple": (1, 1)}


def line_protocol(sample: bytes, size_bytes: int) -> str | None:
    """"LL", "LL128" or "Simple" for a message whose first bytes are `sample`; None when too few are known.

    LL: every line's two flag words equal one non-zero value. LL128: every line's last u64 equals one
    non-zero value below 2^32 (NCCL's flags are step counters). A sample made of one repeated word proves
    nothing (a constant tensor looks like both), and so does a sample too short to rule a protocol out
    (two lines of it): both answer None.
    """
    could_be_ll = size_bytes % LL_LINE_BYTES == 0
    could_be_ll128 = size_bytes % LL128_LINE_BYTES == 0
    if (not size_bytes or (could_be_ll and len(sample) < 2 * LL_LINE_BYTES)
            or len(set(sample[i:i + 4] for i in range(0, len(sample) - 3, 4))) <= 1):
        return None
    if could_be_ll:
        flags = {w for i in range(0, len(sample) - LL_LINE_BYTES + 1, LL_LINE_BYTES)
                 for w in _LL_FLAGS.unpack_from(sample, i)}
        if len(flags) == 1 and 0 not in flags:
            return "LL"
    if could_be_ll128:
        if len(sample) < 2 * LL128_LINE_BYTES:
            return None
        flags = {_U64.unpack_from(sample, i + LL128_LINE_BYTES - 8)[0]
                 for i in range(0, len(sample) - LL128_LINE_BYTES + 1, LL128_LINE_BYTES)}
        if len(flags) == 1 and 0 < next(iter(flags)) < 1 << 32:
            return "LL128"
    return "Simple"


def protocol_payload_bytes(protocol: str | None, size_bytes: int) -> int | None:
    """Data bytes inside `size_bytes` wire bytes of a buffer of the given NCCL protocol."""
    if protocol is None:
        return None
    num, den = _PROTOCOL_PAYLOAD_FRACTION[protocol]
    return size_bytes * num // den


def task_sizes(size_bytes: int, nsocks: int) -> list[int]:
    """How NCCL cuts a message of `size_bytes` (not sent inline) into data-socket tasks."""
    task = max(MIN_TASK_BYTES, -(-size_bytes // nsocks))
    return [min(task, size_bytes - offset) for offset in range(0, size_bytes, task)]


# -- events ----------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class NetSocketMessage:
    """One message of a net-socket connection, as the reading that fits its sockets best dealt it."""
    seq: int
    size_bytes: int
    ts_first_ns: int
    ts_last_ns: int
    complete: bool
    inline: bool | None          # its payload came on the control socket (2.27+); None when nsocks == 0
    tasks: int                   # data-socket tasks it was cut into
    proto: str | None            # LL, LL128, Simple (line_protocol)
    payload_bytes: int | None    # data bytes inside size_bytes under that protocol
    head_crc32: int | None


@dataclass(frozen=True, slots=True)
class InlineEra:
    """Whether a net-socket connection reads as 2.27+ (`inline`: small payloads on the control socket) or older:
    told only once a small message forked the two readings and one of them fits the sockets better."""
    inline: bool


@dataclass(frozen=True, slots=True)
class _MessageStarted:
    """A control socket announced `message`: its payload follows there, or is to be dealt over the data sockets."""
    message: _Message


@dataclass(frozen=True, slots=True)
class _InlineUndecided:
    """A control socket met a message small enough to travel inline before it is known whether payloads do:
    it reads nothing more until told (`_ControlSocket.assume_inline`)."""
    size_bytes: int
    ts_ns: int


# -- net-socket messages and the striping model -----------------------------------------------------

class _Message:
    __slots__ = ("seq", "size_bytes", "ts_first_ns", "ts_last_ns", "inline", "tasks", "pending_bytes",
                 "missing_bytes", "sample", "head_crc32")

    def __init__(self, seq: int, size_bytes: int, ts_ns: int, inline: bool | None):
        self.seq = seq
        self.size_bytes = size_bytes
        self.ts_first_ns = ts_ns
        self.ts_last_ns = ts_ns
        self.inline = inline
        self.tasks = 0
        self.pending_bytes = size_bytes        # payload bytes not delivered yet (captured or lost)
        self.missing_bytes = 0
        self.sample = bytearray()
        self.head_crc32: int | None = None

    def receive(self, data: memoryview | None, nbytes: int, payload_offset: int, ts_ns: int, lost: bool) -> None:
        """`nbytes` payload bytes at `payload_offset`: in `data`, or lost by the capture, or not kept (None)."""
        self.pending_bytes -= nbytes
        if lost:       # when the capture gave up on them says nothing of when they were sent
            self.missing_bytes += nbytes
            return
        self.ts_last_ns = max(self.ts_last_ns, ts_ns)
        if data is not None and payload_offset == len(self.sample) < SAMPLE_BYTES:
            self.sample += data[:SAMPLE_BYTES - payload_offset]
            if self.head_crc32 is None and len(self.sample) >= min(HEAD_DIGEST_BYTES, self.size_bytes):
                self.head_crc32 = zlib.crc32(self.sample[:HEAD_DIGEST_BYTES])

    def event(self) -> NetSocketMessage:
        proto = line_protocol(bytes(self.sample), self.size_bytes)
        return NetSocketMessage(self.seq, self.size_bytes, self.ts_first_ns, self.ts_last_ns,
                                not self.pending_bytes and not self.missing_bytes, self.inline, self.tasks, proto,
                                protocol_payload_bytes(proto, self.size_bytes), self.head_crc32)


class _ControlSocket:
    """A stream decoder for one reading of a net-socket control socket: an `i32 size` per message, then its
    payload where it travels on the control socket too (nsocks == 0, or inline: 2.27+, at most
    INLINE_MAX_BYTES).

    `inline_max_bytes` is INLINE_MAX_BYTES, 0 (older), or None until a message tells them apart. Events:
    `_MessageStarted`, `_InlineUndecided` (it reads on once `assume_inline` says which era to take), and
    DecodeFailed, after which its bytes are only counted.
    """

    def __init__(self, nsocks: int):
        self.nsocks = nsocks
        self.inline_max_bytes: int | None = 0 if nsocks == 0 else None
        self.offset = 0                           # control-socket bytes read (after the socket's index byte)
        self.announced = 0                        # messages announced so far
        self.header = bytearray()
        self.payload: _Message | None = None      # message whose payload is on the control socket now
        self.failed = False
        self.undecided: tuple[int, int] | None = None    # (size, ts) of the small message it stopped at
        self.rest: tuple[memoryview, int] | None = None  # the bytes after it, with their timestamp
        self._events: collections.deque = collections.deque()

    def receive_data(self, data: bytes | memoryview, ts_ns: int) -> None:
        """Control-socket bytes (never while it waits on `assume_inline`: its reading of them depends on it)."""
        self._read(memoryview(data), ts_ns)

    def receive_gap(self, size: int, ts_ns: int, *, lost: bool = True) -> None:
        """Bytes the capture did not deliver (lost, or cut short: unknown either way)."""
        self.offset += size
        msg = self.payload
        if msg is not None and size <= msg.pending_bytes:
            msg.receive(None, size, msg.size_bytes - msg.pending_bytes, ts_ns, True)
            if not msg.pending_bytes:
                self.payload = None
        elif not self.failed:
            self._fail(self.offset - size, f"the capture lost {size} control-socket bytes across a message "
                                           f"header after message {self.announced}: the sizes after it are unknown")

    def receive_end(self, ts_ns: int) -> None:
        """Nothing to flush: a message cut short by the end stays incomplete."""

    def next_event(self) -> _MessageStarted | _InlineUndecided | DecodeFailed | Sentinel:
        return self._events.popleft() if self._events else NEED_DATA

    def assume_inline(self, inline_max_bytes: int) -> None:
        """Take the era (INLINE_MAX_BYTES or 0) for the small message it stopped at, and read on."""
        self.inline_max_bytes = inline_max_bytes
        size, ts_ns = self.undecided
        self.undecided = None
        self._start(size, ts_ns)
        rest, self.rest = self.rest, None
        self._read(*rest)

    def _read(self, view: memoryview, ts_ns: int) -> None:
        pos, end = 0, len(view)
        while pos < end and not self.failed:
            msg = self.payload
            if msg is not None:
                take = min(end - pos, msg.pending_bytes)
                msg.receive(view[pos:pos + take], take, msg.size_bytes - msg.pending_bytes, ts_ns, False)
                pos += take
                self.offset += take
                if not msg.pending_bytes:
                    self.payload = None
                continue
            take = min(4 - len(self.header), end - pos)
            self.header += view[pos:pos + take]
            pos += take
            self.offset += take
            if len(self.header) < 4:
                break
            size = _I32.unpack(self.header)[0]
            self.header.clear()
            if size < 0:
                self._fail(self.offset - 4, f"control socket announced a negative size ({size}) after message "
                                            f"{self.announced}")
            elif 0 < size <= INLINE_MAX_BYTES and self.inline_max_bytes is None:
                self.undecided, self.rest = (size, ts_ns), (view[pos:], ts_ns)
                self._events.append(_InlineUndecided(size, ts_ns))
                return
            else:
                self._start(size, ts_ns)

    def _start(self, size: int, ts_ns: int) -> None:
        inline = None if self.nsocks == 0 else 0 < size <= (self.inline_max_bytes or 0)
        msg = _Message(self.announced, size, ts_ns, inline)
        self.announced += 1
        if size and (self.nsocks == 0 or inline):
            self.payload = msg
        self._events.append(_MessageStarted(msg))

    def _fail(self, offset: int, reason: str) -> None:
        self.failed = True
        self._events.append(DecodeFailed(offset, reason))


class _DataSocket:
    """A stream decoder for one reading of a net-socket data socket. Data sockets carry no framing: their bytes
    are the tasks the control socket's messages were cut into, in the order they were dealt to this socket
    (`expect`), and land in those messages. It has no events of its own (`next_event` is always NEED_DATA).

    Bytes that come before a task is waiting for them are counted (`early_bytes`) and handed to the next
    tasks dealt (`replay_early`): under a wrong reading they never find one.
    """

    def __init__(self):
        self.queue: collections.deque = collections.deque()   # tasks: [message, bytes left, payload offset]
        self.early_bytes = 0
        self.early_lost = 0          # ... of which the capture lost these
        self.early_ts_ns = 0

    def receive_data(self, data: bytes | memoryview, ts_ns: int) -> None:
        view = memoryview(data)
        self._fill(view, len(view), ts_ns, False)

    def receive_gap(self, size: int, ts_ns: int, *, lost: bool = True) -> None:
        """Bytes the capture did not deliver: their messages miss them (lost or cut short alike)."""
        self._fill(None, size, ts_ns, True)

    def receive_end(self, ts_ns: int) -> None:
        """Nothing to flush: a task cut short leaves its message incomplete."""

    def next_event(self) -> Sentinel:
        return NEED_DATA

    def expect(self, msg: _Message, size_bytes: int, payload_offset: int) -> None:
        self.queue.append([msg, size_bytes, payload_offset])

    def replay_early(self) -> None:
        if self.early_bytes:
            early, lost = self.early_bytes, self.early_lost
            self.early_bytes = self.early_lost = 0
            self._fill(None, lost, self.early_ts_ns, True)
            self._fill(None, early - lost, self.early_ts_ns, False)

    def disagreement_bytes(self) -> int:
        """Bytes on which this socket and the control socket disagree: early ones, and tasks never filled."""
        return self.early_bytes + sum(task[1] for task in self.queue)

    def _fill(self, view: memoryview | None, nbytes: int, ts_ns: int, lost: bool) -> None:
        """`nbytes` bytes: in `view`, or lost by the capture (`lost`), or not kept (None)."""
        queue = self.queue
        pos = 0
        while pos < nbytes and queue:
            task = queue[0]
            take = min(nbytes - pos, task[1])
            task[0].receive(None if view is None else view[pos:pos + take], take, task[2], ts_ns, lost)
            pos += take
            task[1] -= take
            task[2] += take
            if not task[1]:
                queue.popleft()
        if pos < nbytes:
            self.early_bytes += nbytes - pos
            self.early_lost += (nbytes - pos) if lost else 0
            self.early_ts_ns = ts_ns


class _Transfer:
    """One reading (hypothesis) of how a net-socket connection's control and data sockets carry its messages:
    a `_ControlSocket` and its `_DataSocket`s, and the striping that deals each announced message's tasks
    round-robin over the data sockets."""

    def __init__(self, nsocks: int):
        self.nsocks = nsocks
        self.control = _ControlSocket(nsocks)
        self.data = [_DataSocket() for _ in range(nsocks)]
        self.messages: list[_Message] = []
        self.next_sock = 0
        self.failure: DecodeFailed | None = None

    def receive_control(self, view: memoryview | None, nbytes: int, ts_ns: int) -> _InlineUndecided | None:
        """Control-socket bytes (None: lost); the small message it stopped at if the era is undecided."""
        if view is None:
            self.control.receive_gap(nbytes, ts_ns)
        else:
            self.control.receive_data(view, ts_ns)
        return self._take_control_events()

    def assume_inline(self, inline_max_bytes: int) -> None:
        self.control.assume_inline(inline_max_bytes)
        self._take_control_events()

    def fork(self) -> _Transfer:
        """A copy to follow the other era from the undecided message on (the bytes after it are shared)."""
        rest = self.control.rest
        return copy.deepcopy(self, {id(rest[0]): rest[0]})

    def _take_control_events(self) -> _InlineUndecided | None:
        while (event := self.control.next_event()) is not NEED_DATA:
            if event.__class__ is _MessageStarted:
                self._deal(event.message)
            elif event.__class__ is DecodeFailed:
                self.failure = event
            else:
                return event
        return None

    def _deal(self, msg: _Message) -> None:
        self.messages.append(msg)
        if not msg.size_bytes or self.nsocks == 0 or msg.inline:
            return
        offset = 0
        for task in task_sizes(msg.size_bytes, self.nsocks):
            self.data[self.next_sock].expect(msg, task, offset)
            offset += task
            msg.tasks += 1
            self.next_sock = (self.next_sock + 1) % self.nsocks
        for sock in self.data:
            sock.replay_early()

    def disagreement_bytes(self) -> int:
        """Bytes on which the control and data sockets disagree under this reading (huge if it failed)."""
        return sum(sock.disagreement_bytes() for sock in self.data) + (1 << 62 if self.failure else 0)


class _NetSocketConnection:
    """The sockets one net-socket sendComm opened to one listener: it couples the control socket and the data
    sockets of each reading (routing each socket's bytes to its decoder in every reading, forking the reading
    where a small message leaves the era open) and, once the capture is over (`end`), hands back the messages
    of the reading that fits best as events: `NetSocketMessage`, `InlineEra`, DecodeFailed."""

    def __init__(self, handshake: bool, sender: str, receiver: str):
        self.handshake = handshake
        self.sender, self.receiver = sender, receiver      # IP addresses
        self.members: dict[int, int] = {}      # socket index -> stream id
        self.nsocks: int | None = None         # known once sealed: the control socket's index
        self.models: list[_Transfer] = []
        self._events: collections.deque = collections.deque()

    def seal(self, nsocks: int) -> None:
        self.nsocks = nsocks
        self.models = [_Transfer(nsocks)]

    def receive_socket(self, index: int, view: memoryview | None, nbytes: int, ts_ns: int) -> None:
        """`nbytes` bytes of socket `index` (None: lost) for every reading."""
        if index == self.nsocks:
            for model in list(self.models):
                undecided = model.receive_control(view, nbytes, ts_ns)
                if undecided is not None:
                    twin = model.fork()
                    self.models.append(twin)
                    model.assume_inline(INLINE_MAX_BYTES)
                    twin.assume_inline(0)
        elif index < self.nsocks:
            for model in self.models:
                sock = model.data[index]
                if view is None:
                    sock.receive_gap(nbytes, ts_ns)
                else:
                    sock.receive_data(view, ts_ns)

    def end_socket(self, index: int, ts_ns: int) -> None:
        for model in self.models:
            (model.control if index == self.nsocks else model.data[index]).receive_end(ts_ns)

    def end(self) -> None:
        """No more bytes (the capture is over): the best reading's outcome becomes the events."""
        if not self.models:
            return
        model = min(self.models, key=_Transfer.disagreement_bytes)
        if len(self.models) > 1 and model.disagreement_bytes() < min(
                m.disagreement_bytes() for m in self.models if m is not model):
            self._events.append(InlineEra(model.control.inline_max_bytes == INLINE_MAX_BYTES))
        if model.failure is not None:
            self._events.append(model.failure)
        self._events.extend(msg.event() for msg in model.messages)

    def next_event(self) -> NetSocketMessage | InlineEra | DecodeFailed | Sentinel:
        return self._events.popleft() if self._events else NEED_DATA


# -- the capture-level decoder ---------------------------------------------------------------------------

_NET, _BOOT, _LABEL = "net_socket", "bootstrap", "label"
_LABEL_PROTOCOLS = {TYPE_PROXY: "nccl_proxy", TYPE_RAS: "nccl_ras"}    # connections only named, not decoded


@dataclass(slots=True)
class _Stream:
    kind: str
    protocol: str
    socket_type: str | None
    magic: int | None
    skip: int                                   # handshake bytes still to pass over
    key: tuple = ()                             # the TCP direction (src ip, src port, dst ip, dst port)
    connection: _NetSocketConnection | None = None
    index: int | None = None
    bootstrap: BootstrapStream | None = None
    payload_bytes: int = 0                      # bytes delivered (a label direction: did it speak?)
    ended: bool = False
    decoded: _Decoded | None = None             # a bootstrap direction's events


@dataclass(slots=True)
class _Decoded:
    """The events of a bootstrap stream decoder or of a net-socket connection, gathered for the rows."""
    messages: list = field(default_factory=list)       # BootstrapMessage or NetSocketMessage
    failure: DecodeFailed | None = None
    peer: BootstrapPeer | None = None
    inline_era: bool | None = None

    def take(self, decoder) -> None:
        """The decoder's events until NEED_DATA."""
        while (event := decoder.next_event()) is not NEED_DATA:
            cls = event.__class__
            if cls is BootstrapMessage or cls is NetSocketMessage:
                self.messages.append(event)
            elif cls is DecodeFailed:
                self.failure = event
            elif cls is BootstrapPeer:
                self.peer = event
            elif cls is InlineEra:
                self.inline_era = event.inline

    @property
    def decode_error(self) -> str | None:
        return None if self.failure is None else self.failure.reason


class NcclSocketCaptureDecoder(ProtocolDecoderBase):
    """NCCL's TCP connections in one capture: net-socket transfers, bootstrap messages, proxy / RAS labels.

    A protocol decoder (decoders.protocols.base). Each bootstrap direction is read by a `BootstrapStream`,
    each net-socket connection by a `_NetSocketConnection` over its sockets' stream decoders; their events
    become the rows at the end of the capture. Connections claimed on pre-2.16 structure alone (no handshake)
    are reported only if the rest of the capture bears them out (`_unproven`).
    """

    name = "nccl_socket"

    def __init__(self):
        super().__init__()
        self._spoke: set[tuple] = set()                              # TCP directions seen carrying bytes
        self._streams: dict[int, _Stream] = {}
        self._labels: dict[tuple, str] = {}                          # claimed TCP key -> protocol
        self._known_magics = {NCCL_SOCKET_MAGIC, NCCL_COMM_ID_MAGIC}
        self._connections: dict[tuple, _NetSocketConnection] = {}    # (src ip, dst ip, dst port) -> latest
        self._legacy_candidates: dict[tuple, dict[int, int]] = {}    # pre-2.16: index -> stream id, by listener
        self._all_connections: list[_NetSocketConnection] = []
        self._decoded: dict[_NetSocketConnection, _Decoded] = {}     # each connection's events, at the end

    # -- claiming ------------------------------------------------------------------------------------
    def claim(self, direction: TcpDirection, prefix: bytes) -> bool | None:
        stream_id, key, syn_seen = direction.stream_id, direction.key, direction.syn_seen
        src, sport, dst, dport = key
        if prefix:
            self._spoke.add(key)
        reverse = self._labels.get((dst, dport, src, sport))
        if reverse is not None:           # the other direction of a connection already claimed
            self._streams[stream_id] = _Stream(_LABEL, reverse, None, None, 0, key)
            return True
        if not prefix:
            return None
        verdict = self._claim_handshake(stream_id, key, prefix) if len(prefix) >= HANDSHAKE_BYTES else False
        if verdict is False:
            verdict = self._claim_legacy(stream_id, key, syn_seen, prefix)
            if verdict is False and len(prefix) < HANDSHAKE_BYTES:
                verdict = None            # the handshake may still be coming (magic and type are two writes)
        if verdict:
            self._labels[key] = self._streams[stream_id].protocol
            self._streams[stream_id].key = key
        return verdict

    def claim_fallback(self, direction: TcpDirection, prefix: bytes, seen_data: bool) -> bool:
        if seen_data:          # nobody's: still, its bytes tell that a connection was not one-way
            self._spoke.add(direction.key)
        return False

    def _claim_handshake(self, stream_id: int, key: tuple, prefix: bytes) -> bool | None:
        magic, socket_type = HANDSHAKE.unpack_from(prefix)
        if socket_type == TYPE_NET_SOCKET:
            if magic != NCCL_SOCKET_MAGIC:      # (an NCCL_SOCKET_MAGIC set in the environment, 2.30+, is not known)
                return False
            if len(prefix) <= HANDSHAKE_BYTES:
                return None
            index = prefix[HANDSHAKE_BYTES]
            if index > MAX_SOCKETS:
                return False
            listener = (key[0], key[2], key[3])
            conn = self._connections.get(listener)
            if conn is None or conn.nsocks is not None or index in conn.members or not conn.handshake:
                conn = self._new_connection(listener, handshake=True)
            conn.members[index] = stream_id
            self._known_magics.add(magic)
            self._streams[stream_id] = _Stream(_NET, "nccl_socket", "net_socket", magic, HANDSHAKE_BYTES + 1,
                                               connection=conn, index=index)
            return True
        if socket_type == TYPE_BOOTSTRAP:
            if len(prefix) < HANDSHAKE_BYTES + 4:
                return None
            if not 0 <= _I32.unpack_from(prefix, HANDSHAKE_BYTES)[0] <= MAX_BOOTSTRAP_BYTES:
                return False
            self._known_magics.add(magic)
            self._streams[stream_id] = _Stream(_BOOT, "nccl_bootstrap", "bootstrap", magic, HANDSHAKE_BYTES,
                                               bootstrap=BootstrapStream(), decoded=_Decoded())
            return True
        if socket_type in _LABEL_PROTOCOLS and magic in self._known_magics:
            self._streams[stream_id] = _Stream(_LABEL, _LABEL_PROTOCOLS[socket_type], SOCKET_TYPES[socket_type],
                                               magic, HANDSHAKE_BYTES)
            return True
        return False

    def _claim_legacy(self, stream_id: int, key: tuple, syn_seen: bool, prefix: bytes) -> bool | None:
        """Before 2.16 nothing announces NCCL: recognise its connections by their structure (from the SYN on).

        A point-to-point bootstrap connection starts `[4][rank] [4][tag] [size]`. Net-socket sockets start
        with their index byte; a control socket is accepted once the sockets 0..index-1 opened just before it
        to the same listener are known and none after it, and the sizes in its first bytes are plausible
        (at most MAX_LEGACY_MESSAGE_BYTES). Data sockets join when offered again after their control
        socket was accepted.
        """
        if not syn_seen:
            return False
        index = prefix[0]
        listener = (key[0], key[2], key[3])
        candidates = self._legacy_candidates.setdefault(listener, {})
        if index <= MAX_SOCKETS:
            candidates.setdefault(index, stream_id)
        if prefix[:4] == _LEGACY_RANK_HEADER[:len(prefix)]:      # bootstrapSend: [4][rank] [4][tag] [size]
            if len(prefix) < 20:
                return None
            rank, size = _I32.unpack_from(prefix, 4)[0], _I32.unpack_from(prefix, 16)[0]
            if prefix[8:12] == _LEGACY_RANK_HEADER and 0 <= rank < MAX_RANK and 0 <= size <= MAX_BOOTSTRAP_BYTES:
                self._streams[stream_id] = _Stream(_BOOT, "nccl_bootstrap", None, None, 0,
                                                   bootstrap=BootstrapStream(), decoded=_Decoded())
                return True
        if index > MAX_SOCKETS:
            return False
        conn = self._connections.get(listener)
        if (conn is not None and not conn.handshake and conn.nsocks is not None and index < conn.nsocks
                and conn.members.get(index) in (None, stream_id)):
            return self._join_legacy(stream_id, conn, index)
        if (candidates.get(index) != stream_id or max(candidates) != index
                or any(i not in candidates for i in range(index))):
            return False
        if len(prefix) < 5:
            return None
        if not _looks_like_control(prefix, index):
            return False
        conn = self._new_connection(listener, handshake=False)
        conn.seal(index)
        del self._legacy_candidates[listener]
        return self._join_legacy(stream_id, conn, index)

    def _join_legacy(self, stream_id: int, conn: _NetSocketConnection, index: int) -> bool:
        conn.members[index] = stream_id
        self._streams[stream_id] = _Stream(_NET, "nccl_socket", None, None, 1, connection=conn, index=index)
        return True

    def _new_connection(self, listener: tuple, handshake: bool) -> _NetSocketConnection:
        conn = _NetSocketConnection(handshake, ip_to_str(listener[0]), ip_to_str(listener[1]))
        self._connections[listener] = conn
        self._all_connections.append(conn)
        return conn

    # -- stream events -------------------------------------------------------------------------------
    def receive_data(self, stream_id: int, data: memoryview, ts_ns: int) -> None:
        self._deliver(stream_id, data, len(data), ts_ns)

    def receive_gap(self, stream_id: int, size: int, ts_ns: int, lost: bool) -> None:
        self._deliver(stream_id, None, size, ts_ns)

    def receive_end(self, stream_id: int, ts_ns: int) -> None:
        st = self._streams[stream_id]
        st.ended = True
        if st.kind == _BOOT:
            st.bootstrap.receive_end(ts_ns)
            st.decoded.take(st.bootstrap)
        elif st.kind == _NET and st.connection.nsocks is not None and st.index <= st.connection.nsocks:
            st.connection.end_socket(st.index, ts_ns)

    def _deliver(self, stream_id: int, view: memoryview | None, nbytes: int, ts_ns: int) -> None:
        st = self._streams[stream_id]
        if st.skip:
            skipped = min(st.skip, nbytes)
            st.skip -= skipped
            nbytes -= skipped
            if view is not None:
                view = view[skipped:]
        st.payload_bytes += nbytes
        if not nbytes or st.kind == _LABEL:
            return
        if st.kind == _BOOT:
            if view is None:
                st.bootstrap.receive_gap(nbytes, ts_ns)
            else:
                st.bootstrap.receive_data(view, ts_ns)
            st.decoded.take(st.bootstrap)
            return
        conn = st.connection
        if conn.nsocks is None:        # the first payload byte: every socket of the connection has connected
            conn.seal(max(conn.members))
        conn.receive_socket(st.index, view, nbytes, ts_ns)

    # -- results -------------------------------------------------------------------------------------
    def end_of_capture(self) -> None:
        for st in self._streams.values():
            if st.kind == _BOOT and not st.ended:      # (the capture decoder ends every direction first)
                st.bootstrap.receive_end(0)
                st.decoded.take(st.bootstrap)
        for conn in self._all_connections:
            conn.end()
            self._decoded[conn] = decoded = _Decoded()
            decoded.take(conn)
        unproven = self._unproven()
        self._emit_rows(self._rows(unproven))
        self._emit(Count("nccl_unproven_streams", len(unproven)))

    def _unproven(self) -> set[int]:
        """Directions claimed on evidence the rest of the capture does not bear out; they stay plain TCP.

        NCCL's net-socket and bootstrap connections carry bytes one way only (the receiver never writes on
        them): a request/response exchange (a verbs program's QP exchange, a benchmark's set-up, a Gloo pair)
        is not one. A bootstrap handshake's magic is the communicator's, random: it is taken for NCCL when
        it opens two connections or more (the root's, the ring's, point-to-point ones), or is
        NCCL_COMM_ID_MAGIC; proxy and RAS connections need such a magic. Before 2.16 nothing names NCCL: a
        net-socket control socket must carry whole messages, each its size then its bytes (at least
        LEGACY_MIN_MESSAGES of them, not empty, before a last one the capture may have cut: a stream of zero
        bytes reads as empty messages), a bootstrapSend connection one whole message."""
        spoke = self._spoke | {st.key for st in self._streams.values() if st.kind == _LABEL and st.payload_bytes}

        def one_way(stream_ids) -> bool:
            return all((k := self._streams[sid].key) and (k[2], k[3], k[0], k[1]) not in spoke for sid in stream_ids)

        unproven: set[int] = set()
        for conn in self._all_connections:
            decoded = self._decoded[conn]
            whole = sum(1 for m in decoded.messages if m.complete and m.size_bytes)
            if not one_way(conn.members.values()) or not conn.handshake and not (
                    decoded.failure is None and whole >= LEGACY_MIN_MESSAGES):
                unproven.update(conn.members.values())
        opened: dict[int, set] = collections.defaultdict(set)          # magic -> connections it opened
        for stream_id, st in self._streams.items():
            if st.kind == _BOOT and st.magic is not None and one_way([stream_id]) and st.decoded.failure is None:
                opened[st.magic].add(frozenset(((st.key[0], st.key[1]), (st.key[2], st.key[3]))))
        magics = {NCCL_COMM_ID_MAGIC} | {magic for magic, connections in opened.items() if len(connections) >= 2}
        for stream_id, st in self._streams.items():
            if st.kind == _BOOT and st.magic is None:
                decoded = st.decoded
                proven = one_way([stream_id]) and decoded.failure is None and (
                    decoded.peer is not None or decoded.messages) and all(m.complete for m in decoded.messages)
            elif st.kind == _BOOT:
                proven = one_way([stream_id]) and st.decoded.failure is None and st.magic in magics
            else:
                proven = st.kind != _LABEL or st.magic is None or st.magic in magics
            if not proven:
                unproven.add(stream_id)
        keys = {self._streams[sid].key for sid in unproven}
        unproven.update(sid for sid, st in self._streams.items()
                        if st.kind == _LABEL and (st.key[2], st.key[3], st.key[0], st.key[1]) in keys)
        return unproven

    def _rows(self, unproven: set[int]) -> CaptureRows:
        messages: list[dict] = []
        streams: dict[int, dict] = {}
        for stream_id, st in self._streams.items():
            if stream_id in unproven:
                continue
            streams[stream_id] = {"protocol": st.protocol, "nccl_socket_type": st.socket_type,
                                  "nccl_magic": None if st.magic is None else f"{st.magic:#018x}"}
            if st.kind == _BOOT:
                peer = st.decoded.peer
                rank, tag = (None, None) if peer is None else (peer.rank, peer.tag)
                streams[stream_id]["decode_error"] = st.decoded.decode_error
                messages.extend({"protocol": "nccl_bootstrap", "stream_id": stream_id,
                                 "ts_first_ns": m.ts_first_ns, "ts_last_ns": m.ts_last_ns,
                                 "size_bytes": m.size_bytes, "complete": m.complete,
                                 "peer_rank": rank, "tag": tag} for m in st.decoded.messages)
        for conn in self._all_connections:
            if unproven.issuperset(conn.members.values()):
                continue
            decoded = self._decoded[conn]
            control_stream = conn.members.get(conn.nsocks)
            for index, stream_id in conn.members.items():
                if stream_id in streams:
                    streams[stream_id].update({
                        "nccl_socket_index": index, "nccl_nsocks": conn.nsocks,
                        "nccl_control_stream_id": control_stream, "nccl_inline": decoded.inline_era,
                        "decode_error": decoded.decode_error if index == conn.nsocks else None})
            if control_stream is None:
                continue
            messages.extend({"protocol": "nccl_socket", "stream_id": control_stream,
                             "ts_first_ns": m.ts_first_ns, "ts_last_ns": m.ts_last_ns, "size_bytes": m.size_bytes,
                             "complete": m.complete, "nccl_seq": m.seq, "nccl_inline": m.inline,
                             "nccl_tasks": m.tasks, "nccl_proto": m.proto, "payload_bytes": m.payload_bytes,
                             "head_crc32": m.head_crc32} for m in decoded.messages)
        return CaptureRows(messages=messages, streams=streams)


def _looks_like_control(prefix: bytes, nsocks: int) -> bool:
    """A pre-2.16 control socket after its index byte: plausible i32 sizes, each followed by its payload when
    nsocks == 0."""
    pos = 1
    while pos + 4 <= len(prefix):
        size = _I32.unpack_from(prefix, pos)[0]
        if not 0 <= size <= MAX_LEGACY_MESSAGE_BYTES:
            return False
        pos += 4 + (size if nsocks == 0 else 0)
    return True
