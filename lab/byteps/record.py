"""Record bytedance/ps-lite jobs (BytePS's ps-lite, built by lab/byteps/build.sh) as lab.record records MXNet:
one network namespace and one `tcpdump -i any` per host, ps-lite's PS_VERBOSE=2 logs, job.json.

    python -m lab.byteps.record --out pcaps --bin build/byteps/bin [--jobs NAME ...]

Each job lands in DIR/<job>/:
- <host>.pcap.gz  the host's capture (eth0 and lo; MTU 1500, offloads off), gzip -9; a host is one node, or
                  server i and worker i in the colocated jobs (host<i>), as BytePS is usually deployed
- <node>.log      the node's stderr: ps-lite's PS_VERBOSE=2 log ("zeromq<TAB>sent: ..." / "received: ...")
- <node>.jsonl    kv_app's record of the node (lab/byteps/kv_app.cc): each request a worker made, each
                  request a kv_app server handled; BytePS's own server keeps none
- job.json        nodes (name, role, host, rank, ps-lite id, ip, netns, pid, port, capture, log, record),
                  programs, settings, env, versions, capture counts, and `raw_meta_layout`: the offsets and
                  sizes of RawMeta and RawNode as g++ laid out this ps-lite's src/meta.h (bin/meta_layout)
Needs root (network namespaces, tcpdump).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from lab.netns import Cluster
from lab.record import (BASE_ENV, CAPTURE_SETTLE_S, PSLITE_NODE_ID_RE, SCHEDULER_PORT, SERVER_PORT,
                        WORKER_PORT, NodeRun, RecordError, _gzip_capture, _prepare_job_dir, _publish_job_dir,
                        _wait_for_nodes, record_each, tcpdump_version)

SDIST = "byteps-0.2.5.post15.tar.gz"
SDIST_SHA256 = "9d6a3c5be4c4b5a172739744bb32725c433f9a9f63794e1885e7376ff4eea99f"   # build.sh checks it
JOB_TIMEOUT_S = 120.0
DEBIAN_ZMQ = "4.3.4 (Debian libzmq3-dev, ZMTP 3.1)"
BUNDLED_ZMQ = "4.1.4 (the sdist's zeromq-4.1.4.tar.gz, static, ZMTP 3.0)"
PORTS = {"scheduler": SCHEDULER_PORT, "server": SERVER_PORT, "worker": WORKER_PORT}


@dataclass(frozen=True, slots=True)
class JobSpec:
    name: str
    num_servers: int
    num_workers: int
    rounds: int
    binary: str                          # the kv_app build in --bin (which libzmq)
    libzmq: str
    worker_args: tuple[str, ...] = ()
    server_binary: str | None = None     # BytePS's own server (byteps_server*), else kv_app serves
    server_env: tuple[tuple[str, str], ...] = ()
    colocated: bool = False              # server i and worker i share host i


SMALL = ("--max-bytes", str(256 << 10))
BYTEPS_PROTOCOL = ("--protocol", "byteps")
# 2 cores: fewer engine threads than BytePS's default 4
SERVER_ENV = (("BYTEPS_SERVER_ENGINE_THREAD", "2"),)
JOBS = {spec.name: spec for spec in (
    JobSpec("byteps_3s3w", 3, 3, rounds=1, binary="kv_app", libzmq=DEBIAN_ZMQ, worker_args=("--max-bytes", str(1 << 20))),
    JobSpec("byteps_zmq414_2s2w", 2, 2, rounds=1, binary="kv_app-zmq414", libzmq=BUNDLED_ZMQ, worker_args=SMALL),
    JobSpec("byteps_colocated_2x2", 2, 2, rounds=1, binary="kv_app", libzmq=DEBIAN_ZMQ, worker_args=SMALL,
            colocated=True),
    JobSpec("byteps_server_2s2w", 2, 2, rounds=1, binary="kv_app-zmq414", libzmq=BUNDLED_ZMQ,
            worker_args=BYTEPS_PROTOCOL, server_binary="byteps_server-zmq414", server_env=SERVER_ENV),
    JobSpec("byteps_server_colocated_2x2", 2, 2, rounds=1, binary="kv_app-zmq414", libzmq=BUNDLED_ZMQ,
            worker_args=BYTEPS_PROTOCOL, server_binary="byteps_server-zmq414", server_env=SERVER_ENV,
            colocated=True),
)}


def host_layout(spec: JobSpec) -> dict[str, str]:
    """node name → the host (network namespace, capture) it runs on, in start order."""
    servers = [f"server{i}" for i in range(spec.num_servers)]
    workers = [f"worker{i}" for i in range(spec.num_workers)]
    if not spec.colocated:
        return {name: name for name in ["scheduler", *servers, *workers]}
    hosts = {"scheduler": "scheduler"}
    for i in range(max(spec.num_servers, spec.num_workers)):
        hosts.update({name: f"host{i}" for name in (f"server{i}", f"worker{i}") if name in servers + workers})
    return hosts


def _node_id(record: Path, log: Path) -> int | None:
    """The ps-lite id the scheduler assigned: kv_app records it, BytePS's server only logs it."""
    if record.exists():
        for line in record.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("event") == "started":
                return entry["id"]
    found = PSLITE_NODE_ID_RE.search(log.read_text(errors="replace")) if log.exists() else None
    return int(found.group(1) or found.group(2)) if found else None


