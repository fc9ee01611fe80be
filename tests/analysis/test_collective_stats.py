"""Collective statistics (analysis.collective_stats) and their place in `stats` and `report`.

Ground truth: the real 4-rank PyTorch Gloo job (pcaps/gloo) and each rank's own record of its operations
(rank<k>.json: kind, Gloo tags, bytes, and the call and return times on the host clock the captures share).
The bandwidths are recomputed here from the record's sizes and the raw message rows with nccl-tests'
factors written out independently; the interval logic is checked against a plain sweep, on the real job and
on random intervals. `stats` and `report` run on a ps-lite job, the Gloo job, and a job holding both (the
two real decodes merged into one directory, with capture clocks for the Gloo ranks).
"""
from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from dlcsniff.analysis import collective_statistics, collective_statistics_of, load_collectives, load_job_model
from dlcsniff.analysis.collective_stats import (
    OPERATION_COLUMNS, RANK_COLUMNS, SEND_RECV, bus_factor, collective_traffic, communication_overlap, concurrency,
    volume_matrix,
)
from dlcsniff.analysis.load import CollectiveDataset
from dlcsniff.analysis.stats_graph import statistics
from dlcsniff.analysis.summary import summary_json
from dlcsniff.cli import app
from tests.conftest import PCAPS

RANKS = [0, 1, 2, 3]
WORLD = 4
PCAP_RESOLUTION_NS = 1000           # pcap timestamps are whole microseconds
COLLECTIVE_TABLES = {"collective_stats", "collective_ranks", "collective_traffic", "collective_concurrency",
                     "collective_overlap"}
PSLITE_TABLES = {"iterations", "keys", "sizes", "traffic", "volume_iterations", "volume_keys"}
JOB_TABLES = {"requests", "in_flight", "connections", "key_updates"}
# every job's network behaviour (analysis/network_behaviour.py), and its arrival lags' figure
NETWORK_TABLES = {"arrivals", "arrival_spread", "link_health", "burstiness", "on_off", "incast", "size_distributions",
                  "roce_paths", "roce_collectives"}
NETWORK_FIGURES = {"arrival_lags"}
# whatif: a job with training iterations gets the what-if curve (dlcsniff simulate on SimGrid)
PSLITE_FIGURES = {"message_sizes", "iterations", "key_overheads", "traffic", "timeline", "whatif"}
COLLECTIVE_FIGURES = {"collective_times", "collective_bandwidth", "collective_skew", "collective_matrix",
                      "collective_timeline"}
# nccl-tests src/*.cu GetBw: busBw = algBw * factor, for n ranks
NCCL_TESTS_FACTORS = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
                      "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
                      "gather": lambda n: (n - 1) / n, "scatter": lambda n: (n - 1) / n,
                      "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, SEND_RECV: lambda n: 1.0}

runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def gloo_dir(decoded_job) -> Path:
    return decoded_job("gloo")


@pytest.fixture(scope="module")
def mxnet_dir(decoded_job) -> Path:
    return decoded_job("mxnet_sync")


@pytest.fixture(scope="module")
def raw_gloo_dir(gloo_dir, tmp_path_factory) -> Path:
    """The Gloo job's decode output without its clocks: every rank's times as its capture took them, on the
    host clock the records share (the ground truth below is on that clock)."""
    out = tmp_path_factory.mktemp("gloo-raw")
    for path in gloo_dir.iterdir():
        if path.name != "clocks.parquet":
            shutil.copy(path, out / path.name)
    return out


@pytest.fixture(scope="module")
def stats(raw_gloo_dir):
    return collective_statistics_of(load_job_model(raw_gloo_dir))


