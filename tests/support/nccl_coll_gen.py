"""Generated NCCL jobs on the wire, following NCCL 2.20.5's own schedules, with their ground truth (tests only).

NCCL cannot run here (no GPU), so the network sends of each collective are computed from NCCL's source, read at
tag v2.20.5-1, NOT from the decoders:
- chunking: src/enqueue.cc computeCollChunkInfo (stepSize = NCCL_BUFFSIZE / NCCL_STEPS = 512 KiB; ring
  all_reduce / all_gather / reduce_scatter chunkSteps 4 sliceSteps 2, broadcast / reduce / tree 1 and 1),
  computeCollLastChunkInfo (a ring all_reduce's last loop: chunks of DIVUP(DIVUP(rem, n), align) * align
  elements, align = NCCL_SIMPLE_ALIGNMENT 4096 bytes), addCBDCollToPlan (the tensor cut over channels in
  aligned contiguous shares, channel 0 first), initCollProxyOp (a CTS offers stepSize * sliceSteps);
- steps: src/device/all_reduce.h, all_gather.h, reduce_scatter.h, broadcast.h, reduce.h (runRing,
  runTreeUpDown), src/device/prims_simple.h genericOp (a step's slices: max(DIVUP(nelem, 16 *
  SlicePerChunk) * 16, stepSize * StepPerSlice / 32) elements, empty slices still sent);
- trees: src/graph/trees.cc ncclGetBtree (every channel here uses the first tree's shape; NCCL mirrors or
  shifts the second tree of a double binary tree, not modelled); send/recv: src/proxy.cc ncclProxyComputeP2p and enqueue.cc
  scheduleP2pTasksToPlan (chunk 128 KiB halved below 1 MiB, quartered below 128 KiB; up to 16 KiB the LL
  protocol, 16-byte lines of 8 data bytes).

The wire (`simulate`): every send waits for what NCCL makes it wait for: the data it forwards or reduces
(ring step s after the receive of step s-1; a pipeline hop after its receive; a tree parent after its
children), and on IB an offered buffer: the receiver's proxy offers up to NCCL_STEPS steps ahead within an
operation, and the next operation's offers only once the previous one is done on that connection. A send
forwards the bytes it received where NCCL copies them (all_gather, broadcast, the all_reduce's second half,
a tree's broadcast) and carries new bytes where NCCL reduces. Ranks may start each operation late
(`skew_us`). Transports: net-IB over RoCEv2 (tests/support/roce_gen.py, one capture of the whole fabric, as a
switch mirror), or the socket transport (tests/support/nccl_gen.py).
"""
from __future__ import annotations

import ipaddress
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.nccl_gen import ERA_INLINE, NcclSender, TcpCapture, ll_buffer
from tests.support.roce_gen import NcclIbConnection, RoceCapture, RoceWire

NCCL_STEPS = 8
STEP_BYTES = (4 << 20) // NCCL_STEPS            # NCCL_BUFFSIZE 4 MiB (src/init.cc DEFAULT_BUFFSIZE)
SIMPLE_ALIGN_BYTES = 32 * 8 * 16                # enqueue.h NCCL_SIMPLE_ALIGNMENT
RING_CHUNK_STEPS, RING_SLICE_STEPS = NCCL_STEPS // 2, NCCL_STEPS // 4    # collectives.h (AR / AG / RS)
P2P_CHUNK_BYTES = 128 << 10                     # NCCL_P2P_NET_CHUNKSIZE
P2P_LL_THRESHOLD = 16384                        # NCCL_P2P_LL_THRESHOLD
HEAD_BYTES = 64                                 # payload bytes generated per send (the rest zeros)

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "send")


