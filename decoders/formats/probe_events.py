"""Probe events: their byte layouts, the probe file format, and pure parsers of both.

Written by the capture daemon (sniffer/), read by decoders.inputs.daemon_dir: defined once, here.
The BPF programs (sniffer/probes/*.c) write fixed-layout little-endian structs into one ring buffer;
the daemon frames each one, unchanged, into the set's probe file, beside records of its own (clock
pairs, processes, attached libraries, sockets already open at start). Nothing here does I/O.

Probe file:

    magic  b"DLCPRB\\x00\\x01"
    u32    header length, then that many bytes of JSON (set number, host, kernel, network namespace)
    record*: u32 payload length, then the payload; every payload starts with a u16 kind.

A record is appended whole or not at all by the daemon, but a crash can cut the last one: readers
decode up to the last complete record and report the cut bytes.

Event times are CLOCK_MONOTONIC ns (`mono_ns`, what BPF programs can read). The daemon writes a
`ClockSync` (monotonic, realtime) pair at start and every few seconds; `EpochClock` turns
monotonic times into epoch ns with the latest pair before them.
"""
from __future__ import annotations

import bisect
import enum
import json
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.protocols.nccl import probes as nccl_api
from dlcsniff.decoders.sansio import NEED_DATA, Sentinel

FILE_MAGIC = b"DLCPRB\x00\x01"
FILE_HEADER_LEN = struct.Struct("<I")
RECORD_LEN = struct.Struct("<I")
KIND = struct.Struct("<H")
# Generous bound for one record (the largest is a daemon JSON record): a longer length field means the
# file is corrupt from there on.
MAX_RECORD_BYTES = 1 << 20
LIB_PATH_BYTES = 256
RINGBUF_KIND_COUNT = 64          # kinds below this come from BPF; the daemon's own records are above


class Kind(enum.IntEnum):
    # from BPF (sniffer/probes/*.c, KIND_* there)
    SOCK_STATE = 1
    SOCK_ACCEPT = 4
    LIB_OPEN = 5
    ZMQ_SEND = 16
    ZMQ_RECV = 17
    NCCL_CALL = 32
    NCCL_COMM_INIT = 33
    # from the daemon
    CLOCK = 64
    PROCESS = 65
    LIBRARY = 66
    SOCKET_SNAPSHOT = 67


# Index = the function id the BPF program writes (ZMQ_FN_* there; libnccl's: decoders.protocols.nccl.probes).
ZMQ_FUNCTIONS = ("zmq_msg_send", "zmq_send", "zmq_msg_recv", "zmq_recv")
ZMQ_SNDMORE = 2

# include/net/tcp_states.h
TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT",
              7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING", 12: "NEW_SYN_RECV"}
TCP_ESTABLISHED, TCP_SYN_SENT, TCP_SYN_RECV, TCP_CLOSE, TCP_LISTEN = 1, 2, 3, 7, 10
TCP_FIN_WAIT1, TCP_CLOSE_WAIT, TCP_LAST_ACK = 4, 8, 9

# struct event_head: kind, reserved, tgid, tid, netns, ts_ns, cgroup_id, comm[16]
HEAD = struct.Struct("<HHIIIQQ16s")
SOCK_EVENT = struct.Struct(HEAD.format + "QHHHBB16s16siI")
LIB_EVENT = struct.Struct(HEAD.format + f"{LIB_PATH_BYTES}s")
ZMQ_EVENT = struct.Struct(HEAD.format + "QQQqiHBB")
NCCL_EVENT = struct.Struct(HEAD.format + "QQQQQiiiHH")
NCCL_COMM_EVENT = struct.Struct(HEAD.format + "QiiiI")
DAEMON_RECORD_HEAD = struct.Struct("<HHI")     # kind, 0, 0: then JSON