def test_aligned_times_stay_within_the_clocks_bounds(gloo_dir, stats):
    """The decode aligns the ranks' captures from the Gloo and TCPStore messages seen at both ends; all four
    were taken on one host's clock, so the correction it applies is an error, within the bound it states."""
    clocks = pd.read_parquet(gloo_dir / "clocks.parquet").set_index("capture")
    assert clocks["aligned"].all() and (clocks["reference"] == "rank0").all() and clocks["consistent"].all()
    assert (clocks.drop("rank0")["messages_used"] > 100).all()
    aligned = collective_statistics_of(load_job_model(gloo_dir))
    assert aligned.summary["clock"]["aligned"] == [f"rank{r}" for r in RANKS]
    both = aligned.ranks.merge(stats.ranks, on=["op", "rank"], suffixes=("", "_raw"))
    assert len(both) == len(stats.ranks) == len(aligned.ranks)
    bound = both["capture"].map(clocks["error_bound_ns"]).to_numpy(np.int64) + PCAP_RESOLUTION_NS
    for edge in ("ts_first_ns", "ts_last_ns"):
        assert ((both[edge] - both[f"{edge}_raw"]).abs().to_numpy(np.int64) <= bound).all()


@pytest.fixture(scope="module")
def recorded() -> pd.DataFrame:
    """One row per Gloo operation per rank as the rank recorded it; a reduce_scatter runs as one all-reduce
    per Gloo tag (PyTorch's Gloo backend), each carrying its share of the tensor."""
    rows = []
    for rank in RANKS:
        record = json.loads((PCAPS / "gloo" / f"rank{rank}.json").read_text())
        assert record["world_size"] == WORLD
        for op in record["operations"]:
            tags = op["gloo_tags"]
            for tag in tags:
                rows.append({"rank": rank, "kind": op["kind"], "seq": tag, "call_ns": op["start_ns"],
                             "return_ns": op["end_ns"], "tensor_bytes": op["tensor_bytes"] // len(tags),
                             "input_bytes": op["input_bytes"], "output_bytes": op["output_bytes"],
                             "wire_kind": "all_reduce" if op["kind"] == "reduce_scatter" else op["kind"]})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def recorded_p2p() -> pd.DataFrame:
    """Sends and receives: (source, destination, n-th transfer between them) with both ends' records."""
    rows = []
    for rank in RANKS:
        record = json.loads((PCAPS / "gloo" / f"rank{rank}.json").read_text())
        for op in record["operations"]:
            if op["kind"] in ("send", "recv"):
                src, dst = (rank, op["peer"]) if op["kind"] == "send" else (op["peer"], rank)
                rows.append({"rank": rank, "src_rank": src, "dst_rank": dst, "order": op["order"],
                             "call_ns": op["start_ns"], "return_ns": op["end_ns"], "tensor_bytes": op["tensor_bytes"]})
    table = pd.DataFrame(rows).sort_values("order")
    table["seq"] = table.groupby(["rank", "src_rank", "dst_rank"]).cumcount()
    return table


# -- the real Gloo job ---------------------------------------------------------------------------------------

def test_every_recorded_operation_is_one_operation_seen_at_its_ranks(stats, recorded, recorded_p2p):
    operations = stats.operations
    assert tuple(operations.columns) == OPERATION_COLUMNS and tuple(stats.ranks.columns) == RANK_COLUMNS
    collectives = operations[operations["kind"] != SEND_RECV].set_index("seq").sort_index()
    truth = recorded.groupby("seq")[["wire_kind", "tensor_bytes"]].first()
    assert collectives.index.tolist() == truth.index.tolist()
    assert collectives["kind"].tolist() == truth["wire_kind"].tolist()
    assert (collectives["ranks_seen"] == WORLD).all() and collectives["complete"].all()
    transfers = operations[operations["kind"] == SEND_RECV]
    assert sorted(zip(transfers["src_rank"], transfers["dst_rank"], transfers["seq"])) == sorted(
        set(zip(recorded_p2p["src_rank"], recorded_p2p["dst_rank"], recorded_p2p["seq"])))
    assert (transfers["ranks_seen"] == 2).all()
    assert stats.summary["losses"] == {"incomplete_collectives": 0, "collectives_not_seen_at_every_rank": 0,
                                       "collective_messages_without_ranks": 0}


