"""Gloo's collectives as PyTorch's Gloo backend runs them: the transfers one rank makes, and the tensor size that
explains what one rank's capture states about an operation.

PyTorch's ProcessGroupGloo (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp) runs each work as one call of a
gloo algorithm, setting no algorithm option: all_reduce -> gloo::allreduce, whose default is the ring
(gloo/allreduce.cc); reduce (reduce.cc: a ring reduce-scatter, then every rank's chunk to the root);
all_gather (allgather.cc: a ring, each rank's input in two halves); all_to_all (alltoall.cc, alltoallv.cc:
one transfer to every peer); gather, scatter (one transfer between the root and every other rank);
broadcast (broadcast.cc: a binomial tree from the root); barrier (barrier.cc: dissemination, empty
transfers). Every transfer of n bytes from A to B is three messages (gloo/transport/tcp/pair.cc): A->B
NOTIFY_SEND_READY(length n), B->A NOTIFY_RECV_READY(length n), A->B SEND_UNBOUND_BUFFER(length n) + n bytes,
each behind a 48-byte preamble. So a rank's schedule for a tensor fixes the bytes an operation puts on each
TCP direction of that rank, and every length the capture can state.

`schedule` lists a rank's transfers for a tensor. `fit` finds the tensor (and element size, and root) whose
schedule agrees with an operation's observation on one capture: every stated length is one the schedule has,
no message type is stated more often than the schedule has transfers, and each TCP direction's byte count
lies within what its sequence space allows (`StreamSpan`). The sequence space counts the bytes of segments
the capture lost, so lost segments narrow nothing and shrink nothing.
"""
from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

PREAMBLE_BYTES = 48
# Messages a transfer puts on its sender's direction (NOTIFY_SEND_READY, SEND_UNBOUND_BUFFER) and on the
# receiver's (NOTIFY_RECV_READY), payload aside.
SENDER_MESSAGES = 2
RECEIVER_MESSAGES = 1
# gloo AllreduceOptions / ReduceOptions kMaxSegmentSize: the largest ring segment.
MAX_SEGMENT_BYTES = 1 << 20
ELEMENT_BYTES = (1, 2, 4, 8)
ROOTED_KINDS = frozenset({"reduce", "broadcast", "gather", "scatter"})
SEGMENTED_KINDS = frozenset({"all_reduce", "reduce"})
MODELLED_KINDS = frozenset({"all_reduce", "reduce", "all_gather", "all_to_all", "gather", "scatter", "broadcast",
                            "barrier"})
# The message a receiver sends (NOTIFY_RECV_READY); the sender sends the other two of a transfer.
RECEIVER_OPCODE = "NOTIFY_RECV_READY"


@dataclass(slots=True)
class Schedule:
    """One rank's transfers in one operation: per peer, the lengths it sends and receives."""
    sends: dict[int, list[int]] = field(default_factory=lambda: collections.defaultdict(list))
    receives: dict[int, list[int]] = field(default_factory=lambda: collections.defaultdict(list))

    def stream_bytes(self, peer: int, outgoing: bool) -> int:
        """Bytes the operation puts on the direction to (outgoing) or from the peer."""
        data, notified = (self.sends, self.receives) if outgoing else (self.receives, self.sends)
        lengths = data.get(peer, ())
        return (sum(lengths) + SENDER_MESSAGES * PREAMBLE_BYTES * len(lengths)
                + RECEIVER_MESSAGES * PREAMBLE_BYTES * len(notified.get(peer, ())))

    @property
    def sent_bytes(self) -> int:
        return sum(map(sum, self.sends.values()))

    @property
    def received_bytes(self) -> int:
        return sum(map(sum, self.receives.values()))


def _round_up(value: int, multiple: int) -> int:
    return value if value % multiple == 0 else value + multiple - value % multiple


