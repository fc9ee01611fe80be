"""Benchmark of decoding the captures users have (`make bench`, section lossy; issue 22): clean and lossy node
captures of real MXNet jobs side by side with the alternatives a user would run on the same file, in one run:

    dlcsniff decode F --out D --force     (the whole process, as a user runs it)
    tshark -r F -q -z conv,tcp            (tshark's TCP pass)
    tcpdump -r F -w /dev/null             (libpcap's read pass)

on the captures of tests/bench/captures.py: a clean ~30 MB node capture, the same with 5 % of its data segments
dropped, a lossy one recorded with tcpdump's buffer small while every core was busy (real loss), the bundled
~400 kB one; and ~1 GB ones, clean and lossy, made from the clean and lossy recordings in a temporary directory
(tests.bench.captures.replicate; removed afterwards; DLCSNIFF_BENCH_LARGE=0 leaves them out), measured against
libpcap's read only (their target; tshark takes tens of seconds on them). Beside them the floor of any decode
built on pandas and pyarrow: the interpreter importing both. Alternated runs, medians (tests/bench/measure.py);
per capture: wall and CPU time, peak RSS of the largest process, µs per packet, the ratios to tshark and
libpcap's read; then the cost per packet of each lossy capture against the clean one of the same job (CPU time:
the figure least moved by other work on a shared machine). The targets are issue 22's. Our bytecode is compiled
first (tests.bench.measure.compile_bytecode).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from tests.bench import captures
from tests.bench.__main__ import OUT, REPO, VENV_BIN, count_packets
from tests.bench.measure import alternate, compile_bytecode, load

REPEAT = 3
TSHARK_TIMEOUT_S = 300
DECODE, TSHARK, LIBPCAP = "dlcsniff decode", "tshark -q -z conv,tcp", "tcpdump -r F -w /dev/null"
FLOOR = "python: import pandas, pyarrow.parquet"


def _commands(pcap, *, tshark: bool = True) -> dict[str, dict]:
    commands = {
        DECODE: {"argv": [str(VENV_BIN / "dlcsniff"), "decode", str(pcap), "--out", str(OUT / "lossy-decoded"),
                          "--force", "--no-progress"]},
        TSHARK: {"argv": ["tshark", "-r", str(pcap), "-q", "-z", "conv,tcp"], "timeout_s": TSHARK_TIMEOUT_S},
        LIBPCAP: {"argv": ["tcpdump", "-r", str(pcap), "-w", "/dev/null"]},
    }
    if not tshark:
        del commands[TSHARK]
    return commands


def _figures(pcap, runs: dict[str, dict]) -> dict:
    packets = count_packets(pcap)
    for found in runs.values():
        found.pop("runs")
        found["us_per_packet_cpu"] = round(found["cpu_s"] / packets * 1e6, 2)
        found["us_per_packet_wall"] = round(found["wall_s"] / packets * 1e6, 2)
    ours, tshark, libpcap = runs[DECODE], runs.get(TSHARK), runs[LIBPCAP]
    compared = tshark is not None and tshark["finished"]
    return {"capture": str(pcap), "mb": round(pcap.stat().st_size / 2**20, 1), "packets": packets, "runs": runs,
            "speedup_vs_tshark_wall": round(tshark["wall_s"] / ours["wall_s"], 2) if compared else None,
            "speedup_vs_tshark_cpu": round(tshark["cpu_s"] / ours["cpu_s"], 2) if compared else None,
            "vs_libpcap_read_wall": round(ours["wall_s"] / libpcap["wall_s"], 2),
            "vs_libpcap_read_cpu": round(ours["cpu_s"] / libpcap["cpu_s"], 2)}


def run() -> dict:
    compile_bytecode(REPO)
    inputs = {"clean": captures.clean_capture(), "dropped 5 %": captures.dropped_capture(),
              "lossy (recorded busy)": captures.lossy_capture(), "small": captures.small_capture()}
    scratch = None
    if os.environ.get("DLCSNIFF_BENCH_LARGE") != "0":
        scratch = Path(tempfile.mkdtemp(prefix="dlcsniff-bench-large-"))
    try:
        if scratch is not None:
            inputs.update(captures.large_captures(scratch))
        before = load()
        floor = alternate({FLOOR: {"argv": [str(VENV_BIN / "python"), "-c", "import pandas, pyarrow.parquet"]}},
                          REPEAT)[FLOOR]
        floor.pop("runs")
        found = {name: _figures(pcap, alternate(_commands(pcap, tshark=not name.startswith("large")), REPEAT))
                 for name, pcap in inputs.items()}
    finally:
        if scratch is not None:
            shutil.rmtree(scratch)
    ours = {name: figures["runs"]["dlcsniff decode"] for name, figures in found.items()}
    per_packet = {f"{name} vs clean": round(ours[name]["us_per_packet_cpu"] / ours["clean"]["us_per_packet_cpu"], 2)
                  for name in ("dropped 5 %", "lossy (recorded busy)")}
    if "large lossy" in ours:
        per_packet["large lossy vs large clean"] = round(ours["large lossy"]["us_per_packet_cpu"]
                                                         / ours["large clean"]["us_per_packet_cpu"], 2)
    largest_rss = max(r["max_process_rss_mb"] for r in ours.values())
    targets = {
        "1: lossy cost per packet at most 1.25x clean (cpu)": all(v <= 1.25 for v in per_packet.values()),
        "2: clean at least 1.2x faster than tshark (wall)": (found["clean"]["speedup_vs_tshark_wall"] or 0) >= 1.2,
        "2: lossy at least 3x faster than tshark (wall)":
            (found["lossy (recorded busy)"]["speedup_vs_tshark_wall"] or 0) >= 3,
        "2: peak RSS under 150 MB (largest process)": largest_rss < 150,
        # flat: the largest capture's peak within 10 % of the smallest one's
        "2: peak RSS flat in file size": largest_rss <= 1.1 * min(r["max_process_rss_mb"] for r in ours.values()),
        "4: small capture no slower than tshark (wall)": (found["small"]["speedup_vs_tshark_wall"] or 0) >= 1,
        "4: small capture under 120 MB": ours["small"]["max_process_rss_mb"] < 120,
    }
    if "large clean" in found:
        targets["2: >= 1 GB within 3x of libpcap's read (wall)"] = all(
            found[name]["vs_libpcap_read_wall"] <= 3 for name in ("large clean", "large lossy"))
    return {"captures": found, "cost_per_packet_lossy_vs_clean_cpu": per_packet, "repeat": REPEAT,
            # the floor against tshark's pass over the small and the clean capture: above 1, targets 2 and 4 are
            # out of reach for any decode that imports pandas and pyarrow
            "floor": {**floor, **{f"vs_tshark_{name}_wall": round(
                floor["wall_s"] / found[name]["runs"][TSHARK]["wall_s"], 2) for name in ("small", "clean")}},
            "max_process_rss_mb": {name: r["max_process_rss_mb"] for name, r in ours.items()},
            "machine": {"before": before, "after": load()}, "targets": targets}


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
