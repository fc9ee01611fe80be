"""Real captures whose clocks were moved by known amounts, as on clusters without good NTP: shifted by seconds
with editcap -t (the real tool), made to drift or step by tests.support.retime (checked here against tshark);
a job decoded beside another job's captures; the bundled Gloo job, recorded on one host (one clock: a send
paired with another message's receive shows as a transit no network gives), with captures that started late
or lost packets; and jobs recorded fresh with lab/record.py (held out: not the bundled ones). The messages
seen at both ends are counted against ps-lite's own PS_VERBOSE=2 logs (tests.support.groundtruth)."""
from __future__ import annotations

import collections
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from dlcsniff.analysis import load_dataset, load_job_view
from dlcsniff.decoders.decode_run import decode_to_dir
from dlcsniff.decoders.timeline import MESSAGE_READ_COLUMNS, observations
from lab.record import MXNetJobSpec, record_gloo_job, record_mxnet_job
from tests.conftest import PCAPS, require_root, require_tool, require_workloads
from tests.support.groundtruth import event_message_keys, load_job, logged_sends
from tests.support.retime import retime_pcap

TOLERANCE_NS = 200_000          # the bar for recovered offsets
PCAP_RESOLUTION_NS = 1_000      # the bundled captures are microsecond pcap
# On one clock a send paired with another message's receive is tens of milliseconds off (a training step);
# tcpdump in two namespaces of one host stamps one packet within microseconds.
ONE_CLOCK_SLACK_NS = 1_000_000
TIMES = [f"{side}_ts_{edge}_aligned_ns" for side in ("send", "recv") for edge in ("first", "last")]


def decoded(inputs: list[Path], out: Path):
    """Decode as `dlcsniff decode` does: (the job view as written, the decode summary)."""
    run = decode_to_dir(inputs, out)
    return load_job_view(out), run.dataset.summary


def moved_job(job_dir: Path, target: Path, moves: dict[str, dict]) -> Path:
    """A copy of a recorded job's captures, all as <node>.pcap (named alike, as a user's are), each node in
    `moves` moved: {"shift_s": s} with editcap -t, or retime_pcap's keywords (drift, step)."""
    job = load_job(job_dir)
    target.mkdir(parents=True)
    for node in job.nodes:
        name, path = node["name"], job.capture_path(node["name"])
        move = moves.get(name, {})
        if set(move) <= {"shift_s"}:
            subprocess.run([require_tool("editcap"), "-F", "pcap", "-t", f"{move.get('shift_s', 0.0):.6f}",
                            str(path), str(target / f"{name}.pcap")], check=True, capture_output=True)
        else:
            retime_pcap(path, target / f"{name}.pcap", **move)
    return target


def both_ends(events: pd.DataFrame) -> pd.DataFrame:
    return events[events["send_capture"].notna() & events["recv_capture"].notna()]


def pslite_data_keys(keys: collections.Counter) -> collections.Counter:
    # data and SimpleApp messages (a node's first ADD_NODE is logged without its id, the TERMINATE a node sends
    # itself not at all: tests/decoders/test_decode_real.py)
    return collections.Counter({key: n for key, n in keys.items() if key[4] is None})


def assert_every_logged_message_matched(job_dir: Path, decode_dir: Path, events: pd.DataFrame) -> None:
    """Every data message ps-lite logged as sent is one event seen at both ends, and nothing else is."""
    messages = pd.read_parquet(decode_dir / "messages.parquet")
    matched = pslite_data_keys(event_message_keys(both_ends(events), messages))
    assert matched == pslite_data_keys(logged_sends(load_job(job_dir))), (matched - pslite_data_keys(
        logged_sends(load_job(job_dir)))).most_common(3)


