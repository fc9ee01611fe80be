"""Clock offset and drift between captures (analysis.clocks), on made-up delays with a known truth and on
real captures whose clocks were moved by known amounts: shifted with editcap, and made to drift by
rewriting their timestamps here (a pcap writer of this test's own, not the decoder's reader)."""
from __future__ import annotations

import gzip
import shutil
import struct
import subprocess

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcsniff.decoders.clocks import CLOCK_COLUMNS, align, estimate_clocks, pair_clocks
from dlcsniff.analysis import load_dataset, load_job_view
from dlcsniff.decoders.output import write_decode_output
from dlcsniff.decoders.job import decode_paths
from tests.conftest import PCAPS, require_tool
from tests.support.groundtruth import load_job

EPOCH = 1_795_940_000_000_000_000
TOLERANCE_NS = 200_000          # the bar for recovered offsets
PCAP_RESOLUTION_NS = 1_000      # the bundled captures are microsecond pcap


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
    clocks = estimate_clocks(samples, ["a", "b"], reference="a")
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
    b = estimate_clocks(samples, ["a", "b"], reference="a").set_index("capture").loc["b"]
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
    clocks = estimate_clocks(pd.concat([ab, bc, one_way], ignore_index=True), ["a", "b", "c", "d"],
                             reference="a").set_index("capture")
    pairs = pair_clocks(pd.concat([ab, bc, one_way], ignore_index=True), EPOCH).set_index(["a", "b"])
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
    assert clocks.loc["d", "offset_ns"] == 0 and clocks.loc["d", "drift_ppm"] == 0
    assert clocks.loc["a", "offset_ns"] == 0 and clocks.loc["a", "error_bound_ns"] == 0


def test_a_clock_step_is_flagged_inconsistent():
    """No line fits a clock that jumps by 1 ms halfway (as an NTP step would) when delays are shorter."""
    rng = np.random.default_rng(11)
    samples = exchange(rng, lambda t: t + np.where(t > 5e8, 1e6, 0), 200, 1e9, 5_000)
    b = estimate_clocks(samples, ["a", "b"], reference="a").set_index("capture").loc["b"]
    assert b["aligned"] and not b["consistent"]


def test_align_keeps_nulls_and_unknown_captures():
    clocks = pd.DataFrame({"capture": ["x"], "offset_ns": [1_000], "drift_ppm": [100.0], "epoch_ts_ns": [EPOCH]})
    ts = pd.array([EPOCH, EPOCH + 10**9, None, EPOCH + 10**9], dtype="Int64")
    out = align(ts, ["x", "x", "x", "other"], clocks)
    assert out[0] == EPOCH + 1_000 and out[1] == EPOCH + 10**9 + 1_000 + 100_000
    assert pd.isna(out[2]) and out[3] == EPOCH + 10**9


# --- real captures whose clocks were moved ---------------------------------------------------------------

SHIFTS_S = {"server0": 2.5, "worker1": -0.75, "server1": 0.000_123}


