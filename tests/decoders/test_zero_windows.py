"""The zero windows of each TCP direction (streams' zero_windows, zero_window_ns: decoders/tcp.py) are the ones
tshark's TCP analysis flags (tcp.analysis.zero_window), on real captures: pcaps/tcp_zero_window (a reader that
stopped reading three times, lab/workloads/slow_reader.py) and pcaps/gloo (one zero window, 82 µs, of a healthy
job; tests/decoders/test_tcp_driver.py holds the per-packet decode to the same); the time at zero window is what
tshark's window fields give by the same rule (from a zero advertisement to the next one with room, without
SYN/FIN/RST), and lies within the reader's own record of when it stopped reading."""
from __future__ import annotations

import json
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest

from dlcsniff.decoders.capture_decoder import decode_capture
from tests.conftest import PCAPS, require_tool

ZERO_WINDOW_JOB = PCAPS / "tcp_zero_window"
CAPTURES = [ZERO_WINDOW_JOB / "reader.pcap.gz", ZERO_WINDOW_JOB / "sender.pcap.gz", PCAPS / "gloo" / "rank0.pcap.gz",
            PCAPS / "gloo" / "rank1.pcap.gz"]
SYN_FIN_RST = 0x07
Direction = tuple[str, int, str, int]


def _tshark_packets(capture: Path) -> list[list[str]]:
    out = subprocess.run([require_tool("tshark"), "-r", str(capture), "-Y", "tcp", "-T", "fields", "-e", "ip.src",
                          "-e", "tcp.srcport", "-e", "ip.dst", "-e", "tcp.dstport", "-e", "frame.time_epoch", "-e",
                          "tcp.flags", "-e", "tcp.window_size_value", "-e", "tcp.analysis.zero_window"],
                         capture_output=True, text=True, check=True).stdout
    return [line.split("\t") for line in out.splitlines()]


def tshark_zero_windows(capture: Path) -> dict[Direction, tuple[int, int]]:
    """Per direction with zero windows: tshark's count of them, and the ns its window stayed at zero by tshark's
    window fields (still zero at the direction's last packet: to that packet)."""
    count: dict[Direction, int] = {}
    closed_ns: dict[Direction, int] = {}
    since: dict[Direction, int] = {}
    last: dict[Direction, int] = {}
    for src, sport, dst, dport, epoch, flags, window, zero in _tshark_packets(capture):
        key = (src, int(sport), dst, int(dport))
        ts_ns = int(Decimal(epoch) * 1_000_000_000)
        last[key] = ts_ns
        if zero:
            count[key] = count.get(key, 0) + 1
        if int(flags, 16) & SYN_FIN_RST:
            continue
        if int(window) == 0:
            since.setdefault(key, ts_ns)
        elif key in since:
            closed_ns[key] = closed_ns.get(key, 0) + ts_ns - since.pop(key)
    for key, start_ns in since.items():
        closed_ns[key] = closed_ns.get(key, 0) + last[key] - start_ns
    return {key: (n, closed_ns.get(key, 0)) for key, n in count.items()}


def dlcsniff_zero_windows(capture: Path) -> dict[Direction, tuple[int, int]]:
    streams = decode_capture(capture).tables["streams"]
    rows = zip(streams["src_ip"], streams["src_port"], streams["dst_ip"], streams["dst_port"], streams["zero_windows"],
               streams["zero_window_ns"])
    return {(src, sport, dst, dport): (n, ns) for src, sport, dst, dport, n, ns in rows if n}


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda path: str(path.relative_to(PCAPS)))
def test_zero_windows_are_tsharks(capture):
    truth = tshark_zero_windows(capture)
    assert truth, "no zero window in the capture: the test would prove nothing"
    assert dlcsniff_zero_windows(capture) == truth


def test_the_window_was_closed_only_while_the_reader_did_not_read():
    """Each zero window the reader's capture shows falls within one of its three stops (its record: wall-clock ns
    around each sleep, the capture taken on the same machine), and each stop closed the window."""
    pauses = json.loads((ZERO_WINDOW_JOB / "reader.json").read_text())["pauses"]
    closed = [int(Decimal(epoch) * 1_000_000_000) for *_, epoch, _, _, zero in _tshark_packets(
        ZERO_WINDOW_JOB / "reader.pcap.gz") if zero]
    within = [next((k for k, pause in enumerate(pauses) if pause["start_ns"] <= ts <= pause["end_ns"]), None)
              for ts in closed]
    assert None not in within and set(within) == {0, 1, 2}, (closed, pauses)
    ((count, closed_ns),) = dlcsniff_zero_windows(ZERO_WINDOW_JOB / "reader.pcap.gz").values()
    assert count == len(closed)
    assert 0 < closed_ns < sum(pause["end_ns"] - pause["start_ns"] for pause in pauses)


@pytest.mark.root
def test_a_slow_reader_recorded_now_has_the_zero_windows_tshark_sees(tmp_path):
    """The recorder's slow-reader job recorded afresh (other timings than the bundled capture's): every capture's
    zero windows and their time, as tshark's fields give them."""
    from lab.record import record_zero_window_job
    from tests.conftest import require_root, require_workloads
    require_root()
    job_dir = record_zero_window_job(tmp_path / "jobs", str(require_workloads()))
    for capture in sorted(job_dir.glob("*.pcap.gz")):
        truth = tshark_zero_windows(capture)
        assert truth, capture.name
        assert dlcsniff_zero_windows(capture) == truth, capture.name
