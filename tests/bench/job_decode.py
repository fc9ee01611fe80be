"""Benchmark of decoding a whole job (`make bench`, section job; issue 11, item 3): 8 node captures of about 1 GB
each, decoded by `dlcsniff decode` with --processes 1 and 2 (forked processes) and with --engine dask on local
clusters of 1 and 2 workers: wall and CPU time, peak memory of the whole process tree, and the speed-up over one
worker. This machine has 2 cores: 2 workers are the most that can pay.

The job is real: MXNet 1.9.1, 4 servers and 4 workers (and the scheduler: a 9th, tiny capture), each in its own
network namespace, wide_mlp's 5 MB weight split across the servers, BATCHES batches: every server and worker
moves about 1 GB. It is recorded once by lab.record into bench-out/ and decompressed there (about 9 GB: check
`df` first); later runs reuse it.
"""
from __future__ import annotations

import gzip
import shutil
import subprocess
from pathlib import Path

from tests.bench.__main__ import OUT, REPO, VENV_BIN, WORKLOAD_PYTHON
from tests.bench.measure import alternate, load

JOB = "mxnet_job8x1g"
SERVERS, WORKERS, BATCHES = 4, 4, 90
REPEAT = 2
DLCSNIFF = str(VENV_BIN / "dlcsniff")


def job_captures() -> list[Path]:
    """The job's node captures (uncompressed), recorded and decompressed on first use."""
    job_dir, pcaps = OUT / JOB, OUT / f"{JOB}.pcaps"
    nodes = SERVERS + WORKERS + 1
    if len(list(pcaps.glob("*.pcap"))) == nodes and not list(pcaps.glob("*.partial")):
        return sorted(pcaps.glob("*.pcap"))
    if len(list(job_dir.glob("*.pcap.gz"))) != nodes:
        shutil.rmtree(job_dir, ignore_errors=True)
        OUT.mkdir(exist_ok=True)
        subprocess.run([str(VENV_BIN / "python"), "-m", "lab.record", "mxnet", "--job", JOB, "--model", "wide_mlp",
                        "--kvstore", "dist_sync", "--servers", str(SERVERS), "--workers", str(WORKERS),
                        "--batches", str(BATCHES), "--out", str(OUT), "--workload-python", str(WORKLOAD_PYTHON),
                        "--timeout", "3600"], check=True, cwd=REPO)
    pcaps.mkdir(exist_ok=True)
    for packed in sorted(job_dir.glob("*.pcap.gz")):
        target = pcaps / packed.name.removesuffix(".gz")
        if target.exists():
            continue
        partial = target.with_name(target.name + ".partial")
        with gzip.open(packed, "rb") as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        partial.rename(target)
    return sorted(pcaps.glob("*.pcap"))


def large_capture() -> Path:
    """One node capture of the job: about 1 GB, 680 k packets."""
    return next(p for p in job_captures() if p.name == "server0.pcap")


def run() -> dict:
    captures = job_captures()
    pcaps = captures[0].parent
    size = sum(p.stat().st_size for p in captures)
    before = load()
    out = str(OUT / "job-decoded")
    commands = {f"--processes {n}": {"argv": [DLCSNIFF, "decode", str(pcaps), "--out", out, "--force", "--no-progress",
                                            "--processes", str(n)]} for n in (1, 2)}
    commands.update({f"--engine dask --processes {n}": {"argv": [DLCSNIFF, "decode", str(pcaps), "--out", out, "--force",
                                                             "--no-progress", "--engine", "dask", "--processes", str(n)]}
                     for n in (1, 2)})
    runs = alternate(commands, REPEAT)
    hashed = alternate({"sha256 of the inputs (the manifest's)": {"argv": [
        str(VENV_BIN / "python"), "-c", "import hashlib, sys\nfor p in sys.argv[1:]:\n"
        " hashlib.file_digest(open(p, 'rb'), 'sha256')", *map(str, captures)]}}, 1)
    for label, found in runs.items():
        base = runs["--processes 1" if not label.startswith("--engine") else "--engine dask --processes 1"]
        found["speedup_vs_1_worker"] = round(base["wall_s"] / found["wall_s"], 2)
        found["gb_per_s"] = round(size / 2**30 / found["wall_s"], 3)
    return {
        "job": JOB, "captures": len(captures), "total_gb": round(size / 2**30, 2),
        "largest_gb": round(max(p.stat().st_size for p in captures) / 2**30, 2),
        "repeat": REPEAT, "machine": {"before": before, "after": load()},
        "runs": runs, "inputs_sha256": hashed,
        "note": "2 cores: beyond 2 workers nothing can be gained here; the manifest's sha256 of every input runs "
                "in a forked process beside the workers (its cost alone is inputs_sha256)",
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
