"""Gloo's TCP transport (PyTorch's CPU collectives), decoded sans-IO: one direction of a pair connection, and the
rank record of the rendezvous. The capture-level decoder that stands on it is decoders.protocols.gloo.

Wire format (gloo/transport/tcp: pair.h, pair.cc, device.cc; checked on captures of torch 2.13 jobs):
- A pair of ranks shares one TCP connection per process group. The side whose listening address
  compares greater (IP bytes, then port) connects and first writes an 8-byte `ssize_t` sequence number:
  the pair identifier the listening side published for the connecting rank. Nothing else is a handshake.
- Then, both ways, messages: a 48-byte preamble of six native (little-endian) u64 — nbytes (preamble +
  payload), opcode, slot, offset, length, roffset — and `nbytes - 48` payload bytes. Opcodes:
  0 SEND_BUFFER (payload; offset/roffset address a registered buffer), 1 SEND_UNBOUND_BUFFER (payload),
  2 NOTIFY_SEND_READY and 3 NOTIFY_RECV_READY (no payload; length = the bytes announced).
- slot = (prefix << 56) | (tag << 24) | delta, the prefix naming the collective (gloo/types.h) and the tag
  being PyTorch's per-process-group collective counter: slot -> (collective, sequence number). Send/recv
  use the caller's tag itself as the slot (prefix 0).
- The rendezvous goes through PyTorch's TCPStore (decoders.protocols.tcpstore.decoder): each rank sets the key
  "<group prefix>/<rank>" to its Rank record (`parse_rank_record`): host name, listening sockaddr, and one
  pair identifier per peer rank. That maps listening addresses and connect sequence numbers to ranks.

`GlooStreamDecoder` reads one direction, a `decoders.sansio.StreamDecoder`: bytes, gaps and the end in, events
out (`next_event`: `PairConnect`, `GlooMessage`, `Resync`, then NEED_DATA).
Payloads are counted, never copied. Bytes the capture lost inside a payload only make that message
incomplete; lost bytes that hit a preamble make the decoder scan forward for the next plausible preamble.
"""
from __future__ import annotations

import enum
import re
import struct
from collections import deque
from dataclasses import dataclass

from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.sansio import NEED_DATA, Resync, Sentinel

PREAMBLE = struct.Struct("<6Q")          # nbytes opcode slot offset length roffset
PREAMBLE_BYTES = PREAMBLE.size
CONNECT_SEQUENCE = struct.Struct("<q")   # ssize_t written by the connecting side
# Sanity bounds for what a preamble may announce (no tensor on a CPU host comes near 2^48 bytes).
MAX_MESSAGE_BYTES = 1 << 48
MAX_SEQUENCE_NUMBER = 1 << 31


class Opcode(enum.IntEnum):
    SEND_BUFFER = 0
    SEND_UNBOUND_BUFFER = 1
    NOTIFY_SEND_READY = 2
    NOTIFY_RECV_READY = 3


_PAYLOAD_OPCODES = frozenset((Opcode.SEND_BUFFER, Opcode.SEND_UNBOUND_BUFFER))
# gloo/types.h slot prefixes -> collective kind, named as in the collectives contract.
SLOT_PREFIX_KINDS = {1: "gather", 2: "all_gather", 3: "reduce", 4: "all_reduce", 5: "scatter", 6: "broadcast",
                     7: "barrier", 8: "all_to_all"}
P2P = "p2p"                              # prefix 0: a send/recv whose slot is the caller's tag
_TAG_SHIFT = 24
_TAG_MASK = 0xFFFF_FFFF
_DELTA_MASK = 0xFF                       # gloo's Slot::operator+ refuses deltas above 0xff
_PREFIX_SHIFT = 56


@dataclass(frozen=True, slots=True)
class Slot:
    kind: str                            # collective kind, or P2P
    tag: int                             # collective sequence number; for P2P the whole slot (user tag)
    delta: int                           # the collective's sub-slot (0 for PyTorch's algorithms)


