"""decoders.protocols.gloo.model: gloo's algorithms as schedules, checked by hand against gloo's source
(gloo/allreduce.cc, reduce.cc, broadcast.cc, barrier.cc), byte for byte against the real job's captures
(pcaps/gloo: every collective's bytes on every TCP direction of every rank), and by fitting: a schedule's own statements and
stream bytes give its tensor back, whole, with statements lost, and for a group of concurrent operations.
"""
from __future__ import annotations

import json
import math
import random

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcsniff.decoders.protocols.gloo import model as gloo_model
from dlcsniff.decoders.protocols.gloo.model import Schedule, Statement, StreamSpan, fit, fit_group, schedule
from dlcsniff.decoders.protocols.gloo.decoder import GlooCaptureDecoder
from tests.conftest import PCAPS
from tests.support.protocol_driver import run_decoder

JOB = PCAPS / "gloo"
OPCODES = ("NOTIFY_SEND_READY", "SEND_UNBOUND_BUFFER", "NOTIFY_RECV_READY")


def as_lists(plan: Schedule) -> tuple[dict, dict]:
    return ({peer: lengths for peer, lengths in plan.sends.items() if lengths},
            {peer: lengths for peer, lengths in plan.receives.items() if lengths})


# -- by hand, from gloo's source ----------------------------------------------------------------------------------

def test_ring_allreduce_segments_and_the_partial_one():
    # 1001 float32 over 4 ranks: 8 segments of roundUp(ceil(4004 / 8), 4) = 504 bytes, the last one 476.
    assert gloo_model.allreduce_segment_bytes(4004, 4, 4) == (8, 504)
    sends, receives = as_lists(schedule("all_reduce", 4004, 4, 4, 1))
    # Rank 1 sends to rank 0 every chunk but its own (reduce-scatter), then every chunk but rank 0's.
    assert sends == {0: [504, 504, 504, 476, 504, 504] + [504, 504, 504, 504, 504, 476]}
    assert receives == {2: [504, 476, 504, 504, 504, 504] + [504, 504, 504, 476, 504, 504]}


def test_ring_allreduce_skips_empty_segments():
    # One byte over 3 ranks: six 1-byte segments, five of them empty; segment 0 (rank 0's chunk) goes
    # round the ring once reduced (2 -> 1 -> 0) and once gathered (0 -> 2 -> 1).
    plans = [as_lists(schedule("all_reduce", 1, 1, 3, rank)) for rank in range(3)]
    assert plans == [({2: [1]}, {1: [1]}), ({0: [1]}, {2: [1, 1]}), ({1: [1, 1]}, {0: [1]})]


def test_large_allreduce_has_one_segment_per_mib_and_k_more_at_most():
    assert gloo_model.allreduce_segment_bytes(64 << 20, 4, 8) == (64, 1 << 20)
    assert gloo_model.allreduce_segment_bytes(11_010_048, 4, 4) == (12, 917_504)


def test_reduce_as_on_the_wire():
    # 4 int64 over 3 ranks to root 0 (seen on a capture): six segments of 8 bytes, the last two empty,
    # chunks of two segments. Each rank sends 4 segments from the next rank's chunk on (the empty ones not);
    # rank 1's chunk then goes to the root, rank 2's is empty.
    assert as_lists(schedule("reduce", 32, 8, 3, 0, root=0)) == ({2: [8, 8]}, {1: [8, 8, 16]})
    assert as_lists(schedule("reduce", 32, 8, 3, 2, root=0)) == ({1: [8, 8, 8, 8]}, {0: [8, 8]})


def test_broadcast_is_a_binomial_tree_from_the_root():
    assert as_lists(schedule("broadcast", 100, 1, 5, 1, root=1)) == ({2: [100], 3: [100], 0: [100]}, {})
    assert as_lists(schedule("broadcast", 100, 1, 5, 0, root=1)) == ({}, {1: [100]})
    assert as_lists(schedule("broadcast", 100, 1, 5, 3, root=1)) == ({}, {1: [100]})


def test_barrier_disseminates_empty_transfers():
    assert as_lists(schedule("barrier", 0, 1, 5, 3)) == ({4: [0], 0: [0], 2: [0]}, {2: [0], 1: [0], 4: [0]})


def test_all_gather_halves_and_the_rest():
    sends, receives = as_lists(schedule("all_gather", 4 * 5, 1, 4, 0))        # 5 bytes per rank
    assert sends == {1: [2, 3] * 3} and receives == {3: [2, 3] * 3}


def test_stream_bytes_count_every_preamble():
    plan = schedule("all_to_all", 300, 1, 3, 0)                               # 100 bytes to each peer
    assert plan.stream_bytes(1, True) == 100 + 2 * 48 + 48                     # its data, and its RR
    assert plan.stream_bytes(1, False) == 100 + 2 * 48 + 48


