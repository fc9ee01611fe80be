"""Capture limits said loudly (issue 19 item 3): a snap length that cut what the decoders read, holes over 1 % of
a flow, packets the kernel dropped as the capture tool recorded them (a pcapng's interface statistics, a capture
daemon's capture.json) are each a warning of `dlcsniff decode` (--json `warnings` and `capture_limits`, the
printed summary) saying what it cost and what to do; each protocol's losses go under its own name.

The captures are real: jobs recorded by tcpdump in network namespaces (lab/record.py: one here with `-s 96`, the
user's case; the bundled mxnet_lossy jobs, whose tcpdump's small buffer lost packets), cut by editcap, recorded by
dumpcap and by the capture daemon on a loaded loopback. The messages affected are checked against ps-lite's
own log (PS_VERBOSE=2, tests/support/groundtruth.py) of every message the job sent. Where a file had to be made
(a pcapng carrying tcpdump's recorded drop counts, a daemon directory around a recorded capture), capinfos
reads it back or the daemon's own format module wrote it.
"""
from __future__ import annotations

import collections
import gzip
import json
import re
import shutil
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from dlcsniff.cli import app
from dlcsniff.decoders.formats.capture_dir import CAPTURE_JSON, FORMAT, PCAP_NAME
from dlcsniff.decoders.inputs.capture_file import open_capture
from tests.conftest import PCAPS, require_root, require_tool, require_workloads
from tests.support import snap_replay
from tests.support.daemon import DLCSNIFF
from tests.support.groundtruth import event_message_keys, load_job, logged_sends

WHOLE_PACKETS, KEEP_UP = "tcpdump -s 0", "larger buffer"
PSLITE_CMD = 4                  # a logged_sends key's control command (None: a data or SimpleApp message)
LIMIT_NAMES = {"snaplen": "snap length", "holes": "holes", "kernel_drops": "kernel drops"}
BLAST_S = 2.0                   # how long the loopback is loaded while a capture with a small buffer runs


def decoded(inputs: list[Path], out: Path) -> tuple[dict, str]:
    """`dlcsniff decode` of the inputs: its --json summary, and its printed summary (a second output)."""
    runner = CliRunner()
    as_json = runner.invoke(app, ["decode", *map(str, inputs), "--out", str(out), "--json"], catch_exceptions=False)
    assert as_json.exit_code == 0, as_json.output
    printed = runner.invoke(app, ["decode", *map(str, inputs), "--out", str(out / "printed")],
                            catch_exceptions=False)
    assert printed.exit_code == 0, printed.output
    return json.loads(as_json.stdout), printed.output


def the_limit(summary: dict, printed: str, limit: str) -> dict:
    """The one capture limit of that kind, after checking its warning is in --json and in the printed summary."""
    found = [entry for entry in summary["capture_limits"] if entry["limit"] == limit]
    assert len(found) == 1, summary["capture_limits"]
    warnings = [w for w in summary["warnings"] if w.startswith(f"capture limit ({LIMIT_NAMES[limit]}): ")]
    assert len(warnings) == 1, summary["warnings"]
    assert re.sub(r"\s+", " ", warnings[0]) in re.sub(r"\s+", " ", printed.replace("warning: ", ""))
    found[0]["warning"] = warnings[0]
    return found[0]


def logged(job_dir: Path) -> tuple[int, collections.Counter]:
    """(ps-lite messages the job sent, its data and SimpleApp messages by their fields): the nodes' own logs."""
    sent = logged_sends(load_job(job_dir))
    return sum(sent.values()), collections.Counter({key: n for key, n in sent.items() if key[PSLITE_CMD] is None})


def missed_of_logged(job_dir: Path, out: Path) -> int:
    """Data and SimpleApp messages the log lists that the decode did not get whole (events.parquet)."""
    _, data = logged(job_dir)
    events = pd.read_parquet(out / "events.parquet")
    whole = event_message_keys(events[events["complete"].to_numpy(bool)], pd.read_parquet(out / "messages.parquet"))
    return sum(data.values()) - sum((data & whole).values())


def assert_cut_cost_is_told(summary: dict, printed: str, job_dir: Path, out: Path, snaplen: int | None) -> None:
    limit = the_limit(summary, printed, "snaplen")
    assert WHOLE_PACKETS in limit["warning"] and "dlcsniff capture" in limit["warning"]
    if snaplen is not None:
        assert f"snaplen: {snaplen} B" in limit["warning"] and set(limit["snaplen_bytes"].values()) == {snaplen}
    sent, _ = logged(job_dir)
    events = pd.read_parquet(out / "events.parquet")
    whole = int(events["complete"].sum())
    # what the warning counts is never more than the log says was not decoded whole; what it cannot count (the
    # messages in the bytes skipped to find the framing again) it says it does not
    assert 0 < limit["messages_affected"] <= sent - whole
    assert sent - whole > limit["messages_affected"] and "lost, and not counted" in limit["warning"]
    assert limit["losses"]["pslite"]["lost_bytes"] > 0


