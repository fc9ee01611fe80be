"""`make bench`: the performance figures the issues ask for, each beside the alternative a user would pick.

    .venv/bin/python -m tests.bench [--only decode,hotpath,...] [--batches N]

decode   — two captures of real MXNet jobs with multi-MB tensors (MTU 1500; recorded once by
           sniffer/record.py into bench-out/; ~140 MB and ~480 MB), each decoded by `dlcsniff decode`
           (default: a forked worker; and in one process) vs `tshark -q -z conv,tcp` on the same file in
           the same run: wall time, packets/s, MB/s, peak RSS of the whole process tree, and the ratio.
Other sections are added by the modules that own them (see SECTIONS).
Timing lives here only: no test asserts on time.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
OUT = REPO / "bench-out"
VENV_BIN = REPO / ".venv" / "bin"
WORKLOAD_PYTHON = REPO / ".venv-workloads" / "bin" / "python"


def _tree_rss_bytes(session: int) -> int:
    """Summed resident memory of every process in one session (the command and any worker it forked)."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            if int(fields[3]) != session:          # field 6 of stat: the session id
                continue
            with open(f"/proc/{entry.name}/statm", "rb") as f:
                total += int(f.read().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


def measure(argv: list[str]) -> tuple[float, int]:
    """(wall seconds, peak summed RSS of the command's process tree), sampled every 5 ms."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss_bytes(proc.pid))
        time.sleep(0.005)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({proc.returncode}): {proc.stderr.read().decode(errors='replace')}")
    return wall, peak


def bench_capture(batches: int) -> Path:
    """The largest node capture of a real MXNet job with multi-MB tensors, uncompressed; recorded once."""
    name = f"mxnet_bench_{batches}"
    pcap = OUT / f"{name}.pcap"
    if pcap.exists():
        return pcap
    OUT.mkdir(exist_ok=True)
    job_dir = OUT / name
    if job_dir.exists():
        shutil.rmtree(job_dir)
    # wide_mlp: a 10000 × 128 float32 weight (5.12 MB), split across both servers by MXNet's big-array rule.
    subprocess.run([str(VENV_BIN / "python"), "-m", "lab.record", "mxnet", "--job", name,
                    "--model", "wide_mlp", "--kvstore", "dist_sync", "--batches", str(batches),
                    "--out", str(OUT), "--workload-python", str(WORKLOAD_PYTHON), "--timeout", "600"],
                   check=True, cwd=REPO)
    largest = max(job_dir.glob("*.pcap.gz"), key=lambda p: p.stat().st_size)
    with gzip.open(largest, "rb") as src, open(pcap, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    return pcap


def count_packets(pcap: Path) -> int:
    from dlcsniff.decoders.inputs.capture_file import open_capture
    with open_capture(pcap) as reader:
        for _ in reader:
            pass
        return reader.packets


def _decode_runs(pcap: Path, repeat: int) -> dict:
    size = pcap.stat().st_size
    packets = count_packets(pcap)
    commands = {
        "dlcsniff decode": [str(VENV_BIN / "dlcsniff"), "decode", str(pcap), "--out", str(OUT / "decoded"),
                            "--no-progress"],
        "dlcsniff decode --workers 0 (one process)": [str(VENV_BIN / "dlcsniff"), "decode", str(pcap), "--out",
                                                      str(OUT / "decoded"), "--no-progress", "--workers", "0"],
        "tshark -q -z conv,tcp": ["tshark", "-r", str(pcap), "-q", "-z", "conv,tcp"],
    }
    runs = {}
    for label, argv in commands.items():
        best = min((measure(argv) for _ in range(repeat)), key=lambda r: r[0])
        runs[label] = {"seconds": round(best[0], 3), "peak_rss_mb": round(best[1] / 2**20, 1),
                       "packets_per_s": round(packets / best[0]), "mb_per_s": round(size / 2**20 / best[0], 1)}
    tshark = runs["tshark -q -z conv,tcp"]["seconds"]
    return {"capture": str(pcap), "capture_mb": round(size / 2**20, 1), "packets": packets, "runs": runs,
            "speedup_vs_tshark": round(tshark / runs["dlcsniff decode"]["seconds"], 2)}


def section_decode(args) -> dict:
    """Two real captures of the same job kind, one ~3.5× the other: speed against tshark on both, and
    peak memory (the whole process tree: the command and the worker it forks) that does not grow."""
    small = _decode_runs(bench_capture(args.batches), args.repeat)
    large = _decode_runs(bench_capture(args.batches * 7 // 2), args.repeat)
    return {"small": small, "large": large,
            "peak_rss_mb_small_vs_large": [small["runs"]["dlcsniff decode"]["peak_rss_mb"],
                                           large["runs"]["dlcsniff decode"]["peak_rss_mb"]],
            "cores": os.cpu_count(), "load_average": os.getloadavg()}


def section_hotpath(args) -> dict:
    result = subprocess.run([str(VENV_BIN / "python"), "-m", "tests.bench.hotpath"], cwd=REPO,
                            capture_output=True, text=True, check=True)
    return {"report": result.stdout.strip().splitlines()}


def _module_section(module: str):
    def run(args) -> dict:
        import importlib
        return importlib.import_module(module).run()
    return run


SECTIONS = {
    "decode": section_decode,
    "hotpath": section_hotpath,
}
for _name in ("analysis", "capture", "dask", "inputs", "simulate"):
    SECTIONS[_name] = _module_section(f"tests.bench.{_name}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated of {', '.join(SECTIONS)}")
    parser.add_argument("--batches", type=int, default=12, help="batches of the recorded MXNet job")
    parser.add_argument("--repeat", type=int, default=3, help="runs per timed command (best is kept)")
    args = parser.parse_args()
    results = {}
    for name in args.only.split(","):
        print(f"== {name}", flush=True)
        results[name] = SECTIONS[name](args)
        print(json.dumps(results[name], indent=2), flush=True)
    OUT.mkdir(exist_ok=True)
    (OUT / "bench.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {OUT / 'bench.json'}")


if __name__ == "__main__":
    main()
