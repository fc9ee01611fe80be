"""The capture daemon for real (root, CI here): `dlcsniff capture` run as users run it, inside a network
namespace of its own, with real traffic, checked with independent readers (tshark, the traffic
program's own byte counts) — signals, a kill, the disk budget, a full disk, restarts, privileges, bad
options, and the unit file.

Also the helpers the other daemon tests share (RunningDaemon, traffic).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dlcsniff.decoders.inputs.capture_file import open_capture
from dlcsniff.decoders.inputs.daemon_dir import load_capture_dir
from dlcsniff.decoders.formats import probe_events as ev
from dlcsniff.decoders.formats.capture_dir import CAPTURE_JSON, FORMAT
from dlcsniff.sniffer import bpf_objects
from dlcsniff.sniffer.capture_dir import DiskBudget
from dlcsniff.sniffer.options import DaemonError, capture_filter, parse_ports
from lab.netns import Cluster
from tests.conftest import REPO, require_root, require_tool
from tests.support.daemon import DLCSNIFF, TOOL_PYTHON, RunningDaemon

pytestmark = pytest.mark.root

TRAFFIC_PORT = 7100
# Sends `total` bytes (-1: until killed) to a server it runs itself on 127.0.0.1:port, `chunk` bytes per
# send, then prints what it sent and what the server received.
TRAFFIC = r"""
import json, socket, sys, threading, time
total, chunk, port, pause_s = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", port))
server.listen()
received = [0]
def serve():
    conn, _ = server.accept()
    while data := conn.recv(1 << 20):
        received[0] += len(data)
thread = threading.Thread(target=serve)
thread.start()
client = socket.socket()
client.connect(("127.0.0.1", port))
print("connected", flush=True)
sent, payload = 0, b"x" * chunk
while total < 0 or sent < total:
    client.sendall(payload)
    sent += chunk
    if pause_s:
        time.sleep(pause_s)