@pytest.mark.root
def test_a_job_recorded_by_tcpdump_with_snaplen_96(tmp_path):
    require_root()
    from lab.record import MXNetJobSpec, record_mxnet_job
    job_dir = record_mxnet_job(MXNetJobSpec("snaplen96", "dist_sync", "mlp", batches=3, snaplen=96), tmp_path,
                               str(require_workloads()))
    summary, printed = decoded([job_dir], tmp_path / "out")
    assert_cut_cost_is_told(summary, printed, job_dir, tmp_path / "out", snaplen=96)


def test_a_job_cut_to_96_bytes_by_editcap(tmp_path):
    """editcap cuts the records and leaves the file's snap length as it was: the warning says it."""
    job = tmp_path / "mxnet_sync"
    shutil.copytree(PCAPS / "mxnet_sync", job, ignore=shutil.ignore_patterns("*.pcap.gz"))
    for capture in sorted((PCAPS / "mxnet_sync").glob("*.pcap.gz")):
        subprocess.run([require_tool("editcap"), "-s", "96", str(capture), str(job / capture.name.removesuffix(".gz"))],
                       check=True)
    summary, printed = decoded([job], tmp_path / "out")
    assert_cut_cost_is_told(summary, printed, job, tmp_path / "out", snaplen=None)
    assert "files' snaplen: 1,564 B" in printed


def test_holes_over_1_percent_of_a_flow(tmp_path):
    """mxnet_lossy: tcpdump's small buffer lost packets in two captures. Every message ps-lite logged was seen by
    one capture or the other; the warning counts exactly those the decode did not get whole."""
    summary, printed = decoded([PCAPS / "mxnet_lossy"], tmp_path / "out")
    limit = the_limit(summary, printed, "holes")
    assert limit["captures"] == ["server0", "worker0"] and limit["directions"] == 4
    assert KEEP_UP in limit["warning"] and "dlcsniff capture" in limit["warning"]
    assert (limit["messages_affected"] == missed_of_logged(PCAPS / "mxnet_lossy", tmp_path / "out")
            == limit["losses"]["pslite"]["incomplete_messages"] == 11)
    assert summary["losses_by_protocol"]["pslite"]["incomplete_messages"] == summary["incomplete_messages"] == 11
    assert "losses by protocol: pslite 11 messages incomplete" in printed


def test_holes_that_took_messages_whole_say_so(tmp_path):
    """mxnet_lossy_heavy: some messages' every byte fell in the holes; the warning counts what it can and says
    what it cannot."""
    summary, printed = decoded([PCAPS / "mxnet_lossy_heavy"], tmp_path / "out")
    limit = the_limit(summary, printed, "holes")
    missed = missed_of_logged(PCAPS / "mxnet_lossy_heavy", tmp_path / "out")
    assert 0 < limit["messages_affected"] < missed and "lost, and not counted" in limit["warning"]


def _statistics_block(interface: int, received: int, dropped: int) -> bytes:
    """A pcapng interface statistics block (little-endian): isb_ifrecv, isb_ifdrop, end of options."""
    options = struct.pack("<HHQHHQHH", 4, 8, received, 5, 8, dropped, 0, 0)
    length = 20 + len(options) + 4
    return struct.pack("<IIIII", 5, length, interface, 0, 0) + options + struct.pack("<I", length)


def test_kernel_drops_in_pcapng_statistics(tmp_path):
    """mxnet_lossy as pcapng files carrying what its tcpdump said it dropped (job.json's capture_stats), in the
    interface statistics block dumpcap writes (capinfos reads the block back)."""
    job = load_job(PCAPS / "mxnet_lossy")
    captures = []
    for node in job.nodes:
        path = tmp_path / "job" / f"{node['name']}.pcapng"
        path.parent.mkdir(exist_ok=True)
        subprocess.run([require_tool("editcap"), "-F", "pcapng", str(job.capture_path(node["name"])), str(path)],
                       check=True)
        stats = node["capture_stats"]
        with open(path, "ab") as capture:
            capture.write(_statistics_block(0, stats["packets_received_by_filter"], stats["packets_dropped_by_kernel"]))
        info = subprocess.run([require_tool("capinfos"), "-I", str(path)], capture_output=True, text=True, check=True)
        assert "Number of stat entries = 1" in info.stdout
        captures.append(path)
    summary, printed = decoded([tmp_path / "job"], tmp_path / "out")
    limit = the_limit(summary, printed, "kernel_drops")
    assert limit["dropped_packets"] == {"server0": 674, "worker0": 176}
    assert "674 in server0, 176 in worker0" in limit["warning"] and KEEP_UP in limit["warning"]
    assert limit["messages_affected"] == missed_of_logged(PCAPS / "mxnet_lossy", tmp_path / "out") == 11