# -- byte for byte against the real job ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wire():
    """rank -> {(peer, outgoing, kind, seq): bytes on that direction}"""
    out = {}
    for rank in range(4):
        rows, _ = run_decoder(JOB / f"rank{rank}.pcap.gz", GlooCaptureDecoder())
        messages = pd.DataFrame(rows.messages)
        messages = messages[(messages["protocol"] == "gloo") & messages["seq"].notna()]
        out[rank] = messages.groupby(["peer_rank", "outgoing", "collective", "seq"])["size_bytes"].sum().to_dict()
    return out


def test_schedules_put_the_recorded_bytes_on_every_direction(wire):
    checked = 0
    for rank in range(4):
        record = json.loads((JOB / f"rank{rank}.json").read_text())
        for operation in record["operations"]:
            works = [work for work in operation["gloo_works"] if work["name"] not in ("send", "recv")]
            for work, tag in zip(works, operation["gloo_tags"]):
                size = 4 * sum(math.prod(shape) for shape in work["input_shapes"]) \
                    if work["name"] in ("all_reduce", "all_to_all") else operation["tensor_bytes"]
                plan = schedule(work["name"], size, 4, 4, rank, operation.get("root"))
                for peer in set(range(4)) - {rank}:
                    for outgoing in (True, False):
                        found = wire[rank].get((peer, outgoing, work["name"], tag), 0)
                        assert found == plan.stream_bytes(peer, outgoing), (rank, work["name"], tag, peer, outgoing)
                        checked += 1
    assert checked > 400


# -- fitting -------------------------------------------------------------------------------------------------------

def statements_of(plan: Schedule) -> list[Statement]:
    return [Statement(peer, sent, opcode, length)
            for sent, side in ((True, plan.sends), (False, plan.receives))
            for peer, lengths in side.items() for length in lengths for opcode in OPCODES]


def spans_of(plan: Schedule, k: int, rank: int, copies: int = 1) -> list[StreamSpan]:
    exact = [(peer, outgoing, copies * plan.stream_bytes(peer, outgoing))
             for peer in range(k) if peer != rank for outgoing in (True, False)]
    return [StreamSpan(peer, outgoing, size, size) for peer, outgoing, size in exact]


KINDS = sorted(gloo_model.MODELLED_KINDS)


@st.composite
def operations(draw):
    kind = draw(st.sampled_from(KINDS))
    k = draw(st.integers(2, 8))
    rank = draw(st.integers(0, k - 1))
    element = draw(st.sampled_from(gloo_model.ELEMENT_BYTES))
    elements = draw(st.one_of(st.integers(1, 40), st.integers(1, 5000), st.integers(1, 3_000_000)))
    root = draw(st.integers(0, k - 1)) if kind in gloo_model.ROOTED_KINDS else None
    chunked = kind in ("all_gather", "all_to_all", "gather", "scatter")
    size = 0 if kind == "barrier" else (k if chunked else 1) * elements * element
    return kind, size, element, k, rank, root


@settings(max_examples=400, deadline=None)
@given(operations(), st.integers(0, 2**32))
def test_fit_gives_the_tensor_back(operation, seed):
    kind, size, element, k, rank, root = operation
    plan = schedule(kind, size, element, k, rank, root)
    stated = statements_of(plan)
    if not stated and kind != "barrier":
        return                                   # nothing of it on this rank's capture
    assert fit(kind, k, rank, stated, spans_of(plan, k, rank)).tensor_bytes == size
    # A tenth of the statements lost: the sequence space still pins the schedule. (A seeded draw, not
    # Hypothesis's own random, which shrinks towards losing them all: with every statement of a ring's
    # segment length gone, nothing states the segment.)
    rng = random.Random(seed)
    kept = [statement for statement in stated if rng.random() > 0.1] or stated[:1]
    assert fit(kind, k, rank, kept, spans_of(plan, k, rank)).tensor_bytes == size


def test_concurrent_group_is_fitted_together():
    """Six all_reduces at once (a list reduce_scatter over 6 ranks): each one's bounds are loose, lost
    statements make a smaller tensor fit each alone, the group's joint bounds do not."""
    k, rank, size = 6, 3, 166
    plan = schedule("all_reduce", size, 2, k, rank)
    rng = random.Random(7)
    members = [[s for s in statements_of(plan) if rng.random() > 0.25] for _ in range(6)]
    loose = [StreamSpan(span.peer, span.outgoing, 0, 6 * span.high) for span in spans_of(plan, k, rank)]
    assert fit_group("all_reduce", k, rank, members, spans_of(plan, k, rank, copies=6)).tensor_bytes == size
    assert {fit("all_reduce", k, rank, member, loose).tensor_bytes for member in members} != {size}


def test_no_agreeing_schedule_is_no_fit():
    stated = [Statement(1, True, "SEND_UNBOUND_BUFFER", 100), Statement(1, True, "SEND_UNBOUND_BUFFER", 37)]
    assert fit("broadcast", 4, 0, stated, []) is None
