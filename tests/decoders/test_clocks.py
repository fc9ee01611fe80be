"""Clock offset and drift between captures (decoders.clocks), on made-up delays with a known truth (real
captures whose clocks were moved by known amounts: test_clocks_captures.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcsniff.decoders.clocks import CLOCK_COLUMNS, align, estimate_clocks, pair_clocks

EPOCH = 1_795_940_000_000_000_000


def estimated(*args, **kwargs) -> pd.DataFrame:
    """estimate_clocks' table (pyarrow), as analysis reads clocks.parquet."""
    return estimate_clocks(*args, **kwargs).to_pandas()


def exchange(rng: np.random.Generator, clock_b, n: int, span_ns: float, min_delay_ns: float) -> pd.DataFrame:
    """Messages both ways between captures a (true time) and b (reads true time t as clock_b(t)), sent at
    random times over span_ns, each taking min_delay_ns plus an exponential queueing delay."""
    frames = []
    for sender, receiver in (("a", "b"), ("b", "a")):
        sent = np.sort(rng.uniform(0, span_ns, n))
        arrived = sent + min_delay_ns + rng.exponential(20 * min_delay_ns + 1, n)
        reading = {"a": lambda t: t, "b": clock_b}
        frames.append(pd.DataFrame({
            "send_capture": sender, "send_ts_ns": np.rint(reading[sender](sent)).astype(np.int64) + EPOCH,
            "recv_capture": receiver, "recv_ts_ns": np.rint(reading[receiver](arrived)).astype(np.int64) + EPOCH}))
    return pd.concat(frames, ignore_index=True)


@settings(max_examples=40, deadline=None)
@given(offset_ns=st.integers(-10**12, 10**12), drift_ppm=st.floats(-300, 300),
       min_delay_ns=st.floats(500, 2e6), span_s=st.floats(0.05, 3600), seed=st.integers(0, 2**32 - 1))
def test_true_clock_lies_within_the_bound_and_no_aligned_delay_is_negative(offset_ns, drift_ppm, min_delay_ns,
                                                                          span_s, seed):
    rng = np.random.default_rng(seed)
    clock_b = lambda t: t + offset_ns + drift_ppm * 1e-6 * t  # noqa: E731
    samples = exchange(rng, clock_b, 200, span_s * 1e9, min_delay_ns)
    clocks = estimated(samples, ["a", "b"], reference="a")
    assert list(clocks.columns) == list(CLOCK_COLUMNS)
    b = clocks.set_index("capture").loc["b"]
    assert b["aligned"] and b["consistent"] and b["via"] == "a"
    # b's readings of true times, back on a's (the true) clock
    truth = np.linspace(0, span_s * 1e9, 50)
    aligned = align(np.rint(clock_b(truth)).astype(np.int64) + EPOCH, np.full(50, "b"), clocks).astype(np.int64)
    error = np.abs(aligned - EPOCH - truth)
    assert error.max() <= b["error_bound_ns"] + 2, (error.max(), b["error_bound_ns"])
    # the bound is half a round trip plus what the drift's uncertainty adds: never beyond the slowest sample
    assert b["error_bound_ns"] <= (samples["recv_ts_ns"] - samples["send_ts_ns"]).abs().max()
    sent = align(samples["send_ts_ns"], samples["send_capture"], clocks).astype(np.int64)
    received = align(samples["recv_ts_ns"], samples["recv_capture"], clocks).astype(np.int64)
    assert (received - sent >= -2).all()     # rounding to whole nanoseconds at both ends


def test_drift_is_found_when_the_data_demand_it():
    rng = np.random.default_rng(7)
    samples = exchange(rng, lambda t: t + 5e6 + 80e-6 * t, 500, 600e9, 20_000)
    b = estimated(samples, ["a", "b"], reference="a").set_index("capture").loc["b"]
    assert b["drift_ppm"] == pytest.approx(-80, abs=0.5)
    assert b["offset_ns"] == pytest.approx(-5e6, abs=float(b["error_bound_ns"]) + 1)
    assert b["messages_used"] == 500 and b["samples_from_via"] == b["samples_to_via"] == 500


