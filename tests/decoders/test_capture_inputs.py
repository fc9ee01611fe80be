"""Captures as users make them, made here by the real tools: tcpdump -C/-W/-G, dumpcap ring buffers, editcap -c
chunks, xz and zstd, pipes and fifos. The pieces of one capture must decode exactly like the whole capture (TCP
flows go on across the pieces); packet counts are tshark's and tcpdump's; inputs of two jobs are warned about;
--filter and the time window keep what tcpdump's filter and tshark's time comparison keep."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dlcsniff.cli import app
from dlcsniff.decoders.errors import CaptureError
from dlcsniff.decoders.inputs.capture_set import expand_inputs
from dlcsniff.decoders.inputs.selection import PacketSelection, TimeBound
from dlcsniff.decoders.job import decode_paths
from tests.conftest import PCAPS, REPO, require_root, require_tool

SYNC = PCAPS / "mxnet_sync"
DLCSNIFF = REPO / ".venv" / "bin" / "dlcsniff"


def _gunzip(source: Path, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.decompress(source.read_bytes()))
    return path


def _tshark_count(*paths: Path, display_filter: str | None = None) -> int:
    total = 0
    for path in paths:
        args = [require_tool("tshark"), "-r", str(path), "-T", "fields", "-e", "frame.number"]
        if display_filter:
            args += ["-Y", display_filter]
        total += len(subprocess.run(args, check=True, capture_output=True, text=True).stdout.split())
    return total


def _tables(inputs: list[Path], **options):
    """The decode tables without the capture column (named after the input), and the summary."""
    dataset = decode_paths(inputs, workers=0, **options)
    return {name: table.drop_columns([c for c in ("capture",) if c in table.column_names])
            for name, table in dataset.tables.items()}, dataset.summary


def _assert_same_decode(pieces: list[Path], whole: Path, counted: list[Path] | None = None) -> dict:
    """Pieces (files, or directories of them) decoded as one capture, exactly like the whole capture; and
    as many packets as tshark counts in them (in `counted`: the same pieces in a form tshark reads)."""
    ours, summary = _tables(pieces)
    theirs, whole_summary = _tables([whole])
    assert len(summary["captures"]) == 1, summary["captures"]
    for name, table in theirs.items():
        assert ours[name].equals(table), name
    assert summary["midstream_streams"] == whole_summary["midstream_streams"]
    files = counted or [f for p in pieces for f in (sorted(p.iterdir()) if p.is_dir() else [p])]
    assert summary["packets"] == whole_summary["packets"] == _tshark_count(*files)
    return summary


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """A real capture: worker0 of the bundled MXNet job, uncompressed (2,796 packets, 2.4 MB)."""
    return _gunzip(SYNC / "worker0.pcap.gz", tmp_path_factory.mktemp("whole") / "worker0.pcap")


def _tcpdump_split(whole: Path, out: Path, *args: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([require_tool("tcpdump"), "-Z", "root", "-r", str(whole), "-w", str(out / whole.name), *args],
                   check=True, capture_output=True)
    return sorted(out.iterdir())


def test_tcpdump_C_pieces_in_a_directory_are_one_capture(whole, tmp_path):
    pieces = _tcpdump_split(whole, tmp_path / "c", "-C", "1")
    assert [p.name for p in pieces] == ["worker0.pcap", "worker0.pcap1", "worker0.pcap2"]
    summary = _assert_same_decode([tmp_path / "c"], whole)
    assert summary["captures"][0]["capture"] == "worker0"
    assert [Path(f["path"]).name for f in summary["captures"][0]["files"]] == [p.name for p in pieces]
    assert summary["midstream_streams"] == 0 and summary["warnings"] == []


def test_pieces_named_in_any_order_are_read_in_time_order(whole, tmp_path):
    pieces = _tcpdump_split(whole, tmp_path / "c", "-C", "1")
    _assert_same_decode([pieces[2], pieces[0], pieces[1]], whole)


def test_a_tcpdump_ring_that_wrapped_is_read_from_its_oldest_file(whole, tmp_path):
    # -C 1 -W 2 over 2.4 MB: the third megabyte overwrote file 0, so file 1 holds the older packets
    pieces = _tcpdump_split(whole, tmp_path / "ring", "-C", "1", "-W", "2")
    assert [p.name for p in pieces] == ["worker0.pcap0", "worker0.pcap1"]
    merged = tmp_path / "merged.pcap"
    subprocess.run([require_tool("mergecap"), "-F", "pcap", "-w", str(merged), *map(str, pieces)], check=True)
    summary = _assert_same_decode(pieces, merged)
    assert [Path(f["path"]).name for f in summary["captures"][0]["files"]] == ["worker0.pcap1", "worker0.pcap0"]


@pytest.mark.parametrize("fmt", ["pcap", "pcapng"])
def test_editcap_chunks_decode_like_the_whole_capture(whole, tmp_path, fmt):
    subprocess.run([require_tool("editcap"), "-F", fmt, "-c", "700", str(whole), str(tmp_path / f"chunk.{fmt}")],
                   check=True, capture_output=True)
    pieces = sorted(tmp_path.glob(f"chunk_*.{fmt}"))
    assert len(pieces) == 4
    reference = whole
    if fmt == "pcapng":
        reference = tmp_path / "whole.pcapng"
        subprocess.run([require_tool("editcap"), "-F", "pcapng", str(whole), str(reference)], check=True)
    summary = _assert_same_decode(pieces, reference)
    assert summary["captures"][0]["capture"] == "chunk"


@pytest.mark.parametrize("tool", ["xz", "zstd", "gzip"])
def test_compressed_pieces(whole, tmp_path, tool):
    pieces = _tcpdump_split(whole, tmp_path / "c", "-C", "1")
    originals = _tcpdump_split(whole, tmp_path / "originals", "-C", "1")
    subprocess.run([require_tool(tool), "-q", *(["--rm"] if tool == "zstd" else []), *map(str, pieces)], check=True)
    compressed = sorted((tmp_path / "c").iterdir())
    assert all(p.suffix in (".xz", ".zst", ".gz") for p in compressed) and len(compressed) == 3
    _assert_same_decode([tmp_path / "c"], whole, counted=originals)


def test_a_capture_daemons_files_named_one_by_one(whole, tmp_path):
    # the daemon's rotated files (capture-SSSS-FFFFF.pcap) given without their directory: one capture per set
    subprocess.run([require_tool("editcap"), "-c", "1000", str(whole), str(tmp_path / "chunk.pcap")], check=True)
    for index, chunk in enumerate(sorted(tmp_path.glob("chunk_*.pcap"))):
        chunk.rename(tmp_path / f"capture-0000-{index:05d}.pcap")
    pieces = sorted(tmp_path.glob("capture-*.pcap"))
    summary = _assert_same_decode(pieces, whole)
    assert summary["captures"][0]["capture"] == "capture-0000"


def test_packet_by_packet_selection_agrees_with_the_batch_path(whole):
    from dlcsniff.decoders.capture_decoder import decode_capture
    selection = PacketSelection(filter="tcp port 9200 or arp", start=TimeBound(100_000_000, True),
                                end=TimeBound(600_000_000, True))
    batched = decode_capture(whole, selection=selection)
    one_by_one = decode_capture(whole, selection=selection, batched=False)
    assert 0 < batched.packets_decoded == one_by_one.packets_decoded < batched.packets
    assert batched.tables["streams"] == one_by_one.tables["streams"]


def test_nodes_named_alike_stay_apart(tmp_path):
    # worker0.pcap and worker1.pcap differ by a digit, as pieces of a -G capture would, but were captured at
    # the same time: two nodes
    for node in ("worker0", "worker1"):
        _gunzip(SYNC / f"{node}.pcap.gz", tmp_path / f"{node}.pcap")
    captures = expand_inputs([tmp_path])
    assert [(c.name, len(c.files)) for c in captures] == [("worker0", 1), ("worker1", 1)]
    assert all(c.notes == () for c in captures)


def test_nodes_named_alike_with_clocks_seconds_apart_stay_apart(tmp_path):
    # worker0's clock 1.5 s ahead (editcap -t): its 0.76 s of packets now start after worker1's end, as the next
    # piece of a -G capture would; its TCP connections are not worker1's, so it is a node of its own
    _gunzip(SYNC / "worker1.pcap.gz", tmp_path / "worker1.pcap")
    subprocess.run([require_tool("editcap"), "-t", "1.5", str(SYNC / "worker0.pcap.gz"),
                    str(tmp_path / "worker0.pcap")], check=True)
    assert [(c.name, len(c.files)) for c in expand_inputs([tmp_path])] == [("worker0", 1), ("worker1", 1)]


def test_nodes_that_share_a_small_connection_with_clocks_seconds_apart_stay_apart(tmp_path):
    # gloo_straggler's rank1 and rank3 each captured their connection to the other, which carries less than a
    # send window: with rank3's clock 14 s ahead (editcap -t), its packets start after rank1's end and take up
    # that connection no further back than the slack allows, so they were read as rank1's next piece (one
    # capture "rank1", "no packets for 8.8 s ... a piece missing?"); rank3's first packets open it again (SYN)
    for rank, shift in (("rank1", "0"), ("rank3", "14")):
        subprocess.run([require_tool("editcap"), "-F", "pcap", "-t", shift,
                        str(PCAPS / "gloo_straggler" / f"{rank}.pcap.gz"), str(tmp_path / f"{rank}.pcap")], check=True)
    assert [(c.name, len(c.files)) for c in expand_inputs([tmp_path])] == [("rank1", 1), ("rank3", 1)]


def test_pieces_named_alike_by_no_tool_are_one_capture(whole, tmp_path):
    # tcpdump -G's names, or a user's: alike but for their digits; the TCP traffic goes on from piece to piece
    subprocess.run([require_tool("editcap"), "-c", "1000", str(whole), str(tmp_path / "chunk.pcap")], check=True)
    for index, chunk in enumerate(sorted(tmp_path.glob("chunk_*.pcap"))):
        chunk.rename(tmp_path / f"trace-{index + 1}.pcap")
    summary = _assert_same_decode(sorted(tmp_path.glob("trace-*.pcap")), whole)
    assert summary["captures"][0]["capture"] == "trace-1"


def test_same_names_in_two_directories_are_refused_with_how_to_name_them(tmp_path):
    _gunzip(SYNC / "worker0.pcap.gz", tmp_path / "a" / "node0.pcap")
    _gunzip(SYNC / "worker1.pcap.gz", tmp_path / "b" / "node0.pcap")
    for inputs in ([tmp_path / "a" / "node0.pcap", tmp_path / "b" / "node0.pcap"], [tmp_path / "a", tmp_path / "b"]):
        with pytest.raises(CaptureError, match=r"share the capture name 'node0'.*e\.g\. a-node0\.pcap, b-node0\.pcap"):
            expand_inputs(inputs)
        result = CliRunner().invoke(app, ["decode", *map(str, inputs), "--out", str(tmp_path / "out")])
        assert result.exit_code != 0 and "Traceback" not in result.output
        assert len(result.output.strip().splitlines()) == 1 and "give each node's capture a name" in result.output
    # one of them empty (a node whose capture saw nothing): no piece of the other either
    subprocess.run([require_tool("editcap"), "-r", str(tmp_path / "a" / "node0.pcap"),
                    str(tmp_path / "b" / "node0.pcap"), "100000"], check=True)
    with pytest.raises(CaptureError, match="a file without packets is no piece of another"):
        expand_inputs([tmp_path / "a", tmp_path / "b"])


def test_same_names_in_two_directories_that_are_pieces_are_one_capture(whole, tmp_path):
    # one node's capture split in two, each half in a directory of its own under the capture's name
    subprocess.run([require_tool("editcap"), "-c", "1500", str(whole), str(tmp_path / "half.pcap")], check=True)
    for directory, half in zip("ab", sorted(tmp_path.glob("half_*.pcap"))):
        (tmp_path / directory).mkdir()
        half.rename(tmp_path / directory / "node0.pcap")
    summary = _assert_same_decode([tmp_path / "b", tmp_path / "a"], whole)
    assert summary["captures"][0]["capture"] == "node0"
    assert [Path(f["path"]).parent.name for f in summary["captures"][0]["files"]] == ["a", "b"]


def test_pieces_named_alike_but_overlapping_say_why_they_stay_apart(tmp_path):
    # named as tcpdump -C pieces, but they are two nodes' captures: decoded apart, and the summary says so
    _gunzip(SYNC / "worker0.pcap.gz", tmp_path / "w.pcap")
    _gunzip(SYNC / "worker1.pcap.gz", tmp_path / "w.pcap1")
    _, summary = _tables([tmp_path])
    assert [c["capture"] for c in summary["captures"]] == ["w", "w.pcap1"]
    note = [w for w in summary["warnings"] if "named as pieces of one capture (tcpdump -C)" in w]
    assert note and "go on" in note[0]


@pytest.mark.parametrize("shift_s, warning", [
    ("5", "no packets for 5.00"),                    # the last piece 5 s later: a gap (a piece missing?)
    ("-0.00002", "overlap by"),                      # 20 µs earlier: its first packets overlap the piece before
])
def test_gaps_and_overlaps_between_pieces_are_reported(whole, tmp_path, shift_s, warning):
    pieces = _tcpdump_split(whole, tmp_path / "c", "-C", "1")
    moved = tmp_path / "moved"
    moved.mkdir()
    for p in pieces[:2]:
        shutil.copy(p, moved / p.name)
    subprocess.run([require_tool("editcap"), "-t", shift_s, str(pieces[2]), str(moved / pieces[2].name)], check=True)
    _, summary = _tables([moved])
    assert len(summary["captures"]) == 1
    assert any(warning in w and "worker0.pcap1 and worker0.pcap2" in w for w in summary["warnings"])


# -- live rotation: tcpdump -G, dumpcap ring buffers ------------------------------------------------------

def _start(args: list[str], ready: str) -> subprocess.Popen:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if ready in line:
            return proc
    proc.wait()
    raise AssertionError(f"{args[0]} did not start: {''.join(seen)}")


def _sink_server() -> tuple[int, socket.socket, threading.Thread]:
    """A TCP server on 127.0.0.1 reading one connection to its end: its port, socket and thread."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            while conn.recv(1 << 16):
                pass
    thread = threading.Thread(target=serve)
    thread.start()
    return port, server, thread