def test_times_are_bounded_by_the_ranks_own_calls_and_returns(stats, recorded, recorded_p2p):
    """On its wire, a rank's part of an operation ends before its own call returns, and nothing of it can
    start before the first rank called."""
    ranks = stats.ranks
    p2p = ranks["kind"] == SEND_RECV
    ends = pd.concat([
        ranks[~p2p].merge(recorded, on=["rank", "seq"]),
        ranks[p2p].merge(stats.operations[["op", "src_rank", "dst_rank"]], on="op").merge(
            recorded_p2p, on=["rank", "src_rank", "dst_rank", "seq"])])
    assert len(ends) == len(ranks)
    assert (ends["ts_last_ns"] <= ends["return_ns"]).all()
    first_call = ends.groupby("op")["call_ns"].transform("min")
    assert (ends["ts_first_ns"] >= first_call - PCAP_RESOLUTION_NS).all()
    assert (ends["time_ns"] >= 0).all() and (ends["time_ns"] <= ends["return_ns"] - first_call + PCAP_RESOLUTION_NS).all()
    spans = ends.groupby("op").agg(first_call=("call_ns", "min"), last_return=("return_ns", "max"))
    operations = stats.operations.set_index("op").join(spans)
    assert (operations["ts_first_ns"] >= operations["first_call"] - PCAP_RESOLUTION_NS).all()
    assert (operations["ts_last_ns"] <= operations["last_return"]).all()


def test_bus_bandwidth_recomputed_from_the_record_and_the_raw_messages(gloo_dir, stats, recorded):
    """S from the ranks' records (nccl-tests' size: the all-gather's and gather's gathered output, the
    all-to-all's per-rank input, the others' tensor), t from messages.parquet (first byte of the operation's
    first message to the last byte of its last, over every capture), factors from nccl-tests."""
    messages = pq.read_table(gloo_dir / "messages.parquet", columns=["collective", "seq", "ts_first_ns",
                                                                     "ts_last_ns"]).to_pandas()
    messages = messages[messages["collective"].notna() & (messages["collective"] != "p2p")]
    spans = messages.groupby("seq").agg(first=("ts_first_ns", "min"), last=("ts_last_ns", "max"))
    truth = recorded.groupby("seq").agg(kind=("wire_kind", "first"), size=("tensor_bytes", "first"),
                                        input_bytes=("input_bytes", "first"))
    truth["size"] = np.where(truth["kind"] == "all_to_all", truth["input_bytes"], truth["size"])
    truth = truth.join(spans)
    moved = truth[truth["size"] > 0]
    expected = [moved["size"].loc[seq] / (moved["last"].loc[seq] - moved["first"].loc[seq]) * 1e9 / 1e9
                * NCCL_TESTS_FACTORS[moved["kind"].loc[seq]](WORLD) for seq in moved.index]
    found = stats.operations[stats.operations["kind"] != SEND_RECV].set_index("seq")
    assert found.loc[moved.index, "busbw_gb_per_s"].to_numpy() == pytest.approx(expected, rel=0.02)
    assert found.loc[moved.index, "time_ns"].tolist() == (moved["last"] - moved["first"]).tolist()
    assert found.loc[truth.index[truth["size"] == 0], "busbw_gb_per_s"].isna().all()   # barriers
    transfers = stats.operations[stats.operations["kind"] == SEND_RECV]
    assert (transfers["busbw_gb_per_s"] == transfers["algbw_gb_per_s"]).all()
    assert (transfers["algbw_gb_per_s"] * transfers["time_ns"]).to_numpy() == pytest.approx(
        transfers["size_bytes"].to_numpy(), rel=1e-9)