def _ceil_div(value: int, divisor: int) -> int:
    return -(-value // divisor)


def allreduce_segment_bytes(tensor_bytes: int, element_bytes: int, world_size: int) -> tuple[int, int]:
    """gloo/allreduce.cc ring: (segments, segment bytes). At least two segments per rank, a multiple of the
    world size, none above MAX_SEGMENT_BYTES (a whole number of elements)."""
    largest = element_bytes * max(1, MAX_SEGMENT_BYTES // element_bytes)
    segments = _round_up(max(_ceil_div(tensor_bytes, largest), 2 * world_size), world_size)
    return segments, _round_up(_ceil_div(tensor_bytes, segments), element_bytes)


def reduce_segment_bytes(tensor_bytes: int, element_bytes: int, world_size: int) -> tuple[int, int]:
    """gloo/reduce.cc: (segments, segment bytes); the segment is sized first, from 2k parts."""
    largest = element_bytes * (MAX_SEGMENT_BYTES // element_bytes)
    segment = _round_up(min(_ceil_div(tensor_bytes, 2 * world_size), largest), element_bytes)
    segments = _round_up(max(_ceil_div(tensor_bytes, segment), 2 * world_size), world_size)
    return segments, segment


def _ring_allreduce(n: int, element_bytes: int, k: int, r: int, out: Schedule) -> None:
    segments, segment = allreduce_segment_bytes(n, element_bytes, k)
    per_rank = segments // k
    send_to, receive_from = (r - 1) % k, (r + 1) % k
    # Reduce-scatter: send every chunk but this rank's, receive every chunk but the next rank's; then
    # all-gather: send every chunk but the previous rank's, receive every chunk but this rank's. Segments
    # past the tensor's end are empty and not sent.
    for send_first, receive_first in (((r + 1) * per_rank, (r + 2) * per_rank), (r * per_rank, (r + 1) * per_rank)):
        for i in range(segments - per_rank):
            for first, peer, lengths in ((send_first, send_to, out.sends), (receive_first, receive_from, out.receives)):
                length = min(segment, n - (first + i) % segments * segment)
                if length > 0:
                    lengths[peer].append(length)


def _reduce(n: int, element_bytes: int, k: int, r: int, root: int, out: Schedule) -> None:
    segments, segment = reduce_segment_bytes(n, element_bytes, k)
    per_rank = segments // k
    chunk = per_rank * segment
    send_to, receive_from = (r - 1) % k, (r + 1) % k
    # gloo's reduce-scatter loop here runs segments - 2 steps (the all-reduce's runs segments - per_rank).
    for i in range(segments - 2):
        for first, peer, lengths in (((r + 1) * per_rank, send_to, out.sends),
                                     ((r + 2) * per_rank, receive_from, out.receives)):
            length = min(segment, n - (first + i) % segments * segment)
            if length > 0:
                lengths[peer].append(length)
    # Then each rank's chunk (the tail one short or empty) goes to the root.
    for q in range(k):
        length = min(chunk, n - q * chunk)
        if q == root or length <= 0:
            continue
        if r == root:
            out.receives[q].append(length)
        elif q == r:
            out.sends[root].append(length)


def _broadcast(n: int, k: int, r: int, root: int, out: Schedule) -> None:
    """gloo/broadcast.cc: a binomial tree over ranks relative to the root."""
    vrank = (r - root) % k
    dim = (k - 1).bit_length()
    mask = (1 << dim) - 1
    for i in range(dim):
        mask ^= 1 << i
        if vrank & mask:
            continue
        vpeer = vrank ^ (1 << i)
        if vpeer >= k:
            continue
        peer = (vpeer + root) % k
        (out.receives if vrank & (1 << i) else out.sends)[peer].append(n)


def schedule(kind: str, tensor_bytes: int, element_bytes: int, world_size: int, rank: int,
             root: int | None = None) -> Schedule:
    """Rank `rank`'s transfers in one operation. `tensor_bytes` as nccl-tests count them: all_reduce, reduce,
    broadcast: the tensor; all_gather, gather: the whole output; scatter: the whole input; all_to_all: one
    rank's input (equal chunks; all_to_allv has no schedule here)."""
    out = Schedule()
    n, k, r = tensor_bytes, world_size, rank
    if k < 2:
        return out
    if kind == "all_reduce":
        if n:
            _ring_allreduce(n, element_bytes, k, r, out)
    elif kind == "reduce":
        if n:
            _reduce(n, element_bytes, k, r, root, out)
    elif kind == "all_gather":
        if n:
            contribution = n // k
            halves = (contribution // 2, contribution - contribution // 2)
            for i in range(2 * (k - 1)):
                out.sends[(r + 1) % k].append(halves[i & 1])
                out.receives[(r - 1) % k].append(halves[i & 1])
    elif kind == "all_to_all":
        for i in range(1, k):
            out.sends[(r + i) % k].append(n // k)
            out.receives[(r - i) % k].append(n // k)
    elif kind in ("gather", "scatter"):
        towards_root = kind == "gather"
        for q in range(k):
            if q == root or (r != root and q != r):
                continue
            if r == root:
                (out.receives if towards_root else out.sends)[q].append(n // k)
            else:
                (out.sends if towards_root else out.receives)[root].append(n // k)
    elif kind == "broadcast":
        _broadcast(n, k, r, root, out)
    elif kind == "barrier":
        distance = 1
        while distance < k:
            out.receives[(r - distance) % k].append(0)
            out.sends[(r + distance) % k].append(0)
            distance <<= 1
    else:
        raise ValueError(f"no Gloo schedule for {kind!r}")
    return out


# -- fitting one capture's observation ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Statement:
    """A length one message states about a transfer between the capturing rank and `peer`."""
    peer: int
    sent: bool                   # the transfer goes from the capturing rank to the peer
    opcode: str
    length: int


@dataclass(frozen=True, slots=True)
class StreamSpan:
    """What the TCP sequence space allows for the operation's bytes on one direction: at least `low` (from its
    first to its last decoded message), at most `high` (plus the undecoded bytes on either side)."""
    peer: int
    outgoing: bool
    low: int
    high: float


@dataclass(frozen=True, slots=True)
class Fit:
    tensor_bytes: int
    element_bytes: int
    root: int | None
    sent_bytes: int
    received_bytes: int
    span_error: int              # bytes by which the schedule misses the sequence-space bounds (0: within all)


def _statement_lengths(statements: list[Statement]) -> list[int]:
    return sorted({statement.length for statement in statements})


def _candidates(kind: str, lengths: list[int], k: int, spans: list[StreamSpan]) -> list[tuple[int, int]]:
    """(tensor bytes, element bytes) worth a schedule, from the stated lengths."""
    if kind == "barrier":
        return [(0, 1)]
    if kind == "broadcast":
        return [(length, 1) for length in lengths]
    if kind in ("all_to_all", "gather", "scatter"):
        return [(k * length, 1) for length in lengths]
    if kind == "all_gather":
        # The two halves differ by at most a byte: one stated half is enough, give or take that byte.
        halves = {a + b for a in (0, *lengths) for b in lengths} | {2 * b + d for b in lengths for d in (-1, 1)}
        return [(k * contribution, 1) for contribution in sorted(halves) if contribution]
    # Ring segments: full segments, then one partial segment or (reduce) a partial chunk of segments.
    # A rank moves at least half the tensor on one of its directions; and below MAX_SEGMENT_BYTES segments
    # there are 2k of them, above it one per MAX_SEGMENT_BYTES (plus up to k of rounding).
    bounded = [span.high if math.isfinite(span.high) else span.low for span in spans]
    budget = int(2 * max(bounded, default=0)) + 1
    most_segments = max(2 * k, _ceil_div(budget, MAX_SEGMENT_BYTES) + k) + 1
    sizing = allreduce_segment_bytes if kind == "all_reduce" else reduce_segment_bytes
    found = []
    for segment in lengths:
        if not segment:
            continue
        for tail in (0, *lengths):
            for element in ELEMENT_BYTES:
                if segment % element or tail % element:
                    continue
                for full in range(min(most_segments, budget // segment + 1) + 1):
                    n = full * segment + tail
                    if n and sizing(n, element, k)[1] == segment:
                        found.append((n, element))
    return found


def _agrees(plan: Schedule, statements: list[Statement]) -> bool:
    """Every stated length is one the schedule has on that peer and direction, and no message type is
    stated more often than there are transfers there."""
    counts = collections.Counter((s.peer, s.sent, s.opcode) for s in statements)
    for (peer, sent, _), count in counts.items():
        if count > len((plan.sends if sent else plan.receives).get(peer, ())):
            return False
    for statement in statements:
        lengths = (plan.sends if statement.sent else plan.receives).get(statement.peer, ())
        if statement.length not in lengths:
            return False
    return True


def _span_error(plan: Schedule, spans: list[StreamSpan], copies: int) -> tuple[int, int]:
    """(bytes outside the bounds, bytes above the decoded spans' lower bounds) of `copies` operations that
    each follow the schedule."""
    error = slack = 0
    for span in spans:
        predicted = copies * plan.stream_bytes(span.peer, span.outgoing)
        if predicted < span.low:
            error += span.low - predicted
        elif predicted > span.high:
            error += int(predicted - span.high)
        slack += max(0, predicted - span.low)
    return error, slack


def fit(kind: str, world_size: int, rank: int, statements: list[Statement], spans: list[StreamSpan]) -> Fit | None:
    """The tensor whose schedule agrees with the statements and best with the spans: fewest bytes outside
    them, then fewest transfer lengths the capture never states, then fewest bytes assumed lost; None when
    no candidate agrees with the statements."""
    return fit_group(kind, world_size, rank, [statements], spans)


def fit_group(kind: str, world_size: int, rank: int, statements: list[list[Statement]],
              spans: list[StreamSpan]) -> Fit | None:
    """`fit` for operations of one tensor size that ran at once (PyTorch runs a list reduce_scatter as k
    all_reduce works of the chunk size, and their messages interleave): each member's statements must agree
    with the schedule, and `spans` bound the members' bytes together."""
    if kind not in MODELLED_KINDS or world_size < 2:
        return None
    lengths = _statement_lengths([statement for member in statements for statement in member])
    if not lengths and kind != "barrier":
        return None
    roots = range(world_size) if kind in ROOTED_KINDS else (None,)
    best = None
    per_member = [StreamSpan(span.peer, span.outgoing, span.low // len(statements), span.high / len(statements))
                  for span in spans]
    for tensor_bytes, element_bytes in _candidates(kind, lengths, world_size, per_member):
        for root in roots:
            plan = schedule(kind, tensor_bytes, element_bytes, world_size, rank, root)
            if not all(_agrees(plan, member) for member in statements):
                continue
            error, slack = _span_error(plan, spans, len(statements))
            # A length the schedule has many times and the capture never states speaks against it.
            unstated = len({length for lengths in (*plan.sends.values(), *plan.receives.values())
                            for length in lengths} - set(lengths))
            key = (error, unstated, slack, tensor_bytes)
            if best is None or key < best[0]:
                best = (key, Fit(tensor_bytes, element_bytes, root, plan.sent_bytes, plan.received_bytes, error))
    return None if best is None else best[1]


# -- placing peers by the structure of the algorithms ---------------------------------------------------------

# The collectives whose peers follow from rank r's schedule alone (a nominal size large enough for every peer a
# ring or barrier touches).
_PLACING_KINDS = ("all_reduce", "all_gather", "barrier")
_NOMINAL_BYTES = 1 << 24


def peer_contradictions(traffic: dict, peer: dict, rank: int, world_size: int) -> int:
    """How often an assignment of ranks to remote ends (`peer`: end -> rank) contradicts the peer structure
    of rank `rank`'s collectives. `traffic`: per (kind, seq), the ends it sent "to" and received "from", and
    per end the time of its "first_send_ns". The rings send to r-1 (all_reduce) or r+1 (all_gather) and
    receive from the other neighbour, the barrier sends to r+d and receives from r-d (d = 1, 2, 4, ...),
    and an all_to_all posts its sends to r+1, r+2, ... in that order."""
    k = world_size
    expected = {kind: schedule(kind, 0 if kind == "barrier" else _NOMINAL_BYTES, 1, k, rank)
                for kind in _PLACING_KINDS}
    count = 0
    for (kind, _), seen in traffic.items():
        plan = expected.get(kind)
        if plan is not None:
            count += sum(peer[end] not in plan.sends for end in seen["to"])
            count += sum(peer[end] not in plan.receives for end in seen["from"])
        elif kind == "all_to_all":
            order = sorted(seen["first_send_ns"], key=seen["first_send_ns"].get)
            distances = [(peer[end] - rank) % k for end in order]
            count += sum(a > b for i, a in enumerate(distances) for b in distances[i + 1:])
    return count
