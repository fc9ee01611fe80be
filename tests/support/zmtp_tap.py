"""Test helpers for the ZMTP decoder: a loopback TCP tap between two real ZeroMQ sockets, and feeders.

`Tap` listens on 127.0.0.1, relays each accepted connection to the real listening socket, and records
every chunk each direction carried, as read, with a monotonic timestamp. The ZeroMQ peers are real
(pyzmq's libzmq 4.3.5), so the recorded bytes are exactly what libzmq puts on a TCP connection.
"""
from __future__ import annotations

import dataclasses
import itertools
import random
import socket
import threading
import time
from dataclasses import dataclass, field

from dlcsniff.decoders.protocols.zmtp.decoder import Command, Message, Resync, ZmtpDecoder
from tests.support.protocol_driver import drain

_RELAY_READ_BYTES = 1 << 16
_JOIN_TIMEOUT_S = 20.0


@dataclass
class TappedConnection:
    """The chunks of one relayed TCP connection: (bytes, ts_ns) per read, in order, per direction."""
    client_to_server: list[tuple[bytes, int]] = field(default_factory=list)
    server_to_client: list[tuple[bytes, int]] = field(default_factory=list)

    @staticmethod
    def joined(chunks: list[tuple[bytes, int]]) -> bytes:
        return b"".join(data for data, _ in chunks)


