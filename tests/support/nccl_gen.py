"""Generated NCCL socket-transport captures, with their ground truth (tests only).

NCCL cannot run on these machines (no GPU), so these captures are written from the protocol description
(NVIDIA/nccl's net_socket.cc / socket.cc / bootstrap.cc behaviour as summarised in ../shared/protocols.md and
decoders/protocols/nccl_socket/decoder.py's docstring), NOT from the decoder: the sender side is simulated step by
step the way NCCL sends (handshake, index byte, size, inline payload or tasks dealt round-robin over the data
sockets), packets are built with scapy and written as pcap.

`TcpCapture` builds TCP connections segment by segment (three-way handshake, MSS-sized segments each
acknowledged by the peer, FIN), so the tests go through the real capture reader and TCP reassembler.
"""
from __future__ import annotations

import array
import random
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import PcapWriter

NCCL_SOCKET_MAGIC = 0x564AB9F2FC4B9D6C      # src/include/socket.h
TYPE_BOOTSTRAP, TYPE_PROXY, TYPE_NET_SOCKET, TYPE_NET_IB = 1, 2, 3, 4
START_US = 1_700_000_000_000_000             # capture clock, microseconds since the epoch

# NCCL generations as far as the wire is concerned
ERA_NO_HANDSHAKE = "2.15"      # no magic/type; bootstrap rank and tag as two 4-byte messages; no inline
ERA_HANDSHAKE = "2.22"         # magic + type; rank and tag still two messages; no inline
ERA_INLINE = "2.27"            # magic + type; one 8-byte {rank, tag} message; payloads <= 128 B inline
ERAS = (ERA_NO_HANDSHAKE, ERA_HANDSHAKE, ERA_INLINE)


class TcpConnection:
    def __init__(self, client: tuple[str, int], server: tuple[str, int], client_isn: int, server_isn: int):
        self.client, self.server = client, server
        self.next_seq = {True: client_isn + 1, False: server_isn + 1}    # keyed by "from the client"


class TcpCapture:
    """Ethernet/IPv4/TCP frames on a microsecond clock; `frames` may be edited (dropped) before `write`. A
    frame is (ts_us, bytes) or (ts_us, bytes kept, wire length) for a packet the capture cut short."""

    def __init__(self, mss: int = 8960, seed: int = 1):
        self.mss = mss
        self.now_us = START_US
        self.frames: list[tuple[int, bytes]] = []
        self.rng = random.Random(seed)

    def _emit(self, src: tuple[str, int], dst: tuple[str, int], seq: int, ack: int, flags: str,
              payload: bytes = b"") -> int:
        self.now_us += 7
        frame = (Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src=src[0], dst=dst[0])
                 / TCP(sport=src[1], dport=dst[1], seq=seq & 0xFFFFFFFF, ack=ack & 0xFFFFFFFF, flags=flags,
                       window=65535))
        if payload:
            frame = frame / Raw(payload)
        self.frames.append((self.now_us, bytes(frame)))
        return len(self.frames) - 1

    def connect(self, client: tuple[str, int], server: tuple[str, int]) -> TcpConnection:
        conn = TcpConnection(client, server, self.rng.getrandbits(32), self.rng.getrandbits(32))
        c_isn, s_isn = conn.next_seq[True] - 1, conn.next_seq[False] - 1
        self._emit(client, server, c_isn, 0, "S")
        self._emit(server, client, s_isn, c_isn + 1, "SA")
        self._emit(client, server, c_isn + 1, s_isn + 1, "A")
        return conn

    def segments(self, conn: TcpConnection, data: bytes, from_client: bool = True):
        """Send `data`, one MSS-sized segment (and the peer's ACK) per step: a generator, so that
        several connections can be interleaved. Yields the index of each data frame."""
        src, dst = (conn.client, conn.server) if from_client else (conn.server, conn.client)
        for start in range(0, len(data), self.mss):
            chunk = data[start:start + self.mss]
            seq = conn.next_seq[from_client]
            index = self._emit(src, dst, seq, conn.next_seq[not from_client], "PA", chunk)
            conn.next_seq[from_client] = seq + len(chunk)
            self._emit(dst, src, conn.next_seq[not from_client], conn.next_seq[from_client], "A")
            yield index

    def send(self, conn: TcpConnection, data: bytes, from_client: bool = True) -> list[int]:
        return list(self.segments(conn, data, from_client))

    def send_parallel(self, sends: list[tuple[TcpConnection, bytes]]) -> None:
        """Several connections sending at once (NCCL's socket threads): their segments interleave."""
        active = [self.segments(conn, data) for conn, data in sends if data]
        while active:
            active = [gen for gen in active if next(gen, None) is not None]

    def close(self, conn: TcpConnection) -> None:
        c, s = conn.next_seq[True], conn.next_seq[False]
        self._emit(conn.client, conn.server, c, s, "FA")
        self._emit(conn.server, conn.client, s, c + 1, "FA")
        self._emit(conn.client, conn.server, c + 1, s + 1, "A")

    def write(self, path: Path, drop: set[int] = frozenset()) -> Path:
        writer = PcapWriter(str(path), linktype=1, sync=False)
        writer.write_header(None)
        for index, (ts_us, frame, *wire) in enumerate(self.frames):
            if index not in drop:
                writer.write_packet(frame, sec=ts_us // 1_000_000, usec=ts_us % 1_000_000, caplen=len(frame),
                                    wirelen=wire[0] if wire else len(frame))
        writer.close()
        return path


