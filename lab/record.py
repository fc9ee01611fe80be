"""Record real distributed jobs, one capture per node, with the programs' own ground truth beside them.

    python -m lab.record all --out pcaps --workload-python .venv-workloads/bin/python
    python -m lab.record mxnet --job big --model wide_mlp --batches 20 --bigarray-bound 65536 --out DIR ...
    python -m lab.record zmq --out DIR --workload-python ...
    python -m lab.record gloo --out DIR --workload-python ... [--world-size 4]
    python -m lab.record gloo-matrix --out DIR --workload-python ... [--world-sizes 2 3 ...] [--max-size B]

Each job lands in DIR/<job>/ (written beside it first, then renamed into place):
- <node>.pcap.gz  tcpdump -i any (eth0 and lo) of the node (its own network namespace, MTU 1500, offloads off), gzip -9
- <node>.log      the node's stderr (MXNet: ps-lite's PS_VERBOSE=2 message log)
- <node>.json     MXNet: the node's own record of what it did (see lab/workloads/mxnet_job.py)
- zmq_record.json zmq: every message the workload sent (see lab/workloads/zmq_job.py)
- rank<r>.json    gloo: the rank's own record of every operation (see lab/workloads/gloo_job.py); the Gloo
                  matrix (lab/gloo_matrix.py): of every cell (lab/workloads/gloo_matrix_job.py)
- plan.json       the Gloo matrix: the job's cells, the same for every rank
- job.json        the job: nodes (name, role, rank, ps-lite id, ip, netns, pid, port), settings, env,
                  times, tool versions, capture counts, exit codes; a fault job's `fault` (what was injected
                  where: the node's own record says when, under `fault`, and a Gloo rank's `error` what failed).
The fault jobs (FAULT_JOBS) are real jobs with one fault injected: a rank or worker that sleeps before a step,
a server that sleeps in its update, a rank that stops taking part until the others time out, a worker that
stops until the job is given up on (killed), a node's link slowed by tc; `dlcsniff diagnose` is judged on them.
Needs root (network namespaces, tcpdump).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from lab import gloo_matrix
from lab.netns import Capture, Cluster, NetnsError

WORKLOADS_DIR = Path(__file__).resolve().parent / "workloads"
SCHEDULER_PORT = 9091
SERVER_PORT = 9100
WORKER_PORT = 9200
ZMQ_BASE_PORT = 5555
GLOO_MASTER_PORT = 29500
GLOO_WORLD_SIZE = 4
JOB_TIMEOUT_S = 60.0
# How long a node may linger after its own record says it finished (MXNet can hang in its exit path).
STRAGGLER_GRACE_S = 10.0
# Time for the last FIN/ACKs to cross the bridge once every process has exited.
CAPTURE_SETTLE_S = 0.2
POLL_S = 0.1
BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
            "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
# ps-lite prints its node id once the scheduler assigned it: "W[11] is connected to others" (or "Bind ... id=1").
PSLITE_NODE_ID_RE = re.compile(r"[HSW]\[(\d+)\] is connected to others|Bind to role=\w+, id=(\d+)")


class RecordError(RuntimeError):
    """A job could not be recorded (a node failed, hung, or a tool is missing)."""


@dataclass(frozen=True, slots=True)
class Stall:
    """One node of a job sleeps `seconds` before training step (MXNet: batch) `step`; an MXNet server, in its
    update of that training iteration (lab/workloads/stalling_sgd.py). how="sigstop" (Gloo ranks): its process
    is stopped (SIGSTOP) that long instead, every thread of it."""

    node: str
    step: int
    seconds: float
    how: str = "sleep"

    def args(self, option: str) -> list[str]:
        how = [] if self.how == "sleep" else ["--stall-by", self.how]
        return [option, str(self.step), "--stall-s", str(self.seconds), *how]


@dataclass(frozen=True, slots=True)
class MXNetJobSpec:
    name: str
    kvstore: str
    model: str
    batches: int
    batch_size: int = 32
    num_servers: int = 2
    num_workers: int = 2
    bigarray_bound: int | None = None
    # tcpdump's kernel buffer (-B, KiB): small ones make the capture lose packets, as busy nodes' captures do
    capture_buffer_kib: int | None = None
    # tcpdump's snap length (-s, bytes): a small one cuts what the decoders read, as `tcpdump -s 96` does; 0: whole
    snaplen: int = 0
    # seconds of a cloud VM's other traffic beside the job (lab/workloads/noise.py): TLS, HTTP to a metadata
    # service and DNS from every node to a "services" host, and a port scan of every node from a "scanner"
    noise_s: float | None = None
    # every node's link to the switch (tbf both ways, lab.netns.Cluster.limit_rate), in Mbit/s; None: the
    # veth pair's own speed
    rate_mbit: float | None = None
    # the links' token bucket in bytes (None: lab.netns.Cluster.limit_rate's, a millisecond at the rate)
    link_burst_bytes: int | None = None
    # a fault job: the node that sleeps (a worker before a batch's step, a server in an iteration's update)
    stall: Stall | None = None
    # a hung job: the recorder kills every node this long after the stalled node's record says it fell asleep,
    # as a user gives up on a job that stopped (their connections close: the capture shows the end)
    give_up_after_s: float | None = None


MXNET_JOBS = {
    spec.name: spec
    for spec in (
        MXNetJobSpec("mxnet_sync", "dist_sync", "mlp", batches=10),
        MXNetJobSpec("mxnet_async", "dist_async", "mlp", batches=10),
        # Lower bound than MXNet's default (1,000,000 elements): the 1.28 M-element weight is split across
        # both servers and so is nothing else, while the capture stays small.
        MXNetJobSpec("mxnet_sync_large", "dist_sync", "wide_mlp", batches=5, bigarray_bound=65536),
        MXNetJobSpec("mxnet_sparse", "dist_sync", "sparse_embedding", batches=8),
        # Other shapes: one server and one worker; three servers and four workers; the MLP's weight split over
        # three servers (bound below its 25,088 elements) in async mode.
        MXNetJobSpec("mxnet_1s1w", "dist_sync", "mlp", batches=4, num_servers=1, num_workers=1),
        MXNetJobSpec("mxnet_3s4w", "dist_sync", "mlp", batches=2, num_servers=3, num_workers=4),
        MXNetJobSpec("mxnet_async_split", "dist_async", "mlp", batches=3, num_servers=3, bigarray_bound=8192),
        # Captures that lose packets, as busy nodes' captures do: tcpdump's kernel buffer at 256 KiB (a few % of
        # a busy node's packets), and at 32 KiB (most of them, and the same bursts at both ends).
        MXNetJobSpec("mxnet_lossy", "dist_sync", "mlp", batches=5, capture_buffer_kib=160),
        MXNetJobSpec("mxnet_lossy_heavy", "dist_sync", "mlp", batches=8, capture_buffer_kib=32),
        # The job among a cloud VM's other traffic.
        MXNetJobSpec("mxnet_noise", "dist_sync", "mlp", batches=3, noise_s=8.0),
        # Fault jobs: worker 1 sleeps 1.2 s before batch 3's pushes; server 1 sleeps 1 s in iteration 3's update.
        MXNetJobSpec("mxnet_slow_worker", "dist_sync", "mlp", batches=6, stall=Stall("worker1", 3, 1.2)),
        MXNetJobSpec("mxnet_slow_server", "dist_sync", "mlp", batches=6, stall=Stall("server1", 3, 1.0)),
        # worker 1 stops before batch 3 (for 60 s); 3 s later the job is killed: the others waited on it
        MXNetJobSpec("mxnet_hang", "dist_sync", "mlp", batches=4, stall=Stall("worker1", 3, 60.0), give_up_after_s=3.0),
    )
}
ZMQ_JOB = "zmq"
GLOO_JOB = "gloo"
ZERO_WINDOW_JOB = "tcp_zero_window"


@dataclass(slots=True)
class NodeRun:
    name: str
    role: str
    process: subprocess.Popen
    capture: Capture
    record_path: Path | None
    port: int | None = None
    exit_code: int | None = None
    killed: bool = False


def tcpdump_version() -> str:
    tcpdump = subprocess.run(["tcpdump", "--version"], capture_output=True, text=True, check=False)
    first_line = (tcpdump.stdout or tcpdump.stderr).splitlines()
    return first_line[0].removeprefix("tcpdump version ").strip() if first_line else "unknown"


def _tool_versions(workload_python: str) -> dict[str, str]:
    return {
        "tcpdump": tcpdump_version(),
        "python": subprocess.run([workload_python, "-c", "import platform; print(platform.python_version())"],
                                 capture_output=True, text=True, check=True).stdout.strip(),
    }


def _read_record(path: Path | None) -> dict | None:
    if path is None or not path.exists():
        return None
    return json.loads(path.read_text())


def _gzip_capture(pcap: Path) -> Path:
    gz_path = pcap.with_name(pcap.name + ".gz")
    with open(pcap, "rb") as raw, gzip.GzipFile(gz_path, "wb", compresslevel=9, mtime=0) as packed:
        shutil.copyfileobj(raw, packed, length=1 << 20)
    pcap.unlink()
    return gz_path


def _pslite_node_id(log_path: Path) -> int | None:
    with open(log_path, encoding="utf-8", errors="replace") as log:
        for line in log:
            found = PSLITE_NODE_ID_RE.search(line)
            if found:
                return int(found.group(1) or found.group(2))
    return None


def _tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(encoding="utf-8", errors="replace").splitlines() if path.exists() else []
    return "\n".join(text[-lines:])


def _kill(nodes: Sequence[NodeRun]) -> None:
    for node in nodes:
        if node.process.poll() is None:
            node.process.kill()
            node.killed = True
    for node in nodes:
        node.process.wait()


def _wait_for_nodes(nodes: Sequence[NodeRun], timeout_s: float, *, failures_expected: bool = False,
                    give_up_after_s: float | None = None) -> int | None:
    """Wait until every node exits. A node still alive STRAGGLER_GRACE_S after its own record said it
    finished is killed (MXNet may hang in its exit path). A node that fails (unless failures_expected: a fault
    job whose nodes fail by design), or a job still running after timeout_s, ends the job: the rest are killed
    and RecordError names the culprits with their log tails. With give_up_after_s, every node is killed that
    long after a node's record says its injected stall began (a hung job given up on): the wall-clock ns it was
    given up at is returned (else None)."""
    deadline = time.monotonic() + timeout_s
    finished_at: dict[str, float] = {}
    given_up_ns = None
    while True:
        now = time.monotonic()
        alive = [node for node in nodes if node.process.poll() is None]
        if give_up_after_s is not None and _stalled_for_s(alive) > give_up_after_s:
            given_up_ns = time.time_ns()
            _kill(nodes)
            continue
        failed = [] if failures_expected else [node for node in nodes
                                               if node.process.poll() not in (None, 0) and not node.killed]
        if failed or now > deadline:
            _kill(nodes)
            culprits = failed or alive
            reason = "failed" if failed else f"still running after {timeout_s} s"
            details = "\n".join(f"--- {node.name} (exit {node.process.returncode}) log tail:\n"
                                f"{_tail(node.capture.path.with_suffix('.log'))}" for node in culprits)
            raise RecordError(f"nodes {reason}: {', '.join(node.name for node in culprits)}\n{details}")
        if not alive:
            break
        for node in alive:
            record = _read_record(node.record_path)
            if record and record.get("finished"):
                finished_at.setdefault(node.name, now)
            if node.name in finished_at and now - finished_at[node.name] > STRAGGLER_GRACE_S:
                node.process.kill()
                node.killed = True
        time.sleep(POLL_S)
    for node in nodes:
        node.exit_code = node.process.returncode
    return given_up_ns


def _stalled_for_s(nodes: Sequence[NodeRun]) -> float:
    """How long ago the earliest injected stall of these nodes began (their records' fault.start_ns), or -1."""
    starts = [record["fault"]["start_ns"] for record in map(_read_record, (node.record_path for node in nodes))
              if record and "fault" in record]
    return (time.time_ns() - min(starts)) / 1e9 if starts else -1.0


def _start_node(cluster: Cluster, job_dir: Path, workload_python: str, name: str, role: str, script: str,
                args: list[str], env: dict, port: int | None = None, buffer_kib: int | None = None,
                snaplen: int = 0) -> NodeRun:
    """Start a node's capture, then its workload: logging to <name>.log, recording to <name>.json. The
    capture listens on "any": eth0 plus lo, where a process's messages to itself travel (ps-lite's
    scheduler answers its own barriers there, every node sends itself TERMINATE)."""
    options = {} if buffer_kib is None else {"buffer_kib": buffer_kib}
    capture = cluster.capture(name, job_dir / f"{name}.pcap", snaplen, interface="any", **options)
    record_path = job_dir / f"{name}.json"
    argv = [workload_python, str(WORKLOADS_DIR / script), *args, "--record", str(record_path)]
    with open(job_dir / f"{name}.log", "wb") as log:
        process = cluster.popen(name, argv, env=env, stdout=log, stderr=log)
    return NodeRun(name, role, process, capture, record_path, port)


def _run_to_end(cluster: Cluster, nodes: Sequence[NodeRun], job_dir: Path, timeout_s: float,
                *, gzip_captures: bool = True, failures_expected: bool = False,
                give_up_after_s: float | None = None) -> tuple[list[dict], int | None]:
    """Wait for every node, stop (and compress) the captures; the nodes' entries for job.json, and when the job
    was given up on (see _wait_for_nodes)."""
    try:
        given_up_ns = _wait_for_nodes(nodes, timeout_s, failures_expected=failures_expected,
                                      give_up_after_s=give_up_after_s)
        capture_stats = _finish_captures(nodes, gzip_captures)
    except RecordError as exc:
        raise RecordError(f"{exc}\n(logs and captures kept in {job_dir})") from None
    return [_node_entry(cluster, node, *capture_stats[node.name]) for node in nodes], given_up_ns


def _finish_captures(nodes: Sequence[NodeRun], gzip_captures: bool) -> dict[str, tuple[dict, Path]]:
    time.sleep(CAPTURE_SETTLE_S)
    stats = {node.name: asdict(node.capture.stop()) for node in nodes}
    return {node.name: (stats[node.name], _gzip_capture(node.capture.path) if gzip_captures
                        else node.capture.path) for node in nodes}


def _node_entry(cluster: Cluster, node: NodeRun, capture_stats: dict, capture: Path) -> dict:
    host = cluster.host(node.name)
    return {
        "name": node.name,
        "role": node.role,
        "ip": host.ip,
        "netns": host.netns,
        "interface": "any",
        "pid": node.process.pid,
        "port": node.port,
        "exit_code": node.exit_code,
        "killed_by_recorder": node.killed,
        "capture": capture.name,
        "capture_stats": capture_stats,
        "log": f"{node.name}.log",
    }


def _prepare_job_dir(out_dir: Path, job: str) -> Path:
    staging = out_dir / f".{job}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def _publish_job_dir(staging: Path, out_dir: Path, job: str, job_record: dict) -> Path:
    (staging / "job.json").write_text(json.dumps(job_record, indent=1) + "\n")
    final = out_dir / job
    shutil.rmtree(final, ignore_errors=True)
    staging.rename(final)
    return final


def _limit_rates(cluster: Cluster, names: Sequence[str], rate_mbit: float | None,
                 burst_bytes: int | None = None) -> None:
    if rate_mbit is not None:
        for name in names:
            cluster.limit_rate(name, rate_mbit * 1e6, burst_bytes)


def record_mxnet_job(spec: MXNetJobSpec, out_dir: Path, workload_python: str,
                     *, timeout_s: float = JOB_TIMEOUT_S) -> Path:
    """Run one MXNet parameter-server job, each node in its own namespace and capture; return its directory."""
    out_dir = Path(out_dir).resolve()
    job_dir = _prepare_job_dir(out_dir, spec.name)
    node_names = ["scheduler", *(f"server{i}" for i in range(spec.num_servers)),
                  *(f"worker{i}" for i in range(spec.num_workers))]
    noise_hosts = ["services", "scanner"] if spec.noise_s else []
    started_ns = time.time_ns()
    with Cluster(f"{spec.name}-{os.getpid()}", node_names + noise_hosts) as cluster:
        _limit_rates(cluster, node_names, spec.rate_mbit, spec.link_burst_bytes)
        scheduler_ip = cluster.host("scheduler").ip
        job_env = {
            "DMLC_PS_ROOT_URI": scheduler_ip,
            "DMLC_PS_ROOT_PORT": str(SCHEDULER_PORT),
            "DMLC_NUM_SERVER": str(spec.num_servers),
            "DMLC_NUM_WORKER": str(spec.num_workers),
            "DMLC_INTERFACE": "eth0",
            "PS_VERBOSE": "2",
        }
        if spec.bigarray_bound is not None:
            job_env["MXNET_KVSTORE_BIGARRAY_BOUND"] = str(spec.bigarray_bound)
        nodes: list[NodeRun] = []
        for name in node_names:
            role = name.rstrip("0123456789")
            port = {"scheduler": SCHEDULER_PORT, "server": SERVER_PORT, "worker": WORKER_PORT}[role]
            node_env = {**BASE_ENV, **job_env, "DMLC_ROLE": role, "DMLC_NODE_HOST": cluster.host(name).ip}
            if role != "scheduler":
                node_env["PORT"] = str(port)  # ps-lite's own variable for a node's listening port
            args = ["--model", spec.model, "--kvstore", spec.kvstore, "--batches", str(spec.batches),
                    "--batch-size", str(spec.batch_size)]
            if spec.stall is not None and spec.stall.node.startswith("server") and role == "worker":
                args += ["--optimizer", "stallingsgd"]
            if spec.stall is not None and spec.stall.node == name:
                args += spec.stall.args("--stall-batch")
            nodes.append(_start_node(cluster, job_dir, workload_python, name, role, "mxnet_job.py", args,
                                     node_env, port, spec.capture_buffer_kib, spec.snaplen))
        # the other traffic starts once every node's capture runs: all of it is in the captures
        noise, secrets = (_start_noise(cluster, job_dir, workload_python, node_names, spec.noise_s)
                          if spec.noise_s else ([], None))
        try:
            node_entries, given_up_ns = _run_to_end(cluster, nodes + noise, job_dir, timeout_s,
                                                    give_up_after_s=spec.give_up_after_s)
        finally:
            if secrets is not None:
                shutil.rmtree(secrets, ignore_errors=True)
    ended_ns = time.time_ns()
    records = {node.name: _read_record(node.record_path) for node in nodes}
    for entry in node_entries[len(nodes):]:
        entry["record"] = f"{entry['name']}.json"
    for entry in node_entries[:len(nodes)]:
        record = records[entry["name"]] or {}
        # a node killed before it wrote its record has none
        entry["record"] = f"{entry['name']}.json" if records[entry["name"]] is not None else None
        entry["pslite_id"] = _pslite_node_id(job_dir / entry["log"])
        # a worker killed before it wrote its record: its rank from its ps-lite id (9 + 2r)
        entry["rank"] = record.get("rank", (entry["pslite_id"] - 9) // 2) if entry["role"] == "worker" else None
    # Servers: ps-lite ids 8 + 2r (ps::Postoffice::ServerRankToID).
    for entry in node_entries:
        if entry["role"] == "server" and entry["pslite_id"] is not None:
            entry["rank"] = (entry["pslite_id"] - 8) // 2
        elif entry["role"] == "scheduler":
            entry["rank"] = 0
    worker_records = [records[node.name] for node in nodes if node.role == "worker"]
    versions = {**_tool_versions(workload_python), **(worker_records[0] or {}).get("versions", {})}
    job_record = {
        "job": spec.name,
        "framework": "mxnet",
        "transport": "ps-lite/zmq",
        "mode": spec.kvstore,
        "model": spec.model,
        "batches": spec.batches,
        "batch_size": spec.batch_size,
        "num_servers": spec.num_servers,
        "num_workers": spec.num_workers,
        "bigarray_bound": spec.bigarray_bound,
        "capture_buffer_kib": spec.capture_buffer_kib,
        "snaplen": spec.snaplen,
        "noise_s": spec.noise_s,
        "rate_mbit": spec.rate_mbit,
        "link_burst_bytes": spec.link_burst_bytes,
        "fault": None if spec.stall is None else {"kind": "stall" if spec.give_up_after_s is None else "hang",
                                                  **asdict(spec.stall), "given_up_after_s": spec.give_up_after_s,
                                                  "given_up_ns": given_up_ns},
        "env": job_env,
        "subnet": str(cluster.subnet),
        "mtu": cluster.mtu,
        "start_ns": started_ns,
        "end_ns": ended_ns,
        "versions": versions,
        "nodes": node_entries,
    }
    return _publish_job_dir(job_dir, out_dir, spec.name, job_record)


def _start_noise(cluster: Cluster, job_dir: Path, workload_python: str, job_nodes: list[str],
                 duration_s: float) -> tuple[list[NodeRun], Path]:
    """The services host (HTTPS, HTTP, DNS) and the scanner, each with its capture, and a noise client on every
    job node (in the job node's capture); the clients write <node>.noise.json. Returns the two nodes and the
    directory holding the TLS key, to remove once the job is over."""
    secrets = Path(tempfile.mkdtemp(prefix="dlcsniff-noise-"))     # the TLS key stays out of the job's files
    key, cert = secrets / "key.pem", secrets / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=api.example.internal", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    services = _start_node(cluster, job_dir, workload_python, "services", "services", "noise.py",
                           ["serve", "--cert", str(cert), "--key", str(key), "--duration", str(duration_s + 2)],
                           BASE_ENV)
    server_ip = cluster.host("services").ip
    for name in job_nodes:
        argv = [workload_python, str(WORKLOADS_DIR / "noise.py"), "client", "--server", server_ip, "--duration",
                str(duration_s), "--record", str(job_dir / f"{name}.noise.json")]
        with open(job_dir / f"{name}.noise.log", "wb") as log:
            cluster.popen(name, argv, env=BASE_ENV, stdout=log, stderr=log)
    scanner = _start_node(cluster, job_dir, workload_python, "scanner", "scanner", "noise.py",
                          ["scan", "--wait-for", f"{cluster.host(job_nodes[0]).ip}:{SCHEDULER_PORT}", "--targets",
                           *(cluster.host(name).ip for name in job_nodes)], BASE_ENV)
    return [services, scanner], secrets


def record_zmq_job(out_dir: Path, workload_python: str, *, timeout_s: float = JOB_TIMEOUT_S) -> Path:
    """Run the pyzmq workload between two namespaces (client connects, server binds); return its directory."""
    out_dir = Path(out_dir).resolve()
    job_dir = _prepare_job_dir(out_dir, ZMQ_JOB)
    started_ns = time.time_ns()
    with Cluster(f"{ZMQ_JOB}-{os.getpid()}", ["server", "client"]) as cluster:
        server_ip = cluster.host("server").ip
        nodes = [_start_node(cluster, job_dir, workload_python, name, name, "zmq_job.py",
                             [name, "--server-ip", server_ip, "--base-port", str(ZMQ_BASE_PORT)], BASE_ENV)
                 for name in ("server", "client")]
        node_entries, _ = _run_to_end(cluster, nodes, job_dir, timeout_s)
    ended_ns = time.time_ns()
    records = {node.name: _read_record(node.record_path) for node in nodes}
    merged = merge_zmq_records(records["server"], records["client"])
    (job_dir / "zmq_record.json").write_text(json.dumps(merged, indent=1) + "\n")
    for node in nodes:
        node.record_path.unlink()
    job_record = {
        "job": ZMQ_JOB,
        "framework": "pyzmq",
        "transport": "zmtp",
        "mode": "patterns",
        "env": {},
        "subnet": str(cluster.subnet),
        "mtu": cluster.mtu,
        "start_ns": started_ns,
        "end_ns": ended_ns,
        "versions": {**_tool_versions(workload_python), **merged["versions"]},
        "nodes": node_entries,
        "record": "zmq_record.json",
    }
    return _publish_job_dir(job_dir, out_dir, ZMQ_JOB, job_record)


@dataclass(frozen=True, slots=True)
class GlooTraining:
    """The Gloo workload as a data-parallel training loop (gloo_job.py --train-steps): per step, computation
    (`compute_matmuls` 256×256 matrix products), then one all-reduce of `grad_elements` float32; `stall`: one
    rank sleeps before a step's all-reduce; `timeout_s`: the process group's timeout (a stall beyond it is a
    hang: the others fail)."""

    steps: int
    grad_elements: int
    compute_matmuls: int
    stall: Stall | None = None
    timeout_s: float | None = None

    def args(self, node: str) -> list[str]:
        args = ["--train-steps", str(self.steps), "--grad-elements", str(self.grad_elements),
                "--compute-matmuls", str(self.compute_matmuls)]
        if self.timeout_s is not None:
            args += ["--timeout-s", str(self.timeout_s)]
        if self.stall is not None and self.stall.node == node:
            args += self.stall.args("--stall-step")
        return args

    @property
    def failures_expected(self) -> bool:
        """The ranks fail by design: a stall longer than the others' timeout."""
        return self.stall is not None and self.timeout_s is not None and self.stall.seconds > self.timeout_s


@dataclass(frozen=True, slots=True)
class GlooFaultJob:
    """A bundled Gloo training job (4 ranks) with one fault: a stall (GlooTraining.stall) or one rank's link
    slowed to `slow_link_mbit` each way (tc tbf, Cluster.limit_rate), the other links left at the veth's speed."""

    name: str
    training: GlooTraining
    slow_link: str | None = None
    slow_link_mbit: float | None = None


GLOO_FAULT_JOBS = {
    job.name: job
    for job in (
        # rank 2 sleeps 1.5 s before step 6's all-reduce
        GlooFaultJob("gloo_straggler", GlooTraining(12, 65_536, 20, stall=Stall("rank2", 6, 1.5))),
        # rank 1's process stopped (SIGSTOP) 1.2 s before step 4's all-reduce
        GlooFaultJob("gloo_straggler_sigstop", GlooTraining(8, 65_536, 20, stall=Stall("rank1", 4, 1.2, "sigstop"))),
        # rank 3 stops before step 5 for 12 s; the others give up after their 4 s timeout
        GlooFaultJob("gloo_hang", GlooTraining(10, 65_536, 20, stall=Stall("rank3", 5, 12.0), timeout_s=4.0)),
        # rank 1's link at 100 Mbit/s each way; 1 MiB all-reduced per step
        GlooFaultJob("gloo_slow_link", GlooTraining(6, 262_144, 20), slow_link="rank1", slow_link_mbit=100),
    )
}
FAULT_JOBS = (*(name for name, spec in MXNET_JOBS.items() if spec.stall), *GLOO_FAULT_JOBS)
ALL_JOBS = (*MXNET_JOBS, ZMQ_JOB, GLOO_JOB, *gloo_matrix.BUNDLED, *GLOO_FAULT_JOBS, ZERO_WINDOW_JOB)
ZERO_WINDOW_PORT = 5600
# The slow reader (lab/workloads/slow_reader.py): a 32 KiB receive buffer, three stops of 0.4 s, 2 MB sent
ZERO_WINDOW_READER = ["--receive-buffer", "32768", "--pauses", "3", "--pause-s", "0.4"]
ZERO_WINDOW_SENDER = ["--bytes", "2000000"]


def _record_gloo_ranks(job_dir: Path, workload_python: str, job: str, script: str, world_size: int,
                       args: Callable[[str], list[str]], limit: Callable[[Cluster, list[str]], None],
                       timeout_s: float, *, gzip_captures: bool = True, failures_expected: bool = False) -> dict:
    """Run a torch.distributed Gloo workload `script`, one rank per namespace (rank 0 hosts the TCPStore), with
    args(node) of each, after `limit` set the ranks' links; the job.json entries every Gloo job has (nodes with
    their ranks and records)."""
    node_names = [f"rank{rank}" for rank in range(world_size)]
    started_ns = time.time_ns()
    with Cluster(f"{job}-{os.getpid()}", node_names) as cluster:
        limit(cluster, node_names)
        master_ip = cluster.host("rank0").ip
        # Gloo binds its listening socket to this interface's address (its default, the address the host
        # name resolves to, is not inside the namespace).
        job_env = {"GLOO_SOCKET_IFNAME": "eth0"}
        nodes = [_start_node(cluster, job_dir, workload_python, name, "rank", script,
                             ["--rank", str(rank), "--world-size", str(world_size), "--master-addr", master_ip,
                              "--master-port", str(GLOO_MASTER_PORT), *args(name)],
                             {**BASE_ENV, **job_env}, GLOO_MASTER_PORT if rank == 0 else None)
                 for rank, name in enumerate(node_names)]
        node_entries, _ = _run_to_end(cluster, nodes, job_dir, timeout_s, gzip_captures=gzip_captures,
                                   failures_expected=failures_expected)
    ended_ns = time.time_ns()
    records = {node.name: _read_record(node.record_path) for node in nodes}
    for rank, entry in enumerate(node_entries):
        entry["rank"] = rank
        entry["record"] = f"{entry['name']}.json"
    return {
        "world_size": world_size,
        "master_addr": master_ip,
        "master_port": GLOO_MASTER_PORT,
        "env": job_env,
        "subnet": str(cluster.subnet),
        "mtu": cluster.mtu,
        "start_ns": started_ns,
        "end_ns": ended_ns,
        "versions": {**_tool_versions(workload_python), **records["rank0"]["versions"]},
        "nodes": node_entries,
    }


def record_gloo_job(out_dir: Path, workload_python: str, *, world_size: int = GLOO_WORLD_SIZE,
                    timeout_s: float = JOB_TIMEOUT_S, name: str = GLOO_JOB, rate_mbit: float | None = None,
                    training: GlooTraining | None = None, slow_link: str | None = None,
                    slow_link_mbit: float | None = None) -> Path:
    """Run the torch.distributed Gloo workload (its list of operations, or `training`), one rank per
    namespace (rank 0 hosts the TCPStore), each on a link of rate_mbit if given, and `slow_link`'s at
    slow_link_mbit; return its directory."""
    out_dir = Path(out_dir).resolve()
    job_dir = _prepare_job_dir(out_dir, name)

    def limit(cluster: Cluster, names: list[str]) -> None:
        _limit_rates(cluster, names, rate_mbit)
        if slow_link is not None:
            _limit_rates(cluster, [slow_link], slow_link_mbit)

    ranks = _record_gloo_ranks(job_dir, workload_python, name, "gloo_job.py", world_size,
                               training.args if training else lambda node: [], limit, timeout_s,
                               failures_expected=training is not None and training.failures_expected)
    fault = None
    if training is not None and training.stall is not None:
        fault = {"kind": "hang" if training.failures_expected else "stall", **asdict(training.stall)}
    elif slow_link is not None:
        fault = {"kind": "slow_link", "node": slow_link, "rate_mbit": slow_link_mbit}
    job_record = {
        "job": name,
        "framework": "pytorch",
        "transport": "gloo/tcp",
        "mode": "training" if training else "collectives",
        "training": asdict(training) if training else None,
        "rate_mbit": rate_mbit,
        "fault": fault,
        **ranks,
    }
    return _publish_job_dir(job_dir, out_dir, name, job_record)


def record_gloo_matrix_job(spec: gloo_matrix.MatrixJobSpec, out_dir: Path, workload_python: str,
                           *, timeout_s: float = gloo_matrix.JOB_TIMEOUT_S) -> Path:
    """Run one job of the Gloo matrix (lab/gloo_matrix.py), one rank per namespace (rank 0 hosts the TCPStore),
    the ranks' sending rate capped together at spec.rate_mbit (tc tbf) so that every capture keeps up; return
    its directory."""
    out_dir = Path(out_dir).resolve()
    job_dir = _prepare_job_dir(out_dir, spec.name)
    plan = spec.cells()
    plan_path = job_dir / "plan.json"
    plan_path.write_text(json.dumps(plan, indent=1) + "\n")
    rate_mbit = max(1, spec.rate_mbit // spec.world_size)

    def limit(cluster: Cluster, names: list[str]) -> None:
        for node in names:
            cluster.limit_send_rate(node, rate_mbit)

    ranks = _record_gloo_ranks(job_dir, workload_python, spec.name, "gloo_matrix_job.py", spec.world_size,
                               lambda node: ["--plan", str(plan_path)], limit, timeout_s, gzip_captures=spec.gzip)
    job_record = {
        "job": spec.name,
        "framework": "pytorch",
        "transport": "gloo/tcp",
        "mode": "matrix",
        "rate_mbit_per_rank": rate_mbit,
        "plan": "plan.json",
        "cells": len(plan),
        **ranks,
    }
    return _publish_job_dir(job_dir, out_dir, spec.name, job_record)


def record_zero_window_job(out_dir: Path, workload_python: str, *, timeout_s: float = JOB_TIMEOUT_S) -> Path:
    """A sender and a receiver that stops reading three times (lab/workloads/slow_reader.py), each in its own
    namespace and capture: real zero-window advertisements, the reader's record saying when it stopped."""
    out_dir = Path(out_dir).resolve()
    job_dir = _prepare_job_dir(out_dir, ZERO_WINDOW_JOB)
    started_ns = time.time_ns()
    with Cluster(f"{ZERO_WINDOW_JOB}-{os.getpid()}", ["reader", "sender"]) as cluster:
        reader_ip = cluster.host("reader").ip
        port = ["--port", str(ZERO_WINDOW_PORT)]
        nodes = [_start_node(cluster, job_dir, workload_python, "reader", "reader", "slow_reader.py",
                             ["--role", "reader", *port, *ZERO_WINDOW_READER], BASE_ENV, ZERO_WINDOW_PORT),
                 _start_node(cluster, job_dir, workload_python, "sender", "sender", "slow_reader.py",
                             ["--role", "sender", "--host", reader_ip, *port, *ZERO_WINDOW_SENDER], BASE_ENV)]
        node_entries, _ = _run_to_end(cluster, nodes, job_dir, timeout_s)
    for entry in node_entries:
        entry["record"] = f"{entry['name']}.json"
    job_record = {
        "job": ZERO_WINDOW_JOB,
        "framework": "python sockets",
        "transport": "tcp",
        "mode": "slow reader",
        "fault": {"kind": "zero_window", "node": "reader", "args": ZERO_WINDOW_READER},
        "subnet": str(cluster.subnet),
        "mtu": cluster.mtu,
        "start_ns": started_ns,
        "end_ns": time.time_ns(),
        "versions": _tool_versions(workload_python),
        "nodes": node_entries,
    }
    return _publish_job_dir(job_dir, out_dir, ZERO_WINDOW_JOB, job_record)


def merge_zmq_records(server: dict, client: dict) -> dict:
    """One record for the job: both sides' messages in time order, each marked `on_wire`.

    A PUB send matched by no subscription never leaves the publisher: the SUB's receives, in order,
    are the PUB sends that travelled."""
    pub_sends = [m for m in server["messages"] if m["type"] == "PUB" and m["direction"] == "send"]
    sub_receives = [m for m in client["messages"] if m["type"] == "SUB" and m["direction"] == "recv"]
    for message in [*server["messages"], *client["messages"]]:
        message["on_wire"] = True
    next_receive = 0
    for send in pub_sends:
        delivered = next_receive < len(sub_receives) and sub_receives[next_receive]["frames"] == send["frames"]
        send["on_wire"] = delivered
        next_receive += delivered
    if next_receive != len(sub_receives):
        raise RecordError("the SUB received messages the PUB record does not hold in that order")
    messages = sorted([*server["messages"], *client["messages"]],
                      key=lambda message: message.get("send_ns", message.get("recv_ns")))
    return {"versions": client["versions"], "sockets": [*server["sockets"], *client["sockets"]],
            "curve": {**server["curve"], **client["curve"]}, "messages": messages}


def record_each(recorders: Iterable[Callable[[], Path]]) -> int:
    """Run each job recorder in turn (each returns its job's directory) and say where each job went, its size
    and how long it took, warning when the kernel dropped packets from a capture. SIGTERM stops it as
    Ctrl-C does. The exit status: 0, or 1 once a job could not be recorded (said on stderr)."""
    signal.signal(signal.SIGTERM, _raise_on_sigterm)
    try:
        for record_job in recorders:
            began = time.monotonic()
            job_dir = record_job()
            size_bytes = sum(path.stat().st_size for path in job_dir.iterdir())
            print(f"{job_dir}: {size_bytes / 1e6:.2f} MB in {time.monotonic() - began:.1f} s")
            nodes = json.loads((job_dir / "job.json").read_text())["nodes"]
            dropped = {n["capture"]: n["capture_stats"]["packets_dropped_by_kernel"] for n in nodes}
            if any(dropped.values()):
                print(f"warning: the kernel dropped packets from the captures: {dropped}", file=sys.stderr)
    except (RecordError, NetnsError, OSError, subprocess.CalledProcessError) as exc:
        print(f"recording failed: {exc}", file=sys.stderr)
        return 1
    return 0


def _raise_on_sigterm(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lab.record", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for command, help_text in (("all", "record every bundled job"), ("mxnet", "record one MXNet job"),
                               ("zmq", "record the pyzmq job"), ("gloo", "record the PyTorch Gloo job"),
                               ("gloo-matrix", "record the Gloo matrix, one job per world size")):
        sub = commands.add_parser(command, help=help_text)
        sub.add_argument("--out", type=Path, required=True, help="directory receiving one folder per job")
        sub.add_argument("--workload-python", required=True, help="python of the venv holding mxnet, pyzmq and torch")
        sub.add_argument("--timeout", type=float, default=JOB_TIMEOUT_S, help="seconds a job may take")
        if command == "all":
            sub.add_argument("--jobs", nargs="+", choices=ALL_JOBS, default=list(ALL_JOBS))
        if command in ("mxnet", "gloo"):
            sub.add_argument("--rate-mbit", type=float, default=None,
                             help="every node's link rate, each way (tc tbf; default: the veth pair's speed)")
        if command == "gloo":
            sub.add_argument("--world-size", type=int, default=GLOO_WORLD_SIZE, help="ranks, one per namespace")
            sub.add_argument("--job", default=GLOO_JOB, help="job (and folder) name")
            sub.add_argument("--train-steps", type=int, default=None,
                             help="a training loop of this many steps instead of the list of operations")
            sub.add_argument("--grad-elements", type=int, default=2_621_440, help="float32 all-reduced per step")
            sub.add_argument("--compute-matmuls", type=int, default=20, help="256×256 matrix products per step")
        if command == "gloo-matrix":
            sub.add_argument("--world-sizes", type=int, nargs="+", default=sorted(gloo_matrix.LARGE_CELLS))
            sub.add_argument("--max-size", type=int, help="leave out the sizes above this (the large cells too)")
            sub.add_argument("--rate-mbit", type=int, default=gloo_matrix.JOB_RATE_MBIT,
                             help="all ranks' sending rate together")
            sub.add_argument("--gzip", action="store_true", help="gzip the captures (slow for large ones)")
            sub.set_defaults(timeout=gloo_matrix.JOB_TIMEOUT_S)
        if command == "mxnet":
            sub.add_argument("--job", required=True, help="job (and folder) name")
            sub.add_argument("--kvstore", default="dist_sync", choices=["dist_sync", "dist_async"])
            sub.add_argument("--model", default="mlp", choices=["mlp", "wide_mlp", "lenet", "sparse_embedding"])
            sub.add_argument("--batches", type=int, default=10)
            sub.add_argument("--batch-size", type=int, default=32)
            sub.add_argument("--servers", type=int, default=2)
            sub.add_argument("--workers", type=int, default=2)
            sub.add_argument("--bigarray-bound", type=int, default=None,
                             help="MXNET_KVSTORE_BIGARRAY_BOUND (elements) for the job")
            sub.add_argument("--capture-buffer-kib", type=int, default=None,
                             help="tcpdump's kernel buffer per node (small: the captures lose packets)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if os.geteuid() != 0:
        print("lab.record needs root (network namespaces, tcpdump)", file=sys.stderr)
        return 2
    if not os.access(args.workload_python, os.X_OK):
        print(f"no workload python at {args.workload_python} (`make workloads` creates it)", file=sys.stderr)
        return 2
    if args.command == "all":
        jobs = args.jobs
    elif args.command == "zmq":
        jobs = [ZMQ_JOB]
    elif args.command == "gloo":
        jobs = [GLOO_JOB]
    elif args.command == "gloo-matrix":
        jobs = [gloo_matrix.MatrixJobSpec(f"gloo_matrix_k{k}", k, max_size=args.max_size, rate_mbit=args.rate_mbit,
                                          gzip=args.gzip) for k in args.world_sizes]
    else:
        jobs = [MXNetJobSpec(args.job, args.kvstore, args.model, args.batches, args.batch_size,
                             args.servers, args.workers, args.bigarray_bound, args.capture_buffer_kib,
                             rate_mbit=args.rate_mbit)]

    def recorder(job) -> Callable[[], Path]:
        if job == ZMQ_JOB:
            return lambda: record_zmq_job(args.out, args.workload_python, timeout_s=args.timeout)
        if job == ZERO_WINDOW_JOB:
            return lambda: record_zero_window_job(args.out, args.workload_python, timeout_s=args.timeout)
        if job == GLOO_JOB and args.command == "gloo":
            training = (GlooTraining(args.train_steps, args.grad_elements, args.compute_matmuls)
                        if args.train_steps else None)
            return lambda: record_gloo_job(args.out, args.workload_python, timeout_s=args.timeout,
                                           world_size=args.world_size, name=args.job, rate_mbit=args.rate_mbit,
                                           training=training)
        if isinstance(job, gloo_matrix.MatrixJobSpec) or job in gloo_matrix.BUNDLED:
            matrix_spec = gloo_matrix.BUNDLED.get(job, job)
            return lambda: record_gloo_matrix_job(matrix_spec, args.out, args.workload_python,
                                                  timeout_s=max(args.timeout, gloo_matrix.JOB_TIMEOUT_S))
        if job == GLOO_JOB:
            return lambda: record_gloo_job(args.out, args.workload_python, timeout_s=args.timeout)
        if job in GLOO_FAULT_JOBS:
            fault_job = GLOO_FAULT_JOBS[job]
            return lambda: record_gloo_job(args.out, args.workload_python, timeout_s=args.timeout,
                                           name=fault_job.name, training=fault_job.training,
                                           slow_link=fault_job.slow_link, slow_link_mbit=fault_job.slow_link_mbit)
        spec = job if isinstance(job, MXNetJobSpec) else MXNET_JOBS[job]
        return lambda: record_mxnet_job(spec, args.out, args.workload_python, timeout_s=args.timeout)
    return record_each(recorder(job) for job in jobs)


if __name__ == "__main__":
    sys.exit(main())