class Tap:
    """Relay 127.0.0.1:<port> -> 127.0.0.1:<upstream_port>, recording both directions.

    Use as a context manager; `close()` waits until every relayed connection has been closed by
    both peers (close the ZeroMQ sockets first) so the recordings are whole.
    """

    def __init__(self, upstream_port: int):
        self._upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.connections: list[TappedConnection] = []
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._accepting = threading.Thread(target=self._accept_loop, daemon=True)
        self._accepting.start()

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def _accept_loop(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:          # the listener was closed
                return
            upstream = socket.create_connection(("127.0.0.1", self._upstream_port))
            self._sockets += (downstream, upstream)
            conn = TappedConnection()
            self.connections.append(conn)
            for src, dst, record in ((downstream, upstream, conn.client_to_server),
                                     (upstream, downstream, conn.server_to_client)):
                pump = threading.Thread(target=_pump, args=(src, dst, record), daemon=True)
                self._threads.append(pump)
                pump.start()

    def close(self) -> None:
        self._listener.shutdown(socket.SHUT_RDWR)     # wakes the blocked accept()
        self._listener.close()
        self._accepting.join(_JOIN_TIMEOUT_S)
        for pump in self._threads:
            pump.join(_JOIN_TIMEOUT_S)
            if pump.is_alive():
                raise RuntimeError("a tapped connection is still open: close both ZeroMQ sockets first")
        for sock in self._sockets:
            sock.close()

    def __enter__(self) -> Tap:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def only_connection(self) -> TappedConnection:
        if len(self.connections) != 1:
            raise AssertionError(f"expected one relayed connection, saw {len(self.connections)}")
        return self.connections[0]


def _pump(src: socket.socket, dst: socket.socket, record: list[tuple[bytes, int]]) -> None:
    try:
        while data := src.recv(_RELAY_READ_BYTES):
            record.append((data, time.monotonic_ns()))
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass                         # a reset: the recording ends here, like the connection


# -- feeding the decoder --------------------------------------------------------------------------

@dataclass(frozen=True)
class Gap:
    """`size` bytes of the stream that the capture lost (lost=False: cut short on purpose, by a snaplen)."""
    size: int
    ts_ns: int = 0
    lost: bool = True


def decode(pieces, *, end: bool = True, **decoder_options) -> tuple[list, ZmtpDecoder]:
    """Feed (bytes, ts_ns) chunks and Gap markers, draining events after each; return (events, decoder)."""
    decoder = ZmtpDecoder(**decoder_options)
    events = []
    for piece in pieces:
        if isinstance(piece, Gap):
            decoder.receive_gap(piece.size, piece.ts_ns, lost=piece.lost)
        else:
            decoder.receive_data(*piece)
        events.extend(drain(decoder))
    if end:
        decoder.receive_end(0)
        events.extend(drain(decoder))
    return events, decoder


def decode_with_invariants(segments: list, sizes: list[int], *, max_buffer: int = 4096, **options) -> list:
    """Feed segments (bytes or Gap), data cut into chunks of `sizes` (cycled; [] = whole), and check
    what must hold for any input: no exception, buffered bytes below max_buffer whenever the decoder
    waits for data, lost bytes and resync offsets within the stream."""
    decoder = ZmtpDecoder(max_buffer=max_buffer, **options)
    events, total = [], 0
    cuts = itertools.cycle(sizes) if sizes else None
    for segment in segments:
        if isinstance(segment, Gap):
            decoder.receive_gap(segment.size, total)
            total += segment.size
        else:
            pos = 0
            while pos < len(segment):
                n = next(cuts) if cuts else len(segment)
                decoder.receive_data(segment[pos:pos + n], total + pos)
                pos += n
                events.extend(drain(decoder))
                assert decoder.buffered_bytes < max_buffer
            total += len(segment)
        events.extend(drain(decoder))
    decoder.receive_end(total)
    events.extend(drain(decoder))
    assert decoder.lost_bytes <= total
    offsets = [ev.offset for ev in events if isinstance(ev, Resync)]
    assert offsets == sorted(offsets) and all(offset <= total for offset in offsets)
    assert sum(ev.lost_bytes for ev in events if isinstance(ev, Resync)) <= decoder.lost_bytes
    return events


def chunked(stream: bytes, sizes) -> list[tuple[bytes, int]]:
    """Cut stream into chunks of the given sizes (the last takes the rest); ts_ns = chunk offset."""
    chunks, pos = [], 0
    for size in sizes:
        if pos >= len(stream):
            break
        chunks.append((stream[pos:pos + size], pos))
        pos += size
    if pos < len(stream):
        chunks.append((stream[pos:], pos))
    return chunks


def bytewise(stream: bytes) -> list[tuple[bytes, int]]:
    return [(stream[i:i + 1], i) for i in range(len(stream))]


def random_chunks(stream: bytes, seed: int, max_size: int = 3000) -> list[tuple[bytes, int]]:
    rng = random.Random(seed)
    return chunked(stream, iter(lambda: rng.randint(1, max_size), None))


def without_timestamps(events: list) -> list:
    """Events with their timestamps zeroed and kept bodies as bytes, to compare across chunkings."""
    out = []
    for ev in events:
        changes = {f.name: 0 for f in dataclasses.fields(ev) if f.name.endswith("_ns")}
        if isinstance(ev, Message):
            changes["frames"] = tuple(None if f is None else bytes(f) for f in ev.frames)
        out.append(dataclasses.replace(ev, **changes))
    return out


def messages(events: list) -> list[Message]:
    return [ev for ev in events if isinstance(ev, Message)]


def commands(events: list, name: str | None = None) -> list[Command]:
    return [ev for ev in events if isinstance(ev, Command) and (name is None or ev.name == name)]


# -- hand-built ZMTP bytes, straight from the RFCs (13, 15, 23, 37) -----------------------------------

def greeting_v3(mechanism: bytes = b"NULL", *, minor: int = 1, as_server: bool = False) -> bytes:
    """64 bytes: signature (0xFF, 8 padding bytes, 0x7F), version 3.minor, mechanism, as-server, filler."""
    return (b"\xff" + bytes(7) + b"\x01\x7f" + bytes([3, minor]) + mechanism.ljust(20, b"\x00")
            + bytes([as_server]) + bytes(31))


def greeting_v2(socket_type: int, *, revision: int = 1) -> bytes:
    """12 bytes: signature, revision (1 = ZMTP 2.0), socket type."""
    return b"\xff" + bytes(7) + b"\x01\x7f" + bytes([revision, socket_type])


def frame(body: bytes, *, more: bool = False, command: bool = False) -> bytes:
    """A 2.0/3.x frame: flags (MORE 1, LONG 2, COMMAND 4), size (1 byte, or 8 bytes BE if > 255), body."""
    flags = (1 if more else 0) | (4 if command else 0)
    if len(body) > 255:
        return bytes([flags | 2]) + len(body).to_bytes(8, "big") + body
    return bytes([flags, len(body)]) + body


def message(*frames: bytes) -> bytes:
    return b"".join(frame(body, more=i < len(frames) - 1) for i, body in enumerate(frames))


def v1_frame(body: bytes, *, more: bool = False) -> bytes:
    """A 1.0 frame: length of flags + body (1 byte, or 0xFF + 8 bytes BE if >= 255), flags, body."""
    length = len(body) + 1
    head = bytes([length]) if length < 255 else b"\xff" + length.to_bytes(8, "big")
    return head + bytes([1 if more else 0]) + body


def v1_message(*frames: bytes) -> bytes:
    return b"".join(v1_frame(body, more=i < len(frames) - 1) for i, body in enumerate(frames))


def metadata(properties: dict[bytes, bytes]) -> bytes:
    return b"".join(bytes([len(name)]) + name + len(value).to_bytes(4, "big") + value
                    for name, value in properties.items())


def command(name: bytes, data: bytes = b"") -> bytes:
    return frame(bytes([len(name)]) + name + data, command=True)
