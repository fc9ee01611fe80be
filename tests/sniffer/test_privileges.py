"""What the capture daemon may still do once it runs (root, CI here): every dlcsniff process of a real capture,
read from /proc/PID/status while it captures, and the probes shown to work with what is left.

Two daemons capture at once in one namespace: one with every probe (libzmq calls included), one packets only.
A pyzmq program starts after both gave up root, so its libzmq is found and probed by a daemon that holds no
capability at all: its root helper loaded the programs, gave up root and opens, on request, only files a
process of the namespace maps; the daemon attaches uprobe links (no capability asked by the kernel) and reads
the library's symbols through that descriptor (a job's libraries may lie in a directory closed to the daemon's
user; the test's own lies in /tmp/pytest-of-root, mode 0700). The helper itself is asked for what it must
refuse.
"""
from __future__ import annotations

import json
import os
import pwd
import select
import shutil
import subprocess
from pathlib import Path

import pytest

from dlcsniff.decoders.inputs.daemon_dir import load_capture_dir
from dlcsniff.sniffer import ebpf, procnet
from dlcsniff.sniffer.root_helper import HELPER_CAPABILITIES, start_probes_helper
from lab.netns import Cluster
from tests.conftest import require_root, require_workloads
from tests.support.daemon import TOOL_PYTHON, RunningDaemon

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
    helper_capabilities = sum(1 << capability for capability in HELPER_CAPABILITIES)
    for name in outs:
        daemon_pid = daemons[name].process.pid
        # the packets-only daemon runs alone; the other one beside its root helper, which dropped root too
        assert daemon_pid in statuses[name] and len(statuses[name]) == (1 if name == "packets" else 2), statuses
        for pid, status in statuses[name].items():
            kept = 0 if pid == daemon_pid else helper_capabilities
            assert status["Uid"].split() == [str(tcpdump.pw_uid)] * 4, (name, pid)
            assert status["Gid"].split() == [str(tcpdump.pw_gid)] * 4 and status["Groups"].strip() == ""
            for field in ("CapEff", "CapPrm", "CapBnd"):
                assert int(status[field], 16) == kept, (name, pid, field, status[field])
            assert int(status["CapInh"], 16) == 0 == int(status["CapAmb"], 16)
            assert status["NoNewPrivs"].strip() == "1"
    # and with no more than that, the probes attached to a library loaded after root was given up
    loaded = load_capture_dir(outs["probes"])
    sends = loaded.zmq_events[(loaded.zmq_events["pid"] == program.pid) & (loaded.zmq_events["direction"] == "send")]
    assert list(sends["size_bytes"]) == [4, 3000]
    assert list(loaded.libraries["pid"]) == [program.pid]


def test_the_root_helper_opens_only_files_a_process_of_its_namespace_maps(tmp_path):
    """The helper as the daemon starts it (here from the test, in the root namespace): once it has dropped root
    it hands out a library a process of its namespace maps executable, and nothing else: not a file no process
    maps, not a file mapped only as data, not a library of a process in another namespace."""
    require_root()
    tcpdump = pwd.getpwnam("tcpdump")
    secret = tmp_path / "secret.key"
    secret.write_bytes(b"\x7fELF, but a key all the same")
    secret.chmod(0o600)
    holder = subprocess.Popen([str(TOOL_PYTHON), "-c", MAPS_A_SECRET, str(secret)], stdout=subprocess.PIPE)
    assert holder.stdout.readline().strip() == b"mapped"
    libc = next(item for item in procnet.executable_files(holder.pid) if "libc.so" in item.path)
    helper = start_probes_helper(tcpdump)
    try:
        helper.go(ebpf.probe_settings(netns=ebpf.netns_inode(), loader=None))
        select.select([helper], [], [], 60)
        loaded = helper.poll()
        assert loaded.what == "probes" and loaded.error is None, loaded.error
        loaded.probes.close()
        reply, fds = helper.request(op="open", pid=holder.pid, paths=[str(secret), libc.path])
        status = status_of(helper.pid)         # it answers once it has dropped root
        assert int(status["CapEff"], 16) == sum(1 << capability for capability in HELPER_CAPABILITIES)
        assert status["Uid"].split()[0] == str(tcpdump.pw_uid)
        assert [item["path"] for item in reply["opened"]] == [libc.path] and len(fds) == 1
        assert os.pread(fds[0], 4, 0) == b"\x7fELF" and os.fstat(fds[0]).st_ino == libc.inode
        os.close(fds[0])
        # a file no process maps: not opened, whatever the path
        reply, fds = helper.request(op="open", pid=os.getpid(), paths=[str(secret), "/etc/shadow"])
        assert reply["opened"] == [] == fds
        with Cluster(f"hlp{os.getpid() % 100000}", ["other"]) as cluster:
            other = cluster.popen("other", [str(TOOL_PYTHON), "-c", MAPS_A_SECRET, str(secret)],
                                  stdout=subprocess.PIPE)
            assert other.stdout.readline().strip() == b"mapped"
            other_libc = next(item for item in procnet.executable_files(other.pid) if "libc.so" in item.path)
            reply, fds = helper.request(op="open", pid=other.pid, paths=[other_libc.path])
            assert reply["opened"] == [] == fds
            reply, _ = helper.request(op="files", pids=[other.pid, holder.pid])
            assert list(reply["files"]) == [str(holder.pid)]
            other.kill()
            other.wait()
    finally:
        helper.close()
        holder.kill()
        holder.wait()
    assert helper.exit_status == 0


# Maps a file (argv[1]) as data, as a process may map a key, and waits.
MAPS_A_SECRET = r"""
import mmap, sys
with open(sys.argv[1], "rb") as file:
    mapped = mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ)
print("mapped", flush=True)
import time; time.sleep(300)
"""