def assert_aligned_back(view, original, reference_shift_ns: int = 0) -> None:
    """`view` (moved clocks) puts every message where `original` (the unmoved captures) did, give or take
    both estimates' bounds, and within 200 µs; every capture is listed, aligned and consistent."""
    clocks, before = view.clocks.set_index("capture"), original.clocks.set_index("capture")
    assert sorted(clocks.index) == sorted(before.index)
    assert clocks["aligned"].all() and clocks["reason"].isna().all() and clocks["consistent"].all(), clocks
    assert len(view.events) == len(original.events)
    assert len(both_ends(view.events)) == len(both_ends(original.events))
    events = view.events.merge(original.events, on="event_id", suffixes=("", "_original"))
    assert len(events) == len(view.events)
    for column in TIMES:
        side = column.split("_")[0]
        known = events[column].notna()
        mine = events[known]
        error = (mine[column] - mine[f"{column}_original"] - reference_shift_ns).abs().astype(np.int64)
        capture = mine[f"{side}_capture"].astype(str)
        bound = (clocks["error_bound_ns"].reindex(capture).to_numpy(np.int64)
                 + before["error_bound_ns"].reindex(capture).to_numpy(np.int64))
        assert error.max() <= TOLERANCE_NS, (column, error.max())
        assert (error.to_numpy() <= bound + PCAP_RESOLUTION_NS).all(), column


# --- the helper that moves clocks, against tshark -------------------------------------------------------------

def epoch_times_ns(path: Path) -> np.ndarray:
    out = subprocess.run([require_tool("tshark"), "-r", str(path), "-T", "fields", "-e", "frame.time_epoch"],
                         check=True, capture_output=True, text=True).stdout.split()
    return np.array([round(float(t) * 1e6) * 1_000 for t in out], dtype=np.int64)


def test_retime_writes_the_times_tshark_reads(tmp_path):
    source = PCAPS / "mxnet_sync" / "worker0.pcap.gz"
    retime_pcap(source, tmp_path / "moved.pcap", shift_ns=-10_000_000_000, drift_ppm=100.0, step_ns=2_000_000,
                step_at_ns=int(epoch_times_ns(source)[1000]))
    before, after = epoch_times_ns(source), epoch_times_ns(tmp_path / "moved.pcap")
    expected = before - 10_000_000_000 + np.rint(100e-6 * (before - before[0])).astype(np.int64)
    expected[1000:] += 2_000_000
    assert len(after) == len(before) == 2796
    assert np.abs(after - expected).max() < PCAP_RESOLUTION_NS      # the file keeps microseconds


# --- the bundled MXNet jobs, moved ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mxnet_sync(tmp_path_factory):
    out = tmp_path_factory.mktemp("mxnet_sync")
    return out, decoded([PCAPS / "mxnet_sync"], out)[0]


SHIFTS_S = {
    "issue_19": {"server0": 0.25, "server1": -0.75, "worker0": 1.5},
    "ten_seconds": {"worker0": 10.0, "worker1": -10.0, "server1": 3.3},
    "reference_moved": {"scheduler": -10.0, "server0": 0.25, "worker1": -2.5},
    "tiny": {"server0": 2.5, "worker1": -0.75, "server1": 0.000_123},
}


@pytest.mark.parametrize("name", SHIFTS_S)
def test_editcap_shifts_of_seconds_are_aligned_back(tmp_path, mxnet_sync, name):
    original_dir, original = mxnet_sync
    shifts = SHIFTS_S[name]
    captures = moved_job(PCAPS / "mxnet_sync", tmp_path / "captures", {n: {"shift_s": s} for n, s in shifts.items()})
    view, summary = decoded([captures], tmp_path / "decoded")
    reference_shift_ns = round(shifts.get("scheduler", 0.0) * 1e9)
    assert_aligned_back(view, original, reference_shift_ns)
    assert_every_logged_message_matched(PCAPS / "mxnet_sync", tmp_path / "decoded", view.events)
    assert not [w for w in summary["warnings"] if "clock" in w]
    # the shift is there before alignment, and gone after it
    for node, shift_s in shifts.items():
        sent = view.events[view.events["send_capture"] == node].merge(
            original.events, on="event_id", suffixes=("", "_original"))
        raw = sent["send_ts_first_ns"] - sent["send_ts_first_ns_original"]
        assert (raw == round(shift_s * 1e9)).all()
    # and every analysis reads the aligned times: the messages as loaded for the statistics
    for shifted, unshifted in zip(*(sorted_times(load_dataset(d).messages)
                                    for d in (tmp_path / "decoded", original_dir))):
        assert np.abs(shifted - unshifted - reference_shift_ns).max() <= TOLERANCE_NS


