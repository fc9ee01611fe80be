"""collectives_from_messages: hand-built message rows, and the four real Gloo captures checked against each
other and against the sizes the job's profiler recorded (traffic identities that hold exactly)."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from dlcsniff.decoders.protocols.gloo.collectives import COLUMNS, collectives_from_messages
from dlcsniff.decoders.protocols.gloo.decoder import GlooCaptureDecoder
from tests.conftest import PCAPS
from tests.support.protocol_driver import run_decoder

JOB = PCAPS / "gloo"
K = 4


def message(collective, seq, *, outgoing, peer, payload=0, ts=0, opcode="SEND_UNBOUND_BUFFER", tag=None, **extra):
    return {"protocol": "gloo", "collective": collective, "seq": seq, "tag": seq if tag is None else tag,
            "outgoing": outgoing, "peer_rank": peer, "world_size": K, "local_rank": 1, "ts_first_ns": ts,
            "ts_last_ns": ts + 5, "size_bytes": 48 + payload, "payload_bytes": payload, "complete": True,
            "opcode": opcode, **extra}


def test_ring_all_reduce_of_one_rank():
    # Rank 1 of 4, a 4096-byte tensor in 2k segments of 512 bytes: 12 go out to rank 0 (reduce-scatter
    # then all-gather, all but its own chunk each time), 12 come in from rank 2.
    rows = [message("all_reduce", 7, outgoing=True, peer=0, payload=512, ts=100 + i) for i in range(12)]
    rows += [message("all_reduce", 7, outgoing=False, peer=2, payload=512, ts=200 + i) for i in range(12)]
    rows += [message("all_reduce", 7, outgoing=False, peer=0, opcode="NOTIFY_RECV_READY", ts=50)]
    out = collectives_from_messages(pd.DataFrame(rows))
    assert list(out.columns) == COLUMNS and len(out) == 1
    row = out.iloc[0]
    assert (row["kind"], row["seq"], row["world_size"], row["algorithm"]) == ("all_reduce", 7, 4, "ring")
    assert (row["ts_first_ns"], row["ts_last_ns"]) == (50, 216)
    assert (row["payload_bytes_sent"], row["payload_bytes_received"]) == (6144, 6144)
    assert (row["wire_bytes_sent"], row["wire_bytes_received"]) == (6144 + 12 * 48, 6144 + 13 * 48)
    assert row["tensor_bytes"] == 4096 and row["peers"] == [0, 2] and row["messages"] == 25


@pytest.mark.parametrize(("kind", "payloads", "expected"), [
    ("all_to_all", [(True, 3, 1000), (False, 3, 1000)], 4000),       # 3 of 4 chunks each way
    ("all_gather", [(True, 6, 500), (False, 6, 500)], 4000),         # k-1 chunks of 1000, each in 2 halves
    ("broadcast", [(True, 2, 4000)], 4000),                          # every message is the tensor
    ("gather", [(True, 1, 1000)], 4000),                             # a non-root's chunk; output is k chunks
    ("barrier", [(True, 2, 0), (False, 2, 0)], 0),
])
def test_tensor_bytes_from_each_algorithm_volume(kind, payloads, expected):
    rows = [message(kind, 3, outgoing=out, peer=peer % 3 + (peer % 3 >= 1), payload=size)
            for out, count, size in payloads for peer in range(count)]
    assert collectives_from_messages(pd.DataFrame(rows)).iloc[0]["tensor_bytes"] == expected


def test_send_and_recv_are_numbered_per_peer_and_tag():
    rows = []
    for i, ts in enumerate((100, 300)):           # two sends to rank 2 with tag 7
        rows += [message("p2p", None, outgoing=True, peer=2, opcode="NOTIFY_SEND_READY", tag=7, ts=ts),
                 message("p2p", None, outgoing=False, peer=2, opcode="NOTIFY_RECV_READY", tag=7, ts=ts + 10),
                 message("p2p", None, outgoing=True, peer=2, payload=1000 * (i + 1), tag=7, ts=ts + 20)]
    rows += [message("p2p", None, outgoing=True, peer=2, opcode="NOTIFY_SEND_READY", tag=9, ts=150),
             message("p2p", None, outgoing=True, peer=2, payload=64, tag=9, ts=160)]
    # a receive from rank 0: its data comes in, its RECV_READY goes out
    rows += [message("p2p", None, outgoing=False, peer=0, opcode="NOTIFY_SEND_READY", tag=7, ts=400),
             message("p2p", None, outgoing=True, peer=0, opcode="NOTIFY_RECV_READY", tag=7, ts=410),
             message("p2p", None, outgoing=False, peer=0, payload=333, tag=7, ts=420)]
    out = collectives_from_messages(pd.DataFrame(rows))
    got = sorted((r.kind, r.seq, tuple(r.peers), r.tensor_bytes, r.messages, r.algorithm) for r in out.itertuples())
    assert got == [("recv", 0, (0,), 333, 3, "p2p"), ("send", 0, (2,), 64, 2, "p2p"),
                   ("send", 0, (2,), 1000, 3, "p2p"), ("send", 1, (2,), 2000, 3, "p2p")]


def test_send_without_opcodes_is_one_operation_per_message():
    rows = [message("p2p", None, outgoing=True, peer=3, payload=100 * (i + 1), tag=0, ts=i) for i in range(2)]
    out = collectives_from_messages(pd.DataFrame(rows).drop(columns="opcode"))
    assert [(r.kind, r.seq, r.tensor_bytes) for r in out.itertuples()] == [("send", 0, 100), ("send", 1, 200)]


def test_missing_world_size_comes_from_the_peers_and_algorithm_column_wins():
    rows = [message("all_to_all", 1, outgoing=out, peer=p, payload=100, world_size=None, algorithm="custom")
            for p in (0, 2, 3) for out in (True, False)]
    row = collectives_from_messages(pd.DataFrame(rows)).iloc[0]
    assert (row["world_size"], row["algorithm"], row["tensor_bytes"]) == (4, "custom", 400)


def test_direction_unknown_counts_neither_way_and_captures_stay_apart():
    rows = [message("broadcast", 2, outgoing=None, peer=None, payload=10, capture="a"),
            message("broadcast", 2, outgoing=True, peer=3, payload=10, capture="b")]
    out = collectives_from_messages(pd.DataFrame(rows)).set_index("capture")
    assert out.loc["a", "wire_bytes_sent"] == 0 and out.loc["a", "wire_bytes_received"] == 0
    assert out.loc["a", "peers"] == [] and out.loc["b", "peers"] == [3]


def test_no_collective_messages_give_an_empty_table():
    rows = [{"protocol": "tcpstore", "collective": None, "size_bytes": 10}]
    out = collectives_from_messages(pd.DataFrame(rows))
    assert out.empty and list(out.columns) == COLUMNS


# -- the real job: every message is in two captures, and the ring/pairwise volumes are exact -------------

@pytest.fixture(scope="module")
def job_collectives() -> pd.DataFrame:
    frames = []
    for rank in range(K):
        rows, _ = run_decoder(JOB / f"rank{rank}.pcap.gz", GlooCaptureDecoder())
        frames.append(pd.DataFrame(rows.messages).assign(capture=f"rank{rank}"))
    messages = pd.concat(frames, ignore_index=True)
    return collectives_from_messages(messages[messages["protocol"] == "gloo"])


@pytest.fixture(scope="module")
def works() -> dict[int, dict]:
    """tag -> the Gloo work rank 0's profiler saw, with its input bytes (float32)."""
    record = json.loads((JOB / "rank0.json").read_text())
    out = {}
    for operation in record["operations"]:
        collective = [work for work in operation["gloo_works"] if work["name"] not in ("send", "recv")]
        for work, tag in zip(collective, operation["gloo_tags"]):
            out[tag] = {**work, "bytes": 4 * sum(math.prod(shape) for shape in work["input_shapes"])}
    return out


