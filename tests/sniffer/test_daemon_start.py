"""The capture daemon's start, as users meet it (root, CI here): `capturing on` and systemd's READY=1 mean that
packets are being captured, whatever the probes are doing; five daemons started together on this 2-core machine
each capture from their own `capturing on`; probes that never load stop neither the capture nor its stop.

Ground truth: a program in each namespace sends a numbered, timestamped record over TCP every 5 ms, from before
the daemon starts to after it stops; every record sent after the test saw the daemon's ready signal (its line, or
the datagram on the notify socket) must be in the capture. How fast that signal comes is `make bench`'s
(tests/bench/capture.py, start); here only what it promises is checked.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from dlcsniff.decoders.inputs.daemon_dir import load_capture_dir
from dlcsniff.sniffer import bpf_objects
from lab.netns import Cluster
from tests.conftest import require_root
from tests.support.daemon import READY_RE, TOOL_PYTHON, RunningDaemon
from tests.support.marks import MARK_PORT, captured_marks, start_marker, stop_marker

pytestmark = pytest.mark.root

def assert_captured_between(directory: Path, ready_ns: int, stopping_ns: int) -> None:
    """Every record sent between the ready signal and the stop is in the capture: none missing in between."""
    marks = captured_marks(load_capture_dir(directory).captures)
    assert marks, f"{directory}: no record captured"
    inside = sorted(sequence for sequence, sent_ns in marks.items() if ready_ns < sent_ns < stopping_ns)
    assert inside, f"{directory}: no record sent between ready and stop was captured"
    # records are numbered in send order: the first sent after ready to the last before the stop, all there
    first = min(sequence for sequence, sent_ns in marks.items() if sent_ns > ready_ns)
    assert inside == list(range(first, inside[-1] + 1)) and inside[0] == first


@pytest.fixture
def notify_socket(request):
    """A listener like systemd's on $NOTIFY_SOCKET (a path, or '@' and an abstract name), yielding (the value
    of NOTIFY_SOCKET, the socket): what the daemon sends arrives there as datagrams."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if request.param == "path":
        directory = tempfile.mkdtemp(prefix="dlcsniff-notify-")
        os.chmod(directory, 0o755)           # the daemon sends as its user, as systemd's socket allows
        address = os.path.join(directory, "notify")
        listener.bind(address)
        os.chmod(address, 0o777)
        value = address
    else:
        value = f"@dlcsniff-test-notify-{os.getpid()}"
        listener.bind("\0" + value[1:])
    listener.settimeout(120)
    yield value, listener
    listener.close()
    if request.param == "path":
        os.unlink(value)
        os.rmdir(os.path.dirname(value))


@pytest.mark.parametrize("notify_socket", ["path", "abstract"], indirect=True)
def test_ready_means_capturing_and_systemd_hears_it_then(tmp_path, notify_socket):
    """Type=notify (sniffer/dlcsniff-capture.service): READY=1 once packets are captured, STATUS= as the probes
    come, STOPPING=1 at the stop."""
    require_root()
    address, listener = notify_socket
    # the daemon runs in the test's namespace, where the listener is (abstract names are per namespace)
    marker = start_marker()
    out = tmp_path / "capture"
    daemon = None
    try:
        daemon = RunningDaemon(["--iface", "lo", "--out", str(out), "--ports", str(MARK_PORT)],
                               env={**os.environ, "NOTIFY_SOCKET": address})
        datagrams = [listener.recv(4096).decode()]
        ready_ns = time.time_ns()
        assert datagrams[0].splitlines()[0] == "READY=1", datagrams
        daemon.wait_loaded()
        time.sleep(0.5)
        stopping_ns = time.time_ns()
        assert daemon.stop() == 0, daemon.stderr
        listener.settimeout(5)
        while not datagrams[-1].startswith("STOPPING=1"):
            datagrams.append(listener.recv(4096).decode())
    finally:
        if daemon is not None:
            daemon.kill()
        stop_marker(marker)
    # the line and the datagram say the same, in that order
    assert [index for index, line in enumerate(daemon.lines) if READY_RE.search(line)] == [0]
    statuses = [line.removeprefix("STATUS=") for datagram in datagrams for line in datagram.splitlines()
                if line.startswith("STATUS=")]
    assert statuses[0].startswith("capturing on lo") and statuses[-1] == "capturing on lo, probes on, payload zmtp-cut"
    assert datagrams[-1] == "STOPPING=1"
    assert_captured_between(out, ready_ns, stopping_ns)


