"""The Chrome trace of every bundled job as a trace viewer must read it (issue 19, item 5): on each track any two
complete (X) slices are disjoint or one holds the other (the format's rule; Perfetto and chrome://tracing drop or
mis-draw the others); every flow event lies in exactly one slice of its track, so that it binds to one message;
and a message's slice lasts from its first byte to its last: no longer than nothing unless the message's first
and last byte share one instant (events.parquet, read with pyarrow: the first byte sent or seen, the last
received or seen, on the job's clock).

The reader is written here from the format alone (JSON, µs timestamps, slices per pid/tid), independent of the
exporter and of tests/support/chrome_trace.py. Perfetto's own importer could not be used: the `perfetto` package
on PyPI fetches its trace_processor_shell binary from Google's storage at first use (no network here), Debian
packages none, and Chromium 156 no longer ships chrome://tracing."""
from __future__ import annotations

import collections
import json

import pandas as pd
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from dlcsniff.cli import app
from tests.conftest import PCAPS

# zmq, tcp_zero_window: no ps-lite message, no collective: nothing to export
JOBS = sorted(path.name for path in PCAPS.iterdir() if path.is_dir()
              and path.name not in ("realcaps", "zmq", "tcp_zero_window"))


PCAP_RESOLUTION_NS = 1000


def _slices(document: dict) -> dict[tuple[int, int], list[tuple[int, int, dict]]]:
    tracks = collections.defaultdict(list)
    for event in document["traceEvents"]:
        if event["ph"] == "X":
            start = round(event["ts"] * 1000)
            tracks[(event["pid"], event["tid"])].append((start, start + round(event["dur"] * 1000), event))
    return tracks


def _improperly_nested(slices: list[tuple[int, int, dict]]) -> list[tuple[dict, dict]]:
    """Every pair of slices that overlap without one holding the other (a sweep: each against the open ones)."""
    found, open_slices = [], []
    for start, end, event in sorted(slices, key=lambda s: (s[0], -s[1])):
        open_slices = [s for s in open_slices if s[1] > start]
        found += [(other[2], event) for other in open_slices if end > other[1]]
        open_slices.append((start, end, event))
    return found


@pytest.fixture(scope="module", params=JOBS)
def exported(request, decoded_job, tmp_path_factory):
    decode_dir = decoded_job(request.param)
    path = tmp_path_factory.mktemp(f"chrome-{request.param}") / "trace.json"
    result = CliRunner().invoke(app, ["export", str(decode_dir), "--format", "chrome", "--out", str(path)])
    assert result.exit_code == 0, result.output
    return decode_dir, json.loads(path.read_text(encoding="utf-8"))


def test_slices_on_a_track_nest(exported):
    _, document = exported
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in document["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    for track, slices in _slices(document).items():
        bad = _improperly_nested(slices)
        assert not bad, (names.get(track), [(a["name"], a["ts"], a["dur"], b["name"], b["ts"], b["dur"])
                                            for a, b in bad[:3]])
        assert all(end >= start for start, end, _ in slices), names.get(track)


def test_every_flow_end_lies_in_exactly_one_slice_of_its_track(exported):
    _, document = exported
    tracks = _slices(document)
    flows = [e for e in document["traceEvents"] if e["ph"] in ("s", "f")]
    assert flows
    for flow in flows:
        at = round(flow["ts"] * 1000)
        holding = [event for start, end, event in tracks[(flow["pid"], flow["tid"])] if start <= at <= end]
        assert len(holding) == 1, (flow, [(e["name"], e["ts"], e["dur"]) for e in holding])
        assert holding[0]["cat"] == ("send" if flow["ph"] == "s" else "recv")
        assert flow["ph"] == "s" or flow.get("bp") == "e"


def test_message_slices_last_from_first_to_last_byte(exported):
    """A slice of no duration only for a message whose first and last byte share an instant, as events.parquet
    dates them: per job, the slices of no duration are at most the ends seen of such messages."""
    decode_dir, document = exported
    events = pq.read_table(decode_dir / "events.parquet").to_pandas()
    # integer nanoseconds (float64 would merge times 256 ns apart at today's epoch values)
    times = {name: events[name].astype("Int64") for name in
             ("send_ts_first_aligned_ns", "recv_ts_first_aligned_ns", "send_ts_last_aligned_ns", "recv_ts_last_aligned_ns")}
    first = pd.concat([times["send_ts_first_aligned_ns"], times["recv_ts_first_aligned_ns"]], axis=1).min(axis=1)
    last = pd.concat([times["send_ts_last_aligned_ns"], times["recv_ts_last_aligned_ns"]], axis=1).max(axis=1)
    ends = events["send_capture"].notna().to_numpy(int) + events["recv_capture"].notna().to_numpy(int)
    shown = events["protocol"].isin(["pslite", "gloo", "nccl_socket", "roce"]).to_numpy(bool)
    messages = [event for slices in _slices(document).values() for _, _, event in slices
                if event.get("cat") in ("send", "recv")]
    instant = sum(event["dur"] == 0 for event in messages)
    # within a capture's resolution (1 µs for pcap): two alignments of one instant may differ by tens of ns
    assert instant <= int(ends[shown & (last - first < PCAP_RESOLUTION_NS).to_numpy(bool)].sum())
    assert instant < len(messages) / 2 or not len(messages)      # the Gloo job: 73 % had none