def test_all_to_all_matrix_sums_are_what_each_rank_recorded(stats, recorded):
    """Each rank sends (n−1)/n of its input and receives (n−1)/n of its output over the network; its own
    chunk stays home."""
    matrix = volume_matrix(stats.traffic, RANKS, "all_to_all")
    per_rank = recorded[recorded["kind"] == "all_to_all"].groupby("rank")[["input_bytes", "output_bytes"]].sum()
    assert matrix.sum(axis=1).tolist() == (per_rank["input_bytes"] * (WORLD - 1) // WORLD).tolist()
    assert matrix.sum(axis=0).tolist() == (per_rank["output_bytes"] * (WORLD - 1) // WORLD).tolist()
    assert (np.diag(matrix.to_numpy()) == 0).all()
    volume = stats.summary["volume"]
    assert volume["all_to_all_bytes"] == int(matrix.to_numpy().sum())
    assert volume["all_reduce_bytes"] == int(volume_matrix(stats.traffic, RANKS, "all_reduce").to_numpy().sum())


def test_a_rank_without_capture_leaves_the_matrices_whole(raw_gloo_dir, stats):
    """Every message of rank 2 was also seen at its peers: without rank 2's capture the traffic is the
    same, seen at one end only, and every operation rank 2 took part in is reported as not seen there."""
    full = load_collectives(raw_gloo_dir)
    without = CollectiveDataset(collectives=full.collectives[full.collectives["capture"] != "rank2"],
                                messages=full.messages[full.messages["capture"] != "rank2"], source="no rank2")
    partial = collective_statistics(without)
    for kind in ("all_to_all", None):
        assert volume_matrix(partial.traffic, RANKS, kind).equals(volume_matrix(stats.traffic, RANKS, kind))
    involved = (partial.traffic["src_rank"] == 2) | (partial.traffic["dst_rank"] == 2)
    assert set(partial.traffic.loc[involved, "seen_at"]) == {"sender", "receiver"}
    assert set(partial.traffic.loc[~involved, "seen_at"]) == {"both"}
    operations = stats.operations
    with_rank2 = (operations["kind"] != SEND_RECV) | (operations["src_rank"] == 2) | (operations["dst_rank"] == 2)
    assert partial.summary["losses"]["collectives_not_seen_at_every_rank"] == int(with_rank2.sum())


def test_skew_is_the_spread_of_the_ranks_starts_and_ends(stats):
    operations = stats.operations
    start, end = operations["start_skew_ns"].to_numpy(np.int64), operations["end_skew_ns"].to_numpy(np.int64)
    assert (start >= 0).all() and (end >= 0).all()
    assert (start <= operations["time_ns"]).all() and (end <= operations["time_ns"]).all()
    per_op = stats.ranks.groupby("op").agg(first=("ts_first_ns", "min"), last=("ts_first_ns", "max"),
                                           first_end=("ts_last_ns", "min"), last_end=("ts_last_ns", "max"))
    by_op = operations.set_index("op").loc[per_op.index]
    assert (by_op["start_skew_ns"] == per_op["last"] - per_op["first"]).all()
    assert (by_op["end_skew_ns"] == per_op["last_end"] - per_op["first_end"]).all()
    # rank 0 joined the first all-reduce last: the others waited for it at rendezvous
    first = stats.ranks[stats.ranks["op"] == "all_reduce#0"].set_index("rank")["start_lag_ns"]
    assert first.idxmax() == 0 and first.max() == by_op.loc["all_reduce#0", "start_skew_ns"]
    assert stats.summary["clock"]["aligned"] == [] and stats.summary["clock"]["raw"] == [f"rank{r}" for r in RANKS]


def _union_length(intervals: list[tuple[int, int]]) -> int:
    """Time covered by the intervals, walking them sorted and merging the ones that meet."""
    covered, merged = 0, None
    for start, end in sorted(intervals):
        if merged is None or start > merged[1]:
            covered += 0 if merged is None else merged[1] - merged[0]
            merged = [start, end]
        else:
            merged[1] = max(merged[1], end)
    return covered + (0 if merged is None else merged[1] - merged[0])


def _sweep_union(intervals: list[tuple[int, int]]) -> tuple[int, int]:
    """(time covered by one interval or more, by two or more: the union of the pairwise intersections)."""
    pairs = [(max(a[0], b[0]), min(a[1], b[1])) for i, a in enumerate(intervals) for b in intervals[i + 1:]]
    return _union_length(intervals), _union_length([(s, e) for s, e in pairs if e > s])


def test_communication_and_gaps_per_rank_against_a_plain_sweep(stats, recorded):
    overlap = stats.overlap.set_index("rank")
    for rank, mine in stats.ranks.groupby("rank"):
        covered, doubled = _sweep_union(list(zip(mine["ts_first_ns"], mine["ts_last_ns"])))
        row = overlap.loc[rank]
        assert (row["communication_ns"], row["concurrent_ns"]) == (covered, doubled)
        wall = mine["ts_last_ns"].max() - mine["ts_first_ns"].min()
        assert row["communication_ns"] + row["gap_ns"] == row["wall_ns"] == wall
        assert row["communication_fraction"] == pytest.approx(covered / row["wall_ns"])
    # The one call that ran several Gloo operations at once, a reduce_scatter of a list (one all-reduce per
    # tag), holds most of the time with two or more in flight: from the first rank's call (peers' messages
    # open an operation on a rank's wire before it calls) to the rank's return. The rest: a fast peer's first
    # message of the next operation arriving as the rank's previous one ends.
    several = recorded[recorded["kind"] == "reduce_scatter"].groupby(["rank", "call_ns", "return_ns"]).size()
    windows = several[several > 1].reset_index().set_index("rank")
    crowded = stats.concurrency[stats.concurrency["in_flight"] > 1]
    inside = ((crowded["ts_first_ns"] >= windows["call_ns"].min() - PCAP_RESOLUTION_NS)
              & (crowded["ts_last_ns"] <= crowded["rank"].map(windows["return_ns"])))
    length = crowded["ts_last_ns"] - crowded["ts_first_ns"]
    per_rank = length[inside].groupby(crowded["rank"]).sum() / length.groupby(crowded["rank"]).sum()
    assert per_rank.index.tolist() == RANKS and (per_rank > 0.9).all()


# -- hand-built inputs ---------------------------------------------------------------------------------------

def _rank_rows(intervals: list[tuple[int, int, int]]) -> pd.DataFrame:
    rank, start, end = (np.array(values, dtype=np.int64) for values in zip(*intervals)) if intervals else (
        np.array([], dtype=np.int64),) * 3
    return pd.DataFrame({"capture": [f"rank{r}" for r in rank], "rank": rank, "ts_first_ns": start, "ts_last_ns": end,
                         "time_ns": end - start})


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 60), st.integers(0, 15)), min_size=1, max_size=25))
def test_concurrency_matches_a_sweep_on_random_intervals(raw):
    rows = _rank_rows([(rank, start, start + length) for rank, start, length in raw])
    segments = concurrency(rows)
    overlap = communication_overlap(rows, segments).set_index("rank")
    for rank, mine in rows.groupby("rank"):
        covered, doubled = _sweep_union(list(zip(mine["ts_first_ns"], mine["ts_last_ns"])))
        wall = mine["ts_last_ns"].max() - mine["ts_first_ns"].min()
        assert overlap.loc[rank, ["communication_ns", "concurrent_ns", "wall_ns"]].tolist() == [covered, doubled, wall]
        own = segments[segments["rank"] == rank]
        assert (own["ts_last_ns"] > own["ts_first_ns"]).all() and (own["in_flight"].diff().iloc[1:] != 0).all()
        # the segments tile the rank's wall time exactly
        assert (own["ts_first_ns"].iloc[1:].to_numpy() == own["ts_last_ns"].iloc[:-1].to_numpy()).all()
        assert int((own["ts_last_ns"] - own["ts_first_ns"]).sum()) == wall