def record_job(spec: JobSpec, out_dir: Path, bin_dir: Path, timeout_s: float = JOB_TIMEOUT_S) -> Path:
    """Run one job, each host in its own namespace with its own capture; return its directory."""
    out_dir, bin_dir = Path(out_dir).resolve(), Path(bin_dir).resolve()
    binary = bin_dir / spec.binary
    server_binary = bin_dir / (spec.server_binary or spec.binary)
    for program in (binary, server_binary, bin_dir / "meta_layout"):
        if not os.access(program, os.X_OK):
            raise RecordError(f"no {program}: run lab/byteps/build.sh (make byteps)")
    job_dir = _prepare_job_dir(out_dir, spec.name)
    host_of = host_layout(spec)
    hosts = list(dict.fromkeys(host_of.values()))
    started_ns = time.time_ns()
    with Cluster(f"{spec.name}-{os.getpid()}", hosts) as cluster:
        job_env = {
            "DMLC_PS_ROOT_URI": cluster.host("scheduler").ip,
            "DMLC_PS_ROOT_PORT": str(SCHEDULER_PORT),
            "DMLC_NUM_SERVER": str(spec.num_servers),
            "DMLC_NUM_WORKER": str(spec.num_workers),
            "DMLC_INTERFACE": "eth0",
            "PS_VERBOSE": "2",
        }
        captures = {host: cluster.capture(host, job_dir / f"{host}.pcap", interface="any") for host in hosts}
        nodes: list[NodeRun] = []
        programs: dict[str, str] = {}
        for name, host in host_of.items():
            role = name.rstrip("0123456789")
            env = {**BASE_ENV, **job_env, "DMLC_ROLE": role, "DMLC_NODE_HOST": cluster.host(host).ip}
            if role != "scheduler":
                env["PORT"] = str(PORTS[role])       # ps-lite's own variable for a node's listening port
            argv = [str(binary), "--record", str(job_dir / f"{name}.jsonl"), "--rounds", str(spec.rounds),
                    *spec.worker_args]
            if role == "server" and spec.server_binary is not None:
                argv = [str(server_binary)]
                env.update(spec.server_env)
            programs[name] = " ".join([Path(argv[0]).name, *argv[1:]]).replace(f"{job_dir}/", "")
            with open(job_dir / f"{name}.log", "wb") as log:
                process = cluster.popen(host, argv, env=env, stdout=log, stderr=log)
            # kv_app's record is JSON lines, not lab.record's one JSON document: no record_path to poll
            nodes.append(NodeRun(name, role, process, captures[host], None, PORTS[role]))
        try:
            _wait_for_nodes(nodes, timeout_s)
            time.sleep(CAPTURE_SETTLE_S)
            capture_stats = {host: asdict(capture.stop()) for host, capture in captures.items()}
        except RecordError as exc:
            raise RecordError(f"{exc}\n(logs and captures kept in {job_dir})") from None
        for capture in captures.values():
            _gzip_capture(capture.path)
        entries = []
        for node in nodes:
            host = cluster.host(host_of[node.name])
            entries.append({
                "name": node.name, "role": node.role, "host": host_of[node.name], "ip": host.ip,
                "netns": host.netns, "interface": "any", "pid": node.process.pid, "port": node.port,
                "exit_code": node.exit_code, "killed_by_recorder": node.killed,
                "capture": f"{host_of[node.name]}.pcap.gz", "capture_stats": capture_stats[host_of[node.name]],
                "log": f"{node.name}.log", "program": programs[node.name],
            })
        subnet, mtu = str(cluster.subnet), cluster.mtu
    ended_ns = time.time_ns()
    for entry in entries:
        record = job_dir / f"{entry['name']}.jsonl"
        entry["record"] = record.name if record.exists() else None
        entry["pslite_id"] = node_id = _node_id(record, job_dir / entry["log"])
        # ps-lite ids (Postoffice::ServerRankToID / WorkerRankToID): server r is 8 + 2r, worker r is 9 + 2r
        entry["rank"] = 0 if entry["role"] == "scheduler" else None if node_id is None else (node_id - 8) // 2
    job_record = {
        "job": spec.name,
        "framework": "byteps-pslite",
        "transport": "ps-lite/zmq",
        "pslite_flavor": "bytedance",
        "pslite_source": f"{SDIST} (PyPI sdist) 3rdparty/ps-lite",
        "sdist_sha256": SDIST_SHA256,
        "workers_program": " ".join((spec.binary, *spec.worker_args)),
        "servers_program": spec.server_binary or spec.binary,
        "server_env": dict(spec.server_env),
        "colocated": spec.colocated,
        "rounds": spec.rounds,
        "num_servers": spec.num_servers,
        "num_workers": spec.num_workers,
        "env": job_env,
        "subnet": subnet,
        "mtu": mtu,
        "start_ns": started_ns,
        "end_ns": ended_ns,
        "versions": {"tcpdump": tcpdump_version(), "libzmq": spec.libzmq, "byteps_sdist": "0.2.5.post15"},
        "raw_meta_layout": json.loads(subprocess.run([str(bin_dir / "meta_layout")], capture_output=True,
                                                     check=True, text=True).stdout),
        "nodes": entries,
    }
    return _publish_job_dir(job_dir, out_dir, spec.name, job_record)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.byteps.record", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory receiving one folder per job")
    parser.add_argument("--bin", type=Path, required=True, help="the bin/ directory lab/byteps/build.sh filled")
    parser.add_argument("--jobs", nargs="+", choices=sorted(JOBS), default=list(JOBS))
    parser.add_argument("--timeout", type=float, default=JOB_TIMEOUT_S, help="seconds a job may take")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("lab.byteps.record needs root (network namespaces, tcpdump)", file=sys.stderr)
        return 2
    return record_each(partial(record_job, JOBS[name], args.out, args.bin, args.timeout) for name in args.jobs)


if __name__ == "__main__":
    sys.exit(main())
