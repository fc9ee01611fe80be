"""NCCL collectives from the wire on generated jobs that follow NCCL 2.20.5's own schedules.

Truth: what the generator (tests/support/nccl_coll_gen.py) put on the wire, computed from NCCL's source (chunk,
step and slice rules, CTS offers, trees, send/recv chunks), not from the decoders; its schedule is pinned here
to the real captures' bytes and logs (pcaps/realcaps/softroce-tutorial) and to NCCL's step-count formula. The
captures go through the whole decode (`decode_paths`): RoCEv2 frames packed from the IBTA layouts (whole
ones cross-checked by tshark in test_roce.py), socket transport from tests/support/nccl_gen.py.
"""
from __future__ import annotations

import json

import pandas as pd
import pytest

from dlcsniff.decoders.job import decode_paths
from dlcsniff.decoders.protocols.nccl.collectives import GATHER_LIKE, PIPELINE
from tests.conftest import PCAPS
from tests.support.nccl_coll_gen import (NCCL_STEPS, RING_CHUNK_STEPS, RING_SLICE_STEPS, STEP_BYTES, Collective,
                                         btree, chunk_sends, p2p_sends, ring_all_reduce_sends, ring_gather_sends,
                                         roce_job, socket_job)
from tests.support.nccl_log import parse_nccl_log

REAL = PCAPS / "realcaps" / "softroce-tutorial" / "nccl"
WORLD_SIZES = range(2, 9)