def test_five_daemons_started_together_capture_from_their_ready_line(tmp_path):
    """Five nodes, five daemons started at once on this 2-core machine (their starts and root helpers compete):
    each captures every record its node sent from its `capturing on` to its stop, and each gets its probes."""
    require_root()
    names = [f"node{index}" for index in range(5)]
    with Cluster(f"five{os.getpid() % 100000}", names) as cluster:
        markers = [start_marker(cluster, name) for name in names]
        daemons = {name: RunningDaemon(["--iface", "lo", "--out", str(tmp_path / name), "--ports", str(MARK_PORT)],
                                       netns=cluster.host(name).netns) for name in names}
        try:
            ready_ns = {}
            for name, daemon in daemons.items():
                daemon.wait_ready(probes=False)
                ready_ns[name] = time.time_ns()
            for daemon in daemons.values():
                daemon.wait_loaded()
            stopping_ns = time.time_ns()
            for name, daemon in daemons.items():
                assert daemon.stop() == 0, daemon.stderr
        finally:
            for daemon in daemons.values():
                daemon.kill()
            for marker in markers:
                stop_marker(marker)
    for name, daemon in daemons.items():
        assert "eBPF probes attached" in daemon.stderr and "payload: zmtp-cut" in daemon.stderr, daemon.stderr
        assert_captured_between(tmp_path / name, ready_ns[name], stopping_ns)


def test_probes_that_never_load_stop_neither_the_capture_nor_its_stop(tmp_path):
    """Loading the probes and the cut stuck for good (every file of their sources is a FIFO no one writes: a read
    never returns): the daemon captures from `capturing on` all the same, stops at SIGTERM within its promise,
    says in capture.json that neither the cut nor the probes were loaded, and leaves no process behind."""
    require_root()
    fifo = tmp_path / "never.c"
    os.mkfifo(fifo)
    binds = "\n".join(f"mount --bind {fifo} {part} || exit 1"
                      for part in dict.fromkeys(part for source in bpf_objects.SOURCES for part in source.parts))
    wrapper = ("unshare", "-m", "--propagation", "private", "sh", "-c", f'{binds}\nexec "$@"', "sh")
    out = tmp_path / "capture"
    with Cluster(f"stk{os.getpid() % 100000}", ["node"]) as cluster:
        marker = start_marker(cluster, "node")
        daemon = RunningDaemon(["--iface", "lo", "--out", str(out), "--ports", str(MARK_PORT)],
                               netns=cluster.host("node").netns, wrapper=wrapper)
        try:
            daemon.wait_ready(probes=False)
            ready_ns = time.time_ns()
            time.sleep(2.0)
            stopping_ns = time.time_ns()
            assert daemon.stop() == 0, daemon.stderr
        finally:
            daemon.kill()
            stop_marker(marker)
    left = subprocess.run(["pgrep", "-f", "--", f'"out_dir": "{out}"'], capture_output=True, text=True).stdout.split()
    assert left == []
    assert "eBPF probes attached" not in daemon.stderr and "Traceback" not in daemon.stderr
    run = json.loads((out / "capture.json").read_text())["runs"][0]
    assert run["stop_reason"] == "signal SIGTERM"
    assert run["ebpf"]["enabled"] is False and run["ebpf"]["reason"] == "the capture stopped before they were loaded"
    assert run["payload"] == {**run["payload"], "mode": "full", "reason": "the capture stopped before it was loaded"}
    assert_captured_between(out, ready_ns, stopping_ns)


# The daemon as `dlcsniff capture` executes it, its systemd notification replaced by a look at what it has
# loaded when it says READY=1 (then it leaves).
LOADED_AT_READY = r"""
import json, os, sys, types
from dlcsniff.sniffer import daemon
from dlcsniff.sniffer.__main__ import main

def at_ready(state):
    if state.startswith(b"READY=1"):
        print(json.dumps(sorted(name for name, module in sys.modules.items() if type(module) is types.ModuleType)),
              flush=True)
        os._exit(0)

daemon._notify_systemd = at_ready
sys.exit(main(sys.argv[1:]))
"""
# What the capture's first moment does not need: the command line's and the decoders' libraries, the probes' side.
NOT_BEFORE_READY = ("typer", "rich", "click", "pandas", "numpy", "pyarrow", "dlcsniff.cli", "dlcsniff.analysis",
                    "dlcsniff.decoders.formats.probe_events", "dlcsniff.decoders.protocols", "dlcsniff.sniffer.ebpf",
                    "dlcsniff.sniffer.uprobes", "dlcsniff.sniffer.procnet", "dlcsniff.sniffer.bpf_objects",
                    "subprocess", "tempfile", "hashlib", "mmap", "ctypes.util")


def test_the_daemon_loads_nothing_the_capture_does_not_need_before_ready(tmp_path):
    """Issue 21: packets from the first moment. What only the probes need is loaded once packets are captured
    (sniffer/first_use.py), and nothing of the command line or the decoders ever is."""
    require_root()
    from dlcsniff.sniffer.options import CaptureOptions, options_json

    options = options_json(CaptureOptions(interface="lo", out_dir=tmp_path / "capture"))
    done = subprocess.run([str(TOOL_PYTHON), "-c", LOADED_AT_READY, options], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    assert "dlcsniff.sniffer.libpcap" in loaded and READY_RE.search(done.stderr), done.stderr
    early = [name for name in loaded if any(name == unwanted or name.startswith(unwanted + ".")
                                            for unwanted in NOT_BEFORE_READY)]
    assert early == []
