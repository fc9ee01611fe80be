"""NCCL's bootstrap connections, decoded sans-IO: `i32 size, bytes` messages, a point-to-point connection's
first ones being the sender's rank and the tag (wire format: decoders.protocols.nccl_socket.decoder, which
claims the connections and feeds each direction, after its handshake, to a `BootstrapStream`).
"""
from __future__ import annotations

import collections
import struct
from dataclasses import dataclass

from dlcsniff.decoders.sansio import NEED_DATA, DecodeFailed, Sentinel

MAX_BOOTSTRAP_BYTES = 1 << 30    # sanity bound on a bootstrap message length
_I32 = struct.Struct("<i")
_BOOTSTRAP_HEADER = struct.Struct("<ii")   # 2.23+: one 8-byte message {rank, tag}


@dataclass(frozen=True, slots=True)
class BootstrapPeer:
    """The first message(s) of a point-to-point bootstrap connection: the sending rank and the tag."""
    rank: int
    tag: int


@dataclass(frozen=True, slots=True)
class BootstrapMessage:
    """One `i32 size, bytes` message of a bootstrap connection (complete: every byte of it was captured)."""
    size_bytes: int
    ts_first_ns: int
    ts_last_ns: int
    complete: bool


class _BootstrapRecord:
    __slots__ = ("size_bytes", "ts_first_ns", "ts_last_ns", "pending_bytes", "missing_bytes", "content")

    def __init__(self, size_bytes: int, ts_ns: int):
        self.size_bytes = size_bytes
        self.ts_first_ns = ts_ns
        self.ts_last_ns = ts_ns
        self.pending_bytes = size_bytes
        self.missing_bytes = 0
        self.content = bytearray()          # kept only for records of at most 8 bytes (rank / tag headers)

    def whole(self, size_bytes: int) -> bytes | None:
        """The record's bytes if it is a whole rank / tag header of `size_bytes`."""
        return bytes(self.content) if self.size_bytes == len(self.content) == size_bytes else None

    def event(self) -> BootstrapMessage:
        return BootstrapMessage(self.size_bytes, self.ts_first_ns, self.ts_last_ns,
                                not self.pending_bytes and not self.missing_bytes)


class BootstrapStream:
    """A stream decoder for one bootstrap connection: `i32 size, bytes` records, in order.

    Events: `BootstrapPeer` first when the connection is a point-to-point one (its first records are the rank
    and the tag), then one `BootstrapMessage` per other record as it ends (a record cut short: at
    `receive_end`), and DecodeFailed where the records stop making sense.
    """

    def __init__(self):
        self.offset = 0
        self.header = bytearray()
        self.current: _BootstrapRecord | None = None
        self.failed = False
        self.records = 0
        self._head: list[_BootstrapRecord] | None = []    # first records, until it is known whether they are a peer
        self._events: collections.deque = collections.deque()

    def receive_data(self, data: bytes | memoryview, ts_ns: int) -> None:
        view = memoryview(data)
        self._read(view, len(view), ts_ns)

    def receive_gap(self, size: int, ts_ns: int, *, lost: bool = True) -> None:
        """Bytes the capture did not deliver (lost, or cut short: unknown either way)."""
        self._read(None, size, ts_ns)

    def receive_end(self, ts_ns: int) -> None:
        """A record cut short by the end is reported incomplete."""
        if self.current is not None:
            self._finish(self.current)
            self.current = None
        self._settle_head(final=True)

    def next_event(self) -> BootstrapPeer | BootstrapMessage | DecodeFailed | Sentinel:
        return self._events.popleft() if self._events else NEED_DATA

    def _read(self, view: memoryview | None, nbytes: int, ts_ns: int) -> None:
        pos = 0
        while pos < nbytes and not self.failed:
            rec = self.current
            if rec is not None:
                take = min(nbytes - pos, rec.pending_bytes)
                if view is None:
                    rec.missing_bytes += take
                elif rec.size_bytes <= _BOOTSTRAP_HEADER.size:
                    rec.content += view[pos:pos + take]
                rec.pending_bytes -= take
                rec.ts_last_ns = ts_ns
                pos += take
                self.offset += take
                if not rec.pending_bytes:
                    self.current = None
                    self._finish(rec)
                continue
            if view is None:
                self._fail(f"the capture lost {nbytes - pos} bytes across a bootstrap message header")
                return
            take = min(4 - len(self.header), nbytes - pos)
            self.header += view[pos:pos + take]
            pos += take
            self.offset += take
            if len(self.header) < 4:
                return
            size = _I32.unpack(self.header)[0]
            self.header.clear()
            if not 0 <= size <= MAX_BOOTSTRAP_BYTES:
                self.offset -= 4
                self._fail(f"bootstrap message {self.records} announces {size} bytes")
                return
            rec = _BootstrapRecord(size, ts_ns)
            self.records += 1
            if size:
                self.current = rec
            else:
                self._finish(rec)

    def _finish(self, rec: _BootstrapRecord) -> None:
        if self._head is None:
            self._events.append(rec.event())
        else:
            self._head.append(rec)
            self._settle_head(final=False)

    def _settle_head(self, final: bool) -> None:
        """Whether the first records are a peer: 2.23+ one 8-byte {rank, tag}, up to 2.22 two 4-byte ones."""
        head = self._head
        if not head:
            return
        peer = rest = None
        if (pair := head[0].whole(8)) is not None:
            peer, rest = _BOOTSTRAP_HEADER.unpack(pair), head[1:]
        elif head[0].whole(4) is not None and len(head) < 2 and not final:
            return
        elif head[0].whole(4) is not None and len(head) >= 2 and head[1].whole(4) is not None:
            peer, rest = (_I32.unpack(head[0].whole(4))[0], _I32.unpack(head[1].whole(4))[0]), head[2:]
        else:
            rest = head
        self._head = None
        if peer is not None:
            self._events.append(BootstrapPeer(*peer))
        self._events.extend(rec.event() for rec in rest)

    def _fail(self, reason: str) -> None:
        self.failed = True
        self._settle_head(final=True)
        self._events.append(DecodeFailed(self.offset, reason))