def parse_slot(slot: int) -> Slot:
    prefix = slot >> _PREFIX_SHIFT
    if prefix == 0:
        return Slot(P2P, slot, 0)
    kind = SLOT_PREFIX_KINDS.get(prefix)
    if kind is None or (slot >> 8) & 0xFFFF:
        raise DecodeError(f"slot {slot:#018x} has no Gloo collective prefix")
    return Slot(kind, (slot >> _TAG_SHIFT) & _TAG_MASK, slot & _DELTA_MASK)


@dataclass(frozen=True, slots=True)
class Preamble:
    nbytes: int                          # whole message: preamble + payload
    opcode: Opcode
    slot: int
    offset: int
    length: int                          # payload bytes, or the bytes a NOTIFY announces
    roffset: int

    @property
    def payload_bytes(self) -> int:
        return self.nbytes - PREAMBLE_BYTES


def parse_preamble(data: bytes | memoryview, offset: int = 0) -> Preamble:
    """The preamble at `offset`; DecodeError if there is none (fewer than 48 bytes, or fields no sender
    would write)."""
    try:
        nbytes, opcode, slot, buffer_offset, length, roffset = PREAMBLE.unpack_from(data, offset)
    except struct.error:
        raise DecodeError(f"{len(data) - offset} bytes, a preamble has 48") from None
    if opcode > Opcode.NOTIFY_RECV_READY:
        raise DecodeError(f"opcode {opcode} is not a Gloo opcode")
    if length >= MAX_MESSAGE_BYTES:
        raise DecodeError(f"length {length} is beyond any tensor")
    if opcode in _PAYLOAD_OPCODES:
        if nbytes != PREAMBLE_BYTES + length:
            raise DecodeError(f"nbytes {nbytes} != 48 + length {length}")
    elif nbytes != PREAMBLE_BYTES:
        raise DecodeError(f"a notification of {nbytes} bytes (always 48)")
    if opcode != Opcode.SEND_BUFFER and (buffer_offset or roffset):
        raise DecodeError(f"offset {buffer_offset} / roffset {roffset} set outside SEND_BUFFER")
    parse_slot(slot)
    return Preamble(nbytes, Opcode(opcode), slot, buffer_offset, length, roffset)


# What a preamble looks like to a scanner, before parse_preamble decides: nbytes >= 48 and < 2^48, an
# opcode 0..3, a slot prefix 0..8, a length < 2^48. Zero-filled payloads never match (nbytes would be 0).
# A lookahead, so that a candidate that parse_preamble refuses does not hide one overlapping it.
_PREAMBLE_CANDIDATE = re.compile(
    rb"(?=(?=[\x30-\xff]|.{1,5}[^\x00]).{6}\x00\x00"
    rb"[\x00-\x03]\x00{7}"
    rb".{7}[\x00-\x08]"
    rb".{8}"
    rb".{6}\x00\x00"
    rb".{8})",
    re.DOTALL)


# -- events -----------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PairConnect:
    """The connecting side's first 8 bytes: the pair identifier the listening side gave this pair."""
    sequence_number: int
    ts_ns: int


@dataclass(frozen=True, slots=True)
class GlooMessage:
    offset: int                          # stream offset of the preamble
    ts_first_ns: int
    ts_last_ns: int
    preamble: Preamble
    missing_bytes: int                   # payload bytes the capture lost
    complete: bool                       # every byte captured (False also when the stream ended inside it)


GlooEvent = PairConnect | GlooMessage | Resync


class _State(enum.Enum):
    SEQUENCE = "sequence"
    PREAMBLE = "preamble"
    PAYLOAD = "payload"
    RESYNC = "resync"