def test_back_to_back_collectives_leave_no_gap_and_no_overlap():
    rows = _rank_rows([(0, 0, 10), (0, 10, 20), (0, 25, 30), (0, 26, 28)])
    segments = concurrency(rows)
    assert segments[["ts_first_ns", "ts_last_ns", "in_flight"]].values.tolist() == [
        [0, 20, 1], [20, 25, 0], [25, 26, 1], [26, 28, 2], [28, 30, 1]]
    row = communication_overlap(rows, segments).iloc[0]
    assert (row["gaps"], row["gap_ns"], row["longest_gap_ns"], row["concurrent_ns"], row["collective_ns"]) == (
        1, 5, 5, 2, 27)
    assert row["concurrent_fraction"] == pytest.approx(2 / 25)


@pytest.mark.parametrize(("n", "factors"), [
    (2, {"all_reduce": 1.0, "all_gather": 0.5, "all_to_all": 0.5, "broadcast": 1.0, "reduce_scatter": 0.5}),
    (4, {"all_reduce": 1.5, "all_gather": 0.75, "all_to_all": 0.75, "gather": 0.75, "scatter": 0.75,
         "reduce": 1.0}),
    (8, {"all_reduce": 1.75, "reduce_scatter": 0.875, SEND_RECV: 1.0}),
])
def test_bus_factors_are_nccl_tests(n, factors):
    kinds = list(factors)
    assert bus_factor(np.array(kinds, dtype=object), np.full(len(kinds), n)).tolist() == list(factors.values())
    assert np.isnan(bus_factor(np.array(["barrier"], dtype=object), np.array([n]))).all()


