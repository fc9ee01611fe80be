"""The sizes of one capture's Gloo operations from what the wire states and the TCP sequence space counts.

A collective's tensor is the one whose gloo schedule (decoders.protocols.gloo.model) agrees with every length its
messages state (each transfer is stated three times: NOTIFY_SEND_READY, NOTIFY_RECV_READY and the data
preamble) and with the bytes each of the capturing rank's TCP directions counts for it (`SequenceSpace`).
The sequence space counts the bytes of segments the capture lost, so a lost segment widens a bound but never
shrinks a size; captured payload bytes play no part.

Gloo's job step (decoders.protocols.gloo.job) builds one `SequenceSpace` per direction from what the capture decoder
left of it (its decoded messages' keys, offsets and sizes) and hands the collectives of
decoders.protocols.gloo.collectives to `fitted`, capture by capture.
"""
from __future__ import annotations

import bisect
import collections
import itertools
import math
from typing import TYPE_CHECKING

from dlcsniff.decoders.protocols.gloo import model as gloo_model

if TYPE_CHECKING:
    import pandas as pd

CollectiveKey = tuple[str, int]          # (kind, seq)
_SIZE_COLUMNS = ["tensor_bytes", "payload_bytes_sent", "payload_bytes_received"]


class SequenceSpace:
    """One direction's collective messages against its TCP sequence space: per collective (kind, seq), the
    bytes it certainly put on the direction and the undecoded bytes it may also have put there.

    Certain: its decoded messages, and the undecoded bytes between two of them when no other operation's
    message comes between its first and last (PyTorch runs a list reduce_scatter as k all_reduce works at
    once, so operations can interleave). Possible: undecoded bytes next to one of its messages or inside
    its span; for a collective none of whose messages was decoded here, the undecoded bytes between the
    collectives before and after it in sequence order (a group's collectives otherwise travel each
    direction one after the other).

    `keys`: per decoded message in stream order, its collective (None: a send/recv); `offsets` and `nbytes`:
    where it starts in the direction and how long it is; `start`: the first offset messages may have (after
    the connect sequence number); `end`: the direction's length, lost bytes counted."""

    def __init__(self, keys: list[CollectiveKey | None], offsets: list[int], nbytes: list[int], start: int,
                 end: int):
        self.keys = keys
        ends = [offset + size for offset, size in zip(offsets, nbytes)]
        # gaps[i]: undecoded bytes before message i; gaps[-1]: after the last one, to the stream's end.
        self.gaps = [max(0, offset - (ends[i - 1] if i else start)) for i, offset in enumerate(offsets)]
        self.gaps.append(max(0, end - (ends[-1] if ends else start)))
        first: dict[CollectiveKey, int] = {}
        last: dict[CollectiveKey, int] = {}
        for i, key in enumerate(keys):
            if key is not None:
                first.setdefault(key, i)
                last[key] = i
        self.certain: dict[CollectiveKey, int] = collections.Counter()
        self.possible: dict[CollectiveKey, int] = collections.Counter()
        self._first, self._last = first, last
        self._nbytes = nbytes
        interleaved = set()
        self.overlaps: set[frozenset] = set()        # pairs of collectives whose messages interleave here
        active: set[CollectiveKey] = set()            # keys whose span holds the current position
        covering = []                                  # per gap: the keys whose span holds it
        for i, key in enumerate(keys):
            covering.append(frozenset(active))
            interleaved.update(other for other in active if other != key)
            if key is not None:
                self.overlaps.update(frozenset((other, key)) for other in active if other != key)
                self.certain[key] += nbytes[i]
                if first[key] == i and last[key] > i:
                    active.add(key)
                elif last[key] == i:
                    active.discard(key)
        covering.append(frozenset(active))
        for i, gap in enumerate(self.gaps):
            if not gap:
                continue
            left = keys[i - 1] if i else None
            right = keys[i] if i < len(keys) else None
            candidates = (covering[i] | {left, right}) - {None}
            if left is not None and left == right and candidates == {left} and left not in interleaved:
                self.certain[left] += gap
            else:
                for key in candidates:
                    self.possible[key] += gap
        # For collectives without a decoded message: by sequence number, the last position of those before
        # and the first of those after (prefix maxima and suffix minima of positions in sequence order).
        by_seq = sorted((key[1], i) for i, key in enumerate(keys) if key is not None)
        self._seqs = [seq for seq, _ in by_seq]
        self._last_before = list(itertools.accumulate((i for _, i in by_seq), max))
        self._first_after = list(itertools.accumulate((i for _, i in reversed(by_seq)), min))[::-1]
        self._gap_sums = [0, *itertools.accumulate(self.gaps)]

    def bounds(self, key: CollectiveKey) -> tuple[int, int]:
        """(fewest, most) bytes the collective put on this direction."""
        if key in self.certain:
            return self.certain[key], self.certain[key] + self.possible[key]
        return 0, self._undecoded_between(key[1], key[1])

    def group_bounds(self, group: frozenset) -> tuple[int, int]:
        """`bounds` for collectives that ran at once, together: the undecoded bytes among their messages
        are theirs for certain when no other operation's message comes in between."""
        present = [key for key in group if key in self._first]
        if not present:
            return 0, self._undecoded_between(min(key[1] for key in group), max(key[1] for key in group))
        start, stop = min(self._first[key] for key in present), max(self._last[key] for key in present)
        certain = sum(self._nbytes[i] for i in range(start, stop + 1) if self.keys[i] in group)
        inner = self._gap_sums[stop + 1] - self._gap_sums[start + 1]
        if all(self.keys[i] in group for i in range(start, stop + 1)):
            certain += inner
            inner = 0
        return certain, certain + inner + self.gaps[start] + self.gaps[stop + 1]

    def _undecoded_between(self, first_seq: int, last_seq: int) -> int:
        """Undecoded bytes between the collectives before `first_seq` and those after `last_seq`."""
        before = bisect.bisect_left(self._seqs, first_seq)
        after = bisect.bisect_right(self._seqs, last_seq)
        start = self._last_before[before - 1] + 1 if before else 0
        stop = self._first_after[after] if after < len(self._seqs) else len(self.gaps) - 1
        low, high = min(start, stop), max(start, stop)
        return self._gap_sums[high + 1] - self._gap_sums[low]


