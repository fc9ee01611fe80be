"""`make bench`: the performance figures the issues ask for, each beside the alternative a user would pick.

    .venv/bin/python -m tests.bench [--only decode,hotpath,...] [--batches N]

decode   — a ≥ 100 MB capture of a real MXNet job with multi-MB tensors (MTU 1500; recorded once by
           sniffer/record.py into bench-out/), decoded by `dlcsniff decode` vs `tshark -q -z conv,tcp`
           on the same file in the same run: wall time, packets/s, MB/s, peak RSS, and the ratio.
           Peak RSS is also measured on the file concatenated with itself (twice the size) to show
           that memory does not grow with the input.
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
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench-out"
VENV_BIN = REPO / ".venv" / "bin"
WORKLOAD_PYTHON = REPO / ".venv-workloads" / "bin" / "python"
MIN_CAPTURE_BYTES = 100 << 20


def peak_rss(argv: list[str]) -> tuple[float, int]:
    """Wall time and peak RSS of one child, measured in a fresh Python so RUSAGE_CHILDREN is its own."""
    probe = (
        "import resource, subprocess, sys, time, json\n"
        "t = time.perf_counter()\n"
        "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)\n"
        "w = time.perf_counter() - t\n"
        "sys.stderr.write(r.stderr.decode(errors='replace')[-2000:]) if r.returncode else None\n"
        "print(json.dumps([w, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, r.returncode]))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, check=True)
    wall, rss, code = json.loads(result.stdout)
    if code != 0:
        raise SystemExit(f"{argv[0]} failed ({code}): {result.stderr}")
    return wall, rss


def bench_capture(batches: int) -> Path:
    """The largest node capture of a real MXNet job with multi-MB tensors, uncompressed, ≥ 100 MB."""
    pcap = OUT / "mxnet_bench.pcap"
    if pcap.exists() and pcap.stat().st_size >= MIN_CAPTURE_BYTES:
        return pcap
    OUT.mkdir(exist_ok=True)
    job_dir = OUT / "mxnet_bench"
    if job_dir.exists():
        shutil.rmtree(job_dir)
    # wide_mlp: a 10000 × 128 float32 weight (5.12 MB), split across both servers by MXNet's big-array rule.
    subprocess.run([str(VENV_BIN / "python"), "-m", "sniffer.record", "mxnet", "--job", "mxnet_bench",
                    "--model", "wide_mlp", "--kvstore", "dist_sync", "--batches", str(batches),
                    "--out", str(OUT), "--workload-python", str(WORKLOAD_PYTHON), "--timeout", "300"],
                   check=True, cwd=REPO)
    largest = max(job_dir.glob("*.pcap.gz"), key=lambda p: p.stat().st_size)
    with gzip.open(largest, "rb") as src, open(pcap, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    if pcap.stat().st_size < MIN_CAPTURE_BYTES:
        pcap.unlink()
        raise SystemExit(f"the recorded capture is under 100 MB: rerun with more --batches (now {batches})")
    return pcap


def count_packets(pcap: Path) -> int:
    from decoders.capture import open_capture
    with open_capture(pcap) as reader:
        for _ in reader:
            pass
        return reader.packets


def section_decode(args) -> dict:
    pcap = bench_capture(args.batches)
    size = pcap.stat().st_size
    packets = count_packets(pcap)
    doubled = OUT / "mxnet_bench_x2.pcap"
    if not doubled.exists():
        subprocess.run(["mergecap", "-a", "-F", "pcap", "-w", str(doubled), str(pcap), str(pcap)], check=True)
    runs = {}
    for label, argv in (
        ("dlcsniff decode", [str(VENV_BIN / "dlcsniff"), "decode", str(pcap), "--out", str(OUT / "decoded"),
                             "--no-progress"]),
        ("tshark -q -z conv,tcp", ["tshark", "-r", str(pcap), "-q", "-z", "conv,tcp"]),
    ):
        best = min((peak_rss(argv) for _ in range(args.repeat)), key=lambda r: r[0])
        runs[label] = {"seconds": round(best[0], 3), "peak_rss_mb": round(best[1] / 2**20, 1),
                       "packets_per_s": round(packets / best[0]), "mb_per_s": round(size / 2**20 / best[0], 1)}
    x2_wall, x2_rss = peak_rss([str(VENV_BIN / "dlcsniff"), "decode", str(doubled), "--out",
                                str(OUT / "decoded_x2"), "--no-progress"])
    ours, theirs = runs["dlcsniff decode"], runs["tshark -q -z conv,tcp"]
    return {
        "capture": str(pcap), "capture_mb": round(size / 2**20, 1), "packets": packets,
        "runs": runs,
        "speedup_vs_tshark": round(theirs["seconds"] / ours["seconds"], 2),
        "dlcsniff_peak_rss_mb_at_2x_size": round(x2_rss / 2**20, 1),
        "dlcsniff_seconds_at_2x_size": round(x2_wall, 3),
    }


def section_hotpath(args) -> dict:
    result = subprocess.run([str(VENV_BIN / "python"), "-m", "tests.bench_hotpath"], cwd=REPO,
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
for _name, _module in (("analysis", "tests.bench_analysis"), ("capture", "tests.bench_capture"),
                       ("dask", "tests.bench_dask")):
    if (REPO / (_module.replace(".", "/") + ".py")).exists():
        SECTIONS[_name] = _module_section(_module)


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