class GlooStreamDecoder:
    """One direction of one Gloo pair connection.

    `initiator`: this direction belongs to the connecting side (it starts with the sequence number).
    `midstream`: the capture did not see the stream's start; decoding begins by scanning for a preamble.
    Public counters: `offset` (stream bytes received, captured or lost), `lost_bytes` (bytes that could
    not be decoded), `resyncs`, `messages`, `last_resync_reason`.
    """

    def __init__(self, *, initiator: bool, midstream: bool = False):
        self.offset = 0
        self.lost_bytes = 0
        self.resyncs = 0
        self.messages = 0
        self.last_resync_reason: str | None = None
        # Bytes already counted in `offset` but not decoded yet: a preamble or sequence number split
        # across chunks, or (RESYNC) the last bytes scanned, where a preamble may start.
        self._header = bytearray()
        self._scan_tail = b""
        self._unsynced_bytes = 0             # RESYNC: bytes given up on since sync was lost
        self._unsynced_reason = ""
        self._preamble: Preamble | None = None
        self._message_offset = 0
        self._message_ts_ns = 0
        self._remaining = 0                  # payload bytes of the current message still to come
        self._missing = 0                    # payload bytes of the current message the capture lost
        self._state = _State.SEQUENCE if initiator else _State.PREAMBLE
        self._events: deque[GlooEvent] = deque()
        if midstream:
            self._lose_sync("capture started mid-connection", 0)

    # -- input ------------------------------------------------------------------------------------
    def receive_data(self, data: bytes | memoryview, ts_ns: int) -> None:
        events = self._events
        view = data if data.__class__ is memoryview else memoryview(data)
        pos, end = 0, len(view)
        while pos < end:
            state = self._state
            if state is _State.PAYLOAD:
                step = min(self._remaining, end - pos)
                self._remaining -= step
                self.offset += step
                pos += step
                if not self._remaining:
                    events.append(self._message_done(ts_ns))
            elif state is _State.PREAMBLE:
                pos = self._read_preamble(view, pos, ts_ns, events)
            elif state is _State.SEQUENCE:
                pos = self._read_sequence(view, pos, ts_ns, events)
            else:
                pos = self._scan(view, pos, ts_ns, events)

    def receive_gap(self, size: int, ts_ns: int, *, lost: bool = True) -> None:
        """`size` stream bytes not in the capture. Payload bytes cut by the snaplen (lost False) count as missing
        as lost ones do: a message's `missing_bytes` are the payload bytes the capture does not hold."""
        events = self._events
        self.offset += size
        if self._state is _State.PAYLOAD:
            covered = min(size, self._remaining)
            self._remaining -= covered
            self._missing += covered
            size -= covered
            if not self._remaining:
                events.append(self._message_done(ts_ns))
        if size:
            self._lose_sync(f"{size} bytes lost where a header was due", size)

    def receive_end(self, ts_ns: int) -> None:
        """The stream ended: a message cut short is reported incomplete, undecoded bytes as lost."""
        if self._state is _State.PAYLOAD:
            self._missing += self._remaining
            self._remaining = 0
            self._events.append(self._message_done(ts_ns))
            return
        self.lost_bytes += len(self._header) + len(self._scan_tail) + self._unsynced_bytes
        self._header.clear()
        self._scan_tail = b""
        self._unsynced_bytes = 0

    def next_event(self) -> GlooEvent | Sentinel:
        return self._events.popleft() if self._events else NEED_DATA

    def skippable_bytes(self) -> int:
        """How many of the stream's next bytes `skip` may account for unseen: the rest of a message's payload
        (never kept) but its last byte, which ends the message."""
        return self._remaining - 1 if self._state is _State.PAYLOAD and self._remaining > 1 else 0

    def skip(self, size: int, ts_ns: int, cut: int) -> None:
        """Account for `size` payload bytes (at most skippable_bytes()), `cut` of them cut by the snaplen, exactly
        as receive_data of the captured ones and receive_gap(lost=False) of the cut ones would."""
        self._remaining -= size
        self.offset += size
        self._missing += cut

    # -- states -----------------------------------------------------------------------------------
    def _read_sequence(self, view: memoryview, pos: int, ts_ns: int, events: deque) -> int:
        taken = min(CONNECT_SEQUENCE.size - len(self._header), len(view) - pos)
        self._header += view[pos:pos + taken]
        self.offset += taken
        if len(self._header) == CONNECT_SEQUENCE.size:
            header = bytes(self._header)
            self._header.clear()
            sequence_number = CONNECT_SEQUENCE.unpack(header)[0]
            if 0 <= sequence_number < MAX_SEQUENCE_NUMBER:
                events.append(PairConnect(sequence_number, ts_ns))
                self._state = _State.PREAMBLE
            else:     # not a connecting side after all: these bytes may begin a preamble
                self._lose_sync(f"connect sequence number {sequence_number} out of range", 0, header)
        return pos + taken

    def _read_preamble(self, view: memoryview, pos: int, ts_ns: int, events: deque) -> int:
        if not self._header:
            self._message_ts_ns = ts_ns
            if len(view) - pos >= PREAMBLE_BYTES:     # the common case: the whole preamble in this chunk
                self.offset += PREAMBLE_BYTES
                self._start_message(view[pos:pos + PREAMBLE_BYTES], ts_ns, events)
                return pos + PREAMBLE_BYTES
        taken = min(PREAMBLE_BYTES - len(self._header), len(view) - pos)
        self._header += view[pos:pos + taken]
        self.offset += taken
        if len(self._header) == PREAMBLE_BYTES:
            header = bytes(self._header)
            self._header.clear()
            self._start_message(header, ts_ns, events)
        return pos + taken

    def _start_message(self, header: bytes | memoryview, ts_ns: int, events: deque) -> None:
        """A preamble's 48 bytes, just counted in `offset`."""
        try:
            preamble = parse_preamble(header)
        except DecodeError as exc:
            # Scan again from the byte after the one that failed to start a preamble.
            self._lose_sync(str(exc), 1, bytes(header[1:]))
            return
        self._preamble = preamble
        self._message_offset = self.offset - PREAMBLE_BYTES
        self._remaining = preamble.payload_bytes
        self._missing = 0
        if self._remaining:
            self._state = _State.PAYLOAD
        else:
            events.append(self._message_done(ts_ns))

    def _message_done(self, ts_ns: int) -> GlooMessage:
        self._state = _State.PREAMBLE
        self.messages += 1
        return GlooMessage(self._message_offset, self._message_ts_ns, ts_ns, self._preamble, self._missing,
                           not self._missing)

    # -- resynchronisation ------------------------------------------------------------------------
    def _lose_sync(self, reason: str, lost_bytes: int, scan_from: bytes = b"") -> None:
        """Stop decoding: `lost_bytes` more bytes are given up on; scanning resumes with `scan_from`, the
        last bytes counted in `offset`."""
        if self._state is not _State.RESYNC:
            self._unsynced_reason = reason
        # Bytes held for decoding or scanning no longer continue into what follows.
        self._unsynced_bytes += lost_bytes + len(self._header) + len(self._scan_tail)
        self._header.clear()
        self._scan_tail = scan_from
        self._state = _State.RESYNC

    def _scan(self, view: memoryview, pos: int, ts_ns: int, events: deque) -> int:
        """Look for a preamble in the held bytes followed by view[pos:]."""
        tail = self._scan_tail
        window = tail + bytes(view[pos:])
        window_offset = self.offset - len(tail)
        for candidate in _PREAMBLE_CANDIDATE.finditer(window):
            start = candidate.start()
            try:
                parse_preamble(window, start)
            except DecodeError:
                continue
            lost = self._unsynced_bytes + start
            self.lost_bytes += lost
            self.resyncs += 1
            self.last_resync_reason = self._unsynced_reason
            events.append(Resync(window_offset + start, lost, ts_ns, self._unsynced_reason))
            self._unsynced_bytes = 0
            self._scan_tail = b""
            self._state = _State.PREAMBLE
            self._message_ts_ns = ts_ns
            consumed = start + PREAMBLE_BYTES - len(tail)    # > 0: the tail is shorter than a preamble
            self.offset += consumed
            self._start_message(window[start:start + PREAMBLE_BYTES], ts_ns, events)
            return pos + consumed
        keep = min(len(window), PREAMBLE_BYTES - 1)
        self._unsynced_bytes += len(window) - keep
        self._scan_tail = window[len(window) - keep:]
        self.offset += len(view) - pos
        return len(view)