def fitted(collectives: pd.DataFrame, messages: pd.DataFrame,
           stream_views: list[tuple[dict, SequenceSpace]]) -> pd.DataFrame:
    """Collectives with tensor and payload bytes from gloo_model.fit: the schedule that agrees with every
    length the capture states and with each direction's sequence space. `stream_views`: per Gloo direction
    of the capture, its message context (pg, peer_rank, outgoing) and its sequence space. Without a fit
    (ranks unknown, or no schedule agrees) the volume estimate of collectives_from_messages stays; an
    all_to_all with unequal chunks (all_to_allv) is summed per peer from any of the three messages stating
    each transfer."""
    import pandas as pd

    gloo = messages[(messages["protocol"] == "gloo") & messages["collective"].isin(gloo_model.MODELLED_KINDS)
                    & messages["peer_rank"].notna() & messages["outgoing"].notna()]
    statements = {}
    for (pg, kind, seq), group in gloo.groupby(["pg", "collective", "seq"], sort=False, dropna=False):
        sent = group["outgoing"].astype(bool) != (group["opcode"] == gloo_model.RECEIVER_OPCODE)
        statements[(pg if isinstance(pg, str) else None, kind, int(seq))] = [
            gloo_model.Statement(int(peer), bool(is_sent), opcode, int(length))
            for peer, is_sent, opcode, length
            in zip(group["peer_rank"], sent, group["opcode"], group["length_bytes"])]
    views = [(context, view) for context, view in stream_views
             if context["peer_rank"] is not None and context["outgoing"] is not None]
    collectives = collectives.copy()
    for index, row in collectives.iterrows():
        kind, rank, k = row["kind"], row["local_rank"], row["world_size"]
        if kind not in gloo_model.MODELLED_KINDS or pd.isna(rank) or pd.isna(k) or pd.isna(row["seq"]):
            continue
        pg = row["pg"] if isinstance(row["pg"], str) else None
        key = (pg, kind, int(row["seq"]))
        stated = statements.get(key, [])
        spans = [gloo_model.StreamSpan(context["peer_rank"], context["outgoing"], *view.bounds(key[1:]))
                 for context, view in views if context["pg"] == pg]
        fit = gloo_model.fit(kind, int(k), int(rank), stated, spans)
        if fit is not None:
            collectives.loc[index, _SIZE_COLUMNS] = [fit.tensor_bytes, fit.sent_bytes, fit.received_bytes]
        elif kind == "all_to_all" and stated:
            sent = _per_peer_transfer_bytes(stated, spans, True)
            collectives.loc[index, _SIZE_COLUMNS] = [round(sent * k / (k - 1)), sent,
                                                     _per_peer_transfer_bytes(stated, spans, False)]
    _fit_concurrent(collectives, statements, views)
    return collectives