def rewrite_pcap(source, target, shift_ns: int, drift_ppm: float) -> None:
    """Copy a (gzipped, microsecond, little-endian) pcap, moving every timestamp t to
    t + shift_ns + drift_ppm * 1e-6 * (t - first timestamp)."""
    data = gzip.decompress(source.read_bytes())
    assert data[:4] == b"\xd4\xc3\xb2\xa1", "this rewriter reads little-endian microsecond pcap"
    out = bytearray(data[:24])
    offset, first = 24, None
    while offset < len(data):
        seconds, micros, caplen, length = struct.unpack_from("<IIII", data, offset)
        ts = seconds * 10**9 + micros * 1_000
        first = ts if first is None else first
        moved = (ts + shift_ns + round(drift_ppm * 1e-6 * (ts - first))) // 1_000
        out += struct.pack("<IIII", moved // 10**6, moved % 10**6, caplen, length)
        out += data[offset + 16:offset + 16 + caplen]
        offset += 16 + caplen
    target.write_bytes(bytes(out))


def decoded_view(directory, out):
    """Decode the captures in `directory` into `out`, with the job view written as decode writes it."""
    write_decode_output(decode_paths([directory]), out)
    return load_job_view(out)


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """The unshifted job: (its decode directory, its view)."""
    out = tmp_path_factory.mktemp("original")
    return out, decoded_view(PCAPS / "mxnet_sync", out)


def test_editcap_shifted_captures_are_aligned_back(tmp_path_factory, original):
    original_dir, original_view = original
    editcap = require_tool("editcap")
    job = load_job(PCAPS / "mxnet_sync")
    captures = tmp_path_factory.mktemp("shifted_captures")
    for node in job.nodes:
        name, path = node["name"], job.capture_path(node["name"])
        if name in SHIFTS_S:
            subprocess.run([editcap, "-t", f"{SHIFTS_S[name]:.6f}", str(path), str(captures / f"{name}.pcapng")],
                           check=True, capture_output=True)
        else:
            shutil.copy(path, captures / path.name)
    shifted_dir = tmp_path_factory.mktemp("shifted")
    view = decoded_view(captures, shifted_dir)
    clocks = view.clocks.set_index("capture")
    assert clocks["reference"].eq("scheduler").all() and clocks["aligned"].all() and clocks["consistent"].all()
    events = view.events.merge(original_view.events, on="event_id", suffixes=("", "_original"))
    assert len(events) == len(view.events) == len(original_view.events)
    for name, shift_s in SHIFTS_S.items():
        sent = events[events["send_capture"] == name]
        # before alignment the shift is there; the correction found takes it away: all captures were taken
        # on one host's clock, so the true correction is minus the shift
        raw = sent["send_ts_first_ns"].astype("Int64") - sent["send_ts_first_ns_original"].astype("Int64")
        assert (raw == round(shift_s * 1e9)).all()
        correction = sent["send_ts_first_aligned_ns"] - sent["send_ts_first_ns"]
        assert ((correction + raw).abs() <= TOLERANCE_NS).all()
        assert ((correction + raw).abs() <= clocks.loc[name, "error_bound_ns"] + PCAP_RESOLUTION_NS).all()
    # the aligned times are what the unshifted captures give (the estimate is shift-equivariant: to the
    # rounding of a nanosecond)
    for column in ("send_ts_first_aligned_ns", "send_ts_last_aligned_ns", "recv_ts_first_aligned_ns",
                   "recv_ts_last_aligned_ns"):
        error = (events[column] - events[f"{column}_original"]).abs()
        assert error.max() <= TOLERANCE_NS and error.max() <= 2
    # and so every analysis sees them: the messages as loaded for the statistics are on the one timeline
    for shifted, unshifted in zip(*(sorted_times(load_dataset(d).messages) for d in (shifted_dir, original_dir))):
        assert np.abs(shifted - unshifted).max() <= 2


def sorted_times(messages: pd.DataFrame) -> list[np.ndarray]:
    """Per capture (by name), its messages' first-byte times in order."""
    return [np.sort(group["ts_first_ns"].to_numpy(np.int64)) for _, group in messages.groupby("capture")]


def test_drifting_capture_is_aligned_back(tmp_path):
    """worker0's clock made 600 ppm fast and 1.2 s ahead: over this job's 1.3 s of messages that is 0.75 ms of
    drift, more than the tolerance, so only a drift estimate brings it back within 200 µs."""
    job = load_job(PCAPS / "mxnet_sync_large")
    captures = tmp_path / "captures"
    captures.mkdir()
    for node in job.nodes:
        path = job.capture_path(node["name"])
        if node["name"] == "worker0":
            rewrite_pcap(path, captures / "worker0.pcap", 1_200_000_000, 600.0)
        else:
            shutil.copy(path, captures / path.name)
    view = decoded_view(captures, tmp_path / "decoded")
    original = decoded_view(PCAPS / "mxnet_sync_large", tmp_path / "original")
    assert load_dataset(tmp_path / "decoded").clocks is not None
    worker0 = view.clocks.set_index("capture").loc["worker0"]
    assert worker0["drift_ppm"] == pytest.approx(-600, abs=60)
    events = view.events.merge(original.events, on="event_id", suffixes=("", "_original"))
    for side in ("send", "recv"):
        mine = events[events[f"{side}_capture"] == "worker0"]
        raw = (mine[f"{side}_ts_first_ns"] - mine[f"{side}_ts_first_ns_original"]).abs()
        error = (mine[f"{side}_ts_first_aligned_ns"] - mine[f"{side}_ts_first_aligned_ns_original"]).abs()
        assert len(mine) > 30 and raw.min() > 10**9 and error.max() <= TOLERANCE_NS
        assert error.max() <= worker0["error_bound_ns"] + PCAP_RESOLUTION_NS
        # an offset alone could not have done it: it would miss one end or the other by more than 200 µs
        assert raw.max() - raw.min() > 2 * TOLERANCE_NS