def _messages(rows: list[tuple]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["capture", "outgoing", "src_rank", "dst_rank", "payload_bytes"]).assign(
        protocol="gloo", pg="g", collective="all_to_all", seq=7.0, size_bytes=lambda t: t["payload_bytes"] + 48)


def test_traffic_counts_a_message_once_from_the_fuller_end():
    messages = _messages([
        ("rank0", True, 0, 1, 100), ("rank1", False, 0, 1, 60),      # the receiver lost part of it
        ("rank1", True, 1, 0, 30), ("rank0", False, 1, 0, 30),       # seen whole at both ends
        ("rank1", True, 1, 2, 50),                                   # rank 2 not captured
        ("rank0", False, 3, 0, 20),                                  # rank 3 not captured
        ("rank0", None, 0, 2, 999), ("rank0", True, None, 2, 999),   # unusable rows
    ])
    traffic = collective_traffic(messages)
    found = {(s, d): (b, seen) for s, d, b, seen in zip(traffic["src_rank"], traffic["dst_rank"],
                                                        traffic["payload_bytes"], traffic["seen_at"])}
    assert found == {(0, 1): (100, "both"), (1, 0): (30, "both"), (1, 2): (50, "sender"), (3, 0): (20, "receiver")}
    assert volume_matrix(traffic, [0, 1, 2, 3]).to_numpy().tolist() == [
        [0, 100, 0, 0], [30, 0, 50, 0], [0, 0, 0, 0], [20, 0, 0, 0]]


def test_what_a_capture_cannot_tell_stays_unknown():
    """A capture without the rendezvous (rank unknown), a size the decoder could not recover, a send whose
    peer is unknown, no message with both ranks: statistics as far as the data go, and a summary that is
    strict JSON."""
    collectives = pd.DataFrame({
        "protocol": "gloo", "capture": ["a", "a", "b"], "pg": None, "kind": ["all_reduce", "send", "all_reduce"],
        "seq": [0, 0, 0], "world_size": pd.array([2, None, 2], dtype="Int32"),
        "local_rank": pd.array([None, None, 1], dtype="Int32"), "ts_first_ns": [10, 30, 12], "ts_last_ns": [20, 30, 25],
        "wire_bytes_sent": 1, "wire_bytes_received": 1, "tensor_bytes": pd.array([None, 5, 100], dtype="Int64"),
        "peers": [np.array([1]), np.array([], dtype=np.int64), np.array([0])], "algorithm": ["ring", "p2p", "ring"],
        "messages": 1, "complete": [True, False, True]})
    stats = collective_statistics(CollectiveDataset(collectives=collectives, messages=_messages([]), source="hand"))
    operations = stats.operations.set_index("op")
    assert operations.index.tolist() == ["all_reduce#0", "send_recv ?→?#0"]
    assert operations.loc["all_reduce#0", ["size_bytes", "time_ns", "start_skew_ns", "end_skew_ns"]].tolist() == [
        100, 15, 2, 5]
    assert operations.loc["all_reduce#0", "busbw_gb_per_s"] == pytest.approx(100 / 15 * 2 * (2 - 1) / 2)
    assert np.isnan(operations.loc["send_recv ?→?#0", "busbw_gb_per_s"])          # no time on the wire
    assert pd.isna(operations.loc["send_recv ?→?#0", "start_skew_ns"])            # one end seen
    assert stats.ranks["rank"].tolist() == [-1, 1, -1] and len(stats.traffic) == 0
    assert stats.summary["losses"] == {"incomplete_collectives": 1, "collectives_not_seen_at_every_rank": 1,
                                       "collective_messages_without_ranks": 0}
    assert json.loads(summary_json(statistics("hand", trace=None, collectives=stats)))["collectives"]