client.close()
thread.join()
print(json.dumps({"sent": sent, "received": received[0]}), flush=True)
"""


def start_traffic(cluster: Cluster, host: str, total_bytes: int, *, chunk_bytes: int = 1000, pause_s: float = 0.0,
                  port: int = TRAFFIC_PORT) -> subprocess.Popen:
    process = cluster.popen(host, [str(TOOL_PYTHON), "-c", TRAFFIC, str(total_bytes), str(chunk_bytes), str(port),
                                   str(pause_s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert process.stdout.readline().strip() == b"connected", process.stderr.read()
    return process


def finish_traffic(process: subprocess.Popen) -> dict:
    out, errors = process.communicate(timeout=60)
    assert process.returncode == 0, errors.decode()
    return json.loads(out.decode().splitlines()[-1])


def tshark_payload_bytes(path: Path, port: int) -> int:
    """Distinct TCP payload bytes sent to `port` (retransmissions counted once), as tshark reads the file."""
    done = subprocess.run([require_tool("tshark"), "-r", str(path), "-Y", f"tcp.dstport == {port} && tcp.len > 0",
                           "-T", "fields", "-e", "tcp.seq", "-e", "tcp.len"], capture_output=True, text=True,
                          check=False)
    covered, end = 0, 0
    for start, length in sorted(tuple(map(int, line.split())) for line in done.stdout.splitlines()):
        if start + length > end:
            covered += start + length - max(start, end)
            end = start + length
    return covered


def tshark_packet_count(path: Path) -> int:
    done = subprocess.run([require_tool("tshark"), "-r", str(path), "-T", "fields", "-e", "frame.number"],
                          capture_output=True, text=True, check=False)
    return len(done.stdout.split())


def allocated_bytes(directory: Path) -> int:
    return sum(entry.stat().st_blocks * 512 for entry in directory.iterdir())


def file_digests(directory: Path) -> dict[str, str]:
    """Every file but the index (capture.json) and the scratch file it is written through, which a SIGKILL can
    leave behind and the next write of the index replaces."""
    return {entry.name: hashlib.sha256(entry.read_bytes()).hexdigest() for entry in directory.iterdir()
            if entry.name not in (CAPTURE_JSON, f".{CAPTURE_JSON}.partial")}


@pytest.fixture(scope="module")
def node():
    require_root()
    with Cluster(f"dmn{os.getpid() % 100000}", ["node"]) as cluster:
        yield cluster


def netns(cluster: Cluster) -> str:
    return cluster.host("node").netns


# -- pure parts first -----------------------------------------------------------------------------------

def test_ports_and_filter_expression():
    assert parse_ports("9091, 9100-9200") == [(9091, 9091), (9100, 9200)]
    assert capture_filter("host 198.18.0.1", "9091,9100-9200") == \
        "(host 198.18.0.1) and (tcp port 9091 or tcp portrange 9100-9200)"
    assert capture_filter(None, None) is None
    for bad in ("0", "70000", "9200-9100", "80;ls", ""):
        with pytest.raises(DaemonError, match="--ports"):
            parse_ports(bad)


def test_disk_budget_counts_whole_blocks_and_reservations():
    budget = DiskBudget(limit_bytes=10_000, block_bytes=4096, used_bytes=4096)
    assert budget.room("a") == 4096                    # 10000 - 4096 = 5904, floored to whole blocks
    assert budget.reserve("a", 4000) and not budget.reserve("b", 1)
    budget.settle("a", 0)
    assert budget.reserve("b", 4096) and budget.room("a") == 0
    assert DiskBudget(None, 4096, 0).room("a") is None


# -- the daemon, for real -------------------------------------------------------------------------------

BAD_OPTIONS = [
    (["--iface", "nosuch0"], "no interface 'nosuch0'"),
    (["--iface", "lo", "--filter", "tcp port"], "bad filter"),
    (["--iface", "lo", "--ports", "70000"], "--ports"),
    (["--iface", "lo", "--rotate-size", "999kB"], "--rotate-size must be at least 1 MB"),
    (["--iface", "lo", "--rotate-mb", "0"], "--rotate-mb"),
    (["--iface", "lo", "--max-disk", "0"], "--max-disk must be at least 1 MB"),
    (["--iface", "lo", "--max-disk-mb", "0"], "--max-disk-mb"),
    (["--iface", "lo", "--snaplen", "300000B"], "--snaplen"),
    (["--iface", "lo", "--buffer-size", "8GiB"], "--buffer-size must be within"),
    (["--iface", "lo", "--duration", "0"], "--duration"),
    (["--iface", "lo", "--user", "no-such-user-here"], "no such user"),
    (["--iface", "lo", "--lib", "/etc/hostname"], "exports neither libzmq"),
    (["--iface", "lo", "--lib", "/nonexistent/libzmq.so"], "not a file"),
]


@pytest.mark.parametrize("args,message", BAD_OPTIONS, ids=[message for _, message in BAD_OPTIONS])
def test_bad_options_fail_before_anything_starts(tmp_path, args, message):
    require_root()
    out = tmp_path / "capture"
    done = subprocess.run([str(DLCSNIFF), "capture", *args, "--out", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()


def test_a_directory_that_is_not_a_capture_is_refused(tmp_path):
    require_root()
    (tmp_path / "notes.txt").write_text("mine")
    done = subprocess.run([str(DLCSNIFF), "capture", "--iface", "lo", "--no-ebpf", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not a dlcsniff capture" in done.stderr
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["notes.txt"]


def test_sigterm_flushes_everything_and_privileges_are_dropped(node, tmp_path):
    out = tmp_path / "capture"
    daemon = RunningDaemon(["--iface", "lo", "--out", str(out), "--ports", str(TRAFFIC_PORT)], netns=netns(node))
    try:
        daemon.wait_ready()
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{daemon.process.pid}/status").read_text()
                      .splitlines() if ":\t" in line)
        traffic = start_traffic(node, "node", 3_000_000, chunk_bytes=10_000)
        sent = finish_traffic(traffic)
        code = daemon.stop(signal.SIGTERM)
    finally:
        daemon.kill()
    assert code == 0, daemon.stderr
    # The daemon runs as `tcpdump` (its capabilities: tests/sniffer/test_privileges.py)
    tcpdump_uid = str(os.stat(out).st_uid)
    assert status["Uid"].split()[0] == tcpdump_uid != "0"
    assert os.stat(out).st_mode & 0o777 == 0o700
    assert {entry.stat().st_mode & 0o777 for entry in out.iterdir()} == {0o600}
    info = json.loads((out / "capture.json").read_text())
    assert info["format"] == FORMAT and info["interface"] == "lo"
    assert info["filter"] == f"(tcp port {TRAFFIC_PORT})"
    run = info["runs"][0]
    assert run["stop_reason"] == "signal SIGTERM" and run["start_ns"] < run["stop_ns"] == info["stop_ns"]
    packet_files = [item for item in info["files"] if item["kind"] == "packets"]
    assert len(packet_files) == 1
    pcap = out / packet_files[0]["name"]
    # every byte the program sent is in the file, and capture.json counts what tshark reads
    assert tshark_payload_bytes(pcap, TRAFFIC_PORT) == sent["sent"] == sent["received"]
    assert packet_files[0]["packets"] == tshark_packet_count(pcap)
    assert packet_files[0]["dropped"] == 0 and packet_files[0]["bytes"] == pcap.stat().st_size
    probes = next(item for item in info["files"] if item["kind"] == "probes")
    header, found, bad, truncated = ev.parse_probe_file((out / probes["name"]).read_bytes())
    assert (bad, truncated) == ([], 0) and probes["events"] == sum(
        1 for item in found if not isinstance(item, (ev.ClockSync, ev.ProcessInfo, ev.LibraryAttached,
                                                     ev.SocketSnapshot)))
    # the traffic program's connection, attributed to the program
    flows = load_capture_dir(out).flows
    to_server = flows[(flows["remote_port"] == TRAFFIC_PORT) & (flows["source"] == "connect")]
    assert list(to_server["pid"]) == [traffic.pid]


def test_sigkill_leaves_readable_files_and_a_restart_adds_a_set(node, tmp_path):
    out = tmp_path / "capture"
    args = ["--iface", "lo", "--out", str(out), "--ports", str(TRAFFIC_PORT), "--rotate-size", "1MB"]
    daemon = RunningDaemon(args, netns=netns(node))
    traffic = None
    try:
        daemon.wait_ready()
        traffic = start_traffic(node, "node", -1, chunk_bytes=10_000, pause_s=0.002)
        time.sleep(1.5)       # let it write a few files: the kill has to land mid-stream
        daemon.process.kill()
        daemon.wait(10)
    finally:
        daemon.kill()
        if traffic is not None:
            traffic.kill()
            traffic.wait()
    left = subprocess.run(["pgrep", "-f", "--", f'"out_dir": "{out}"'], capture_output=True, text=True).stdout.split()
    assert left == []
    pcaps = sorted(out.glob("capture-0001-*.pcap"))
    assert len(pcaps) >= 2
    for index, pcap in enumerate(pcaps):
        with open_capture(pcap) as reader:
            ours = sum(1 for _ in reader)
        # the kill may land right after a rotation: the newest file can hold its header only
        assert ours > 0 or index == len(pcaps) - 1
        if index in (0, len(pcaps) - 2, len(pcaps) - 1):
            # tshark reads each to its last complete packet (the killed one included); our reader agrees
            assert ours == tshark_packet_count(pcap)
    _, found, bad, truncated = ev.parse_probe_file((out / "probes-0001.events").read_bytes())
    assert not bad and found
    before = file_digests(out)

    restarted = RunningDaemon([*args, "--duration", "1s"], netns=netns(node))
    restarted.wait_ready()
    assert restarted.wait(30) == 0, restarted.stderr
    assert file_digests(out).items() >= before.items()      # the old set untouched
    info = json.loads((out / "capture.json").read_text())
    assert [run["set"] for run in info["runs"]] == [1, 2]
    assert info["runs"][0]["stop_reason"].startswith("killed")
    assert info["runs"][1]["stop_reason"] == "--duration 1 s reached"
    assert (out / "capture-0002-00000.pcap").exists() and (out / "probes-0002.events").exists()
    loaded = load_capture_dir(out)
    assert sorted(loaded.sets) == [1, 2] and loaded.sets[1] == pcaps
    assert any("killed" in warning for warning in loaded.warnings)


def test_disk_budget_is_never_exceeded(node, tmp_path):
    out = tmp_path / "capture"
    budget_bytes = 3_000_000
    daemon = RunningDaemon(["--iface", "lo", "--out", str(out), "--ports", str(TRAFFIC_PORT), "--rotate-size", "1MB",
                            "--max-disk", "3MB", "--snaplen", "2000B"], netns=netns(node))
    traffic = None
    peak = 0
    try:
        daemon.wait_ready()
        traffic = start_traffic(node, "node", -1, chunk_bytes=1000)
        while daemon.process.poll() is None:
            peak = max(peak, allocated_bytes(out))
            time.sleep(0.02)
        code = daemon.wait(10)
    finally:
        daemon.kill()
        if traffic is not None:
            traffic.kill()
            traffic.wait()
    assert code == 0 and "disk budget of 3 MB used up" in daemon.stderr
    assert peak <= budget_bytes and allocated_bytes(out) <= budget_bytes
    assert sum(entry.stat().st_size for entry in out.iterdir()) <= budget_bytes
    info = json.loads((out / "capture.json").read_text())
    packet_files = [item for item in info["files"] if item["kind"] == "packets"]
    assert len(packet_files) >= 2
    for item in packet_files:
        assert item["bytes"] <= 1_000_000
        assert item["packets"] == tshark_packet_count(out / item["name"])
    # and nearly used: what is left is capture.json's reserve (it is rewritten beside itself) and a few blocks
    assert allocated_bytes(out) > budget_bytes - 100_000
    # a restart finds no room for a new set: it says so before touching anything
    before = file_digests(out)
    again = subprocess.run([str(DLCSNIFF), "capture", "--iface", "lo", "--out", str(out), "--max-disk", "3MB"],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "no room for a new file set" in again.stderr
    assert file_digests(out) == before


def test_full_disk_stops_cleanly(node, tmp_path):
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)], check=True)
    try:
        out = mount_point / "capture"
        daemon = RunningDaemon(["--iface", "lo", "--out", str(out), "--ports", str(TRAFFIC_PORT), "--no-ebpf"],
                               netns=netns(node))
        traffic = None
        try:
            daemon.wait_ready()
            traffic = start_traffic(node, "node", -1, chunk_bytes=1000)
            code = daemon.wait(30)
        finally:
            daemon.kill()
            if traffic is not None:
                traffic.kill()
                traffic.wait()
        assert code == 3 and "disk full" in daemon.stderr and "Traceback" not in daemon.stderr
        pcap = out / "capture-0001-00000.pcap"
        with open_capture(pcap) as reader:
            assert sum(1 for _ in reader) == tshark_packet_count(pcap) > 0
        json.loads((out / "capture.json").read_text())     # written atomically: never half a file
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


NO_CLANG_PATH = "/usr/sbin:/sbin"      # clang is in /usr/bin
NOT_BUILT = (str(bpf_objects.BUILD_DIR), str(bpf_objects.CACHE_DIR.parent))     # no object anywhere


def hidden_run(cluster: Cluster, out: Path, hidden: tuple[str, ...], *, path: str | None = None,
               runs: int = 1) -> tuple[str, dict]:
    """`dlcsniff capture` on lo in the node's namespace, `runs` times in one mount namespace where each directory
    of `hidden` is an empty tmpfs (and with `path` as its PATH), each stopped once its probes are attached or
    off: what it printed, and the last run of capture.json."""
    Path(bpf_objects.CACHE_DIR.parent).mkdir(parents=True, exist_ok=True)
    # a directory the machine does not have (a container without /lib/modules) is hidden already
    hide = "\n".join([*(f"if [ -d {hidden_dir} ]; then mount -t tmpfs none {hidden_dir} || exit 1; fi"
                         for hidden_dir in hidden),
                       *([f"export PATH={path}"] if path else []),
                       # each run but the last: the daemon as a job of this shell, stopped at a line on its stdin
                       *(['"$@" & read line; kill -TERM $!; wait $!'] * (runs - 1)), 'exec "$@"'])
    wrapper = ("unshare", "-m", "--propagation", "private", "sh", "-c", hide, "sh")
    daemon = RunningDaemon(["--iface", "lo", "--out", str(out)], netns=netns(cluster), wrapper=wrapper,
                           stdin=subprocess.PIPE)
    try:
        for run in range(runs):
            daemon.wait_loaded(count=run + 1)
            if run + 1 < runs:
                daemon.process.stdin.write("next\n")
                daemon.process.stdin.flush()
        assert daemon.stop() == 0, daemon.stderr
    finally:
        daemon.kill()
    assert "Traceback" not in daemon.stderr, daemon.stderr
    return daemon.stderr, json.loads((out / "capture.json").read_text())["runs"][-1]


def test_the_probes_need_neither_kernel_headers_nor_a_compiler_at_start(node, tmp_path):
    """/lib/modules, /usr/src emptied, and clang not on the PATH: the objects `make setup` built load as they are
    (CO-RE, against the kernel's BTF)."""
    stderr, run = hidden_run(node, tmp_path / "capture", ("/lib/modules", "/usr/src"), path=NO_CLANG_PATH)
    assert "eBPF probes attached" in stderr and "eBPF probes off" not in stderr and "compiled now" not in stderr
    assert run["ebpf"]["enabled"] is True and run["ebpf"]["netns_filtered"] is True
    assert run["payload"]["mode"] == "zmtp-cut"


def test_objects_not_built_are_built_at_start_and_cached(node, tmp_path):
    """A package installed without `make setup`: the root helper builds the objects with clang in the
    background (packets are captured meanwhile), says so, and caches them; the next start finds them."""
    stderr, run = hidden_run(node, tmp_path / "capture", NOT_BUILT, runs=2)
    for source in bpf_objects.SOURCES:
        assert stderr.count(f"{source.name}: not built by `make setup`: compiled now with clang") == 1, stderr
    assert stderr.count("eBPF probes attached") == 2 and stderr.count("payload: zmtp-cut") == 2
    assert run["ebpf"]["enabled"] is True
    assert not (bpf_objects.CACHE_DIR / bpf_objects.PROBES.file_name).exists()     # only in that mount namespace


def test_without_objects_nor_clang_it_says_so_once_and_captures_packets(node, tmp_path):
    stderr, run = hidden_run(node, tmp_path / "capture", NOT_BUILT, path=NO_CLANG_PATH)
    assert stderr.count("eBPF probes off") == 1 and "clang is missing" in stderr
    assert run["ebpf"]["enabled"] is False and "clang is missing" in run["ebpf"]["reason"]
    assert run["payload"]["mode"] == "full" and "clang is missing" in run["payload"]["reason"]
    info = json.loads((tmp_path / "capture" / "capture.json").read_text())
    assert [item["kind"] for item in info["files"]] == ["packets"]



def test_on_a_kernel_without_btf_the_probes_are_off_and_packets_still_captured_and_cut(node, tmp_path):
    """/sys/kernel/btf hidden, as on a kernel built without CONFIG_DEBUG_INFO_BTF: the probes (CO-RE) cannot load,
    and the daemon says so once, with what that costs; the cut reads no kernel structure and still runs."""
    stderr, run = hidden_run(node, tmp_path / "capture", ("/sys/kernel/btf",))
    assert stderr.count("eBPF probes off (the kernel has no BTF") == 1, stderr
    assert "packets are still captured, and cut, but no flow is attributed to a process" in stderr
    assert run["ebpf"]["enabled"] is False and "no BTF" in run["ebpf"]["reason"]
    assert run["payload"]["mode"] == "zmtp-cut"
    info = json.loads((tmp_path / "capture" / "capture.json").read_text())
    assert [item["kind"] for item in info["files"]] == ["packets"]

def test_print_bpf_shows_the_objects_and_the_settings_used_here():
    done = subprocess.run([str(DLCSNIFF), "capture", "--print-bpf", "--ports", "9000-9100"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for source in bpf_objects.SOURCES:
        assert f"// ==== {source.name}: {bpf_objects.BUILD_DIR / source.file_name}" in done.stdout
        assert all(f"//   {flag}" in done.stdout for flag in source.cflags())
        for part in source.parts:
            assert part.read_text() in done.stdout
    assert f"//   netns_inum = {os.stat('/proc/self/ns/net').st_ino}" in done.stdout
    assert "//   snap_ports_filtered = 1" in done.stdout and "//   snap_ports_wanted = 101 bits set" in done.stdout


def test_the_systemd_unit_is_valid_and_runs_our_options(tmp_path):
    unit = REPO / "sniffer" / "dlcsniff-capture.service"
    verify = subprocess.run([require_tool("systemd-analyze"), "verify", str(unit)], capture_output=True, text=True,
                            timeout=60)
    assert verify.returncode == 0, verify.stderr
    exec_start = next(line for line in unit.read_text().splitlines() if line.startswith("ExecStart="))
    options = re.findall(r"(--[a-z-]+)", exec_start)
    help_text = subprocess.run([str(DLCSNIFF), "capture", "--help"], capture_output=True, text=True,
                               env={**os.environ, "COLUMNS": "200"}).stdout
    assert options and all(option in help_text for option in options)