def _ring_ops(n: int, scale: int = 1) -> list[Collective]:
    """Every ring kind, 1 byte to several MiB: uneven and even chunks, one loop and several, all_gather
    sizes per rank of a whole and a partial 2 MiB chunk, roots other than 0."""
    return [Collective("all_reduce", 1, es=1), Collective("all_reduce", 24576),
            Collective("all_gather", 4096 * 3 * n), Collective("reduce_scatter", 8192 * n),
            Collective("broadcast", 100_000, root=1 % n), Collective("reduce", 3_000_000 // scale, root=n - 1),
            Collective("all_reduce", 5_000_004 // scale // 4 * 4), Collective("all_gather", (3_000_000 // scale) * n, es=2),
            Collective("reduce_scatter", 4 * n), Collective("all_reduce", 24576)]


def _tree_ops(large: int = 5_000_004) -> list[Collective]:
    return [Collective("all_reduce", 1, es=1, algorithm="tree"), Collective("all_reduce", large, algorithm="tree"),
            Collective("all_reduce", 8, algorithm="tree")]


def _expected_kind(op: Collective, n: int) -> str:
    """What the wire can say: with two ranks nobody forwards or reduces what it received from another rank."""
    if n == 2 and op.kind in ("all_gather", "reduce_scatter"):
        return GATHER_LIKE
    if n == 2 and op.kind in ("broadcast", "reduce"):
        return PIPELINE
    return op.kind


def _collectives(job) -> pd.DataFrame:
    found = decode_paths(job.paths, workers=0).tables["collectives"].to_pandas()
    return found[found["protocol"].isin(["roce", "nccl_socket"])]


def _check(job, found: pd.DataFrame, *, ranks: bool = True) -> None:
    """Every rank's operations, in order, of the right kind, algorithm and size, nothing invented; its rank,
    the world size, complete, within the operation's time on the wire."""
    n = len(job.hosts)
    collective = found[found["algorithm"] != "p2p"]
    assert set(collective["local_address"]) == set(job.hosts)
    for rank, host in enumerate(job.hosts):
        mine = collective[collective["local_address"] == host].sort_values("seq")
        got = list(zip(mine["kind"], mine["algorithm"], mine["tensor_bytes"]))
        assert got == [(_expected_kind(op, n), op.algorithm, op.nbytes) for op in job.operations], (n, rank, got)
        assert set(mine["world_size"]) == {n} and mine["complete"].all()
        if ranks:
            assert set(mine["local_rank"]) == {rank}
        for (first_us, last_us), row in zip(job.spans_us, mine.itertuples()):
            assert first_us * 1000 <= row.ts_first_ns <= row.ts_last_ns <= last_us * 1000


# -- the generator against NCCL ----------------------------------------------------------------------------

def test_the_schedule_is_the_real_captures_and_nccls_step_counts():
    """Sends per connection on the real ring2 captures (barrier: 1 uint8; then 6144 float32), in FIFO order,
    equal the generator's schedule for the sending rank; send counts equal enqueue.cc computeCollSteps
    divided by sliceSteps; the generator's trees are the real logs' `Trees [0]` lines."""
    tables = decode_paths(sorted(REAL.glob("ring2_node*.pcap.gz")), workers=0).tables
    messages = tables["messages"].to_pandas()
    data = messages[(messages["protocol"] == "roce") & (messages["nccl_role"] == "data")
                    & (messages["capture"] == "ring2_node0")]
    logs = {log.host: log for log in map(parse_nccl_log, REAL.glob("ring2_node*.log"))}
    connections = data.sort_values("nccl_fifo_idx").groupby(["src_ip", "dst_ip"])["size_bytes"].apply(list)
    assert len(connections) == 2
    for (src, _), sizes in connections.items():
        rank = logs[src].rank
        want = ring_all_reduce_sends(3, rank, 1, 1) + ring_all_reduce_sends(3, rank, 6144, 4)
        assert sizes == [b for b, _ in want]
    for log in logs.values():
        parent, children = btree(3, log.rank)
        assert (parent, children) == (log.tree_parent, log.tree_children)

    chunk = STEP_BYTES * RING_CHUNK_STEPS
    for n in (2, 3, 8):
        for count in (1, 4097, chunk * n - 4, chunk * n * 3 + 12_345):
            steps = -(-count // (n * chunk)) * (n - 1) * 2 * RING_CHUNK_STEPS
            assert len(ring_all_reduce_sends(n, 1, count, 1)) == steps // RING_SLICE_STEPS
            steps = -(-count // chunk) * (n - 1) * RING_CHUNK_STEPS
            assert len(ring_gather_sends(n, count, 1)) == steps // RING_SLICE_STEPS
    assert [len(chunk_sends(count, 4)) for count in (1, STEP_BYTES // 4, STEP_BYTES // 4 + 1)] == [1, 1, 2]
    # send/recv (ncclProxyComputeP2p), worked out by hand: LL up to 16 KiB (16-byte lines of 8 data bytes),
    # then chunks of 32 KiB below 128 KiB, 64 KiB below 1 MiB, 128 KiB above, each CTS offering min(size, chunk)
    assert p2p_sends(0) == ([0], 0, True) and p2p_sends(1000) == ([2000], 2000, True)
    assert p2p_sends(20_000) == ([20_000], 20_000, False)
    assert p2p_sends(100_000) == ([32768, 32768, 32768, 1696], 32768, False)
    assert p2p_sends(2 << 20) == ([131072] * 16, 131072, False)
    assert NCCL_STEPS == 8


# -- RoCE ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", WORLD_SIZES)
def test_roce_ring_operations_of_every_kind(tmp_path, n):
    """A whole fabric's capture (a switch mirror), ranks starting each operation up to 300 µs apart: every
    rank's all_reduce, all_gather, reduce_scatter, broadcast and reduce, 1 byte to 5 MB, exactly."""
    job = roce_job(tmp_path / "ring.pcap", n, _ring_ops(n), skew_us=300, mtu=4096)
    found = _collectives(job)
    _check(job, found)
    roots = found[found["kind"].isin(["broadcast", "reduce"])].groupby("seq")["root_rank"].unique()
    if n > 2:                         # a pipeline's end shows its root, a middle rank the kind
        assert {seq: list(r) for seq, r in roots.items()} == {4: [1 % n], 5: [n - 1]}


@pytest.mark.parametrize("n", WORLD_SIZES)
def test_roce_tree_all_reduces(tmp_path, n):
    """Tree all_reduces on NCCL's binary tree, each rank's own capture (two ranks: one capture of both)."""
    job = roce_job(tmp_path / "tree.pcap", n, _tree_ops(), skew_us=300, mtu=4096, per_rank=n > 2)
    found = _collectives(job)
    _check(job, found)
    for rank in range(n):
        parent, children = btree(n, rank)
        row = found[found["local_address"] == job.hosts[rank]].iloc[0]
        tree = json.loads(row["evidence"])["channels"][0]["tree"]
        assert tree == "/".join(map(str, children + [-1] * (3 - len(children)))) + f"->{rank}->{parent}"


@pytest.mark.parametrize(("n", "algorithm"), [(2, "ring"), (8, "ring"), (5, "tree")])
def test_roce_64_mib(tmp_path, n, algorithm):
    """64 MiB: 16 ring loops on two ranks, 4 on eight; 128 tree chunks (data packets cut to 64 bytes)."""
    job = roce_job(tmp_path / "big.pcap", n, [Collective("all_reduce", 64 << 20, algorithm=algorithm)], mtu=4096,
                   snap=64, per_rank=algorithm == "tree")
    _check(job, _collectives(job))


def test_roce_send_recv(tmp_path):
    """send/recv on their own connections, empty to 3 MB (LL lines up to 16 KiB), after a barrier-like
    all_reduce that names every rank: each message once at its sender and once at its receiver."""
    n, sizes = 4, [0, 1000, 16384, 20_000, 300_000, 3_000_000]
    pairs = [(0, 1), (1, 0), (2, 3), (3, 1)]
    ops = [Collective("all_reduce", 1, es=1)] + [Collective("send", size, algorithm="p2p", peer=pairs[k % len(pairs)])
                                                  for k, size in enumerate(sizes)]
    job = roce_job(tmp_path / "p2p.pcap", n, ops, skew_us=200, mtu=4096)
    found = _collectives(job)
    p2p = found[found["algorithm"] == "p2p"]
    got = sorted(zip(p2p["local_rank"], p2p["kind"], p2p["peers"].map(list), p2p["tensor_bytes"]))
    want = sorted([(op.peer[0], "send", [op.peer[1]], op.nbytes) for op in ops[1:]]
                  + [(op.peer[1], "recv", [op.peer[0]], op.nbytes) for op in ops[1:]])
    assert got == want
    assert set(found[found["algorithm"] != "p2p"]["kind"]) == {"all_reduce"}


def _mixed_ops(n: int, scale: int = 1) -> list[Collective]:
    """Ring and tree operations in one job, as NCCL picks them per operation when NCCL_ALGO is not set."""
    return [Collective("all_reduce", 1, es=1, algorithm="tree"), Collective("all_reduce", 24576),
            Collective("all_reduce", 8, algorithm="tree"), Collective("all_gather", 4096 * 3 * n),
            Collective("all_reduce", 3_000_004 // scale // 4 * 4, algorithm="tree"),
            Collective("all_reduce", 5_000_004 // scale // 4 * 4), Collective("broadcast", 100_000, root=1 % n),
            Collective("all_reduce", 24576, algorithm="tree"), Collective("reduce_scatter", 8192 * n)]


@pytest.mark.parametrize("n", [3, 5, 8])
def test_roce_ring_and_tree_on_shared_connections(tmp_path, n):
    """Ring and tree operations on one channel, whose ring connections are also tree edges (NCCL keeps one
    connection per channel, peer and direction): each rank's own capture, every operation exactly."""
    job = roce_job(tmp_path / "mixed.pcap", n, _mixed_ops(n), skew_us=300, mtu=4096, per_rank=True)
    _check(job, _collectives(job))


def test_socket_transport_ring_and_tree_invents_nothing(tmp_path):
    """The stated limit on sockets: without CTS offers nothing says which connections are the ring's when they
    are also tree edges; such a channel is not parsed, and what was read before is right."""
    n = 5
    job = socket_job(tmp_path / "mixed.pcap", n, _mixed_ops(n, scale=20), skew_us=300, per_rank=True)
    found = _collectives(job)
    for host in job.hosts:
        mine = found[found["local_address"] == host].sort_values("seq")
        got = list(zip(mine["kind"], mine["algorithm"], mine["tensor_bytes"]))
        want = [(op.kind, op.algorithm, op.nbytes) for op in job.operations]
        assert got[-1][0] == "unknown" and got[:-1] == want[:len(got) - 1], (host, got)


def test_roce_a_lost_packet_spoils_only_its_operation(tmp_path):
    """The captures miss one packet in the middle of a 5 MB all_reduce's message: the RETH still gives the
    message's size, so every operation comes out the same; only that operation, at its sender and receiver,
    is incomplete."""
    n = 4
    ops = [Collective("all_reduce", 24576), Collective("all_reduce", 5_000_004), Collective("all_gather", 8192 * n)]
    job = roce_job(tmp_path / "lossy.pcap", n, ops, mtu=4096, per_rank=True, lose_in=1)
    found = _collectives(job)
    incomplete = found[~found["complete"].astype(bool)]
    assert list(incomplete["seq"]) == [1, 1] and set(incomplete["local_address"]) == set(job.lost)
    found = found.assign(complete=True)
    _check(job, found)


def test_roce_with_ib_set_up_connections(tmp_path):
    """Each connection's IB set-up TCP connection in the capture (magic + type 4, then both sides' metadata:
    QP numbers, GIDs, the CTS FIFO): it ties each data QP to the QP its CTS come on, two channels apart."""
    n = 4
    job = roce_job(tmp_path / "setup.pcap", n, _ring_ops(n, scale=4), channels=2, mtu=4096, set_up=True,
                   per_rank=True)
    tables = decode_paths(job.paths, workers=0).tables
    streams = tables["streams"].to_pandas()
    assert (streams["protocol"] == "nccl_ib_setup").sum() == 2 * 2 * n * 2      # 2 ends' captures, 2 channels
    roce = streams[streams["protocol"] == "roce"]
    assert roce["nccl_setup_flow_id"].notna().all()
    setup_of = dict(zip(roce["flow_id"], roce["nccl_setup_flow_id"]))
    by_qp = {(r.capture, r.src_ip, r.dst_ip, r.dest_qp): r.flow_id for r in roce.itertuples()}
    found = tables["collectives"].to_pandas()
    _check(job, found[found["protocol"] == "roce"])
    for row in found.itertuples():
        for connection in json.loads(row.evidence)["connections"]:      # "<sender>-><receiver> data qp D cts qp C"
            ends, qps = connection["connection"].split(" data qp ")
            sender, receiver = ends.split("->")
            data_qp, cts_qp = map(int, qps.split(" cts qp "))
            assert setup_of[by_qp[(row.capture, sender, receiver, data_qp)]] == \
                setup_of[by_qp[(row.capture, receiver, sender, cts_qp)]]


def test_roce_two_channels(tmp_path):
    """Two channels (each its own QP pair to the same peer): one collective runs on both, each its share;
    the rows merge them; a small one runs on channel 0 only."""
    n = 3
    ops = [Collective("all_reduce", 5_000_004), Collective("all_gather", 4096 * n), Collective("all_reduce", 1, es=1),
           Collective("reduce_scatter", (3 << 20) * n)]
    job = roce_job(tmp_path / "channels.pcap", n, ops, channels=2, skew_us=100, mtu=4096)
    found = _collectives(job)
    _check(job, found)
    assert list(found[found["local_address"] == job.hosts[0]].sort_values("seq")["channels"]) == [2, 1, 1, 2]


def test_roce_back_to_back_zero_tensors(tmp_path):
    """No idle time between operations, and tensors of zeros (a reduction changes no byte, so the payload tells
    nothing): operations still come apart by the CTS offers (the next operation's first offer follows the
    previous one's end). An all_reduce of equal chunks stays one; two equal all_gathers stay two, of a kind
    the wire cannot decide; full loops of two all_reduces stay apart."""
    n = 3
    ops = [Collective("all_reduce", 24576), Collective("all_reduce", 24576), Collective("all_gather", 8192 * n),
           Collective("all_gather", 8192 * n), Collective("all_reduce", 6 << 20), Collective("all_reduce", 6 << 20)]
    job = roce_job(tmp_path / "b2b.pcap", n, ops, idle_gap_us=0, mtu=4096, zeros=True)
    found = _collectives(job)
    for host in job.hosts:
        mine = found[found["local_address"] == host].sort_values("seq")
        assert list(zip(mine["kind"], mine["tensor_bytes"])) == [
            ("all_reduce", 24576), ("all_reduce", 24576), (GATHER_LIKE, 8192 * n), (GATHER_LIKE, 8192 * n),
            ("all_reduce", 6 << 20), ("all_reduce", 6 << 20)]


# -- socket transport ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("n", "nsocks"), [(2, 0), (3, 2), (5, 0)])
def test_socket_transport_ring_operations(tmp_path, n, nsocks):
    """The same inference on NCCL's socket transport (no CTS): kinds and sizes exactly; ranks from the ring
    chunk schedule of the uneven 1-byte all_reduce (the ring index, the rank on a ring in rank order)."""
    job = socket_job(tmp_path / "ring.pcap", n, _ring_ops(n, scale=4), nsocks=nsocks, skew_us=300)
    _check(job, _collectives(job))


def test_socket_transport_tree(tmp_path):
    """Tree all_reduces on sockets, each rank's own capture: kinds and sizes; no CTS names the ranks."""
    job = socket_job(tmp_path / "tree.pcap", 5, _tree_ops(1_500_004), skew_us=300, per_rank=True)
    found = _collectives(job)
    _check(job, found, ranks=False)
    assert found["local_rank"].isna().all()


def test_socket_transport_limit_full_loops_back_to_back(tmp_path):
    """The stated limit: without CTS (no offers, no offer times), an all_reduce whose loops are all full runs on
    into the next one, whatever the time between them (only the offers tell operations apart): three
    all_reduces, the first two of one full loop each, read as one of all three sizes; its last, uneven loop
    ends it."""
    n = 2
    full = (2 << 20) * n                     # one full loop: n chunks of 2 MiB
    job = socket_job(tmp_path / "b2b.pcap", n, [Collective("all_reduce", full), Collective("all_reduce", full),
                                                Collective("all_reduce", 24576)])
    found = _collectives(job)
    for host in job.hosts:
        mine = found[found["local_address"] == host].sort_values("seq")
        assert list(zip(mine["kind"], mine["tensor_bytes"])) == [("all_reduce", 2 * full + 24576)]
