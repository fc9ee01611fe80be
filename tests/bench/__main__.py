"""`make bench`: the performance figures the issues ask for, each beside the alternative a user would pick.

    .venv/bin/python -m tests.bench [--only startup,decode,job,...]

startup  — `dlcsniff decode` of a small bundled capture vs tshark; `--help` of every command; the import floors
           (tests/bench/startup.py)
decode   — throughput on a ~140 MB and a ~1 GB node capture of real MXNet jobs vs tshark and libpcap's read pass,
           compiled parts on and off (tests/bench/decode.py)
job      — a job of 8 node captures of ~1 GB each, --workers 1 and 2, --engine dask (tests/bench/job_decode.py)
lossy    — clean and lossy node captures (real loss, and 5 % of segments dropped), a small one, and ~1 GB clean
           and lossy ones made from them at bench time, against tshark's TCP pass and libpcap's read; the cost
           per packet lossy against clean, peak RSS, the pandas+pyarrow floor: issue 22's ratios in one run
           (tests/bench/lossy.py)
Other sections are added by the modules that own them (see SECTIONS). Every module times commands the same way
(tests/bench/measure.py: wall and CPU time, peak memory of the process tree, alternated runs, medians).
Timing lives here only: no test asserts on time.
"""
from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
OUT = REPO / "bench-out"
VENV_BIN = REPO / ".venv" / "bin"
WORKLOAD_PYTHON = REPO / ".venv-workloads" / "bin" / "python"


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


def section_hotpath(args) -> dict:
    result = subprocess.run([str(VENV_BIN / "python"), "-m", "tests.bench.hotpath"], cwd=REPO,
                            capture_output=True, text=True, check=True)
    return {"report": result.stdout.strip().splitlines()}


def _module_section(module: str):
    def run(args) -> dict:
        import importlib
        return importlib.import_module(module).run()
    return run


SECTIONS = {"startup": _module_section("tests.bench.startup"), "decode": _module_section("tests.bench.decode"),
            "job": _module_section("tests.bench.job_decode"), "hotpath": section_hotpath,
            **{name: _module_section(f"tests.bench.{name}")
               for name in ("analysis", "capture", "dask", "inputs", "lossy", "simulate")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated of {', '.join(SECTIONS)}")
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