# -- stats and report ----------------------------------------------------------------------------------------

def _pngs(page: str) -> dict[str, bytes]:
    """figure name → the PNG the page shows for it (the figures it does not draw interactively)."""
    found = re.findall(r"<figure id='([^']+)'><figcaption>.*?</figcaption>"
                       r"<img alt='[^']*' src='data:image/png;base64,([^']+)'>", page)
    return {name: base64.b64decode(data) for name, data in found}


def _report(decode_dir: Path, tmp_path: Path) -> set[str]:
    """The report's figures: each drawn in the page (a PNG, or interactive charts) and as a PNG file."""
    result = invoke("report", decode_dir, "--out", tmp_path / "report.html", "--figures", tmp_path / "figures")
    assert result.exit_code == 0, result.output
    page = (tmp_path / "report.html").read_text()
    figures = re.findall(r"<figure id='([^']+)'>", page)
    files = {path.stem: path.read_bytes() for path in (tmp_path / "figures").glob("*.png")}
    assert set(files) == set(figures) and len(figures) == len(set(figures))
    embedded = _pngs(page)
    assert embedded == {name: files[name] for name in embedded}
    interactive = set(re.findall(r"<div class='chart' id='([a-z_]+)-\d+-chart'", page))
    assert interactive | set(embedded) == set(figures) and not interactive & set(embedded)
    assert all(png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000 for png in files.values())
    return set(figures)