# -- NCCL payload buffers ----------------------------------------------------------------------------

def ll_buffer(data: bytes, flag: int) -> bytes:
    """NCCL LL lines: 8 data bytes per 16-byte line, each u32 of data followed by the u32 flag."""
    assert len(data) % 8 == 0 and sys.byteorder == "little"
    words = array.array("I", data)
    lines = array.array("I", [flag]) * (2 * len(words))
    lines[0::2] = words
    return lines.tobytes()


def ll128_buffer(data: bytes, flag: int) -> bytes:
    """NCCL LL128 lines: 120 data bytes then the u64 flag per 128-byte line."""
    assert len(data) % 120 == 0
    flag_bytes = struct.pack("<Q", flag)
    return b"".join(data[i:i + 120] + flag_bytes for i in range(0, len(data), 120))


def nccl_buffer(proto: str, wire_bytes: int, rng: random.Random, flag: int) -> bytes:
    """A buffer of `wire_bytes` bytes as NCCL's `proto` (Simple, LL, LL128) puts it on the wire."""
    if proto == "LL":
        return ll_buffer(rng.randbytes(wire_bytes // 2), flag)
    if proto == "LL128":
        return ll128_buffer(rng.randbytes(wire_bytes // 128 * 120), flag)
    return rng.randbytes(wire_bytes)


# -- net-socket transport ----------------------------------------------------------------------------

@dataclass
class SocketMessage:
    """What NCCL's sender did for one isend on a net-socket connection."""
    seq: int
    size_bytes: int
    inline: bool | None          # payload after the size on the control socket (None: nSocks == 0)
    tasks: list[tuple[int, int]]  # (data socket index, bytes) in the order they were dealt
    proto: str
    payload_bytes: int           # data bytes inside the buffer


@dataclass
class NetSocketConnection:
    sender: str
    receiver: str
    listen_port: int
    nsocks: int
    era: str
    ports: list[int]             # sender-side ports: data sockets 0..nsocks-1, then the control socket
    messages: list[SocketMessage] = field(default_factory=list)

    @property
    def control_key(self) -> tuple[str, int, str, int]:
        return (self.sender, self.ports[-1], self.receiver, self.listen_port)


class NcclSender:
    """One NCCL net-socket sendComm, sending the way net_socket.cc does."""

    def __init__(self, cap: TcpCapture, sender: str, receiver: str, listen_port: int, nsocks: int, era: str,
                 first_port: int):
        self.cap = cap
        self.info = NetSocketConnection(sender, receiver, listen_port, nsocks, era,
                                        list(range(first_port, first_port + nsocks + 1)))
        self.next_sock = 0
        self.socks = []
        for index, port in enumerate(self.info.ports):     # data sockets first, the control socket last
            conn = cap.connect((sender, port), (receiver, listen_port))
            if era != ERA_NO_HANDSHAKE:
                cap.send(conn, struct.pack("<Qi", NCCL_SOCKET_MAGIC, TYPE_NET_SOCKET))
            cap.send(conn, bytes([index]))
            self.socks.append(conn)

    def isend(self, buffer: bytes, proto: str = "Simple", payload_bytes: int | None = None) -> None:
        info = self.info
        size = len(buffer)
        control, data_socks = self.socks[-1], self.socks[:-1]
        inline = None if not info.nsocks else (info.era == ERA_INLINE and 0 < size <= 128)
        msg = SocketMessage(len(info.messages), size, inline, [], proto,
                            size if payload_bytes is None else payload_bytes)
        info.messages.append(msg)
        if not info.nsocks or inline:
            self.cap.send(control, struct.pack("<i", size) + buffer)
            return
        self.cap.send(control, struct.pack("<i", size))
        task = max(64 * 1024, -(-size // info.nsocks))
        per_sock: dict[int, bytearray] = {}
        for offset in range(0, size, task):
            chunk = buffer[offset:offset + task]
            per_sock.setdefault(self.next_sock, bytearray()).extend(chunk)
            msg.tasks.append((self.next_sock, len(chunk)))
            self.next_sock = (self.next_sock + 1) % info.nsocks
        self.cap.send_parallel([(data_socks[s], bytes(b)) for s, b in per_sock.items()])

    def close(self) -> None:
        for conn in self.socks:
            self.cap.close(conn)


# -- bootstrap -------------------------------------------------------------------------------------

@dataclass
class BootstrapMessage:
    sender: str
    rank: int | None
    tag: int | None
    size_bytes: int


def bootstrap_send(cap: TcpCapture, sender: tuple[str, int], receiver: tuple[str, int], era: str, magic: int,
                   rank: int, tag: int, data: bytes) -> BootstrapMessage:
    """bootstrapSend: a connection of its own, the rank and tag, the message, close."""
    conn = cap.connect(sender, receiver)
    if era != ERA_NO_HANDSHAKE:
        cap.send(conn, struct.pack("<Qi", magic, TYPE_BOOTSTRAP))
    if era == ERA_INLINE:
        cap.send(conn, struct.pack("<iii", 8, rank, tag))
    else:
        cap.send(conn, struct.pack("<ii", 4, rank))
        cap.send(conn, struct.pack("<ii", 4, tag))
    cap.send(conn, struct.pack("<i", len(data)) + data)
    cap.close(conn)
    return BootstrapMessage(sender[0], rank, tag, len(data))


def bootstrap_ring(cap: TcpCapture, sender: tuple[str, int], receiver: tuple[str, int], magic: int,
                   messages: list[bytes]) -> list[BootstrapMessage]:
    """The bootstrap ring's persistent connection (2.16+): plain size-prefixed messages."""
    conn = cap.connect(sender, receiver)
    cap.send(conn, struct.pack("<Qi", magic, TYPE_BOOTSTRAP))
    for data in messages:
        cap.send(conn, struct.pack("<i", len(data)) + data)
    return [BootstrapMessage(sender[0], None, None, len(d)) for d in messages]


# -- scenarios --------------------------------------------------------------------------------------

@dataclass
class NcclCapture:
    path: Path
    connections: list[NetSocketConnection]
    bootstrap: list[BootstrapMessage]


# Sizes that exercise every branch: empty, inline-sized, just above the inline limit, below and above the
# 64 KiB minimum task, not a multiple of nSocks, MiBs (16 tasks of more than 64 KiB with 16 sockets).
SIZES = [0, 8, 128, 129, 4000, 65536, 65537, 200_003, 1 << 20, (2 << 20) + 3]


def net_socket_capture(path: Path, *, era: str, nsocks: int, sizes: list[int] = SIZES, protos: tuple = ("Simple",),
                       seed: int = 7) -> NcclCapture:
    """Two ranks, one net-socket connection each way, a few bootstrap messages, a proxy connection and
    one unrelated TCP connection (which the decoder must leave alone)."""
    rng = random.Random(seed)
    cap = TcpCapture(seed=seed)
    magic = rng.getrandbits(64)
    a, b = "198.18.0.1", "198.18.0.2"
    boot = [bootstrap_send(cap, (a, 41000), (b, 40000), era, magic, 0, -(1 << 31) | 5, rng.randbytes(120)),
            bootstrap_send(cap, (b, 41001), (a, 40001), era, magic, 1, 7, rng.randbytes(4)),
            bootstrap_send(cap, (b, 41002), (a, 40001), era, magic, 1, 9, b"")]
    if era != ERA_NO_HANDSHAKE:
        boot += bootstrap_ring(cap, (a, 41003), (b, 40000), magic, [rng.randbytes(28), rng.randbytes(56)])
        proxy = cap.connect((a, 41004), (a, 40002))
        cap.send(proxy, struct.pack("<Qi", magic, TYPE_PROXY) + rng.randbytes(40))
        cap.send(proxy, rng.randbytes(24), from_client=False)
    other = cap.connect((a, 41005), (b, 5201))
    cap.send(other, rng.randbytes(3000))
    cap.send(other, rng.randbytes(100), from_client=False)
    senders = [NcclSender(cap, a, b, 43000, nsocks, era, 42000), NcclSender(cap, b, a, 43001, nsocks, era, 44000)]
    for i, size in enumerate(sizes):
        for j, sender in enumerate(senders):
            proto = protos[(i + j) % len(protos)]
            wire = size - size % (128 if proto == "LL128" else 16) if proto != "Simple" else size
            buffer = nccl_buffer(proto, wire, rng, flag=i + 1)
            payload = wire // 2 if proto == "LL" else wire // 128 * 120 if proto == "LL128" else wire
            sender.isend(buffer, proto, payload)
    for sender in senders:
        sender.close()
    cap.write(path)
    return NcclCapture(path, [s.info for s in senders], boot)