def sorted_times(messages: pd.DataFrame) -> list[np.ndarray]:
    """Per capture (by name), its messages' first-byte times in order."""
    return [np.sort(group["ts_first_ns"].to_numpy(np.int64)) for _, group in messages.groupby("capture")]


@pytest.mark.parametrize("moves", [
    {"worker0": {"shift_ns": 10_000_000_000, "drift_ppm": 100.0}, "server1": {"shift_ns": -10_000_000_000,
                                                                             "drift_ppm": -100.0}},
    # 600 ppm over this job's 1.3 s of messages: 0.75 ms, more than the tolerance; an offset alone would not do
    {"worker0": {"shift_ns": 1_200_000_000, "drift_ppm": 600.0}},
])
def test_drifting_captures_are_aligned_back(tmp_path, moves):
    original = decoded([PCAPS / "mxnet_sync_large"], tmp_path / "original")[0]
    captures = moved_job(PCAPS / "mxnet_sync_large", tmp_path / "captures", moves)
    view = decoded([captures], tmp_path / "decoded")[0]
    assert_aligned_back(view, original)
    clocks = view.clocks.set_index("capture")
    for node, move in moves.items():
        drift = clocks.loc[node, "drift_ppm"] - original.clocks.set_index("capture").loc[node, "drift_ppm"]
        assert drift == pytest.approx(-move["drift_ppm"], abs=60)


def test_a_clock_step_is_said_in_the_summary(tmp_path, mxnet_sync):
    """worker0's clock steps 2 ms forward halfway through the job (as NTP steps a clock): no offset and drift
    fit its messages, clocks.parquet says consistent false, and so does the decode summary."""
    _, original = mxnet_sync
    half = int(np.median(original.events["send_ts_first_ns"].dropna().to_numpy(np.int64)))
    captures = moved_job(PCAPS / "mxnet_sync", tmp_path / "captures",
                         {"worker0": {"step_ns": 2_000_000, "step_at_ns": half}})
    view, summary = decoded([captures], tmp_path / "decoded")
    worker0 = view.clocks.set_index("capture").loc["worker0"]
    assert worker0["aligned"] and not worker0["consistent"]
    said = [w for w in summary["warnings"] if w.startswith("clocks of ")]
    assert said and "worker0" in said[0] and "not consistent" in said[0] and "aligned transits are negative" in said[0]


def test_a_job_decoded_beside_another_keeps_its_clocks(tmp_path, mxnet_sync):
    """The MXNet and the Gloo job decoded together: each job its own reference and epoch, every offset and
    aligned time as when it is decoded alone."""
    _, mxnet_alone = mxnet_sync
    gloo_alone = decoded([PCAPS / "gloo"], tmp_path / "gloo")[0]
    both = decoded([PCAPS / "mxnet_sync", PCAPS / "gloo"], tmp_path / "both")[0]
    together = both.clocks.set_index("capture")
    for alone in (mxnet_alone, gloo_alone):
        mine = alone.clocks.set_index("capture")
        theirs = together.loc[mine.index]
        assert (theirs["reference"] == mine["reference"]).all() and (theirs["epoch_ts_ns"] == mine["epoch_ts_ns"]).all()
        assert (theirs["offset_ns"] - mine["offset_ns"]).abs().max() <= 1_000
        assert (theirs["drift_ppm"] - mine["drift_ppm"]).abs().max() <= 1e-6
        job = set(mine.index)
        theirs_events = both.events[both.events["send_capture"].isin(job) | both.events["recv_capture"].isin(job)]
        assert len(theirs_events) == len(alone.events)
        for column in TIMES:
            apart = np.sort(alone.events[column].dropna().to_numpy(np.int64))
            beside = np.sort(theirs_events[column].dropna().to_numpy(np.int64))
            assert len(apart) == len(beside) and np.abs(apart - beside).max() <= 1_000, column