def _daemon_directory(path: Path, capture: Path, dropped: int) -> Path:
    """A capture daemon's directory holding one recorded capture as its set 1, capture.json saying the kernel
    dropped `dropped` packets while it was written."""
    path.mkdir(parents=True)
    name = PCAP_NAME.format(set=1, index=0)
    with gzip.open(capture) as source, open(path / name, "wb") as target:
        shutil.copyfileobj(source, target)
    (path / CAPTURE_JSON).write_text(json.dumps({"format": FORMAT, "runs": [{"set": 1}], "files": [
        {"name": name, "set": 1, "kind": "packets", "opened_ns": 0, "dropped": dropped}]}))
    return path


def test_kernel_drops_in_a_daemon_capture_json(tmp_path):
    job = load_job(PCAPS / "mxnet_lossy")
    directories = [_daemon_directory(tmp_path / node["name"], job.capture_path(node["name"]),
                                     node["capture_stats"]["packets_dropped_by_kernel"]) for node in job.nodes]
    summary, printed = decoded(directories, tmp_path / "out")
    limit = the_limit(summary, printed, "kernel_drops")
    assert limit["dropped_packets"] == {"server0": 674, "worker0": 176}
    assert limit["messages_affected"] == missed_of_logged(PCAPS / "mxnet_lossy", tmp_path / "out") == 11


def _load_loopback(port: int, seconds: float) -> None:
    """As much TCP over the loopback as one connection carries for `seconds`."""
    server = socket.create_server(("127.0.0.1", port))
    done = threading.Event()

    def sink() -> None:
        connection, _ = server.accept()
        with connection:
            while connection.recv(1 << 20):
                pass
        done.set()
    threading.Thread(target=sink, daemon=True).start()
    chunk = bytes(1 << 20)
    with socket.create_connection(("127.0.0.1", port)) as sender:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sender.sendall(chunk)
    done.wait(10)
    server.close()


@pytest.mark.root
def test_what_dumpcap_dropped_is_read_from_its_statistics(tmp_path):
    """A real dumpcap with a 1 MiB buffer on a loaded loopback: the drop count it prints is the one read from the
    file it wrote, and decode warns of it."""
    require_root()
    path = tmp_path / "busy.pcapng"
    dumpcap = subprocess.Popen([require_tool("dumpcap"), "-i", "lo", "-B", "1", "-f", "tcp port 45711", "-w",
                                str(path), "-a", f"duration:{BLAST_S + 2:.0f}"], stderr=subprocess.PIPE, text=True)
    time.sleep(1)
    _load_loopback(45711, BLAST_S)
    _, stderr = dumpcap.communicate(timeout=30)
    said = re.search(r"Packets received/dropped on interface '[^']*': (\d+)/(\d+)", stderr)
    assert said, stderr
    with open_capture(path) as reader:
        for _ in reader.batches():
            pass
        assert reader.dropped_packets == int(said.group(2)) > 0
    summary, printed = decoded([path], tmp_path / "out")
    limit = the_limit(summary, printed, "kernel_drops")
    assert limit["dropped_packets"] == {"busy": int(said.group(2))}


