"""NCCL collectives from NCCL's own step structure, for both network transports: the IB transport over RoCE
(protocols.roce.decoder) and the socket transport (protocols.nccl_socket.decoder). Pure functions over the
job's message and stream columns; decoders.job runs `resolve_job` (a job step) once the captures are decoded,
because which host captured, the ring and the world size need every capture of the job.

What the inference relies on (NCCL 2.20.5, read at tag v2.20.5-1; checked on the real captures in
pcaps/realcaps/softroce-tutorial):
- A connection carries one channel's network sends between two ranks, one way: a QP pair on IB (data one
  way, CTS the other), a control socket (+ data sockets) on the socket transport. Operations on a
  connection run one after the other (src/proxy.cc ProxyAppend chains them with `nextPeer`), so an
  operation owns a contiguous run of the connection's FIFO slots: net_ib's CTS `idx` counted from 1, the
  socket transport's message number.
- Every proxy step is one network send, empty ones included: an empty slice is posted with size 0
  (src/device/prims_simple.h genericOp) and sendProxyProgress (src/transport/net.cc) isends it: a 0-byte
  RDMA WRITE_WITH_IMM on IB, a 0 `i32 size` on sockets.
- The CTS entry (ncclIbSendFifo) names the sending rank (`tag`) and offers `stepSize * sliceSteps` bytes
  (net.cc recvProxyProgress; enqueue.cc initCollProxyOp `nbytes`); stepSize = NCCL_BUFFSIZE / NCCL_STEPS
  = 512 KiB by default. Within an operation the receiver offers buffers ahead, up to NCCL_STEPS steps
  (`posted < done + maxDepth`); the first offer of the next operation on a connection waits until the
  previous one is done there.
- Ring steps (src/device/*.h runRing, src/include/collectives.h, enqueue.cc computeCollSteps):
  all_reduce: a loop of 2(n-1) steps, each of SlicePerChunk = CHUNKSTEPS/SLICESTEPS = 2 slices, i.e.
  4(n-1) sends per connection; at step s ring index r sends chunk (r-1-s) mod n, so the chunk received at
  step s is the one sent at step s+1; the last loop's chunks are cut to a multiple of 4096 bytes
  (computeCollLastChunkInfo), the chunks past the data empty. all_gather / reduce_scatter: loops of n-1
  steps of 2 slices, every step the same size. broadcast / reduce (PipelineFrom / PipelineTo): one send
  per chunk of stepSize, the chunk forwarded hop by hop (the root of a broadcast and its previous rank,
  the root of a reduce and its next rank, use one connection only). A slice of a step of `nelem` elements
  is max(ceil(nelem / 32) * 16, stepSize * sliceSteps / 32) elements: the step's bytes split that way.
- Tree all_reduce (all_reduce.h runTreeUpDown / runTreeSplit): one send per chunk of stepSize on every tree
  edge, up (reduce) then down (broadcast); NCCL 2.20 tunes Tree for all_reduce only (graph/tuning.cc).
- send/recv use their own connections (connIndex 1), chunks of NCCL_P2P_NET_CHUNKSIZE (128 KiB) halved
  below 1 MiB and quartered below 128 KiB, offered `min(bytes, chunk)` per CTS (proxy.cc
  ncclProxyComputeP2p); up to 16 KiB they use the LL protocol (enqueue.cc P2P_LL_THRESHOLD): 16-byte
  lines of 8 data bytes.

What the wire cannot say is reported, never guessed (README: NCCL collectives): a kind the sizes cannot tell
apart (all_gather / reduce_scatter, broadcast / reduce) is told by whether a rank forwarded what it received
(`head_crc32`), else it stays `all_gather_or_reduce_scatter` / `broadcast_or_reduce`; the socket transport,
without CTS offers, gives no ranks from tags, no offered size and no offer times; LL / LL128, a NCCL_BUFFSIZE
other than the default, rings or trees that differ between channels, CollNet / NVLS or a capture starting
inside an operation turn a host's sends from there on into one `unknown` row.
"""
from __future__ import annotations

import json
import zlib
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dlcsniff.decoders.protocols.nccl.wire import (Connection, Operation, Send, Wire,
                                                   capture_hosts, job_world_size, ring_cycle, roce_wire, socket_wire,
                                                   store_ranks)
from dlcsniff.decoders.protocols.nccl_socket.decoder import HEAD_DIGEST_BYTES

if TYPE_CHECKING:
    import pandas as pd

    from dlcsniff.decoders.protocols.job_step import JobColumns