def test_captures_that_cannot_be_aligned_are_listed_with_why(tmp_path):
    """The ZMTP job's captures (no message the job view merges) beside the MXNet job's: listed, not aligned,
    with no offset, and said in the summary."""
    view, summary = decoded([PCAPS / "mxnet_sync", PCAPS / "zmq"], tmp_path / "decoded")
    clocks = view.clocks.set_index("capture")
    assert {"client", "server", "scheduler", "worker0"} <= set(clocks.index)
    for name in ("client", "server"):
        row = clocks.loc[name]
        assert not row["aligned"] and pd.isna(row["offset_ns"]) and pd.isna(row["drift_ppm"])
        assert "no message the job view merges" in row["reason"]
    assert [w for w in summary["warnings"] if w.startswith("clocks")] == [
        f"clocks: captures client, server could not be aligned ({clocks.loc['client', 'reason']}); their times stay "
        f"on their own clocks"]
    assert clocks.drop(index=["client", "server"])["aligned"].all()


# --- one host, one clock: Gloo --------------------------------------------------------------------------------

GLOO_FIELDS = ("opcode", "slot", "offset_bytes", "length_bytes", "roffset_bytes", "seq", "store_query", "store_key",
               "value_bytes")


def assert_each_send_paired_with_its_receive(decode_dir: Path, view) -> None:
    """On one clock: the aligned transits within the clocks' stated bounds of zero or more, the unaligned ones
    no more than microseconds below zero, and the sender's and the receiver's sightings of each message carry
    the same fields (slot, offsets, length; TCPStore's query and key)."""
    clocks = view.clocks.set_index("capture")
    events = both_ends(view.events)
    events = events[events["send_capture"].astype(str) != events["recv_capture"].astype(str)]
    assert len(events) > 100
    bound = (clocks["error_bound_ns"].reindex(events["send_capture"].astype(str)).to_numpy(np.int64)
             + clocks["error_bound_ns"].reindex(events["recv_capture"].astype(str)).to_numpy(np.int64))
    transit = events["transit_ns"].to_numpy(np.float64)
    whole = events["complete"].to_numpy(bool)
    assert np.isnan(transit[~whole]).all() and (transit[whole] >= -bound[whole] - PCAP_RESOLUTION_NS).all()
    # on the one clock a message's receipt starts after its send starts, and (whole at both ends) ends after it;
    # a sighting with a hole dates its last byte at the packet after the hole, so its end says nothing of pairing
    first = (events["recv_ts_first_ns"] - events["send_ts_first_ns"]).to_numpy(np.int64)
    last = (events["recv_ts_last_ns"] - events["send_ts_last_ns"]).to_numpy(np.int64)[whole]
    assert first.min() >= -ONE_CLOCK_SLACK_NS, first.min()
    assert last.min() >= -ONE_CLOCK_SLACK_NS, last.min()
    # each side's sighting, as the timeline pairs them; the fields compared are none it pairs by
    arrow = {name: pq.read_table(decode_dir / f"{name}.parquet") for name in ("messages", "streams", "nodes")}
    tables = {name: table.to_pandas() for name, table in arrow.items()}
    seen = pd.DataFrame({name: list(values) for name, values in observations(
        arrow["messages"].select(list(MESSAGE_READ_COLUMNS)), arrow["streams"], arrow["nodes"]).items()})
    seen = seen[seen["event_id"].isin(events["event_id"]).to_numpy(bool)]
    fields = tables["messages"][list(GLOO_FIELDS)]
    sent, received = (fields.iloc[seen.loc[seen[f"{side}_side"], ["event_id", "message_row"]].drop_duplicates(
        "event_id").set_index("event_id")["message_row"].reindex(events["event_id"]).to_numpy(np.int64)]
        .reset_index(drop=True) for side in ("send", "recv"))
    for column in GLOO_FIELDS:
        assert sent[column].isna().equals(received[column].isna()), column
        assert (sent[column].dropna() == received[column].dropna()).all(), column