def layout_cflags() -> dict[str, int]:
    """The -D values the BPF programs are compiled with, so that C and Python share one definition."""
    defines = {f"KIND_{kind.name}": int(kind) for kind in Kind if kind < RINGBUF_KIND_COUNT}
    defines.update(
        KIND_COUNT=RINGBUF_KIND_COUNT,
        EVENT_HEAD_BYTES=HEAD.size,
        SOCK_EVENT_BYTES=SOCK_EVENT.size,
        LIB_EVENT_BYTES=LIB_EVENT.size,
        LIB_PATH_BYTES=LIB_PATH_BYTES,
        ZMQ_EVENT_BYTES=ZMQ_EVENT.size,
        NCCL_EVENT_BYTES=NCCL_EVENT.size,
        NCCL_COMM_EVENT_BYTES=NCCL_COMM_EVENT.size,
        ZMQ_SNDMORE_FLAG=ZMQ_SNDMORE,
        ZMQ_MSG_FLAGS_OFFSET=43,
    )
    defines.update({f"ZMQ_FN_{name.removeprefix('zmq_').upper()}": index for index, name in enumerate(ZMQ_FUNCTIONS)})
    defines.update(nccl_api.function_defines())
    return defines


# -- events -----------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SockEvent:
    """SOCK_STATE (a TCP state change) or SOCK_ACCEPT (accept() returned `fd`, peer in remote_ip/remote_port)."""
    kind: Kind
    mono_ns: int
    tgid: int
    tid: int
    comm: str
    cgroup_id: int
    netns: int
    skaddr: int
    family: int
    local_ip: str | None
    local_port: int
    remote_ip: str | None
    remote_port: int
    oldstate: int
    newstate: int
    fd: int


@dataclass(frozen=True, slots=True)
class LibOpen:
    mono_ns: int
    tgid: int
    tid: int
    comm: str
    netns: int
    path: str


@dataclass(frozen=True, slots=True)
class ZmqCall:
    """One frame handed to (ZMQ_SEND) or returned by (ZMQ_RECV) libzmq."""
    kind: Kind
    mono_ns: int             # call
    return_mono_ns: int      # return
    tgid: int
    tid: int
    comm: str
    cgroup_id: int
    netns: int
    function: str
    socket: int
    msg: int
    size_bytes: int
    flags: int
    more: bool | None


@dataclass(frozen=True, slots=True)
class NcclCall:
    mono_ns: int
    tgid: int
    tid: int
    comm: str
    cgroup_id: int
    netns: int
    function: str
    sendbuff: int
    recvbuff: int
    count: int
    datatype: int
    op: int
    peer: int
    comm_handle: int
    stream: int

    @property
    def dtype(self) -> str | None:
        """The element type's name (ncclDataType_t), None for one unknown."""
        return nccl_api.DATATYPES.get(self.datatype, (None, None))[0]

    @property
    def size_bytes(self) -> int | None:
        """The buffer's bytes: count elements of the type (None for a type unknown)."""
        element_bytes = nccl_api.DATATYPES.get(self.datatype, (None, None))[1]
        return self.count * element_bytes if element_bytes else None

    @property
    def op_name(self) -> str | None:
        """The reduction's name (ncclRedOp_t), None for one unknown."""
        return nccl_api.REDOPS.get(self.op)


@dataclass(frozen=True, slots=True)
class NcclCommInit:
    mono_ns: int
    tgid: int
    tid: int
    comm: str
    cgroup_id: int
    netns: int
    comm_handle: int
    nranks: int
    rank: int
    result: int


@dataclass(frozen=True, slots=True)
class ClockSync:
    mono_ns: int
    realtime_ns: int


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    mono_ns: int
    tgid: int
    comm: str
    cmdline: tuple[str, ...]
    cgroup: str | None
    netns: int | None


@dataclass(frozen=True, slots=True)
class LibraryAttached:
    mono_ns: int
    path: str
    library: str             # "libzmq" or "libnccl"
    functions: tuple[str, ...]
    tgid: int | None         # the process it was found in (None: given on the command line)


