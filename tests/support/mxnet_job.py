"""A real MXNet parameter-server job in network namespaces, with a capture daemon (or tcpdump) on every node."""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy
import pytest
from lab.netns import Cluster
from lab.record import BASE_ENV, SCHEDULER_PORT, SERVER_PORT, WORKER_PORT, WORKLOADS_DIR
from tests.support.daemon import RunningDaemon, process_tree_cpu_s


NODES = ("scheduler", "server0", "server1", "worker0", "worker1")


ROLE_PORTS = {"scheduler": SCHEDULER_PORT, "server": SERVER_PORT, "worker": WORKER_PORT}


PSLITE_PORTS = set(ROLE_PORTS.values())


JOB_TIMEOUT_S = 180.0


CAPTURE_LEAD_S = 1.0           # the captures start this long before the job, as a user's prolog would


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
    capture_start_cpu_s: float = 0.0  # and before the job started (their start)
    capture_cpu_samples: list[tuple[int, float]] = field(default_factory=list)   # (time.time_ns(), CPU so far)

    def job_cpu_seconds(self) -> float:
        """CPU the job's own processes used (every node; a probe's trap and the kernel's work on their
        packets are charged to them)."""
        return sum(node.cpu_s or 0.0 for node in self.nodes.values())

    def training_span_ns(self) -> tuple[int, int]:
        """The workers' training loops: first batch start to last batch end (time.time_ns()), slowest worker."""
        spans = []
        for node in self.nodes.values():
            if node.role == "worker":
                batches = json.loads(node.record.read_text())["batches"]
                spans.append((batches[0]["start_ns"], batches[-1]["end_ns"]))
        return max(spans, key=lambda span: span[1] - span[0])

    def training_seconds(self) -> float:
        start, end = self.training_span_ns()
        return (end - start) / 1e9

    def capture_training_cpu_s(self) -> float | None:
        """CPU the capture processes used during the training loop (sampled every CPU_SAMPLE_S, interpolated)."""
        if len(self.capture_cpu_samples) < 2:
            return None
        times, used = zip(*self.capture_cpu_samples)
        start, end = self.training_span_ns()
        return float(numpy.interp(end, times, used) - numpy.interp(start, times, used))


def child_pids(pids: list[int]) -> list[int]:
    found = subprocess.run(["pgrep", "-P", ",".join(map(str, pids))], capture_output=True, text=True).stdout
    return [int(pid) for pid in found.split()]


def capture_cpu_seconds(run: JobRun) -> float:
    """CPU the capture processes used so far: theirs, their children's (a daemon's root helpers), live or
    exited (an exited child's CPU is its parent's once it was collected)."""
    pids = [daemon.process.pid for daemon in run.daemons.values()] + [process.pid for process in run.captures]
    return sum(process_tree_cpu_s(pid) or 0.0 for pid in pids)


def cpu_seconds(pids: list[int], *, children: bool = False) -> float:
    """User + system CPU the processes used so far (with `children`, and their children that exited)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += sum(int(value) for value in fields[11:15 if children else 13])
    return total / os.sysconf("SC_CLK_TCK")


CPU_SAMPLE_S = 0.1


class _CpuSampler:
    """The capture processes' CPU so far, every CPU_SAMPLE_S, while the job runs."""

    def __init__(self, run: JobRun) -> None:
        self._run = run
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(CPU_SAMPLE_S):
            self._run.capture_cpu_samples.append((time.time_ns(), capture_cpu_seconds(self._run)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_mxnet_job(out_dir: Path, workload_python: Path, *, capture: str | None = "dlcsniff", batches: int = 10,
                  model: str = "mlp", daemon_args: tuple[str, ...] = (), tcpdump_snaplen: int = 0) -> JobRun:
    """Run the job in fresh namespaces with, on every node, a dlcsniff daemon (capture="dlcsniff"), a
    plain `tcpdump -i any -w` as a reference (capture="tcpdump") or nothing (None), all started together
    CAPTURE_LEAD_S before the job (not once they are ready: what they miss of the job's start is theirs to
    miss); stop them after. `capture_start_cpu_s`: their CPU until the job starts."""
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
            time.sleep(CAPTURE_LEAD_S)
            cpu_before = capture_cpu_seconds(run)
            run.capture_start_cpu_s = cpu_before
            sampler = _CpuSampler(run)
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
            run.capture_cpu_s = capture_cpu_seconds(run) - cpu_before
            sampler.stop()
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