def late_and_lossy(job_dir: Path, target: Path, late: str, lossy: str, late_from: int = 3000) -> Path:
    """The job's captures, `late`'s started `late_from` packets late (editcap -r), `lossy`'s with three runs of
    packets gone (editcap deleting them, as a busy host's capture drops them)."""
    target.mkdir(parents=True)
    job = load_job(job_dir)
    editcap = require_tool("editcap")
    for node in job.nodes:
        path = job.capture_path(node["name"])
        if node["name"] == late:
            subprocess.run([editcap, "-r", str(path), str(target / f"{late}.pcap"), f"{late_from}-100000000"], check=True)
        elif node["name"] == lossy:
            subprocess.run([editcap, str(path), str(target / f"{lossy}.pcap"), "5000-5100", "12000-12040",
                            "20000-20300"], check=True)
        else:
            shutil.copy(path, target / path.name)
    return target


def assert_messages_after_a_late_start_are_matched(job_dir: Path, view, late: str, late_capture: Path) -> None:
    """Every message on the late node's connections that its peers saw after the late capture's first packet
    (one clock), and after the other direction of its connection showed a message there, is seen at both ends:
    a direction caught inside a large message has no header in its first bytes, and its reverse is the
    evidence it is Gloo."""
    start_ns = int(epoch_times_ns(late_capture)[0])
    ip = load_job(job_dir).node(late)["ip"]
    events = view.events
    connection = events["connection"].astype(str)
    on_late = connection.str.contains(f"{ip}:", regex=False)
    peer_time = events["send_ts_first_ns"].where(events["send_capture"] != late, events["recv_ts_first_ns"])
    late_time = events["send_ts_first_ns"].where(events["send_capture"] == late, events["recv_ts_first_ns"])
    seen_late = late_time.where((events["send_capture"] == late) | (events["recv_capture"] == late))
    first_there = seen_late.groupby(connection).min()
    reverse = connection.map(lambda c: ">".join(reversed(c.split(">"))))
    evidence_ns = reverse.map(first_there).fillna(np.inf)
    later = events[on_late.to_numpy(bool) & (peer_time > np.maximum(start_ns, evidence_ns) + 10_000_000)
                   .fillna(False).to_numpy(bool)]
    assert len(later) > 100
    assert (later["send_capture"].notna() & later["recv_capture"].notna()).all()


def test_a_one_host_gloo_job_pairs_each_send_with_its_own_receive(tmp_path):
    view, summary = decoded([PCAPS / "gloo"], tmp_path / "whole")
    assert_each_send_paired_with_its_receive(tmp_path / "whole", view)
    assert len(both_ends(view.events)) == len(view.events)
    assert not [w for w in summary["warnings"] if "clock" in w]


def test_a_late_and_a_lossy_capture_pair_each_send_with_its_own_receive(tmp_path):
    """rank2's capture started late and rank1's lost packets: before, the n-th message of a kind on a
    connection at one end was paired with the n-th at the other, so every message after the first one missed
    was paired with its successor's receive (transits down to -357 ms on one clock)."""
    captures = late_and_lossy(PCAPS / "gloo", tmp_path / "captures", "rank2", "rank1")
    view, _ = decoded([captures], tmp_path / "decoded")
    assert_each_send_paired_with_its_receive(tmp_path / "decoded", view)
    assert_messages_after_a_late_start_are_matched(PCAPS / "gloo", view, "rank2", captures / "rank2.pcap")
    assert view.clocks["aligned"].all() and view.clocks["consistent"].all()