@dataclass(frozen=True, slots=True)
class SocketSnapshot:
    """A TCP socket already open when the probes attached (from /proc)."""
    mono_ns: int
    family: int
    local_ip: str
    local_port: int
    remote_ip: str
    remote_port: int
    state: int
    inode: int
    tgid: int | None
    comm: str | None


Event = (SockEvent | LibOpen | ZmqCall | NcclCall | NcclCommInit | ClockSync | ProcessInfo | LibraryAttached
         | SocketSnapshot)


def _comm(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _ip(family: int, raw: bytes) -> str | None:
    if family == socket.AF_INET:
        return socket.inet_ntop(socket.AF_INET, raw[:4])
    if family == socket.AF_INET6:
        return socket.inet_ntop(socket.AF_INET6, raw)
    return None


def _parse_sock(payload) -> SockEvent:
    (kind, _, tgid, tid, netns, mono_ns, cgroup_id, comm, skaddr, family, sport, dport, oldstate, newstate,
     saddr, daddr, fd, _) = SOCK_EVENT.unpack(payload)
    # Addresses are only filled in by state changes (both ends) and accept() (the peer).
    local_ip = _ip(family, saddr) if kind == Kind.SOCK_STATE else None
    remote_ip = _ip(family, daddr) if kind in (Kind.SOCK_STATE, Kind.SOCK_ACCEPT) else None
    return SockEvent(Kind(kind), mono_ns, tgid, tid, _comm(comm), cgroup_id, netns, skaddr, family, local_ip, sport,
                     remote_ip, dport, oldstate, newstate, fd)


def _parse_lib(payload) -> LibOpen:
    _, _, tgid, tid, netns, mono_ns, _, comm, path = LIB_EVENT.unpack(payload)
    return LibOpen(mono_ns, tgid, tid, _comm(comm), netns, path.split(b"\0", 1)[0].decode("utf-8", "surrogateescape"))


def _parse_zmq(payload) -> ZmqCall:
    (kind, _, tgid, tid, netns, mono_ns, cgroup_id, comm, return_mono_ns, zsocket, msg, size, flags, function,
     more, _) = ZMQ_EVENT.unpack(payload)
    if function >= len(ZMQ_FUNCTIONS):
        raise DecodeError(f"zmq event with unknown function id {function}")
    return ZmqCall(Kind(kind), mono_ns, return_mono_ns, tgid, tid, _comm(comm), cgroup_id, netns,
                   ZMQ_FUNCTIONS[function], zsocket, msg, size, flags, None if more == 255 else bool(more))


def _parse_nccl(payload) -> NcclCall:
    (_, _, tgid, tid, netns, mono_ns, cgroup_id, comm, sendbuff, recvbuff, count, comm_handle, stream, datatype,
     op, peer, function, _) = NCCL_EVENT.unpack(payload)
    if function >= len(nccl_api.FUNCTIONS):
        raise DecodeError(f"nccl event with unknown function id {function}")
    return NcclCall(mono_ns, tgid, tid, _comm(comm), cgroup_id, netns, nccl_api.FUNCTIONS[function], sendbuff,
                    recvbuff, count, datatype, op, peer, comm_handle, stream)


def _parse_nccl_comm(payload) -> NcclCommInit:
    _, _, tgid, tid, netns, mono_ns, cgroup_id, comm, comm_handle, nranks, rank, result, _ = \
        NCCL_COMM_EVENT.unpack(payload)
    return NcclCommInit(mono_ns, tgid, tid, _comm(comm), cgroup_id, netns, comm_handle, nranks, rank, result)


def _daemon_json(payload) -> dict:
    try:
        value = json.loads(bytes(payload[DAEMON_RECORD_HEAD.size:]))
    except ValueError as exc:
        raise DecodeError(f"daemon record is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise DecodeError("daemon record is not a JSON object")
    return value


def _parse_daemon(kind: Kind, payload) -> Event:
    record = _daemon_json(payload)
    try:
        if kind == Kind.CLOCK:
            return ClockSync(int(record["mono_ns"]), int(record["realtime_ns"]))
        if kind == Kind.PROCESS:
            return ProcessInfo(int(record["mono_ns"]), int(record["tgid"]), str(record["comm"]),
                               tuple(record["cmdline"]), record.get("cgroup"), record.get("netns"))
        if kind == Kind.LIBRARY:
            return LibraryAttached(int(record["mono_ns"]), str(record["path"]), str(record["library"]),
                                   tuple(record["functions"]), record.get("tgid"))
        return SocketSnapshot(int(record["mono_ns"]), int(record["family"]), str(record["local_ip"]),
                              int(record["local_port"]), str(record["remote_ip"]), int(record["remote_port"]),
                              int(record["state"]), int(record["inode"]), record.get("tgid"), record.get("comm"))
    except (KeyError, TypeError, ValueError) as exc:
        raise DecodeError(f"{kind.name} record lacks or mistypes {exc}") from None


_LAYOUTS = {
    Kind.SOCK_STATE: (SOCK_EVENT, _parse_sock),
    Kind.SOCK_ACCEPT: (SOCK_EVENT, _parse_sock),
    Kind.LIB_OPEN: (LIB_EVENT, _parse_lib),
    Kind.ZMQ_SEND: (ZMQ_EVENT, _parse_zmq),
    Kind.ZMQ_RECV: (ZMQ_EVENT, _parse_zmq),
    Kind.NCCL_CALL: (NCCL_EVENT, _parse_nccl),
    Kind.NCCL_COMM_INIT: (NCCL_COMM_EVENT, _parse_nccl_comm),
}


def event_kind(payload: bytes | memoryview) -> int:
    if len(payload) < KIND.size:
        raise DecodeError(f"event of {len(payload)} bytes has no kind")
    return KIND.unpack_from(payload)[0]


def parse_event(payload: bytes | memoryview) -> Event:
    """One record payload (a BPF event as the ring buffer delivered it, or a daemon record) -> its event."""
    raw_kind = event_kind(payload)
    try:
        kind = Kind(raw_kind)
    except ValueError:
        raise DecodeError(f"unknown event kind {raw_kind}") from None
    if kind >= RINGBUF_KIND_COUNT:
        return _parse_daemon(kind, payload)
    layout, parse = _LAYOUTS[kind]
    if len(payload) != layout.size:
        raise DecodeError(f"{kind.name} event of {len(payload)} bytes, expected {layout.size}")
    return parse(payload)


# -- writing (the daemon's side of the format) -------------------------------------------------------

def file_header(meta: dict) -> bytes:
    body = json.dumps(meta, sort_keys=True).encode()
    return FILE_MAGIC + FILE_HEADER_LEN.pack(len(body)) + body


def frame(payload: bytes | memoryview) -> bytes:
    return RECORD_LEN.pack(len(payload)) + bytes(payload)


def daemon_record(kind: Kind, fields: dict) -> bytes:
    """A framed daemon record (clock pair, process, library, open socket)."""
    return frame(DAEMON_RECORD_HEAD.pack(kind, 0, 0) + json.dumps(fields, sort_keys=True).encode())


# -- reading ----------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class BadRecord:
    """A record that could not be decoded (skipped: its length framing still holds)."""
    offset: int
    reason: str


class ProbeFileDecoder:
    """Sans-IO reader of a probe file: `receive_data(chunk)`, `receive_end()` at the end of the file, and
    `next_event()` until it returns NEED_DATA. `header` is set once the file header is read.

    The stream decoders' shape (decoders.sansio.StreamDecoder) without its capture times and gaps: a file's
    bytes are all there and its records carry their own times."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._offset = 0             # file offset of _buffer[0]
        self._eof = False
        self.header: dict | None = None
        self.records = 0
        self.truncated_bytes = 0     # a record cut short at the end of the file

    def receive_data(self, data: bytes | memoryview) -> None:
        if self._eof and data:
            raise DecodeError("data after the end of the file")
        self._buffer += data

    def receive_end(self) -> None:
        """The end of the file: a record it cuts short is counted (truncated_bytes), a header it cuts fails."""
        self._eof = True

    def _consume(self, count: int) -> memoryview:
        piece = memoryview(bytes(self._buffer[:count]))
        del self._buffer[:count]
        self._offset += count
        return piece

    def _read_header(self) -> bool:
        head_bytes = len(FILE_MAGIC) + FILE_HEADER_LEN.size
        if len(self._buffer) < len(FILE_MAGIC) and not self._eof and FILE_MAGIC.startswith(bytes(self._buffer)):
            return False
        if bytes(self._buffer[:len(FILE_MAGIC)]) != FILE_MAGIC[:len(self._buffer)] or (
                self._eof and len(self._buffer) < head_bytes):
            raise DecodeError(f"not a dlcsniff probe file (starts with {bytes(self._buffer[:8])!r})")
        if len(self._buffer) < head_bytes:
            return False
        (length,) = FILE_HEADER_LEN.unpack_from(self._buffer, len(FILE_MAGIC))
        if length > MAX_RECORD_BYTES:
            raise DecodeError(f"probe file header of {length} bytes")
        if len(self._buffer) < head_bytes + length:
            if self._eof:
                raise DecodeError("probe file cut inside its header")
            return False
        self._consume(head_bytes)
        try:
            self.header = json.loads(bytes(self._consume(length)))
        except ValueError as exc:
            raise DecodeError(f"probe file header is not JSON: {exc}") from None
        return True

    def next_event(self) -> Event | BadRecord | Sentinel:
        """The next event, a BadRecord for one that does not decode, or NEED_DATA."""
        if self.header is None and not self._read_header():
            return NEED_DATA
        if len(self._buffer) < RECORD_LEN.size:
            self._note_cut()
            return NEED_DATA
        (length,) = RECORD_LEN.unpack_from(self._buffer)
        if length > MAX_RECORD_BYTES or length < KIND.size:
            raise DecodeError(f"record length {length} at offset {self._offset}: the file is corrupt from here")
        if len(self._buffer) < RECORD_LEN.size + length:
            self._note_cut()
            return NEED_DATA
        offset = self._offset
        self._consume(RECORD_LEN.size)
        payload = self._consume(length)
        self.records += 1
        try:
            return parse_event(payload)
        except DecodeError as exc:
            return BadRecord(offset, str(exc))

    def _note_cut(self) -> None:
        if self._eof:
            self.truncated_bytes = len(self._buffer)


def parse_probe_file(data: bytes | memoryview) -> tuple[dict, list[Event], list[BadRecord], int]:
    """A whole probe file's bytes -> (header, events, bad records, truncated bytes at the end)."""
    decoder = ProbeFileDecoder()
    decoder.receive_data(data)
    decoder.receive_end()
    events: list[Event] = []
    bad: list[BadRecord] = []
    while (item := decoder.next_event()) is not NEED_DATA:
        (bad if isinstance(item, BadRecord) else events).append(item)
    return decoder.header or {}, events, bad, decoder.truncated_bytes


# -- times ------------------------------------------------------------------------------------------

class EpochClock:
    """Monotonic ns -> epoch ns, with the latest ClockSync pair taken at or before the time (the first
    pair for earlier times)."""

    def __init__(self, syncs: Iterable[ClockSync]) -> None:
        pairs = sorted((sync.mono_ns, sync.realtime_ns - sync.mono_ns) for sync in syncs)
        if not pairs:
            raise DecodeError("no clock pair: monotonic event times cannot be placed on the epoch")
        self._mono = [mono for mono, _ in pairs]
        self._offset = [offset for _, offset in pairs]

    def offset_ns(self, mono_ns: int) -> int:
        return self._offset[max(bisect.bisect_right(self._mono, mono_ns) - 1, 0)]

    def epoch_ns(self, mono_ns: int) -> int:
        return mono_ns + self.offset_ns(mono_ns)