@pytest.mark.root
def test_live_rotation_by_tcpdump_G_and_dumpcap_ring(tmp_path):
    require_root()
    port, server, thread = _sink_server()
    bpf = f"tcp port {port}"
    (tmp_path / "g").mkdir()
    (tmp_path / "ring").mkdir()
    tcpdump = _start([require_tool("tcpdump"), "-i", "lo", "-n", "-U", "-Z", "root", "-G", "1",
                      "-w", str(tmp_path / "g" / "trace-%Y%m%d-%H%M%S.pcap"), bpf], "listening on")
    dumpcap = _start([require_tool("dumpcap"), "-i", "lo", "-f", bpf, "-b", "duration:1", "-b", "files:10",
                      "-w", str(tmp_path / "ring" / "node.pcapng")], "File:")
    try:
        client = socket.create_connection(("127.0.0.1", port))
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            client.sendall(b"x" * 2048)
            time.sleep(0.02)
        client.close()
        thread.join()
        time.sleep(1.0)
    finally:
        server.close()
        for proc in (tcpdump, dumpcap):
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
    for directory, pattern in (("g", "trace-*.pcap"), ("ring", "node_*.pcapng")):
        pieces = sorted((tmp_path / directory).glob(pattern))
        assert len(pieces) >= 3, pieces
        merged = tmp_path / f"{directory}-merged.pcapng"
        subprocess.run([require_tool("mergecap"), "-w", str(merged), *map(str, pieces)], check=True)
        summary = _assert_same_decode([tmp_path / directory], merged)
        assert summary["midstream_streams"] == 0          # the connection's SYN is in the first piece
        assert len(summary["captures"][0]["files"]) == len(pieces)