def _fit_concurrent(collectives: pd.DataFrame, statements: dict, views: list[tuple[dict, SequenceSpace]]) -> None:
    """Collectives of one kind whose messages interleave (works PyTorch ran at once: a list reduce_scatter's
    k all_reduces of one chunk size) are fitted again together, as one tensor size, against their joint
    sequence-space bounds, which stay tight where each one's alone cannot; the joint fit replaces the
    single ones when it is within every bound."""
    import pandas as pd

    parent: dict = {}

    def root(key):
        while parent.setdefault(key, key) != key:
            key = parent[key]
        return key

    for context, view in views:
        for pair in view.overlaps:
            first, second = sorted(pair)
            if first[0] == second[0]:
                parent[root((context["pg"], *second))] = root((context["pg"], *first))
    groups = collections.defaultdict(list)
    for key in parent:
        groups[root(key)].append(key)
    rows = {(pg if isinstance(pg, str) else None, kind, int(seq)): index
            for index, pg, kind, seq in zip(collectives.index, collectives["pg"], collectives["kind"],
                                            collectives["seq"]) if not pd.isna(seq)}
    for members in groups.values():
        indices = [rows.get(member) for member in members]
        if len(members) < 2 or None in indices:
            continue
        first = collectives.loc[indices[0]]
        if pd.isna(first["local_rank"]) or pd.isna(first["world_size"]):
            continue
        pg = members[0][0]
        keys = frozenset(member[1:] for member in members)
        spans = [gloo_model.StreamSpan(context["peer_rank"], context["outgoing"], *view.group_bounds(keys))
                 for context, view in views if context["pg"] == pg]
        fit = gloo_model.fit_group(members[0][1], int(first["world_size"]), int(first["local_rank"]),
                                   [statements.get(member, []) for member in members], spans)
        if fit is not None and not fit.span_error:
            collectives.loc[indices, _SIZE_COLUMNS] = [fit.tensor_bytes, fit.sent_bytes, fit.received_bytes]


def _per_peer_transfer_bytes(statements: list, spans: list, sent: bool) -> int:
    """One transfer per peer and direction (all_to_all): its length from whichever of its three messages
    the capture kept; when it kept none, from the sequence space: the most its direction's bytes allow,
    less the three preambles it puts there (its two, and the other way's NOTIFY_RECV_READY)."""
    lengths: dict[int, int] = {}
    for statement in statements:
        if statement.sent == sent:
            lengths[statement.peer] = max(lengths.get(statement.peer, 0), statement.length)
    headers = (gloo_model.SENDER_MESSAGES + gloo_model.RECEIVER_MESSAGES) * gloo_model.PREAMBLE_BYTES
    for span in spans:
        if span.outgoing == sent and span.peer not in lengths and headers < span.high < math.inf:
            lengths[span.peer] = int(span.high) - headers
    return sum(lengths.values())