def _stats(decode_dir: Path, out: Path) -> dict:
    result = invoke("stats", decode_dir, "--out", out, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_stats_and_report_of_the_gloo_job(gloo_dir, tmp_path):
    summary = _stats(gloo_dir, tmp_path / "stats")
    written = {path.stem for path in (tmp_path / "stats").glob("*.parquet")}
    # of the merged view's tables only the connections: requests and key updates are ps-lite's
    assert written == COLLECTIVE_TABLES | {"connections"} | NETWORK_TABLES and "statistics" not in summary
    assert "latency" not in summary and summary["merge"]["events_seen_at_both_ends"] == summary["merge"]["events"]
    section = summary["collectives"]
    assert section["operations"] == 28 and section["ranks"] == RANKS
    assert set(section["by_kind"]) == {"all_reduce", "all_to_all", "broadcast", "all_gather", "reduce", "gather",
                                       "scatter", "barrier", SEND_RECV}
    assert section["by_kind"]["barrier"]["busbw_gb_per_s"] is None
    table = pd.read_parquet(tmp_path / "stats" / "collective_stats.parquet")
    assert tuple(table.columns) == OPERATION_COLUMNS and len(table) == 28
    refused = invoke("stats", gloo_dir, "--out", tmp_path / "stats")        # another run's output is there
    assert refused.exit_code == 1 and "--force" in refused.output
    terminal = invoke("stats", gloo_dir, "--out", tmp_path / "stats", "--force")
    assert terminal.exit_code == 0 and "all-to-all / all-reduce bytes" in terminal.stdout
    assert "SketchDLC" not in terminal.stdout and "busbw" in terminal.stdout
    assert set(_report(gloo_dir, tmp_path / "report")) == COLLECTIVE_FIGURES | NETWORK_FIGURES


def test_stats_and_report_of_a_ps_lite_job_have_no_collective_part(mxnet_dir, tmp_path):
    summary = _stats(mxnet_dir, tmp_path / "stats")
    assert {path.stem for path in (tmp_path / "stats").glob("*.parquet")} == PSLITE_TABLES | JOB_TABLES | NETWORK_TABLES
    assert "collectives" not in summary and summary["iterations"]["total"] > 0
    assert set(_report(mxnet_dir, tmp_path / "report")) == PSLITE_FIGURES | NETWORK_FIGURES


@pytest.fixture(scope="module")
def mixed_dir(gloo_dir, mxnet_dir, tmp_path_factory) -> Path:
    """The ps-lite job's decode output with the Gloo job's collectives and messages added, and clock rows
    putting Gloo rank r r milliseconds later on the job's timeline."""
    out = tmp_path_factory.mktemp("mixed")
    for path in mxnet_dir.glob("*.parquet"):
        shutil.copy(path, out / path.name)
    messages = pa.concat_tables([pq.read_table(mxnet_dir / "messages.parquet"),
                                 pq.read_table(gloo_dir / "messages.parquet")])
    pq.write_table(messages, out / "messages.parquet")
    shutil.copy(gloo_dir / "collectives.parquet", out / "collectives.parquet")
    clocks = pd.read_parquet(mxnet_dir / "clocks.parquet")
    gloo_clocks = clocks.iloc[[0] * len(RANKS)].assign(
        capture=[f"rank{r}" for r in RANKS], offset_ns=[r * 1_000_000 for r in RANKS], drift_ppm=0.0)
    pd.concat([clocks, gloo_clocks], ignore_index=True).to_parquet(out / "clocks.parquet", index=False)
    return out


def test_stats_and_report_of_a_job_with_both(mixed_dir, stats, tmp_path):
    summary = _stats(mixed_dir, tmp_path / "stats")
    written = {path.stem for path in (tmp_path / "stats").glob("*.parquet")}
    assert written == PSLITE_TABLES | JOB_TABLES | COLLECTIVE_TABLES | NETWORK_TABLES
    assert summary["iterations"]["total"] > 0 and summary["collectives"]["operations"] == 28
    assert summary["collectives"]["clock"]["aligned"] == [f"rank{r}" for r in RANKS]
    assert set(summary["losses"]) >= {"records", "incomplete_collectives"}
    # every rank's times moved by its clock's offset; skews follow
    aligned = pd.read_parquet(tmp_path / "stats" / "collective_ranks.parquet").set_index(["op", "rank"])
    raw = stats.ranks.set_index(["op", "rank"]).loc[aligned.index]
    offset = aligned.index.get_level_values("rank").to_numpy() * 1_000_000
    for edge in ("ts_first_ns", "ts_last_ns"):
        assert (aligned[edge] - raw[edge] == offset).all()
    shifted = aligned.groupby(level="op")["ts_first_ns"].agg(lambda s: s.max() - s.min())
    operations = pd.read_parquet(tmp_path / "stats" / "collective_stats.parquet").set_index("op")
    assert (operations.loc[shifted.index, "start_skew_ns"] == shifted).all()
    terminal = invoke("stats", mixed_dir, "--out", tmp_path / "stats", "--force")
    assert "SketchDLC figures" in terminal.stdout and "all-to-all / all-reduce bytes" in terminal.stdout
    assert set(_report(mixed_dir, tmp_path / "report")) == PSLITE_FIGURES | COLLECTIVE_FIGURES | NETWORK_FIGURES


def test_a_job_with_neither_is_a_one_line_error(gloo_dir, tmp_path):
    for path in gloo_dir.glob("*.parquet"):
        shutil.copy(path, tmp_path / path.name)
    empty = pq.read_table(gloo_dir / "collectives.parquet").slice(0, 0)
    pq.write_table(empty, tmp_path / "collectives.parquet")
    for command in ("stats", "report"):
        result = invoke(command, tmp_path, "--out", tmp_path / command)
        assert result.exit_code == 1 and "Traceback" not in result.output
        assert "no ps-lite message and no collective operation" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