# -- streams ---------------------------------------------------------------------------------------------

def test_a_pipe_into_decode_dash(tmp_path):
    """A real pipe: gzip -dc capture | dlcsniff decode - (the installed command)."""
    out = tmp_path / "out"
    result = subprocess.run(f"gzip -dc {SYNC / 'worker0.pcap.gz'} | {DLCSNIFF} decode - --out {out} --json",
                            shell=True, check=True, capture_output=True, text=True)
    summary = json.loads(result.stdout)
    assert summary["captures"][0]["capture"] == "stdin"
    assert summary["packets"] == 2796


def test_stdin_and_a_fifo_through_the_cli(whole, tmp_path):
    expected, _ = _tables([whole])
    runner = CliRunner()
    for name, source in (("plain", whole.read_bytes()), ("zstd", subprocess.run(
            [require_tool("zstd"), "-c", str(whole)], check=True, capture_output=True).stdout)):
        result = runner.invoke(app, ["decode", "-", "--out", str(tmp_path / name), "--json"], input=source)
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["packets"] == 2796
    fifo = tmp_path / "worker0"
    os.mkfifo(fifo)
    writer = subprocess.Popen(f"xz -c {whole} > {fifo}", shell=True)
    result = runner.invoke(app, ["decode", str(fifo), "--out", str(tmp_path / "fifo"), "--json", "--progress"])
    writer.wait(timeout=30)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["captures"][0]["capture"] == "worker0" and summary["packets"] == 2796
    import pyarrow.parquet as pq
    streams = pq.read_table(tmp_path / "fifo" / "streams.parquet").drop_columns(["capture"])
    assert streams.equals(expected["streams"])


