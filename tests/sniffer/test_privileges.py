"""What the capture daemon may still do once it runs (root, CI here): every dlcsniff process of a real capture,
read from /proc/PID/status while it captures, and the probes shown to work with what is left.

Two daemons capture at once in one namespace: one with every probe (libzmq calls included), one packets only.
A pyzmq program starts after both gave up root, so its libzmq is found and probed by a daemon that is no
longer root: the probe helper loaded the programs and exited, the daemon attaches uprobe links (no
capability asked by the kernel) and reads the library's symbols (CAP_DAC_READ_SEARCH: a job's libraries may
lie in a directory closed to the daemon's user; the test's own lies in /tmp/pytest-of-root, mode 0700).
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

from dlcsniff.decoders.inputs.daemon_dir import load_capture_dir
from dlcsniff.sniffer.privileges import CAP_DAC_READ_SEARCH
from lab.netns import Cluster
from tests.conftest import require_root, require_workloads
from tests.support.daemon import RunningDaemon

pytestmark = pytest.mark.root

PROGRAM = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import zmq
push = zmq.Context().socket(zmq.PUSH)
push.bind("tcp://127.0.0.1:7500")
pull = zmq.Context().socket(zmq.PULL)
pull.connect("tcp://127.0.0.1:7500")
print("imported", flush=True)
sys.stdin.readline()
push.send_multipart([b"meta", b"x" * 3000])
print(json.dumps([len(frame) for frame in pull.recv_multipart()]), flush=True)
"""


def status_of(pid: int) -> dict[str, str]:
    return dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)


def processes_of(out: Path) -> list[int]:
    """Every process a daemon writing into `out` runs as: the daemon, and any child it has."""
    found = subprocess.run(["pgrep", "-f", "--", f'"out_dir": "{out}"'], capture_output=True, text=True).stdout.split()
    pids = [int(pid) for pid in found]
    children = subprocess.run(["pgrep", "-P", ",".join(map(str, pids))], capture_output=True, text=True).stdout.split()
    return pids + [int(pid) for pid in children]


def test_every_dlcsniff_process_keeps_only_what_capturing_needs(tmp_path):
    require_root()
    python = require_workloads()
    # pyzmq, copied where only root may look: the daemon must read its libzmq all the same
    site = python.parent.parent / "lib" / "python3.11" / "site-packages"
    private = tmp_path / "private"
    for name in ("zmq", "pyzmq.libs"):
        shutil.copytree(site / name, private / name)
    assert Path("/tmp/pytest-of-root").stat().st_mode & 0o077 == 0
    tcpdump = pwd.getpwnam("tcpdump")
    outs = {"probes": tmp_path / "probes", "packets": tmp_path / "packets"}
    with Cluster(f"prv{os.getpid() % 100000}", ["node"]) as cluster:
        netns = cluster.host("node").netns
        daemons = {"probes": RunningDaemon(["--iface", "lo", "--out", str(outs["probes"]), "--zmq-events", "calls"],
                                           netns=netns),
                   "packets": RunningDaemon(["--iface", "lo", "--out", str(outs["packets"]), "--no-ebpf"],
                                            netns=netns)}
        try:
            for daemon in daemons.values():
                daemon.wait_ready()
            program = cluster.popen("node", [str(python), "-c", PROGRAM, str(private)], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE)
            assert program.stdout.readline().strip() == b"imported"
            daemons["probes"].wait_for(r"probing libzmq in \S*/private/\S*pyzmq.libs/libzmq", 30)
            program.stdin.write(b"go\n")
            program.stdin.flush()
            sizes = json.loads(program.stdout.readline())
            assert program.wait(timeout=30) == 0
            statuses = {name: {pid: status_of(pid) for pid in processes_of(outs[name])} for name in outs}
            for daemon in daemons.values():
                assert daemon.stop() == 0, daemon.stderr
        finally:
            for daemon in daemons.values():
                daemon.kill()
    assert sizes == [4, 3000]
    for name, kept in (("probes", 1 << CAP_DAC_READ_SEARCH), ("packets", 0)):
        # one process each: the probe helper that loaded the programs as root has exited
        assert list(statuses[name]) == [daemons[name].process.pid], statuses[name]
        status = statuses[name][daemons[name].process.pid]
        assert status["Uid"].split() == [str(tcpdump.pw_uid)] * 4 and status["Gid"].split() == [str(tcpdump.pw_gid)] * 4
        assert status["Groups"].strip() == ""
        for field in ("CapEff", "CapPrm", "CapBnd"):
            assert int(status[field], 16) == kept, (name, field, status[field])
        assert int(status["CapInh"], 16) == 0 == int(status["CapAmb"], 16)
        assert status["NoNewPrivs"].strip() == "1"
    # and with no more than that, the probes attached to a library loaded after root was given up
    loaded = load_capture_dir(outs["probes"])
    sends = loaded.zmq_events[(loaded.zmq_events["pid"] == program.pid) & (loaded.zmq_events["direction"] == "send")]
    assert list(sends["size_bytes"]) == [4, 3000]
    assert list(loaded.libraries["pid"]) == [program.pid]