# -- the rendezvous record ---------------------------------------------------------------------------

_SIZE = struct.Struct("<Q")
_SOCKADDR_FAMILY = struct.Struct("<H")       # sa_family_t, native order
_SOCKADDR_PORT = struct.Struct(">H")         # sin_port / sin6_port, network order
_AF_INET = 2
_AF_INET6 = 10
_SOCKADDR_IN6_ADDRESS_OFFSET = 8             # after family, port, flowinfo
MAX_HOSTNAME_BYTES = 255
MAX_RANKS = 1 << 20


@dataclass(frozen=True, slots=True)
class RankRecord:
    """What a rank publishes in the store for its peers (gloo/transport/tcp/context.cc `Rank`)."""
    hostname: str
    ip: bytes                                # packed address of the rank's listening socket
    port: int
    pair_ids: tuple[int, ...]                # per peer rank: the sequence number that peer sends when it
    #                                          connects; empty when ranks are used as sequence numbers


def parse_rank_record(value: bytes | memoryview) -> RankRecord:
    """`u64 len, host name, u64 len, Address bytes (sockaddr_storage + seq), ssize_t pair id per rank`."""
    try:
        hostname_bytes = _SIZE.unpack_from(value, 0)[0]
        if hostname_bytes > MAX_HOSTNAME_BYTES:
            raise DecodeError(f"host name of {hostname_bytes} bytes")
        address_at = _SIZE.size + hostname_bytes
        address_bytes = _SIZE.unpack_from(value, address_at)[0]
        sockaddr_at = address_at + _SIZE.size
        family = _SOCKADDR_FAMILY.unpack_from(value, sockaddr_at)[0]
        port = _SOCKADDR_PORT.unpack_from(value, sockaddr_at + 2)[0]
        if family == _AF_INET:
            ip = bytes(value[sockaddr_at + 4:sockaddr_at + 8])
        elif family == _AF_INET6:
            ip_at = sockaddr_at + _SOCKADDR_IN6_ADDRESS_OFFSET
            ip = bytes(value[ip_at:ip_at + 16])
        else:
            raise DecodeError(f"address family {family}")
    except struct.error:
        raise DecodeError("too short for a Gloo rank record") from None
    pair_ids_at = sockaddr_at + address_bytes
    pair_id_bytes = len(value) - pair_ids_at
    if address_bytes < len(ip) + 4 or pair_id_bytes < 0 or pair_id_bytes % CONNECT_SEQUENCE.size \
            or pair_id_bytes // CONNECT_SEQUENCE.size > MAX_RANKS:
        raise DecodeError("lengths do not add up to a Gloo rank record")
    pair_ids = tuple(seq for (seq,) in CONNECT_SEQUENCE.iter_unpack(value[pair_ids_at:]))
    hostname = bytes(value[_SIZE.size:address_at]).decode("utf-8", "replace")
    return RankRecord(hostname, ip, port, pair_ids)


def split_rank_key(key: str) -> tuple[str, int] | None:
    """A rendezvous key "<group prefix>/<rank>" -> (group prefix, rank); None for other keys."""
    group, slash, rank = key.rpartition("/")
    return (group, int(rank)) if slash and rank.isdigit() else None


# -- what a direction's first bytes may be ---------------------------------------------------------------

def is_preamble(prefix: bytes, offset: int) -> bool:
    """Whether a preamble starts at `offset` of `prefix`."""
    try:
        parse_preamble(prefix, offset)
    except DecodeError:
        return False
    return True


def could_be_sequence_or_preamble(prefix: bytes) -> bool:
    """False once the first bytes can be neither a connect sequence number nor a preamble's nbytes."""
    if len(prefix) < CONNECT_SEQUENCE.size:
        return True
    first = _SIZE.unpack_from(prefix, 0)[0]
    return first < MAX_SEQUENCE_NUMBER or PREAMBLE_BYTES <= first < MAX_MESSAGE_BYTES