def test_dask_refuses_a_stream():
    from dlcsniff.decoders.dask_decode import decode_paths_dask
    with pytest.raises(CaptureError, match="cannot be handed to Dask workers"):
        decode_paths_dask([Path("-")])


# -- two jobs --------------------------------------------------------------------------------------------

def test_two_jobs_are_warned_about_with_the_evidence():
    _, summary = _tables([SYNC / "worker0.pcap.gz", PCAPS / "gloo" / "rank0.pcap.gz"])
    hosts = [w for w in summary["warnings"] if "no host in common" in w]
    times = [w for w in summary["warnings"] if "apart" in w]
    assert hosts and "captures worker0 (hosts 198.18.0." in hosts[0] and "captures rank0 (hosts 198.18.1." in hosts[0]
    assert times and "captures worker0 from 2026-" in times[0]


def test_two_jobs_at_one_time_are_told_apart_by_their_hosts(tmp_path):
    # the Gloo capture moved in time onto the MXNet one: only the hosts tell the jobs apart
    gloo = tmp_path / "rank0.pcap"
    first = lambda path: float(subprocess.run(  # noqa: E731
        [require_tool("tshark"), "-r", str(path), "-c", "1", "-T", "fields", "-e", "frame.time_epoch"],
        check=True, capture_output=True, text=True).stdout)
    shift = first(SYNC / "worker0.pcap.gz") - first(PCAPS / "gloo" / "rank0.pcap.gz")
    subprocess.run([require_tool("editcap"), "-t", f"{shift:.6f}", str(PCAPS / "gloo" / "rank0.pcap.gz"), str(gloo)],
                   check=True)
    _, summary = _tables([SYNC / "worker0.pcap.gz", gloo])
    assert any("look like 2 jobs: no host in common" in w for w in summary["warnings"])
    assert not any("apart" in w for w in summary["warnings"])