def test_captures_chain_through_the_best_bounded_pairs():
    """c talks only to b; a talks to b over a slow path and to c... not at all: c is aligned through b and
    its bound is the sum of both pairs'. d talks to a one way only: it cannot be bounded, so not aligned."""
    rng = np.random.default_rng(3)
    ab = exchange(rng, lambda t: t + 1e9, 100, 1e9, 50_000)
    bc = exchange(rng, lambda t: t - 3e8, 100, 1e9, 10_000)
    bc["send_capture"] = bc["send_capture"].map({"a": "b", "b": "c"})
    bc["recv_capture"] = bc["recv_capture"].map({"a": "b", "b": "c"})
    # b's clock reads a's + 1 s, so b's side of the b-c exchange is on b's clock
    bc.loc[bc["send_capture"] == "b", "send_ts_ns"] += 10**9
    bc.loc[bc["recv_capture"] == "b", "recv_ts_ns"] += 10**9
    one_way = exchange(rng, lambda t: t, 20, 1e9, 10_000)
    one_way = one_way[one_way["send_capture"] == "a"].assign(recv_capture="d")
    clocks = estimated(pd.concat([ab, bc, one_way], ignore_index=True), ["a", "b", "c", "d"],
                             reference="a").set_index("capture")
    pairs = pd.DataFrame(pair_clocks(pd.concat([ab, bc, one_way], ignore_index=True), EPOCH)).set_index(["a", "b"])
    assert set(pairs.index) == {("a", "b"), ("b", "c")}
    assert clocks.loc["c", "via"] == "b" and clocks.loc["b", "via"] == "a"
    assert clocks.loc["c", "error_bound_ns"] == pytest.approx(
        pairs.loc[("a", "b"), "error_bound_ns"] + pairs.loc[("b", "c"), "error_bound_ns"], abs=1)
    # b's clock reads true time + 1 s, c's true time - 0.3 s: back on a's clock, within the bounds
    truth = np.linspace(0, 1e9, 11)
    for name, reading in (("b", truth + 1e9), ("c", truth - 3e8)):
        aligned = align(np.rint(reading).astype(np.int64) + EPOCH, np.full(11, name), clocks.reset_index())
        error = np.abs(aligned.astype(np.int64) - EPOCH - truth)
        assert error.max() <= clocks.loc[name, "error_bound_ns"] + 2
    assert not clocks.loc["d", "aligned"] and pd.isna(clocks.loc["d", "error_bound_ns"])
    # never offset 0 as if it were aligned: no offset, no drift, and why
    assert pd.isna(clocks.loc["d", "offset_ns"]) and pd.isna(clocks.loc["d", "drift_ppm"])
    assert clocks.loc["d", "reason"].startswith("the messages seen at both ends go one way only (0 one-way delays "
                                                "from it, 20 to it)")
    assert pd.isna(clocks.loc["a", "reason"]) and pd.isna(clocks.loc["c", "reason"])
    assert clocks.loc["a", "offset_ns"] == 0 and clocks.loc["a", "error_bound_ns"] == 0


def test_a_clock_step_is_flagged_inconsistent():
    """No line fits a clock that jumps by 1 ms halfway (as an NTP step would) when delays are shorter."""
    rng = np.random.default_rng(11)
    samples = exchange(rng, lambda t: t + np.where(t > 5e8, 1e6, 0), 200, 1e9, 5_000)
    b = estimated(samples, ["a", "b"], reference="a").set_index("capture").loc["b"]
    assert b["aligned"] and not b["consistent"]


def test_align_keeps_nulls_and_unknown_captures():
    clocks = pd.DataFrame({"capture": ["x"], "offset_ns": [1_000], "drift_ppm": [100.0], "epoch_ts_ns": [EPOCH]})
    ts = pd.array([EPOCH, EPOCH + 10**9, None, EPOCH + 10**9], dtype="Int64")
    out = align(ts, ["x", "x", "x", "other"], clocks)
    assert out[0] == EPOCH + 1_000 and out[1] == EPOCH + 10**9 + 1_000 + 100_000
    assert pd.isna(out[2]) and out[3] == EPOCH + 10**9