@pytest.mark.parametrize("late_from", [2000, 3000, 4000, 5000])         # each a cut where it happened
def test_a_capture_started_inside_large_messages_decodes_both_directions_of_every_gloo_pair(tmp_path, late_from):
    """rank1's capture started late, at packet counts where a direction of one or two of its Gloo pairs is inside
    a 0.9 MB message: its first bytes show no header, and ps-lite's weak mid-connection claim took it; it stayed
    plain TCP and its messages were seen at one end only. The claimed reverse direction is the evidence now."""
    captures = late_and_lossy(PCAPS / "gloo", tmp_path / "captures", "rank1", "rank3", late_from)
    view, _ = decoded([captures], tmp_path / "decoded")
    streams = pd.read_parquet(tmp_path / "decoded" / "streams.parquet")
    late = streams[(streams["capture"] == "rank1") & (streams["bytes"] > 0)
                   & ~streams["dst_port"].eq(29500) & ~streams["src_port"].eq(29500)]
    assert (late["protocol"] == "gloo").all() and len(late) == 6, late[["src_port", "dst_port", "protocol"]]
    assert_each_send_paired_with_its_receive(tmp_path / "decoded", view)
    assert_messages_after_a_late_start_are_matched(PCAPS / "gloo", view, "rank1", captures / "rank1.pcap")


# --- jobs recorded fresh ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fresh_mxnet(tmp_path_factory) -> Path:
    require_root()
    spec = MXNetJobSpec("clocks_heldout", "dist_sync", "mlp", batches=20)
    return record_mxnet_job(spec, tmp_path_factory.mktemp("fresh"), str(require_workloads()), timeout_s=300)


@pytest.fixture(scope="module")
def fresh_gloo(tmp_path_factory) -> Path:
    require_root()
    return record_gloo_job(tmp_path_factory.mktemp("fresh"), str(require_workloads()), name="clocks_gloo",
                           timeout_s=300)


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("moves", [
    {"server0": {"shift_s": 0.25}, "server1": {"shift_s": -0.75}, "worker0": {"shift_s": 1.5}},
    {"worker1": {"shift_ns": 10_000_000_000, "drift_ppm": 100.0},
     "server0": {"shift_ns": -10_000_000_000, "drift_ppm": -100.0}, "worker0": {"shift_ns": -250_000_000}},
], ids=["editcap", "drift"])
def test_a_fresh_mxnet_job_with_clocks_seconds_apart(fresh_mxnet, tmp_path, moves):
    original = decoded([fresh_mxnet], tmp_path / "original")[0]
    assert_every_logged_message_matched(fresh_mxnet, tmp_path / "original", original.events)
    view = decoded([moved_job(fresh_mxnet, tmp_path / "captures", moves)], tmp_path / "decoded")[0]
    assert_aligned_back(view, original)
    assert_every_logged_message_matched(fresh_mxnet, tmp_path / "decoded", view.events)


@pytest.mark.root
@pytest.mark.slow
def test_a_fresh_gloo_job_pairs_each_send_with_its_own_receive(fresh_gloo, tmp_path):
    view = decoded([fresh_gloo], tmp_path / "whole")[0]
    assert_each_send_paired_with_its_receive(tmp_path / "whole", view)
    captures = late_and_lossy(fresh_gloo, tmp_path / "captures", "rank1", "rank3")
    view = decoded([captures], tmp_path / "decoded")[0]
    assert_each_send_paired_with_its_receive(tmp_path / "decoded", view)


@pytest.mark.root
@pytest.mark.slow
def test_a_fresh_gloo_jobs_messages_after_a_late_start_are_seen_at_both_ends(fresh_gloo, tmp_path):
    captures = late_and_lossy(fresh_gloo, tmp_path / "captures", "rank1", "rank3")
    view = decoded([captures], tmp_path / "decoded")[0]
    assert_messages_after_a_late_start_are_matched(fresh_gloo, view, "rank1", captures / "rank1.pcap")