def test_one_job_gets_no_such_warning():
    _, summary = _tables([SYNC])
    assert not any("jobs" in w for w in summary["warnings"])


# -- --filter and the time window --------------------------------------------------------------------------

def test_filter_keeps_what_tcpdump_keeps_and_decodes_like_a_filtered_capture(whole, tmp_path):
    expression = "tcp and (src host 198.18.0.4 or (tcp[tcpflags] & tcp-syn != 0)) and len > 60"
    filtered = tmp_path / "filtered.pcap"
    subprocess.run([require_tool("tcpdump"), "-Z", "root", "-r", str(whole), "-w", str(filtered), expression],
                   check=True, capture_output=True)
    kept = _tshark_count(filtered)
    assert 0 < kept < 2796
    ours, summary = _tables([whole], selection=PacketSelection(filter=expression))
    theirs, _ = _tables([filtered])
    assert summary["packets"] == 2796 and summary["packets_decoded"] == kept
    for name, table in theirs.items():
        assert ours[name].equals(table), name
    assert summary["selection"]["filter"] == expression


def test_filter_on_pcapng_with_two_link_types(tmp_path):
    # an Ethernet interface and a Linux cooked one in one file: a program compiled for each
    ether = tmp_path / "ether.pcap"
    subprocess.run([require_tool("editcap"), "-T", "ether", str(SYNC / "scheduler.pcap.gz"), str(ether)], check=True)
    merged = tmp_path / "merged.pcapng"
    subprocess.run([require_tool("mergecap"), "-w", str(merged), str(ether), str(SYNC / "worker0.pcap.gz")],
                   check=True)
    display = "tcp.port == 9100 or tcp.port == 9000"
    _, summary = _tables([merged], selection=PacketSelection(filter="tcp port 9100 or tcp port 9000"))
    assert summary["packets_decoded"] == _tshark_count(merged, display_filter=display)


