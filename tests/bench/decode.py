"""Benchmark of decode throughput (`make bench`, section decode; issue 11, item 2), on two node captures of real
MXNet jobs with multi-MB tensors (MTU 1500), uncompressed:

- ~140 MB (bench_capture: 2 servers, 2 workers, 12 batches), against `tshark -r F -q -z conv,tcp` (target: at
  least 3 times as fast) and libpcap's read pass `tcpdump -r F -w /dev/null`;
- ~1 GB (a server of section job's 8-node job), against libpcap's read pass (target: within 3 times its time;
  tshark's TCP pass goes superlinear there: it is given TSHARK_LARGE_TIMEOUT_S, once);

each `dlcsniff decode` as a user runs it (a forked worker decodes while the main process loads the rest), in one
process (--workers 0), and with DLCSNIFF_PURE_PYTHON=1 (no compiled parts: the figures the choice of the C
extensions rests on); beside them the sha256 of the file that every decode's manifest records (computed in a
forked process while the worker decodes); alternated, medians. Per run: packets/s and MB/s (wall), MB/s per core (CPU time), µs per
packet, peak memory. Then: the cost per packet on the large capture against the small one, and the peak memory of
both (it must not grow with the file).
"""
from __future__ import annotations

from pathlib import Path

from tests.bench.__main__ import OUT, VENV_BIN, bench_capture, count_packets
from tests.bench.job_decode import large_capture
from tests.bench.measure import alternate, load

REPEAT = 3
TSHARK_LARGE_TIMEOUT_S = 180
DLCSNIFF = str(VENV_BIN / "dlcsniff")
PYTHON = str(VENV_BIN / "python")


def _commands(pcap: Path, *, tshark: bool) -> dict[str, dict]:
    decode = [DLCSNIFF, "decode", str(pcap), "--out", str(OUT / "decoded"), "--force", "--no-progress"]
    commands = {
        "dlcsniff decode": {"argv": decode},
        "dlcsniff decode --processes 0": {"argv": [*decode, "--processes", "0"]},
        "dlcsniff decode, pure Python": {"argv": decode, "env": {"DLCSNIFF_PURE_PYTHON": "1"}},
        "tcpdump -r F -w /dev/null": {"argv": ["tcpdump", "-r", str(pcap), "-w", "/dev/null"]},
        # the manifest's sha256 of the input, which every decode computes beside its workers
        "python: sha256 of F": {"argv": [PYTHON, "-c", "import hashlib, sys; "
                                         "hashlib.file_digest(open(sys.argv[1], 'rb'), 'sha256')", str(pcap)]},
    }
    if tshark:
        commands["tshark -q -z conv,tcp"] = {"argv": ["tshark", "-r", str(pcap), "-q", "-z", "conv,tcp"]}
    return commands


def _figures(pcap: Path, runs: dict[str, dict]) -> dict:
    size, packets = pcap.stat().st_size, count_packets(pcap)
    for found in runs.values():
        if found["finished"]:
            found["packets_per_s"] = round(packets / found["wall_s"])
            found["mb_per_s"] = round(size / 2**20 / found["wall_s"], 1)
            found["mb_per_s_per_core"] = round(size / 2**20 / found["cpu_s"], 1)
            found["us_per_packet_wall"] = round(found["wall_s"] / packets * 1e6, 2)
            found["us_per_packet_cpu"] = round(found["cpu_s"] / packets * 1e6, 2)
        found.pop("runs")
    ours = runs["dlcsniff decode"]
    ratios = {"tcpdump_read_vs_dlcsniff_wall": round(ours["wall_s"] / runs["tcpdump -r F -w /dev/null"]["wall_s"], 2),
              "compiled_speedup_vs_pure_python_cpu": round(runs["dlcsniff decode, pure Python"]["cpu_s"]
                                                           / ours["cpu_s"], 2),
              "sha256_vs_tcpdump_read_wall": round(runs["python: sha256 of F"]["wall_s"]
                                                   / runs["tcpdump -r F -w /dev/null"]["wall_s"], 2)}
    tshark = runs.get("tshark -q -z conv,tcp")
    if tshark is not None and tshark["finished"]:
        ratios["speedup_vs_tshark_wall"] = round(tshark["wall_s"] / ours["wall_s"], 2)
        ratios["speedup_vs_tshark_cpu"] = round(tshark["cpu_s"] / ours["cpu_s"], 2)
    return {"capture": str(pcap), "capture_mb": round(size / 2**20, 1), "packets": packets, "runs": runs,
            "ratios": ratios}


def run() -> dict:
    small_pcap, large_pcap = bench_capture(12), large_capture()
    before = load()
    small = _figures(small_pcap, alternate(_commands(small_pcap, tshark=True), REPEAT))
    large_runs = alternate(_commands(large_pcap, tshark=False), REPEAT)
    large_runs.update(alternate({"tshark -q -z conv,tcp": {
        "argv": ["tshark", "-r", str(large_pcap), "-q", "-z", "conv,tcp"], "timeout_s": TSHARK_LARGE_TIMEOUT_S}}, 1))
    large = _figures(large_pcap, large_runs)
    ours_small, ours_large = small["runs"]["dlcsniff decode"], large["runs"]["dlcsniff decode"]
    return {
        "small": small, "large": large, "repeat": REPEAT, "machine": {"before": before, "after": load()},
        "tshark_on_large": ("finished" if large["runs"]["tshark -q -z conv,tcp"]["finished"]
                            else f"did not finish in {TSHARK_LARGE_TIMEOUT_S} s"),
        "cost_per_packet_large_vs_small_cpu": round(ours_large["us_per_packet_cpu"] / ours_small["us_per_packet_cpu"], 2),
        "peak_memory_mb_small_large": {key: [ours_small[key], ours_large[key]] for key in (
            "max_process_rss_mb", "peak_rss_mb", "peak_pss_mb")},
        "targets": {
            "at least 3x tshark on the small capture (wall)": small["ratios"].get("speedup_vs_tshark_wall", 0) >= 3,
            "within 3x of libpcap's read pass on >= 1 GB (wall)": large["ratios"]["tcpdump_read_vs_dlcsniff_wall"] <= 3,
            "cost per packet on >= 1 GB no higher than on the small capture (cpu)":
                ours_large["us_per_packet_cpu"] <= ours_small["us_per_packet_cpu"],
            "peak RSS under 150 MB on both (largest process)":
                max(ours_small["max_process_rss_mb"], ours_large["max_process_rss_mb"]) < 150,
            "peak RSS under 150 MB on both (whole tree, shared pages twice)":
                max(ours_small["peak_rss_mb"], ours_large["peak_rss_mb"]) < 150,
        },
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