@pytest.mark.root
def test_what_the_capture_daemon_dropped_is_read_from_its_capture_json(tmp_path):
    require_root()
    out = tmp_path / "daemon"
    daemon = subprocess.Popen([str(DLCSNIFF), "capture", "-i", "lo", "--out", str(out), "--buffer-size", "1MiB",
                               "--no-ebpf", "--filter", "tcp port 45712", "--duration", f"{BLAST_S + 3:.0f}s"],
                              stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    _load_loopback(45712, BLAST_S)
    daemon.communicate(timeout=60)
    dropped = sum(entry["dropped"] for entry in json.loads((out / CAPTURE_JSON).read_text())["files"]
                  if entry["kind"] == "packets")
    assert dropped > 0
    summary, printed = decoded([out], tmp_path / "out")
    assert the_limit(summary, printed, "kernel_drops")["dropped_packets"] == {"daemon": dropped}


@pytest.mark.root
def test_the_daemons_cut_is_no_limit(tmp_path):
    """mxnet_sync cut by the daemon's in-kernel filter (run by the kernel on each packet, tests/support/
    snap_replay.py): most bytes cut, nothing the decoders read, no warning."""
    require_root()
    (tmp_path / "job").mkdir()
    for capture in sorted((PCAPS / "mxnet_sync").glob("*.pcap.gz")):
        cut, _ = snap_replay.cut_capture(snap_replay.read_capture(capture))
        cut.write(tmp_path / "job" / capture.name.removesuffix(".gz"))
    summary, printed = decoded([tmp_path / "job"], tmp_path / "out")
    assert summary["uncaptured_bytes"] > 0.9 * (summary["uncaptured_bytes"] + summary["tcp_bytes"])
    assert summary["capture_limits"] == [] and summary["losses_by_protocol"] == {}
    assert "capture limit" not in printed and summary["messages"] == 253


CLEAN_JOBS = sorted(path.name for path in PCAPS.iterdir() if path.is_dir() and path.name != "realcaps"
                    and not path.name.startswith("mxnet_lossy"))


@pytest.mark.parametrize("job", CLEAN_JOBS)
def test_no_limit_on_a_clean_job(job, tmp_path):
    """Every bundled job whose captures kept every packet (their files' snap length is above every packet)."""
    from dlcsniff.decoders.job import decode_paths
    summary = decode_paths([PCAPS / job]).summary
    assert summary["capture_limits"] == [] and summary["losses_by_protocol"] == {}
    assert not [w for w in summary["warnings"] if w.startswith("capture limit")]


def test_a_gloo_jobs_losses_go_under_gloo(tmp_path):
    """The Gloo job with 401 packets of one rank's capture deleted (editcap): the bytes its Gloo decoder skipped
    are Gloo's, said under its name; nothing is said of ZMTP (issue 19 item 3: "ZMTP resync skipped" was
    printed for Gloo jobs)."""
    job = tmp_path / "gloo"
    job.mkdir()
    for capture in sorted((PCAPS / "gloo").glob("*.pcap.gz")):
        if capture.name.startswith("rank1"):
            subprocess.run([require_tool("editcap"), str(capture), str(job / "rank1.pcap"), "5000-5400"], check=True)
        else:
            shutil.copy(capture, job)
    summary, printed = decoded([job], tmp_path / "out")
    assert set(summary["losses_by_protocol"]) == {"gloo"} and summary["zmtp_lost_bytes"] == 0
    assert summary["losses_by_protocol"]["gloo"]["lost_bytes"] > 0
    assert "ZMTP" not in printed
    assert re.search(r"losses by protocol: gloo \d+ messages incomplete .*, [\d,]+ B skipped to find the Gloo "
                     r"framing again", printed)


def test_a_plain_zmq_jobs_losses_name_no_ps_lite_header(tmp_path):
    """pcaps/zmq (pyzmq, no ps-lite) with a seeded 10 % of its TCP data segments dropped: the ZMTP messages the
    holes cut are counted under zmtp as ZMTP messages incomplete, each connection once, as zmtp.parquet holds
    them; nothing is said of a ps-lite header, which these streams never had (it said "zmtp 3 messages
    unreadable (their ps-lite header not captured)", and counted only those before a stream's first whole one)."""
    from tests.support.gloo_matrix import drop_segments
    job = tmp_path / "zmq"
    job.mkdir()
    for capture in sorted((PCAPS / "zmq").glob("*.pcap.gz")):
        assert drop_segments(capture, job / capture.name.removesuffix(".gz"), 0.1, seed=7).left_out > 0
    summary, printed = decoded([job], tmp_path / "out")
    zmtp = pd.read_parquet(tmp_path / "out" / "zmtp.parquet")
    streams = pd.read_parquet(tmp_path / "out" / "streams.parquet")
    plain = streams[streams["protocol"] == "zmtp"]
    cut = zmtp[zmtp["command"].isna() & ~zmtp["complete"]].merge(
        plain[["flow_id", "src_ip", "src_port", "dst_ip", "dst_port"]], on="flow_id")
    by_direction = cut.groupby(["flow_id", "src_ip", "src_port", "dst_ip", "dst_port"]).size()
    each_connection_once = by_direction.groupby(level=[1, 2, 3, 4]).max()     # as the capture that lost most
    assert each_connection_once.sum() > 0
    assert summary["losses_by_protocol"]["zmtp"]["undecoded_messages"] == each_connection_once.sum()
    assert "ps-lite" not in " ".join(summary["warnings"]) and "ps-lite header" not in printed
    assert re.search(r"losses by protocol: zmtp \d+ ZMTP messages incomplete \(bytes of them not captured\)", printed)