def test_time_window_keeps_what_tshark_keeps(whole, tmp_path):
    epochs = [float(t) for t in subprocess.run(
        [require_tool("tshark"), "-r", str(whole), "-T", "fields", "-e", "frame.time_epoch"], check=True,
        capture_output=True, text=True).stdout.split()]
    origin = min(epochs)
    start_s, end_s = origin + 0.2, origin + 0.72
    expected = sum(start_s <= t < end_s for t in epochs)
    runner = CliRunner()
    for index, (start, end) in enumerate(((f"{start_s:.6f}", f"{end_s:.6f}"), ("+0.2s", "+720ms"))):
        result = runner.invoke(app, ["decode", str(whole), "--out", str(tmp_path / f"w{index}"), "--json",
                                     "--start", start, "--end", end])
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout)
        assert summary["packets_decoded"] == expected
        assert summary["selection"]["start"]["given"] == start
        assert summary["selection"]["start"]["ts_ns"] == pytest.approx(start_s * 1e9, abs=1000)
    stream = runner.invoke(app, ["decode", "-", "--out", str(tmp_path / "s"), "--json", "--start", "+0.2s",
                                 "--end", "+720ms"], input=whole.read_bytes())
    assert json.loads(stream.stdout)["packets_decoded"] == expected      # from the stream's own first packet
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(int(origin))) + "Z"
    result = runner.invoke(app, ["decode", str(whole), "--out", str(tmp_path / "iso"), "--json", "--end", iso])
    assert json.loads(result.stdout)["packets_decoded"] == sum(t < int(origin) for t in epochs)


@pytest.mark.parametrize("bound, says", [("+2.8", "has no unit: a duration needs one (ns, us, µs, ms, s, min, h)"),
                                         ("+2m", "is not a duration"), ("+1GB", "(GB is a size)")])
def test_a_time_after_the_start_needs_its_unit(tmp_path, bound, says):
    """A duration after the start of the capture is read by the one parser of durations: a bare +2.8 (it was
    seconds, where every other duration option refuses a bare number) is refused with the units."""
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["decode", str(SYNC), "--out", str(out), "--start", bound])
    assert result.exit_code == 1 and says in result.output, result.output
    assert not out.exists()


def test_a_relative_window_counts_from_the_earliest_capture():
    ours, summary = _tables([SYNC], selection=PacketSelection(start=TimeBound(500_000_000, True)))
    firsts = [c["ts_first_ns"] for c in summary["captures"]]
    assert summary["selection"]["start"]["ts_ns"] == min(firsts) + 500_000_000


def test_a_bad_filter_is_one_line_before_any_decoding(tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["decode", str(SYNC), "--out", str(out), "--filter", "tcp port"])
    assert result.exit_code == 1
    assert result.output.strip().count("\n") == 0 and "syntax error" in result.output
    assert not out.exists()
    with pytest.raises(CaptureError, match="link type 276"):
        decode_paths([SYNC], selection=PacketSelection(filter="ether host 01:02:03:04:05:06"))
    bad = CliRunner().invoke(app, ["decode", str(SYNC), "--out", str(out), "--start", "yesterday"])
    assert bad.exit_code == 1 and "not a time" in bad.output


def test_a_capture_given_twice_under_two_names_is_warned_about(tmp_path):
    """A directory holding a node's capture and a renamed, recompressed copy of it (worker0.pcap.gz beside
    worker0-copy.pcap.zst): decoded as two nodes, each message the capture saw counted twice, and told (it was
    not: only a clocks warning that the copy shares no message with another capture). Two nodes' captures of
    one job (mxnet_sync's) are not alike."""
    job = tmp_path / "job"
    job.mkdir()
    original = PCAPS / "mxnet_sync" / "worker0.pcap.gz"
    shutil.copy(original, job)
    subprocess.run([require_tool("zstd"), "-q", "-o", str(job / "worker0-copy.pcap.zst")],
                   input=gzip.decompress(original.read_bytes()), check=True)
    _, summary = _tables([job])
    packets = _tshark_count(original)
    alike = [w for w in summary["warnings"] if "hold the same packets" in w]
    assert len(alike) == 1 and alike[0].startswith(f"captures worker0, worker0-copy hold the same packets "
                                                   f"({packets:,}, from "), alike
    assert alike[0].endswith("one capture given 2 times? Each is decoded as a node of its own, so its messages are "
                             "counted once per copy; decode one of them")
    _, healthy = _tables([PCAPS / "mxnet_sync"])
    assert not [w for w in healthy["warnings"] if "same packets" in w]