def test_what_one_rank_sends_another_receives(job_collectives):
    collectives = job_collectives[~job_collectives["kind"].isin(["send", "recv"])]
    totals = collectives.groupby(["kind", "seq"])[["payload_bytes_sent", "payload_bytes_received",
                                                   "wire_bytes_sent", "wire_bytes_received"]].sum()
    assert (totals["payload_bytes_sent"] == totals["payload_bytes_received"]).all()
    assert (totals["wire_bytes_sent"] == totals["wire_bytes_received"]).all()
    assert (collectives.groupby(["kind", "seq"])["capture"].nunique() == K).all()
    p2p = job_collectives[job_collectives["kind"].isin(["send", "recv"])]
    sent = p2p[p2p["kind"] == "send"]["payload_bytes_sent"].sum()
    assert sent == p2p[p2p["kind"] == "recv"]["payload_bytes_received"].sum() and sent > 0


def test_ring_and_pairwise_volumes_match_the_recorded_tensors_exactly(job_collectives, works):
    totals = job_collectives.groupby(["kind", "seq"])["payload_bytes_sent"].sum()
    checked = 0
    for (kind, seq), sent in totals.items():
        if kind == "all_reduce":           # ring: every rank forwards all chunks but its own, twice
            assert sent == 2 * (K - 1) * works[seq]["bytes"], seq
        elif kind == "all_to_all":         # every rank keeps 1/k of its input
            assert sent == K * (K - 1) * works[seq]["bytes"] // K, seq
        elif kind == "all_gather":         # every rank's input travels to the k-1 others
            assert sent == K * (K - 1) * works[seq]["bytes"], seq
        else:
            continue
        assert works[seq]["name"] == kind
        checked += 1
    assert checked >= 10


def test_every_rank_agrees_on_each_collective(job_collectives):
    collectives = job_collectives[~job_collectives["kind"].isin(["send", "recv"])]
    per_collective = collectives.groupby(["kind", "seq"])
    assert (per_collective["world_size"].nunique() == 1).all()
    assert (per_collective["algorithm"].nunique() == 1).all()
    assert sorted(collectives["local_rank"].unique()) == list(range(K))
    spread = per_collective["tensor_bytes"].agg(lambda sizes: sizes.max() - sizes.min())
    largest = per_collective["tensor_bytes"].max()
    assert (spread <= 0.02 * largest).all()