NCCL_STEPS = 8                                   # src/include/device.h
STEP_BYTES = (4 << 20) // NCCL_STEPS             # default NCCL_BUFFSIZE (src/init.cc) / NCCL_STEPS
RING_SLICE_STEPS = NCCL_STEPS // 4               # ALLREDUCE/ALLGATHER/REDUCESCATTER_SLICESTEPS
SLICES_PER_RING_STEP = (NCCL_STEPS // 2) // RING_SLICE_STEPS     # CHUNKSTEPS / SLICESTEPS
RING_GRANT_BYTES = STEP_BYTES * RING_SLICE_STEPS  # a ring all_reduce / all_gather / reduce_scatter CTS
PIPELINE_GRANT_BYTES = STEP_BYTES                # broadcast, reduce, tree: sliceSteps 1
ELEMENT_BYTES = (1, 2, 4, 8)                     # the element sizes a slice may be counted in
MAX_WORLD_SIZE = 1024                            # bound on the world sizes tried from the steps alone
PROTOCOLS = ("roce", "nccl_socket")

# Columns of collectives.parquet this module fills (decoders.schema.COLLECTIVES).
OUTPUT_COLUMNS = ("protocol", "kind", "seq", "world_size", "ts_first_ns", "ts_last_ns", "wire_bytes_sent",
                  "wire_bytes_received", "tensor_bytes", "peers", "algorithm", "capture", "pg", "local_rank",
                  "payload_bytes_sent", "payload_bytes_received", "messages", "complete", "local_address",
                  "channel", "channels", "root_rank", "evidence")

GATHER_LIKE, PIPELINE = "all_gather_or_reduce_scatter", "broadcast_or_reduce"
UNKNOWN = "unknown"
# an ambiguous kind -> the kinds it stands for (a rank that resolved one of them resolves the others)
AMBIGUOUS_KINDS = {GATHER_LIKE: ("all_gather", "reduce_scatter"), PIPELINE: ("broadcast", "reduce")}


# -- the shapes of a step --------------------------------------------------------------------------------

def _slice_split_ok(first: int, second: int, grant: int | None) -> bool:
    """Whether one ring step of first + second bytes was cut into its two slices as NCCL cuts it: a slice is
    max(ceil(nelem / 32) * 16, stepSize * sliceSteps / 32) elements (prims_simple.h genericOp), for some
    element size."""
    nelem = first + second
    floor = (grant or RING_GRANT_BYTES) // 32
    return any(first == min(max(-(-nelem // (32 * es)) * 16 * es, floor), nelem) for es in ELEMENT_BYTES)


def _steps(sends: list[Send]) -> list[tuple[int, int]] | None:
    """The sends of a ring all_reduce / all_gather / reduce_scatter as steps of two slices (bytes), or None
    when a pair is not cut the way NCCL cuts a step."""
    steps = []
    for k in range(0, len(sends), SLICES_PER_RING_STEP):
        first, second = sends[k], sends[k + 1]
        if not _slice_split_ok(first.size_bytes, second.size_bytes, first.grant_bytes):
            return None
        steps.append((first.size_bytes, second.size_bytes))
    return steps


def _all_reduce_chunk(ring_index: int, step: int, n: int) -> int:
    return (ring_index - 1 - step) % n            # all_reduce.h runRing, every one of the 2(n-1) steps


def _chunk_sizes(step_bytes: list[int], ring_index: int, n: int) -> list[int] | None:
    """The size of each chunk of a ring all_reduce loop if `step_bytes` fits ring index `ring_index`'s
    schedule, else None: NCCL cuts a loop into n chunks of chunkCount elements, the last non-empty one
    shorter and the ones after it empty (computeCollLastChunkInfo, runRing's nelem)."""
    by_chunk: dict[int, int] = {}
    for s, b in enumerate(step_bytes):
        if by_chunk.setdefault(_all_reduce_chunk(ring_index, s, n), b) != b:
            return None
    sizes = [by_chunk.get(c, 0) for c in range(n)]
    nonzero = [b for b in sizes if b]
    if any(sizes[i] < sizes[i + 1] for i in range(n - 1)) or any(b != sizes[0] for b in nonzero[:-1]):
        return None
    return sizes


def _full(send: Send, offered: int) -> bool:
    """Whether a send filled its buffer: the CTS offer, or on sockets (no CTS) what NCCL offers by default for
    this kind of step (`offered`)."""
    return send.size_bytes == (send.grant_bytes if send.grant_bytes is not None else offered)


def _granted_ahead(cuts: list[tuple[list[Send], int]]) -> bool:
    """Whether the sends from each cut on may belong to the operation before the cut. Within an operation the
    receiver offers buffers ahead of the data (up to NCCL_STEPS steps), so the offer for the slot after the
    cut is usually written before the data of the slot before it arrives; the next operation's first offer
    only follows the previous operation's end on that connection. False when every connection shows the
    offer after the cut written after the data before it; True when one shows it before, or none shows
    offer times (sockets)."""
    known = [(sends[k].grant_ts_ns, sends[k - 1].ts_last_ns) for sends, k in cuts
             if 0 < k < len(sends) and sends[k].grant_ts_ns is not None]
    return not known or any(grant < last for grant, last in known)


def _zero_head(send: Send) -> bool:
    return send.head == zlib.crc32(bytes(min(HEAD_DIGEST_BYTES, send.size_bytes)))


def _heads_compared(received: list[Send], forwarded: list[Send]) -> str | None:
    """'reduced' when a send's first bytes differ from those of the receive it follows on (forwarding never
    changes them), 'forwarded' when all are the same, None when nothing can be compared: payload not
    captured, or zeros (a sum of zeros is zeros)."""
    pairs = [(a.head, b.head) for a, b in zip(received, forwarded)
             if a.head is not None and b.head is not None and a.size_bytes and b.size_bytes
             and not (_zero_head(a) and _zero_head(b))]
    if not pairs:
        return None
    return "forwarded" if all(a == b for a, b in pairs) else "reduced"


# -- ring ---------------------------------------------------------------------------------------------------

@dataclass(slots=True)
class _Ring:
    """One rank's ring channel: connections from its previous rank and to its next (either may be silent)."""
    ins: list[Send]
    outs: list[Send]
    in_name: str | None
    out_name: str | None
    n: int
    ring_index: int | None            # its place on the ring counted from rank 0, when the job shows it
    prev_index: int | None

    def sends(self, i0: int, i1: int, j0: int, j1: int) -> dict[str, list[Send]]:
        out = {}
        if self.in_name is not None and i1 > i0:
            out[self.in_name] = self.ins[i0:i1]
        if self.out_name is not None and j1 > j0:
            out[self.out_name] = self.outs[j0:j1]
        return out


def _ring_loops(ring: _Ring, i: int, j: int, per_loop: int, take) -> tuple[list, int, int]:
    """Loops of `per_loop` sends on both connections from (i, j), each cut into NCCL steps of two slices and
    offered as ring steps are, for as long as `take(got_in, got_out, steps_in, steps_out)` makes something of
    them (None ends the operation before the loop); a loop not full, or whose next offer came only after it,
    is the operation's last. Returns what `take` made of each loop and where the loops end."""
    taken = []
    while i + per_loop <= len(ring.ins) and j + per_loop <= len(ring.outs):
        got_in, got_out = ring.ins[i:i + per_loop], ring.outs[j:j + per_loop]
        steps_in, steps_out = _steps(got_in), _steps(got_out)
        if steps_in is None or steps_out is None or not _ring_step_grants(got_in + got_out):
            break
        loop = take(got_in, got_out, steps_in, steps_out)
        if loop is None:
            break
        taken.append(loop)
        i, j = i + per_loop, j + per_loop
        if not all(_full(s, RING_GRANT_BYTES) for s in got_out + got_in) \
                or not _granted_ahead([(ring.ins, i), (ring.outs, j)]):
            break
    return taken, i, j


def _try_all_reduce(ring: _Ring, i: int, j: int) -> tuple[Operation, int, int] | None:
    """Ring all_reduce loops from (i, j): both connections advance 4(n-1) sends per loop. A loop is taken when
    the chunk received at step s is the size sent at step s+1 and the bytes per step fit the chunk schedule
    of the sending ring index."""
    n, per_loop = ring.n, 4 * (ring.n - 1)

    def take(got_in, got_out, steps_in, steps_out) -> tuple[int, dict] | None:
        step_in, step_out = [sum(s) for s in steps_in], [sum(s) for s in steps_out]
        if any(step_in[s] != step_out[s + 1] for s in range(len(step_out) - 1)):
            return None
        out_fit = [r for r in range(n) if _chunk_sizes(step_out, r, n) is not None]
        in_fit = [r for r in range(n) if _chunk_sizes(step_in, r, n) is not None]
        if (ring.ring_index not in out_fit if ring.ring_index is not None else not out_fit) or \
                (ring.prev_index not in in_fit if ring.prev_index is not None else not in_fit):
            return None
        if len(set(step_out)) == 1 and step_out[0] and not _one_all_reduce(got_in, got_out, n):
            return None               # equal chunks: two all_gather-like operations fit better
        sizes = _chunk_sizes(step_out, ring.ring_index if ring.ring_index is not None else out_fit[0], n)
        return sum(sizes), {"step_bytes_out": step_out, "step_bytes_in": step_in,
                            "ring_indexes_fitting": out_fit if len(out_fit) < n else "any"}

    loops, end_i, end_j = _ring_loops(ring, i, j, per_loop, take)
    if not loops:
        return None
    return (Operation("all_reduce", "ring", sum(size for size, _ in loops), ring.sends(i, end_i, j, end_j),
                      {"loops": len(loops), "sends_per_loop": per_loop, "loop_checks": [c for _, c in loops]}),
            end_i, end_j)


def _one_all_reduce(got_in: list[Send], got_out: list[Send], n: int) -> bool:
    """A loop of n equal chunks: one all_reduce, or two operations of one chunk per rank (all_gather /
    reduce_scatter pairs send the same)? Two operations show, on every connection with offer times, the
    second's first offer written after the first's last data. Without offer times (sockets) the payload
    decides what it can: forwarded at steps 1..n-2 is an all_gather's first half, anything else is taken for
    the all_reduce."""
    half = 2 * (n - 1)
    if got_in[half].grant_ts_ns is not None or got_out[half].grant_ts_ns is not None:
        return _granted_ahead([(got_in, half), (got_out, half)])
    return _heads_compared(got_in[0:half - 2:2], got_out[2:half:2]) != "forwarded"


def _try_gather_like(ring: _Ring, i: int, j: int) -> tuple[Operation, int, int] | None:
    """Ring all_gather / reduce_scatter loops from (i, j): n-1 steps of two slices per loop on both
    connections, every step of a loop the same size."""
    n, per_loop = ring.n, 2 * (ring.n - 1)
    loops, end_i, end_j = _ring_loops(ring, i, j, per_loop, lambda got_in, got_out, steps_in, steps_out:
                                      sum(steps_out[0]) if len(set(steps_in + steps_out)) == 1 else None)
    if not loops:
        return None
    # out-step s (s >= 1) carries what in-step s-1 brought: unchanged in all_gather, reduced in reduce_scatter
    heads_in = [s for k in range(i, end_i, per_loop) for s in ring.ins[k:k + per_loop - 2:2]]
    heads_out = [s for k in range(j, end_j, per_loop) for s in ring.outs[k + 2:k + per_loop:2]]
    compared = _heads_compared(heads_in, heads_out)
    kind = {"forwarded": "all_gather", "reduced": "reduce_scatter"}.get(compared, GATHER_LIKE)
    return (Operation(kind, "ring", sum(loops) * n, ring.sends(i, end_i, j, end_j),
                      {"loops": len(loops), "sends_per_loop": per_loop, "bytes_per_rank_per_loop": loops,
                       "payload": compared or "not captured"}), end_i, end_j)


def _try_pipeline(ring: _Ring, i: int, j: int) -> tuple[Operation, int, int] | None:
    """A ring broadcast / reduce from (i, j): one send per chunk of stepSize, the operation ending at the first
    send short of its buffer (or at an offer that came only after the data before it). A rank in the middle
    of the pipeline receives each chunk before it sends it on; the ends use one connection."""
    ins, outs = ring.ins[i:], ring.outs[j:]

    def run(sends: list[Send]) -> int:
        for k, s in enumerate(sends):
            if not _full(s, PIPELINE_GRANT_BYTES) or not _granted_ahead([(sends, k + 1)]):
                return k + 1
        return len(sends)

    both = 0
    if ins and outs and ring.n >= 3:          # with two ranks nobody is between the root and the last
        k = min(run(ins), run(outs))
        if all(a.size_bytes == b.size_bytes and a.ts_last_ns <= b.ts_first_ns for a, b in zip(ins[:k], outs[:k])) \
                and _single_grant_sized(ins[:k] + outs[:k]):
            both = k
    if both:
        compared = _heads_compared(ins[:both], outs[:both])
        kind = {"forwarded": "broadcast", "reduced": "reduce"}.get(compared, PIPELINE)
        return (Operation(kind, "ring", sum(s.payload_bytes for s in ins[:both]),
                          ring.sends(i, i + both, j, j + both),
                          {"chunks": both, "position": "middle", "payload": compared or "not captured"}),
                i + both, j + both)
    first_in = ins[0].ts_first_ns if ins else None
    first_out = outs[0].ts_first_ns if outs else None
    if first_out is not None and (first_in is None or first_out <= first_in):
        k = run(outs)
        if not _single_grant_sized(outs[:k]):
            return None
        return (Operation(PIPELINE, "ring", sum(s.payload_bytes for s in outs[:k]), ring.sends(i, i, j, j + k),
                          {"chunks": k, "position": "first",
                           "role": "a broadcast's root, or the rank after a reduce's root"}),
                i, j + k)
    if first_in is not None:
        k = run(ins)
        if not _single_grant_sized(ins[:k]):
            return None
        return (Operation(PIPELINE, "ring", sum(s.payload_bytes for s in ins[:k]), ring.sends(i, i + k, j, j),
                          {"chunks": k, "position": "last",
                           "role": "the rank before a broadcast's root, or a reduce's root"}),
                i + k, j)
    return None


def _single_grant_sized(sends: list[Send]) -> bool:
    """broadcast, reduce and tree all_reduce offer one Simple step per CTS (sliceSteps 1), and send no empty
    chunk (a chunk is what is left of the tensor, and an empty collective has no proxy step at all:
    enqueue.cc addCBDCollToPlan)."""
    return all(s.grant_bytes in (None, PIPELINE_GRANT_BYTES) and s.size_bytes for s in sends)


def _ring_step_grants(sends: list[Send]) -> bool:
    """ring all_reduce, all_gather and reduce_scatter offer two Simple steps per CTS (sliceSteps 2)."""
    return all(s.grant_bytes in (None, RING_GRANT_BYTES) for s in sends)


MAX_PARSE_STATES = 20_000      # ring parse positions explored before settling for the first fit at each


def parse_ring(ring: _Ring) -> tuple[list[Operation], int, int]:
    """Every operation of one rank's ring channel, in order; stops where no NCCL ring schedule fits. Where
    several schedules fit the next sends (without CTS, a reduce's chunks also fit reduce_scatter steps), the
    reading that explains the most sends in the fewest operations wins; ties go to the first of all_reduce,
    all_gather / reduce_scatter, broadcast / reduce."""
    tries = (_try_all_reduce, _try_gather_like, _try_pipeline)
    found: dict[tuple[int, int], list] = {}
    frontier = [(0, 0)]
    while frontier and len(found) < MAX_PARSE_STATES:
        state = frontier.pop()
        if state in found:
            continue
        found[state] = [f for f in (t(ring, *state) for t in tries) if f is not None]
        frontier += [(i, j) for _, i, j in found[state] if (i, j) not in found]
    if frontier:                    # too many readings: the first fit at each position
        ops, (i, j) = [], (0, 0)
        while (fits := [f for f in (t(ring, i, j) for t in tries) if f is not None]):
            op, i, j = fits[0]
            ops.append(op)
        return ops, i, j
    best: dict[tuple[int, int], tuple] = {}          # state -> (sends explained, -operations, ops, end)
    for state in sorted(found, key=sum, reverse=True):
        options = [(0, 0, [], state)]
        for op, i, j in found[state]:
            explained, negative_ops, rest, end = best[(i, j)]
            options.append((explained + (i - state[0]) + (j - state[1]), negative_ops - 1, [op] + rest, end))
        best[state] = max(options, key=lambda o: o[:2])
    _, _, ops, (i, j) = best[(0, 0)]
    return ops, i, j


# -- tree ---------------------------------------------------------------------------------------------------

def _tree_op(edges: dict[str, tuple[Connection, Connection]], pos: dict[str, int]) -> Operation | None:
    """The tree all_reduce starting at `pos` (each connection's sends already used), or None. Every tree edge
    carries, each way, one send per chunk of stepSize (the CTS size); a send short of its buffer is the
    operation's last chunk. All edge directions carry the same chunk sizes; towards its parent a rank sends
    first (reduce goes up before the broadcast comes down)."""
    conns = [c for pair in edges.values() for c in pair]
    if not conns or not all(pos[c.name] < len(c.sends) for c in conns):
        return None
    lists = [c.sends[pos[c.name]:] for c in conns]
    first = lists[0]
    count = next((k + 1 for k, s in enumerate(first)
                  if not _full(s, PIPELINE_GRANT_BYTES)
                  or not _granted_ahead([(c.sends, pos[c.name] + k + 1) for c in conns])), len(first))
    if any(len(lst) < count or [s.size_bytes for s in lst[:count]] != [s.size_bytes for s in first[:count]]
           for lst in lists) or not _single_grant_sized(first[:count]):
        return None
    sends, roles = {}, {}
    for peer, (inbound, outbound) in edges.items():
        got_in = inbound.sends[pos[inbound.name]:pos[inbound.name] + count]
        got_out = outbound.sends[pos[outbound.name]:pos[outbound.name] + count]
        sends[inbound.name], sends[outbound.name] = got_in, got_out
        roles[peer] = "up" if got_out[0].ts_first_ns < got_in[0].ts_first_ns else "down"
    return Operation("all_reduce", "tree", sum(s.payload_bytes for s in first[:count]), sends,
                     {"chunks": count, "tree_roles": roles})


def _advance(pos: dict[str, int], op: Operation) -> None:
    for name, sends in op.sends.items():
        pos[name] += len(sends)


def parse_tree(edges: dict[str, tuple[Connection, Connection]]) -> tuple[list[Operation], dict[str, int]]:
    """Tree all_reduces on one channel, seen from one rank (`_tree_op` one after the other)."""
    pos = {c.name: 0 for pair in edges.values() for c in pair}
    ops: list[Operation] = []
    while (op := _tree_op(edges, pos)) is not None:
        ops.append(op)
        _advance(pos, op)
    return ops, pos


def parse_ring_and_tree(ring: _Ring, edges: dict[str, tuple[Connection, Connection]], names: list[str]
                        ) -> tuple[list[Operation], dict[str, int]]:
    """A channel carrying ring and tree operations (NCCL picks the algorithm per operation when NCCL_ALGO is
    not set), on connections they may share (one per channel, peer and direction: the ring's next can be
    the tree's parent): at each point the ring and the tree each read their next operation, and the one
    whose sends begin first is the next (operations run one after the other)."""
    pos = dict.fromkeys(names, 0)
    ops: list[Operation] = []
    while True:
        candidates = []
        i, j = pos.get(ring.in_name, 0), pos.get(ring.out_name, 0)
        found = next((f for f in (t(ring, i, j) for t in (_try_all_reduce, _try_gather_like, _try_pipeline))
                      if f is not None), None)
        if found is not None:
            candidates.append(found[0])
        tree = _tree_op(edges, pos)
        if tree is not None:
            candidates.append(tree)
        if not candidates:
            return ops, pos
        op = min(candidates, key=lambda op: (min(s.ts_first_ns for lst in op.sends.values() for s in lst),
                                             -sum(len(lst) for lst in op.sends.values())))
        ops.append(op)
        _advance(pos, op)


# -- send / recv ----------------------------------------------------------------------------------------------

def parse_p2p(conn: Connection, outgoing: bool) -> list[Operation]:
    """send/recv messages on a p2p connection: each a run of sends of the offered chunk, the last one short of
    it or followed by an offer written only after its data (ncclProxyComputeP2p: chunk = min(bytes, 128 KiB
    halved below 1 MiB, quartered below 128 KiB); an empty message is one 0-byte send)."""
    ops, k = [], 0
    sends = conn.sends
    while k < len(sends):
        start = k
        while k < len(sends):
            s = sends[k]
            k += 1
            if s.grant_bytes is None or s.size_bytes < s.grant_bytes or not s.size_bytes \
                    or not _granted_ahead([(sends, k)]):
                break
        got = sends[start:k]
        ll = any(s.ll for s in got)
        ops.append(Operation("send" if outgoing else "recv", "p2p", sum(s.payload_bytes for s in got),
                             {conn.name: got},
                             {"sends": len(got), "offered": sorted({s.grant_bytes for s in got if s.grant_bytes}),
                              "protocol": "LL (size known to 8 bytes)" if ll else "Simple"}))
    return ops


# -- one capture ------------------------------------------------------------------------------------------

def _channels(conns: list[Connection], host: str) -> list[list[Connection]]:
    """The host's collective connections as channels: between two hosts each channel has its own connection
    per direction, set up in channel order (NCCL connects channel 0 first), so the k-th connection to or
    from a peer belongs to channel k."""
    by_pair: dict[tuple[str, str], list[Connection]] = defaultdict(list)
    for c in conns:
        if host in (c.sender, c.receiver) and not c.p2p:
            by_pair[(c.sender, c.receiver)].append(c)
    channels: dict[int, list[Connection]] = defaultdict(list)
    for pair in by_pair.values():
        for k, c in enumerate(sorted(pair, key=lambda c: c.order)):
            channels[k].append(c)
    return [channels[k] for k in sorted(channels)]


@dataclass(slots=True)
class _Job:
    """What the job's captures say together."""
    rank_of: dict[str, int]              # host -> rank
    ring_index_of: dict[str, int]        # host -> its place on the ring, counted from rank 0 (all_reduce.h ringIx)
    world_size: int | None
    world_source: str
    world_exact: bool


def _ring_indexes(wire: Wire, rank_of: dict[str, int]) -> dict[str, int]:
    """Each host's place on the job's ring, counted from rank 0's host along the ring (the rank itself only
    when NCCL laid the ring out in rank order), when the captures show the whole ring and rank 0."""
    nxt: dict[str, set[str]] = defaultdict(set)
    for c in (c for cs in wire.connections.values() for c in cs if not c.p2p):
        nxt[c.sender].add(c.receiver)
    ring = ring_cycle(dict(nxt))
    first = next((i for i, host in enumerate(ring or ()) if rank_of.get(host) == 0), None)
    return {} if first is None else {host: (i - first) % len(ring) for i, host in enumerate(ring)}


def _ring_connection(connections: dict[str, Connection], one_way: list[str]) -> Connection | None:
    """A rank's ring connection in one direction among those to or from its peers: the only one that carries
    ring steps (two-step offers), or else the only one to a peer that is no tree neighbour."""
    stepped = [c for c in connections.values() if any(s.grant_bytes == RING_GRANT_BYTES for s in c.sends)]
    if len(stepped) == 1:
        return stepped[0]
    return connections[one_way[0]] if len(one_way) == 1 and not stepped else None


def _label(rank_of: dict[str, int], host: str) -> str:
    return str(rank_of[host]) if host in rank_of else host


def _parse_channel(conns: list[Connection], host: str, job: _Job, n: int
                   ) -> tuple[list[Operation], dict[str, int], dict]:
    """Operations of one channel at `host`, how many sends of each connection they explain, and the
    channel's shape: a ring (from the previous rank, to the next), a tree (neighbours both ways), or both."""
    rank_of = job.rank_of
    out = {c.receiver: c for c in conns if c.sender == host}
    inc = {c.sender: c for c in conns if c.receiver == host}
    both = sorted(set(out) & set(inc))
    ring_in, ring_out = sorted(set(inc) - set(out)), sorted(set(out) - set(inc))
    edges = {p: (inc[p], out[p]) for p in both}
    parses = []

    def ring_of(inbound: Connection | None, outbound: Connection | None) -> tuple[_Ring, dict]:
        prev, nxt = inbound and inbound.sender, outbound and outbound.receiver
        ring = _Ring(inbound.sends if inbound else [], outbound.sends if outbound else [],
                     inbound and inbound.name, outbound and outbound.name, n,
                     job.ring_index_of.get(host), job.ring_index_of.get(prev))
        return ring, {"ring": f"{_label(rank_of, prev) if prev else '?'} -> {_label(rank_of, host)} -> "
                              f"{_label(rank_of, nxt) if nxt else '?'}"}

    def ring_parse(inbound: Connection | None, outbound: Connection | None) -> None:
        ring, shape = ring_of(inbound, outbound)
        ops, i, j = parse_ring(ring)
        parses.append((ops, {name: k for name, k in ((ring.in_name, i), (ring.out_name, j)) if name}, shape))

    if not both and len(ring_in) <= 1 and len(ring_out) <= 1:
        ring_parse(inc.get(ring_in[0]) if ring_in else None, out.get(ring_out[0]) if ring_out else None)
    if len(both) == 1 and not ring_in and not ring_out and n == 2:
        ring_parse(inc[both[0]], out[both[0]])         # two ranks: prev == next, ring or tree alike
    if both and not ring_in and not ring_out:
        ops, pos = parse_tree(edges)
        parses.append((ops, pos, {"tree_neighbours": both}))
    ring_in_conn, ring_out_conn = _ring_connection(inc, ring_in), _ring_connection(out, ring_out)
    if both and ring_in_conn and ring_out_conn:
        ring, shape = ring_of(ring_in_conn, ring_out_conn)
        ops, pos = parse_ring_and_tree(ring, edges, [c.name for c in conns])
        parses.append((ops, pos, {**shape, "tree_neighbours": both}))
    if not parses:
        return [], {}, {"reason": "the channel's connections are neither a ring nor a tree",
                        "to": sorted(out), "from": sorted(inc)}
    for ops, _, _ in parses:
        for op in ops:
            if "tree_roles" in op.evidence:
                roles = op.evidence.pop("tree_roles")
                up = [p for p, role in roles.items() if role == "up"]
                down = [_label(rank_of, p) for p, role in roles.items() if role == "down"]
                op.evidence["tree"] = (f"{'/'.join(down + ['-1'] * (3 - len(down)))}->{_label(rank_of, host)}->"
                                       f"{_label(rank_of, up[0]) if len(up) == 1 else '-1' if not up else '?'}")
    # several shapes may fit (two ranks; a ring next to a tree): the one that explains more sends in fewer
    # operations
    return max(parses, key=lambda p: (sum(p[1].values()), -len(p[0])))


def world_size_from_steps(conns: list[Connection], host: str, job: _Job, lower_bound: int) -> list[int]:
    """The world sizes under which one capture's ring channels parse completely (no other capture needed)."""
    fits = []
    channels = _channels(conns, host)
    total = sum(len(c.sends) for ch in channels for c in ch)
    for n in range(max(lower_bound, 2), min(MAX_WORLD_SIZE, total // 2 + 1) + 1):
        if all(sum(_parse_channel(ch, host, job, n)[1].values()) == sum(len(c.sends) for c in ch)
               for ch in channels):
            fits.append(n)
    return fits


def infer_capture(capture: str, conns: list[Connection], host: str, job: _Job, protocol: str) -> list[dict]:
    """One row per operation at `host` in this capture (collectives merged over channels, then send/recv)."""
    rank_of, n, world_source = job.rank_of, job.world_size, job.world_source
    neighbours = {h for c in conns for h in (c.sender, c.receiver) if host in (c.sender, c.receiver)}
    if not job.world_exact:
        named = [rank_of[h] for h in neighbours if h in rank_of]
        low = max(len(neighbours), max(named, default=-1) + 1, n or 0)
        fits = world_size_from_steps(conns, host, job, low)
        if len(fits) == 1:
            n, world_source = fits[0], f"the ring steps fit only n = {fits[0]} (at least {low})"
        else:
            n, world_source = low, f"lower bound ({world_source}); ring steps fit {fits or 'none'}"
    rank = rank_of.get(host)
    rows: list[dict] = []
    channel_ops: list[tuple[int, Operation, dict]] = []
    leftover: dict[str, list[Send]] = {}
    for channel, conns_of_channel in enumerate(_channels(conns, host)):
        ops, used, shape = _parse_channel(conns_of_channel, host, job, n or 2)
        channel_ops += [(channel, op, shape) for op in ops]
        leftover.update({c.name: c.sends[used.get(c.name, 0):] for c in conns_of_channel
                         if len(c.sends) > used.get(c.name, 0)})
    rank_source = "CTS tag written into this host's FIFO" if rank is not None else None
    if rank is None:
        indexes = {tuple(check["ring_indexes_fitting"]) for _, op, _ in channel_ops
                   for check in op.evidence.get("loop_checks", ()) if check["ring_indexes_fitting"] != "any"}
        fitting = set.intersection(*(set(t) for t in indexes)) if indexes else set()
        if len(fitting) == 1:       # (the rank when the ring runs in rank order, as with one rank per node)
            rank, rank_source = fitting.pop(), "ring index from the all_reduce chunk schedule of its sends"
    for seq, group in enumerate(_merge_channels(channel_ops)):
        rows.append(_collective_row(capture, protocol, seq, group, host, rank, rank_source, rank_of, n,
                                    world_source, conns))
    for c in conns:
        if c.p2p and host in (c.sender, c.receiver):
            peer = c.receiver if c.sender == host else c.sender
            for seq, op in enumerate(parse_p2p(c, c.sender == host)):
                rows.append(_collective_row(capture, protocol, seq, [(0, op, {"peer": _label(rank_of, peer)})],
                                            host, rank, rank_source, rank_of, n, world_source, conns))
    if leftover:
        rows.append(_unknown_row(capture, protocol, len(rows), host, rank, n, {
            "reason": "sends left that fit no NCCL schedule tried",
            "sends_left": {name: len(sends) for name, sends in leftover.items()}}, _sent_on(conns, leftover)))
    return rows


def _merge_channels(channel_ops: list[tuple[int, Operation, dict]]) -> list[list[tuple[int, Operation, dict]]]:
    """One collective split over channels runs on all of them at once (each channel its own share: enqueue.cc
    addTunedCollToPlan), and collectives run one after the other: channel operations whose data overlap in
    time are one collective."""
    ordered = sorted(channel_ops, key=lambda item: item[1].span())
    groups: list[list] = []
    end = None
    for item in ordered:
        first, last = item[1].span()
        if groups and first <= end and all(ch != item[0] for ch, _, _ in groups[-1]):
            groups[-1].append(item)
            end = max(end, last)
        else:
            groups.append([item])
            end = last
    return groups


def _collective_row(capture: str, protocol: str, seq: int, group: list[tuple[int, Operation, dict]], host: str,
                    rank: int | None, rank_source: str | None, rank_of: dict[str, int], n: int | None,
                    world_source: str, conns: list[Connection]) -> dict:
    kinds = {op.kind for _, op, _ in group}
    kind = kinds.pop() if len(kinds) == 1 else UNKNOWN
    algorithms = {op.algorithm for _, op, _ in group}
    sends = {name: lst for _, op, _ in group for name, lst in op.sends.items()}
    outgoing = {c.name for c in conns if c.sender == host}
    peers_hosts = sorted({c.receiver if c.sender == host else c.sender for c in conns if c.name in sends})
    firsts, lasts = zip(*(op.span() for _, op, _ in group))
    sent = [s for name, lst in sends.items() if name in outgoing for s in lst]
    received = [s for name, lst in sends.items() if name not in outgoing for s in lst]
    evidence = {"channels": [{"channel": ch, **shape, **op.evidence, "kind": op.kind, "tensor_bytes": op.tensor_bytes}
                             for ch, op, shape in group],
                "connections": [{"connection": name, "idx": [lst[0].idx, lst[-1].idx], "sends": len(lst),
                                 "zero_byte_sends": sum(1 for s in lst if not s.size_bytes),
                                 "offered": sorted({s.grant_bytes for s in lst if s.grant_bytes is not None}),
                                 "data_in_offered_buffers": all(s.va_matches is not False for s in lst)}
                                for name, lst in sends.items()],
                "rank_source": rank_source or "unknown", "world_size_source": world_source}
    tensor = [op.tensor_bytes for _, op, _ in group]
    return {"protocol": protocol, "kind": kind, "seq": seq, "world_size": n, "ts_first_ns": min(firsts),
            "ts_last_ns": max(lasts), "wire_bytes_sent": sum(s.size_bytes for s in sent),
            "wire_bytes_received": sum(s.size_bytes for s in received),
            "tensor_bytes": None if None in tensor else sum(tensor),
            "peers": sorted(rank_of[h] for h in peers_hosts if h in rank_of) if all(h in rank_of for h in peers_hosts)
            else [], "algorithm": algorithms.pop() if len(algorithms) == 1 else None, "capture": capture, "pg": None,
            "local_rank": rank, "payload_bytes_sent": sum(s.payload_bytes for s in sent),
            "payload_bytes_received": sum(s.payload_bytes for s in received),
            "messages": len(sent) + len(received), "complete": all(s.complete for s in sent + received),
            "local_address": host, "channel": min(ch for ch, _, _ in group), "channels": len(group),
            "root_rank": None, "evidence": json.dumps(evidence, default=str),
            "_position": group[0][1].evidence.get("position"), "_sends": _sent_on(conns, sends)}


def _sent_on(conns: list[Connection], sends: dict[str, list[Send]]) -> list[tuple[str, str, Send]]:
    """(sending host, receiving host, send) of each send, by the connections they were sent on."""
    ends = {c.name: (c.sender, c.receiver) for c in conns}
    return [(*ends[name], send) for name, lst in sends.items() for send in lst]


def _unknown_row(capture: str, protocol: str, seq: int, host: str | None, rank: int | None, n: int | None,
                 evidence: dict, sends: list[tuple[str, str, Send]] = ()) -> dict:
    row = {name: None for name in OUTPUT_COLUMNS}
    row.update(protocol=protocol, kind=UNKNOWN, seq=seq, world_size=n, capture=capture, local_rank=rank,
               local_address=host, peers=[], evidence=json.dumps(evidence, default=str), _position=None,
               _sends=list(sends))
    return row


def message_tags(rows: list[dict], rank_of: dict[str, int]) -> dict[str, dict[int, object]]:
    """What each NCCL message row belongs to, from the operations its capture's host was read into (the same
    rows collectives.parquet gets): column -> message row -> value, for `collective` (the operation's kind,
    "p2p" for send/recv), `seq`, `local_rank` (the capture host's rank), `outgoing` (sent by that host),
    `payload_bytes`, and `src_rank` / `dst_rank` where the job's ranks name the hosts. A send's data writes run
    from its sender to its receiver; the CTS writes that offered it the other way, with no payload. A capture
    whose operations were read at two hosts (a mirror of their link) tags a message as its sender saw it."""
    tags: dict[str, dict[int, object]] = defaultdict(dict)
    ended = [(sender == row["local_address"], row, sender, receiver, send)
             for row in rows for sender, receiver, send in row["_sends"]]
    for outgoing, row, sender, receiver, send in sorted(ended, key=lambda item: item[0]):
        kind = "p2p" if row["algorithm"] == "p2p" else row["kind"]
        common = {"collective": kind, "seq": row["seq"], "local_rank": row["local_rank"]}
        directions = [(index, payload, sender, receiver, outgoing) for index, payload in send.rows]
        directions += [(index, 0, receiver, sender, not outgoing) for index in send.grant_rows]
        for index, payload, src, dst, sent_here in directions:
            values = {**common, "outgoing": sent_here, "payload_bytes": payload}
            values.update((name, rank_of[host]) for name, host in (("src_rank", src), ("dst_rank", dst))
                          if host in rank_of)
            for name, value in values.items():
                tags[name][index] = value
    return dict(tags)


def _resolve_across_ranks(rows: list[dict]) -> None:
    """A rank at an end of a broadcast / reduce pipeline, or one whose payload was not captured, reports an
    ambiguous kind; another rank of the job that resolved the same operation (every rank's operations come
    in the same order, so the same seq) names it for all. The root of a broadcast is the rank that only
    sends, of a reduce the one that only receives."""
    collective = [row for row in rows if row["algorithm"] != "p2p"]
    resolved: dict[tuple, set[str]] = defaultdict(set)
    for row in collective:
        for ambiguous, kinds in AMBIGUOUS_KINDS.items():
            if row["kind"] in kinds:
                resolved[(row["protocol"], row["seq"], ambiguous)].add(row["kind"])
    for row in collective:
        found = resolved.get((row["protocol"], row["seq"], row["kind"]))
        if row["kind"] in AMBIGUOUS_KINDS and found and len(found) == 1:
            row["kind"] = next(iter(found))
            evidence = json.loads(row["evidence"])
            evidence["kind_source"] = "another rank of the job resolved the same operation from its payload"
            row["evidence"] = json.dumps(evidence)
    roots: dict[tuple, set[int]] = defaultdict(set)
    for row in collective:
        if (row["kind"], row["_position"]) in (("broadcast", "first"), ("reduce", "last")) \
                and row["local_rank"] is not None:
            roots[(row["protocol"], row["seq"], row["kind"])].add(row["local_rank"])
    for row in collective:
        root = roots.get((row["protocol"], row["seq"], row["kind"]))
        if root and len(root) == 1:
            row["root_rank"] = next(iter(root))


def infer_collectives(messages: pd.DataFrame, streams: pd.DataFrame) -> tuple[list[dict], dict[str, dict]]:
    """One row per NCCL collective (and send/recv) per capture and host, over all captures of one job; and what
    each NCCL message row belongs to (`message_tags`, by the frame's index)."""
    flows: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for capture, a, b in zip(streams["capture"], streams["src_ip"], streams["dst_ip"]):
        if isinstance(a, str) and isinstance(b, str):
            flows[capture].append((a, b))
    store = store_ranks(messages, streams)
    rows: list[dict] = []
    tags: dict[str, dict] = defaultdict(dict)
    for protocol, build in (("roce", roce_wire), ("nccl_socket", socket_wire)):
        if not (messages["protocol"] == protocol).any():
            continue
        wire = build(messages, streams)
        rank_of = {**store.rank_of, **wire.rank_of}
        hosts = {h for cs in wire.connections.values() for c in cs for h in (c.sender, c.receiver)}
        world = job_world_size(wire, store)
        missing = sorted(set(range(world[0])) - set(rank_of.values())) if world[0] and world[2] else []
        unranked = sorted(hosts - set(rank_of))
        if len(missing) == 1 and len(unranked) == 1:       # the one rank no one named is the one host left
            rank_of[unranked[0]] = missing[0]
        job = _Job(rank_of, _ring_indexes(wire, rank_of), *world)
        job_rows = []
        for capture, conns in wire.connections.items():
            hosts_here = capture_hosts(conns, job=wire.connections, world_size=world[0], other_flows=flows[capture])
            if not hosts_here:
                job_rows.append(_unknown_row(capture, protocol, 0, None, None, world[0], {
                    "reason": "no host whose operations this capture shows whole: two hosts touch every NCCL "
                              "connection; give the job's other captures, or the capture's TCP streams"}))
            for host in hosts_here:
                job_rows += infer_capture(capture, conns, host, job, protocol)
        _resolve_across_ranks(job_rows)
        rows += job_rows
        for name, values in message_tags(job_rows, rank_of).items():
            tags[name].update(values)
    return rows, dict(tags)


_MESSAGE_COLUMNS = ("protocol", "capture", "flow_id", "src_ip", "dst_ip", "dest_qp", "psn", "size_bytes", "complete",
                    "ts_first_ns", "ts_last_ns", "va", "nccl_role", "nccl_tag", "nccl_fifo_idx", "nccl_sizes_bytes",
                    "nccl_addrs", "nccl_seq", "nccl_proto", "payload_bytes", "head_crc32", "src_rank",
                    "world_size", "local_world_size")
_STREAM_COLUMNS = ("capture", "flow_id", "src_ip", "dst_ip", "nccl_setup_flow_id")


def resolve_job(job: JobColumns) -> None:
    """The job step (decoders.protocols.job_step): the job's NCCL collectives, and in each NCCL message the
    operation it belongs to (as collectives.parquet reads it)."""
    collectives, tags = collective_columns(job.messages, job.streams)
    for name, values in tags.items():
        for row, value in values.items():
            job.messages[name][row] = value
    job.collectives.append(collectives)


def collective_columns(messages: dict[str, list], streams: dict[str, list]
                       ) -> tuple[dict[str, list], dict[str, dict[int, object]]]:
    """The job's NCCL collectives as collectives-table columns (OUTPUT_COLUMNS), from the messages and streams
    columns decoders.job assembled, and the values of the messages' columns that say which operation each NCCL
    message belongs to (column -> row -> value: `message_tags`); both empty when the job has no NCCL traffic."""
    if not any(p in PROTOCOLS for p in set(messages.get("protocol", ()))):
        return {}, {}
    from dlcsniff.decoders.arrow_without_pandas import pandas
    pd = pandas()               # only for jobs with NCCL traffic: the decoders stay quick to import

    n = len(messages.get("protocol", ()))
    frame = pd.DataFrame({name: messages.get(name, [None] * n) for name in _MESSAGE_COLUMNS})
    frame = frame[frame["protocol"].isin(PROTOCOLS + ("tcpstore",))]
    m = len(streams.get("flow_id", ()))
    ends = pd.DataFrame({name: streams.get(name, [None] * m) for name in _STREAM_COLUMNS})
    rows, tags = infer_collectives(frame, ends)
    return {name: [row[name] for row in rows] for name in OUTPUT_COLUMNS}, tags
