"""A real MXNet parameter-server job in network namespaces, with a capture daemon (or tcpdump) on every node."""
from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
import pytest
from lab.netns import Cluster
from lab.record import BASE_ENV, SCHEDULER_PORT, SERVER_PORT, WORKER_PORT, WORKLOADS_DIR
from tests.support.daemon import RunningDaemon


NODES = ("scheduler", "server0", "server1", "worker0", "worker1")


ROLE_PORTS = {"scheduler": SCHEDULER_PORT, "server": SERVER_PORT, "worker": WORKER_PORT}


PSLITE_PORTS = set(ROLE_PORTS.values())


JOB_TIMEOUT_S = 180.0


STRAGGLER_GRACE_S = 10.0       # MXNet can hang in its exit path once the workers are done


@dataclass
class NodeProcess:
    name: str
    role: str
    ip: str
    process: subprocess.Popen
    log: Path
    record: Path
    killed: bool = False
    cpu_s: float | None = None       # user + system CPU of the process (its threads), once it was reaped


@dataclass
class JobRun:
    directory: Path
    nodes: dict[str, NodeProcess]
    daemons: dict[str, RunningDaemon] = field(default_factory=dict)
    captures: list[subprocess.Popen] = field(default_factory=list)     # tcpdump, for reference runs
    capture_cpu_s: float = 0.0       # CPU the capture processes used from job start to job end

    def job_cpu_seconds(self) -> float:
        """CPU the job's own processes used (every node; a probe's trap and the kernel's work on their
        packets are charged to them)."""
        return sum(node.cpu_s or 0.0 for node in self.nodes.values())

    def training_seconds(self) -> float:
        """Wall time of the workers' training loops (first batch start to last batch end, slowest worker)."""
        spans = []
        for node in self.nodes.values():
            if node.role == "worker":
                batches = json.loads(node.record.read_text())["batches"]
                spans.append((batches[-1]["end_ns"] - batches[0]["start_ns"]) / 1e9)
        return max(spans)


def child_pids(pids: list[int]) -> list[int]:
    found = subprocess.run(["pgrep", "-P", ",".join(map(str, pids))], capture_output=True, text=True).stdout
    return [int(pid) for pid in found.split()]


def _capture_pids(run: JobRun) -> list[int]:
    pids = [daemon.process.pid for daemon in run.daemons.values()] + [process.pid for process in run.captures]
    return pids + child_pids(pids)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU the processes used so far."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def run_mxnet_job(out_dir: Path, workload_python: Path, *, capture: str | None = "dlcsniff", batches: int = 10,
                  model: str = "mlp", daemon_args: tuple[str, ...] = (), tcpdump_snaplen: int = 0) -> JobRun:
    """Run the job in fresh namespaces with, on every node, a dlcsniff daemon (capture="dlcsniff"), a
    plain `tcpdump -i any -w` as a reference (capture="tcpdump") or nothing (None); stop them after."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with Cluster(f"mxd{os.getpid() % 100000}", list(NODES)) as cluster:
        run = JobRun(out_dir, {})
        try:
            for name in NODES:
                netns = cluster.host(name).netns
                if capture == "dlcsniff":
                    run.daemons[name] = RunningDaemon(["--iface", "any", "--out", str(out_dir / name), *daemon_args],
                                                      netns=netns)
                elif capture == "tcpdump":
                    run.captures.append(cluster.popen(name, ["tcpdump", "-i", "any", "-s", str(tcpdump_snaplen), "-B", "65536", "-n",
                                                             "-Z", "root", "-w", str(out_dir / f"{name}.pcap")],
                                                      stderr=subprocess.DEVNULL))
            for daemon in run.daemons.values():
                daemon.wait_ready()
            if run.captures:
                time.sleep(1.0)       # tcpdump opens its capture
            cpu_before = cpu_seconds(_capture_pids(run)) if capture else 0.0
            job_env = {**BASE_ENV, "DMLC_PS_ROOT_URI": cluster.host("scheduler").ip,
                       "DMLC_PS_ROOT_PORT": str(SCHEDULER_PORT), "DMLC_NUM_SERVER": "2", "DMLC_NUM_WORKER": "2",
                       "DMLC_INTERFACE": "eth0", "PS_VERBOSE": "2"}
            for name in NODES:
                role = name.rstrip("0123456789")
                env = {**job_env, "DMLC_ROLE": role, "DMLC_NODE_HOST": cluster.host(name).ip}
                if role != "scheduler":
                    env["PORT"] = str(ROLE_PORTS[role])
                log, record = out_dir / f"{name}.log", out_dir / f"{name}.json"
                argv = [str(workload_python), str(WORKLOADS_DIR / "mxnet_job.py"), "--record", str(record),
                        "--model", model, "--kvstore", "dist_sync", "--batches", str(batches)]
                with open(log, "wb") as log_file:
                    process = cluster.popen(name, argv, env=env, stdout=log_file, stderr=log_file)
                run.nodes[name] = NodeProcess(name, role, cluster.host(name).ip, process, log, record)
            _wait_for_job(run)
            run.capture_cpu_s = cpu_seconds(_capture_pids(run)) - cpu_before if capture else 0.0
            for process in run.captures:
                process.send_signal(15)
                process.wait(timeout=10)
            for daemon in run.daemons.values():
                daemon.process.send_signal(15)
            for name, daemon in run.daemons.items():
                assert daemon.wait(10) == 0, f"{name} daemon:\n{daemon.stderr}"
        finally:
            for daemon in run.daemons.values():
                daemon.kill()
    failed = {name: node.process.returncode for name, node in run.nodes.items()
              if node.process.returncode != 0 and not node.killed}
    assert not failed, f"nodes failed: {failed}\n" + "\n".join(
        f"--- {name}:\n{run.nodes[name].log.read_text()[-2000:]}" for name in failed)
    return run


def _reaped(node: NodeProcess) -> bool:
    """Whether the node's process ended; reaped here with its resource usage (Popen keeps none)."""
    if node.process.returncode is None:
        pid, status, usage = os.wait4(node.process.pid, os.WNOHANG)
        if pid == 0:
            return False
        node.process.returncode = os.waitstatus_to_exitcode(status)
        node.cpu_s = usage.ru_utime + usage.ru_stime
    return True


def _wait_for_job(run: JobRun) -> None:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    workers_done_at = None
    while not all(_reaped(node) for node in run.nodes.values()):
        now = time.monotonic()
        if workers_done_at is None and all(_reaped(node) for node in run.nodes.values() if node.role == "worker"):
            workers_done_at = now
        if now > deadline or (workers_done_at is not None and now - workers_done_at > STRAGGLER_GRACE_S):
            for node in run.nodes.values():
                if not _reaped(node):
                    node.process.kill()
                    node.killed = True
                    node.process.wait()
            if now > deadline:
                pytest.fail(f"the MXNet job did not finish within {JOB_TIMEOUT_S} s")
        time.sleep(0.1)
