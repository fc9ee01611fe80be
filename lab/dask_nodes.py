"""A real distributed Dask cluster on one machine: `dask scheduler` and `dask worker` processes, each in a network
namespace standing for a node of its own (lab/netns.py), and a `client` host from which a decode reaches them; the
workers read the captures where they lie (this machine's one file system stands for a shared one).

    with dask_nodes(2, log_dir) as (cluster, address):
        cluster.run("client", [dlcsniff, "decode", ..., "--engine", "dask", "--scheduler", address])
"""
from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Iterator

from lab.netns import Cluster

REPO = Path(__file__).resolve().parent.parent
DASK = str(REPO / ".venv" / "bin" / "dask")
PYTHON = str(REPO / ".venv" / "bin" / "python")
SCHEDULER_PORT = 8786
START_S = 120


def process_tree(pids: list[int]) -> list[int]:
    """Every process descending from the given ones (a `dask worker` runs its worker under a nanny)."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def peak_rss_mb(pid: int) -> float:
    """A live process's peak resident set (VmHWM), in MiB; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return 0.0


@contextlib.contextmanager
def dask_nodes(workers: int, log_dir: Path, *, tag: str | None = None) -> Iterator[tuple[Cluster, str, list[int]]]:
    """A scheduler host, `workers` worker hosts (w0, w1...) of one single-threaded worker each and a client host;
    yields the cluster, the scheduler's address and the pids of the worker processes (`dask worker`), once every
    worker has joined. Everything is stopped and the namespaces removed on leaving."""
    names = [f"w{k}" for k in range(workers)]
    logs = []
    with Cluster(tag or f"dask{os.getpid() % 100000}", ["scheduler", *names, "client"]) as cluster:
        scheduler_ip = cluster.host("scheduler").ip
        address = f"tcp://{scheduler_ip}:{SCHEDULER_PORT}"

        def start(host: str, argv: list[str]) -> subprocess.Popen:
            logs.append(open(Path(log_dir) / f"{host}.log", "wb"))
            return cluster.popen(host, argv, stdout=subprocess.DEVNULL, stderr=logs[-1], cwd=log_dir)

        try:
            start("scheduler", [DASK, "scheduler", "--host", scheduler_ip, "--port", str(SCHEDULER_PORT),
                                "--no-dashboard"])
            pids = [start(name, [DASK, "worker", address, "--host", cluster.host(name).ip, "--nthreads", "1",
                                 "--nworkers", "1", "--no-dashboard"]).pid for name in names]
            code = ("from distributed import Client\n"
                    f"with Client({address!r}, timeout={START_S}) as c: c.wait_for_workers({workers}, "
                    f"timeout={START_S})")
            cluster.run("client", [PYTHON, "-c", code], timeout_s=2 * START_S)
            yield cluster, address, pids
        finally:
            cluster.close()
            for log in logs:
                log.close()
