"""Benchmark of `decode --engine dask` (`make bench`): 8 node captures of one real MXNet job decoded on local
Dask clusters of 1, 2 and 4 worker processes, beside the pandas engine in one process and in forked processes;
then on real distributed clusters (lab/dask_nodes.py: `dask scheduler` and 1, 2 or 4 `dask worker` processes,
each in a network namespace standing for a node, `dlcsniff decode --scheduler` run from a client host): wall and
CPU time of the decode, and the peak memory of each worker process, against the number of workers.

The job (3 servers, 4 workers and the scheduler, each captured in its own network namespace; wide_mlp's
5 MB tensors) is recorded once by lab/record.py into bench-out/. A cluster is started before its timed
runs (its start-up is reported apart); each figure is the best of REPEATS runs. Timing lives here only.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from tests.bench.__main__ import OUT, REPO, VENV_BIN, WORKLOAD_PYTHON

JOB = "mxnet_dask8"
SERVERS, WORKERS, BATCHES = 3, 4, 6
DASK_WORKERS = (1, 2, 4)
REPEATS = 3


def job_captures() -> list[Path]:
    """The job's 8 node captures, recorded on first use."""
    job_dir = OUT / JOB
    captures = sorted(job_dir.glob("*.pcap.gz"))
    if len(captures) == SERVERS + WORKERS + 1:
        return captures
    if job_dir.exists():
        shutil.rmtree(job_dir)
    OUT.mkdir(exist_ok=True)
    subprocess.run([str(VENV_BIN / "python"), "-m", "lab.record", "mxnet", "--job", JOB, "--model", "wide_mlp",
                    "--kvstore", "dist_sync", "--servers", str(SERVERS), "--workers", str(WORKERS),
                    "--batches", str(BATCHES), "--out", str(OUT), "--workload-python", str(WORKLOAD_PYTHON),
                    "--timeout", "300"], check=True, cwd=REPO)
    captures = sorted(job_dir.glob("*.pcap.gz"))
    if len(captures) != SERVERS + WORKERS + 1:
        raise SystemExit(f"{job_dir}: the recording left {len(captures)} captures, not {SERVERS + WORKERS + 1}")
    return captures


def best_seconds(decode) -> tuple[float, dict]:
    """The fastest of REPEATS runs of decode() → (seconds, what was decoded: packets and messages)."""
    runs = []
    for _ in range(REPEATS):
        began = time.perf_counter()
        dataset = decode()
        runs.append(time.perf_counter() - began)
    return min(runs), {"packets": dataset.summary["packets"], "messages": dataset.tables["messages"].num_rows}


def distributed_runs(captures: list[Path]) -> list[dict]:
    """`dlcsniff decode --engine dask --scheduler` of the job on clusters of DASK_WORKERS workers in namespaces."""
    import tempfile

    from lab.dask_nodes import dask_nodes, peak_rss_mb, process_tree
    from tests.bench.measure import measure

    rows = []
    for n in DASK_WORKERS:
        with tempfile.TemporaryDirectory() as logs, dask_nodes(n, Path(logs)) as (cluster, address, pids):
            argv = ["ip", "netns", "exec", cluster.host("client").netns, str(VENV_BIN / "dlcsniff"), "decode",
                    *map(str, captures), "--out", str(OUT / "dask-distributed"), "--force", "--no-progress",
                    "--engine", "dask", "--scheduler", address]
            runs = [measure(argv) for _ in range(REPEATS)]
            workers_mb = [round(peak_rss_mb(pid), 1) for pid in process_tree(pids) if pid not in pids]
        best = min(runs, key=lambda r: r.wall_s)
        rows.append({"workers": n, "wall_s": round(best.wall_s, 3), "client_cpu_s": round(best.cpu_s, 3),
                     "client_peak_rss_mb": round(best.max_process_rss_mb, 1), "worker_peak_rss_mb": workers_mb})
    one = rows[0]["wall_s"]
    for row in rows:
        row["speedup_vs_1_worker"] = round(one / row["wall_s"], 2)
    return rows


def run() -> dict:
    from dlcsniff.decoders.dask_cluster import dask_client
    from dlcsniff.decoders.dask_decode import decode_paths_dask
    from dlcsniff.decoders.job import decode_paths

    captures = job_captures()
    cores = len(os.sched_getaffinity(0))
    load_before = os.getloadavg()[0]      # other work on a shared machine shows in the figures
    rows = []
    seconds, decoded = best_seconds(lambda: decode_paths(captures, workers=0))
    rows.append({"engine": "pandas", "processes": 1, "seconds": seconds, "cluster_start_s": None})
    seconds, _ = best_seconds(lambda: decode_paths(captures, workers=cores))
    rows.append({"engine": "pandas (forked)", "processes": cores, "seconds": seconds, "cluster_start_s": None})
    for n in DASK_WORKERS:
        began = time.perf_counter()
        with dask_client(None, n, tasks=len(captures)) as client:
            started = time.perf_counter() - began
            address = client.scheduler.address
            seconds, found = best_seconds(lambda: decode_paths_dask(captures, scheduler=address))
        if found != decoded:
            raise SystemExit(f"dask with {n} workers decoded {found}, pandas {decoded}")
        rows.append({"engine": "dask", "processes": n, "seconds": seconds, "cluster_start_s": round(started, 2)})
    pandas_s = rows[0]["seconds"]
    dask_one_s = next(r["seconds"] for r in rows if r["engine"] == "dask" and r["processes"] == 1)
    for row in rows:
        row["speedup_vs_pandas"] = round(pandas_s / row["seconds"], 2)
        row["speedup_vs_dask_1"] = round(dask_one_s / row["seconds"], 2) if row["engine"] == "dask" else None
        row["seconds"] = round(row["seconds"], 3)
    return {
        "name": "decode --engine dask: 8 node captures of one MXNet job",
        "note": f"this machine has {cores} cores: no gain is expected past {cores} workers",
        "cores": cores,
        "load_average_1min": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        "captures": len(captures),
        "capture_mb_compressed": round(sum(p.stat().st_size for p in captures) / 2**20, 1),
        **decoded,
        "repeats": REPEATS,
        "runs": rows,
        "distributed (namespaces)": distributed_runs(captures),
        "table": [f"{'engine':<16}{'processes':>10}{'seconds':>10}{'vs pandas':>11}{'vs dask 1':>11}"] + [
            f"{r['engine']:<16}{r['processes']:>10}{r['seconds']:>10.3f}{r['speedup_vs_pandas']:>10.2f}x"
            + (f"{r['speedup_vs_dask_1']:>10.2f}x" if r["speedup_vs_dask_1"] is not None else f"{'':>11}")
            for r in rows],
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
