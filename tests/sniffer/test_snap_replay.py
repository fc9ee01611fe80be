"""The in-kernel ZMTP cut on real jobs' traffic reordered and lost as a network would (root: the kernel runs the
filter, BPF_PROG_TEST_RUN, one packet at a time; tests/support/snap_replay.py).

Two recorded MXNet jobs (pcaps/: a small-message MLP and a 5 MB-weight one, whole packets) are edited as netem
would do it, which this kernel lacks: segments swapped, held back a few packets or hundreds (a loss and its
retransmission), repeated, split in two sent in reverse. The edited capture is then cut by the filter as
the daemon's socket would cut it, and checked against the same edited capture kept whole:
- no byte a decoder needs is cut: `dlcsniff decode` gives the same messages, ZMTP frames and streams;
- the filter never gives up on a flow: no direction kept whole for good, every wait for a hole resumed, and
  every packet that came in order (nothing missing before it, nothing early after it) cut exactly as in the
  capture never edited.
A filter with a wrong rule (one that cuts bodies the decoders keep) fails the same comparison.
"""
from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, require_root
from tests.support import snap_replay
from tests.support.daemon import DLCSNIFF

pytestmark = pytest.mark.root

# capture -> (edits per run, seeds, whether holes that may hold a header must come up). Small messages put frame
# headers in most segments, so holes there are waited for; 5 MB values put most holes inside a body.
CAPTURES = {"mxnet_sync/server0.pcap.gz": (40, (1, 2, 3), True),
            "mxnet_sync_large/worker0.pcap.gz": (150, (4,), False)}
TABLES = ("messages", "zmtp", "streams")
CAPTURED_COLUMNS = {"bytes", "uncaptured_bytes"}       # streams: what the capture holds differs, by design


def decoded(capture: snap_replay.Capture, directory: Path) -> dict[str, pd.DataFrame]:
    """`dlcsniff decode` of the capture written as node.pcap (the same name for every variant)."""
    directory.mkdir(parents=True)
    pcap = capture.write(directory / "node.pcap")
    done = subprocess.run([str(DLCSNIFF), "decode", str(pcap), "--out", str(directory / "out"), "--no-progress"],
                          capture_output=True, text=True, cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr
    tables = {name: pq.read_table(directory / "out" / f"{name}.parquet").to_pandas() for name in TABLES}
    tables["streams"] = tables["streams"].drop(columns=sorted(CAPTURED_COLUMNS & set(tables["streams"].columns)))
    pcap.unlink()
    return tables


def assert_same_decode(whole: dict[str, pd.DataFrame], cut: dict[str, pd.DataFrame]) -> None:
    for name in TABLES:
        pd.testing.assert_frame_equal(whole[name], cut[name], obj=name)


@pytest.fixture(scope="module", params=sorted(CAPTURES))
def recorded(request, tmp_path_factory):
    require_root()
    capture = snap_replay.read_capture(REPO / "pcaps" / request.param)
    cut, counts = snap_replay.cut_capture(capture)
    return request.param, capture, cut, counts, tmp_path_factory.mktemp("replay")


def test_the_capture_in_order_is_cut_and_decodes_as_whole(recorded):
    name, capture, cut, counts, scratch = recorded
    assert counts["cut_bytes"] > 0.5 * capture.captured_bytes and counts["waits"] == 0
    assert_same_decode(decoded(capture, scratch / "whole"), decoded(cut, scratch / "cut"))


def test_reordered_and_lost_segments_are_followed_on(recorded):
    name, capture, in_order_cut, in_order_counts, scratch = recorded
    edits, seeds, waits_expected = CAPTURES[name]
    waits = 0
    cut_length = {record.data: len(cut.data) for record, cut in zip(capture.records, in_order_cut.records)}
    assert len(in_order_cut.records) == len(capture.records)          # nothing dropped (no --ports here)
    for seed in seeds:
        edited, made = snap_replay.edited(capture, random.Random(seed), edits)
        assert all(made.values()), made                                # every kind of edit was made
        cut, counts = snap_replay.cut_capture(edited)
        assert_same_decode(decoded(edited, scratch / f"whole-{seed}"), decoded(cut, scratch / f"cut-{seed}"))
        # never given up: the same directions kept whole as in order (flows begun before the capture), and
        # each hole that might hold a frame header waited for until the framing was found again
        assert counts["full_flows"] == in_order_counts["full_flows"], (seed, counts)
        assert counts["waits"] == counts["resumed"], (seed, counts)
        waits += counts["waits"]
        # what came in order is cut as if nothing had happened before it
        in_order = snap_replay.followed_in_order(edited)
        compared = [(len(cut.data), cut_length[record.data]) for record, cut, followed
                    in zip(edited.records, cut.records, in_order) if followed and record.data in cut_length]
        assert len(compared) > 0.25 * len(snap_replay.tcp_segments(edited))          # not a vacuous check
        assert all(got == expected for got, expected in compared), seed
        # and what the filter could not follow on is the packets past holes only: the capture grows by little
        assert cut.captured_bytes < in_order_cut.captured_bytes + 0.25 * (capture.captured_bytes
                                                                            - in_order_cut.captured_bytes)
        shutil.rmtree(scratch / f"whole-{seed}")
        shutil.rmtree(scratch / f"cut-{seed}")
    assert waits > 0 or not waits_expected


def test_a_filter_that_cuts_what_decoders_keep_is_caught(recorded):
    """The comparison can fail: a rule that keeps no body past a message's first two frames (ps-lite's
    lens, the values of small tensors) decodes differently."""
    name, capture, _, _, scratch = recorded
    wrong, _ = snap_replay.cut_capture(capture, SNAP_KEPT_BODY_MAX=0)
    with pytest.raises(AssertionError):
        assert_same_decode(decoded(capture, scratch / "whole-wrong"), decoded(wrong, scratch / "cut-wrong"))