def _divup(a: int, b: int) -> int:
    return -(-a // b)


# -- NCCL's schedules ---------------------------------------------------------------------------------------

def step_slices(nelem: int, es: int, slice_per_chunk: int, step_per_slice: int) -> list[int]:
    """The bytes of each slice of one step of `nelem` elements (prims_simple.h genericOp)."""
    nelem = max(0, nelem)
    slice_elems = max(_divup(nelem, 16 * slice_per_chunk) * 16, STEP_BYTES // es * step_per_slice // 32)
    out, offset = [], 0
    for _ in range(slice_per_chunk):
        size = min(slice_elems, nelem - offset)
        out.append(size * es)
        offset += size
    return out


def channel_counts(count: int, es: int, channels: int) -> list[int]:
    """The tensor's elements per channel (addCBDCollToPlan: shares of DIVUP(bytes / channels, 16) bytes,
    rounded up to the alignment, channel 0 first; channels left without work are not used)."""
    align = SIMPLE_ALIGN_BYTES // es
    max_bytes = _divup(_divup(count * es, channels), 16) * 16
    out, left = [], count
    for _ in range(channels):
        if not left:
            break
        work = min(_divup(_divup(max_bytes, es), align) * align, left)
        out.append(work)
        left -= work
    return out


def ring_all_reduce_sends(n: int, ring_index: int, count: int, es: int) -> list[tuple[int, int]]:
    """(bytes, step) of each send of ring index `ring_index` in a ring all_reduce of `count` elements on one
    channel (all_reduce.h runRing: step s carries chunk (ring_index - 1 - s) mod n)."""
    chunk_count = STEP_BYTES * RING_CHUNK_STEPS // es
    align = SIMPLE_ALIGN_BYTES // es
    sends = []
    for offset in range(0, count, n * chunk_count):
        rem = count - offset
        chunk = chunk_count if rem >= n * chunk_count else _divup(_divup(rem, n), align) * align
        for step in range(2 * (n - 1)):
            c = (ring_index - 1 - step) % n
            nelem = min(chunk, rem - c * chunk)
            sends += [(b, step) for b in step_slices(nelem, es, RING_CHUNK_STEPS // RING_SLICE_STEPS,
                                                     RING_SLICE_STEPS)]
    return sends


def ring_gather_sends(n: int, count: int, es: int) -> list[tuple[int, int]]:
    """(bytes, step) of each send of a ring all_gather / reduce_scatter of `count` elements per rank on one
    channel: loops of chunkCount, n-1 steps each, every step the same size (all_gather.h, reduce_scatter.h)."""
    chunk_count = STEP_BYTES * RING_CHUNK_STEPS // es
    sends = []
    for offset in range(0, count, chunk_count):
        nelem = min(chunk_count, count - offset)
        for step in range(n - 1):
            sends += [(b, step) for b in step_slices(nelem, es, RING_CHUNK_STEPS // RING_SLICE_STEPS,
                                                     RING_SLICE_STEPS)]
    return sends


def chunk_sends(count: int, es: int) -> list[int]:
    """The sends of a broadcast, reduce or tree all_reduce of `count` elements on one channel: one per chunk of
    stepSize (chunkSteps = sliceSteps = 1), one slice each."""
    chunk_count = STEP_BYTES // es
    return [step_slices(min(chunk_count, count - offset), es, 1, 1)[0] for offset in range(0, count, chunk_count)]


def p2p_sends(nbytes: int) -> tuple[list[int], int, bool]:
    """(wire bytes of each send, bytes each CTS offers, LL) of one send/recv of `nbytes` on one connection
    (ncclProxyComputeP2p; LL lines carry 8 data bytes in 16)."""
    if nbytes <= P2P_LL_THRESHOLD:
        wire = _divup(2 * nbytes, 16) * 16
        return [wire], wire, True
    chunk = P2P_CHUNK_BYTES // 4 if nbytes < P2P_CHUNK_BYTES else \
        P2P_CHUNK_BYTES // 2 if nbytes < 8 * P2P_CHUNK_BYTES else P2P_CHUNK_BYTES
    return [min(chunk, nbytes - o) for o in range(0, nbytes, chunk)], min(nbytes, chunk), False


def btree(n: int, rank: int) -> tuple[int, list[int]]:
    """(parent, children) of `rank` in NCCL's binary tree of n ranks (trees.cc ncclGetBtree; -1: none)."""
    bit = 1
    while bit < n and not bit & rank:
        bit <<= 1
    if rank == 0:
        return -1, [bit >> 1] if n > 1 else []
    up = (rank ^ bit) | (bit << 1)
    if up >= n:
        up = rank ^ bit
    lowbit = bit >> 1
    down0 = -1 if lowbit == 0 else rank - lowbit
    down1 = -1 if lowbit == 0 else rank + lowbit
    while down1 >= n:
        down1 = -1 if lowbit == 0 else rank + lowbit
        lowbit >>= 1
    return up, [d for d in (down0, down1) if d != -1]


# -- operations and their sends --------------------------------------------------------------------------------

@dataclass
class Collective:
    """One operation as a program calls it: the truth the tests compare with."""
    kind: str                     # all_reduce, all_gather, reduce_scatter, broadcast, reduce, send
    nbytes: int                   # tensor bytes (all_gather: the gathered output; reduce_scatter: the input)
    algorithm: str = "ring"       # ring / tree (all_reduce); p2p for send
    es: int = 4                   # element size
    root: int = 0                 # broadcast / reduce
    peer: tuple[int, int] = (0, 1)   # send: (sender, receiver)


@dataclass
class _Send:
    conn: tuple                   # (sender, receiver, channel, p2p)
    size: int
    waits: list[tuple[tuple, int]] = field(default_factory=list)    # receives it needs: (connection, index)
    forwards: tuple[tuple, int] | None = None                       # the receive whose bytes it carries on
    ll: bool = False


def _ring_plan(op: Collective, n: int, channels: int) -> tuple[dict[tuple, list[_Send]], dict[tuple, int]]:
    plan: dict[tuple, list[_Send]] = defaultdict(list)
    grants: dict[tuple, int] = {}
    per_rank = op.nbytes // n if op.kind in ("all_gather", "reduce_scatter") else op.nbytes
    for channel, count in enumerate(channel_counts(per_rank // op.es, op.es, channels)):
        for r in range(n):
            out, into = (r, (r + 1) % n, channel, False), ((r - 1) % n, r, channel, False)
            if op.kind == "all_reduce":
                sends = ring_all_reduce_sends(n, r, count, op.es)
                # steps 0..n-1 send new (reduced) bytes, steps n..2n-3 copy what came in
                plan[out] += [_Send(out, b, [(into, g - 2)] if g >= 2 else [], (into, g - 2) if step >= n else None)
                              for g, (b, step) in enumerate(sends)]
            elif op.kind in ("all_gather", "reduce_scatter"):
                sends = ring_gather_sends(n, count, op.es)
                copy = op.kind == "all_gather"
                plan[out] += [_Send(out, b, [(into, g - 2)] if g >= 2 else [],
                                    (into, g - 2) if copy and step >= 1 else None) for g, (b, step) in enumerate(sends)]
            else:
                first = op.root if op.kind == "broadcast" else (op.root + 1) % n     # the pipeline's start
                last = (op.root - 1) % n if op.kind == "broadcast" else op.root
                if r == last:
                    continue
                chunks = chunk_sends(count, op.es)
                plan[out] += [_Send(out, b, [] if r == first else [(into, g)],
                                    (into, g) if op.kind == "broadcast" and r != first else None)
                              for g, b in enumerate(chunks)]
            grants[out] = STEP_BYTES * (RING_SLICE_STEPS if op.kind in ("all_reduce", "all_gather",
                                                                          "reduce_scatter") else 1)
    return plan, grants


def _tree_plan(op: Collective, n: int, channels: int) -> tuple[dict[tuple, list[_Send]], dict[tuple, int]]:
    plan: dict[tuple, list[_Send]] = defaultdict(list)
    grants: dict[tuple, int] = {}
    for channel, count in enumerate(channel_counts(op.nbytes // op.es, op.es, channels)):
        chunks = chunk_sends(count, op.es)
        for r in range(n):
            parent, children = btree(n, r)
            ups = [(c, r, channel, False) for c in children]
            if parent != -1:
                up = (r, parent, channel, False)
                plan[up] += [_Send(up, b, [(c, g) for c in ups]) for g, b in enumerate(chunks)]
                grants[up] = STEP_BYTES
            for child in children:
                down = (r, child, channel, False)
                if parent == -1:            # the root sends down what it reduced
                    plan[down] += [_Send(down, b, [(c, g) for c in ups]) for g, b in enumerate(chunks)]
                else:
                    came = (parent, r, channel, False)
                    plan[down] += [_Send(down, b, [(came, g)], (came, g)) for g, b in enumerate(chunks)]
                grants[down] = STEP_BYTES
    return plan, grants


def _p2p_plan(op: Collective) -> tuple[dict[tuple, list[_Send]], dict[tuple, int]]:
    conn = (op.peer[0], op.peer[1], 0, True)
    sizes, grant, ll = p2p_sends(op.nbytes)
    return {conn: [_Send(conn, b, ll=ll) for b in sizes]}, {conn: grant}


def plan(op: Collective, n: int, channels: int = 1) -> tuple[dict[tuple, list[_Send]], dict[tuple, int]]:
    """Each connection's sends for one operation, and the bytes each CTS offers on it."""
    if op.kind == "send":
        return _p2p_plan(op)
    if op.algorithm == "tree":
        return _tree_plan(op, n, channels)
    return _ring_plan(op, n, channels)


# -- the wire ---------------------------------------------------------------------------------------------

@dataclass
class GeneratedJob:
    paths: list[Path]             # one capture of the whole fabric, or one per rank (rank r's is paths[r])
    hosts: list[str]              # rank r's address is hosts[r]
    operations: list[Collective]
    spans_us: list[tuple[int, int]] = field(default_factory=list)    # first and last packet of each operation
    truth: RoceCapture | None = None
    lost: tuple[str, ...] = ()    # the sender and receiver of a packet the captures missed


def _write(cap: TcpCapture, path: Path, hosts: list[str], per_rank: bool, drop: set[int] = frozenset()) -> list[Path]:
    """The fabric as one capture (a switch mirror), or each rank's own capture: the frames from or to its
    address (Ethernet + IPv4: addresses at bytes 26..33); frames in `drop` are missing from every capture."""
    cap.frames = [f for i, f in enumerate(cap.frames) if i not in drop]
    if not per_rank:
        return [cap.write(path)]
    paths, frames = [], cap.frames
    for rank, host in enumerate(hosts):
        address = ipaddress.IPv4Address(host).packed
        cap.frames = [f for f in frames if address in (f[1][26:30], f[1][30:34])]
        paths.append(cap.write(path.with_name(f"{path.stem}_rank{rank}{path.suffix}")))
    cap.frames = frames
    return paths


def _hosts(n: int) -> list[str]:
    return [f"198.18.{3 + r // 200}.{r % 200 + 1}" for r in range(n)]


class _IbTransport:
    def __init__(self, cap: TcpCapture, path: Path, hosts: list[str], rng: random.Random, mtu: int, snap: int | None,
                 set_up: bool):
        self.truth = RoceCapture(path)
        self.wire = RoceWire(cap, self.truth, "ipv4", snap_payload=snap)
        self.hosts, self.rng, self.mtu, self.set_up = hosts, rng, mtu, set_up
        self.conns: dict[tuple, NcclIbConnection] = {}
        self.next_qp: dict[int, int] = defaultdict(lambda: 0x40)
        self.offers = True

    def connection(self, key: tuple) -> NcclIbConnection:
        conn = self.conns.get(key)
        if conn is None:           # QPs numbered per host in set-up order, as the HCA does
            sender, receiver = key[0], key[1]
            sender_qp, receiver_qp = self.next_qp[sender], self.next_qp[receiver]
            self.next_qp[sender] += 1
            self.next_qp[receiver] += 1
            conn = self.conns[key] = NcclIbConnection(self.wire, self.hosts[sender], self.hosts[receiver], sender,
                                                      sender_qp, receiver_qp, "2.21", self.rng, STEP_BYTES)
            conn.data.mtu = conn.cts.mtu = self.mtu
            if self.set_up:
                conn.set_up(45000 + len(self.conns), 46000 + receiver)
        return conn

    def offer(self, key: tuple, grant: int) -> None:
        self.connection(key).offer(size=grant)

    def send(self, key: tuple, payload: bytes) -> None:
        self.connection(key).transfer([len(payload)], payload=payload)


class _SocketTransport:
    def __init__(self, cap: TcpCapture, hosts: list[str], nsocks: int):
        self.cap, self.hosts, self.nsocks = cap, hosts, nsocks
        self.conns: dict[tuple, NcclSender] = {}
        self.offers = False
        self.truth = None

    def connection(self, key: tuple) -> NcclSender:
        conn = self.conns.get(key)
        if conn is None:
            port = 42000 + 100 * len(self.conns)
            conn = self.conns[key] = NcclSender(self.cap, self.hosts[key[0]], self.hosts[key[1]],
                                                43000 + key[2] + 10 * key[3], self.nsocks, ERA_INLINE, port)
        return conn

    def offer(self, key: tuple, grant: int) -> None:
        """No CTS on sockets: the receiver reads what comes."""

    def send(self, key: tuple, payload: bytes) -> None:
        self.connection(key).isend(payload)


def simulate(transport, cap: TcpCapture, n: int, operations: list[Collective], rng: random.Random, *,
             channels: int = 1, idle_gap_us: int = 20_000, skew_us: int = 0, zeros: bool = False
             ) -> list[tuple[int, int]]:
    """Put the operations on the wire one after the other; returns each one's first and last packet time.
    `zeros`: every tensor is zeros (what is reduced looks forwarded)."""
    spans = []
    for op in operations:
        cap.now_us += idle_gap_us
        start = {r: cap.now_us + (rng.randrange(skew_us) if skew_us else 0) for r in range(n)}
        sends, grants = plan(op, n, channels)
        depth = {key: NCCL_STEPS // (RING_SLICE_STEPS if grants[key] == STEP_BYTES * RING_SLICE_STEPS else 1)
                 for key in sends}
        offered = dict.fromkeys(sends, 0)
        done = dict.fromkeys(sends, 0)
        received: dict[tuple[tuple, int], bytes] = {}
        first_frame = len(cap.frames)
        order = sorted(sends, key=lambda key: (key[2], key[0], key[1]))
        for key in order:             # NCCL connects a channel's peers at init, channel 0 first
            transport.connection(key)
        while any(done[key] < len(sends[key]) for key in order):
            progressed = False
            for key in order:         # the receivers' proxies offer buffers
                while transport.offers and start[key[1]] <= cap.now_us and \
                        offered[key] < min(done[key] + depth[key], len(sends[key])):
                    transport.offer(key, grants[key])
                    offered[key] += 1
                    progressed = True
            for key in order:         # the senders send what is ready
                k = done[key]
                if k == len(sends[key]) or start[key[0]] > cap.now_us or (transport.offers and offered[key] <= k):
                    continue
                send = sends[key][k]
                if any(wait not in received for wait in send.waits):
                    continue
                payload = bytes(send.size) if zeros else _payload(send, received, rng)
                transport.send(key, payload)
                received[(key, k)] = payload
                done[key] += 1
                progressed = True
            if not progressed:
                later = [t for t in start.values() if t > cap.now_us]
                assert later, f"the schedule of {op} is stuck"
                cap.now_us = min(later)
        spans.append((cap.frames[first_frame][0], cap.now_us))
    return spans


def _payload(send: _Send, received: dict, rng: random.Random) -> bytes:
    """The bytes of one send: what it forwards unchanged, or new (reduced) bytes; only the first HEAD_BYTES
    vary (the decoders digest those), LL sends are LL lines."""
    if send.forwards is not None:
        return received[send.forwards]
    if send.ll:
        data = rng.randbytes(min(send.size // 2, HEAD_BYTES)).ljust(send.size // 2, b"\0")
        return ll_buffer(data, 1)
    return rng.randbytes(min(send.size, HEAD_BYTES)) + bytes(max(0, send.size - HEAD_BYTES))


def roce_job(path: Path, n: int, operations: list[Collective], *, channels: int = 1, idle_gap_us: int = 20_000,
             skew_us: int = 0, mtu: int = 1024, snap: int | None = 256, per_rank: bool = False, zeros: bool = False,
             set_up: bool = False, lose_in: int | None = None, seed: int = 13) -> GeneratedJob:
    """NCCL over RoCEv2, every rank on its own host; data packets keep `snap` payload bytes (None: whole);
    `set_up`: each connection's IB set-up TCP connection is in the capture too; `lose_in`: the captures miss
    one data packet inside a message of that operation (GeneratedJob.lost: its sender and receiver)."""
    rng = random.Random(seed)
    cap = TcpCapture(seed=seed)
    hosts = _hosts(n)
    transport = _IbTransport(cap, path, hosts, rng, mtu, snap, set_up)
    spans = simulate(transport, cap, n, operations, rng, channels=channels, idle_gap_us=idle_gap_us, skew_us=skew_us,
                     zeros=zeros)
    drop, lost = set(), ()
    if lose_in is not None:     # a MIDDLE packet (RDMA WRITE opcode 0x07) of a message of that operation
        first_us, last_us = spans[lose_in]
        middles = [i for i, (ts, frame, *_) in enumerate(cap.frames)
                   if first_us <= ts <= last_us and len(frame) > 54 and frame[42] == 0x07]
        drop = {middles[len(middles) // 2]}
        frame = cap.frames[middles[len(middles) // 2]][1]
        lost = (str(ipaddress.IPv4Address(frame[26:30])), str(ipaddress.IPv4Address(frame[30:34])))
    return GeneratedJob(_write(cap, path, hosts, per_rank, drop), hosts, operations, spans, transport.truth, lost)


def socket_job(path: Path, n: int, operations: list[Collective], *, channels: int = 1, nsocks: int = 0,
               idle_gap_us: int = 20_000, skew_us: int = 0, per_rank: bool = False, seed: int = 11) -> GeneratedJob:
    """NCCL's socket transport, every rank on its own host."""
    rng = random.Random(seed)
    cap = TcpCapture(seed=seed)
    hosts = _hosts(n)
    transport = _SocketTransport(cap, hosts, nsocks)
    spans = simulate(transport, cap, n, operations, rng, channels=channels, idle_gap_us=idle_gap_us, skew_us=skew_us)
    for sender in transport.conns.values():
        sender.close()
    return GeneratedJob(_write(cap, path, hosts, per_rank), hosts, operations, spans)
