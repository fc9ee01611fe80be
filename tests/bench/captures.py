"""The node captures `make bench` measures decoding on (issue 22), recorded from real MXNet jobs into bench-out/
once (kept out of git) and reused:

- clean: an ordinary node capture of a big-array job (wide_mlp's 5 MB weight split over 2 servers), ~21 MB;
- lossy: a node capture of the same kind of job recorded the way busy nodes' captures are, tcpdump with a small
  kernel buffer (-B) while every core is kept busy by spinning processes, so the kernel drops packets: real loss;
- dropped: the clean capture with 5 % of its data segments left out (tests.support.gloo_matrix.drop_segments);
- small: a bundled capture of ~400 kB (pcaps/mxnet_sparse worker1, uncompressed);
- large: ~1 GB clean and lossy ones, made at bench time in a temporary directory from the clean and the lossy
  recordings (`replicate`: copies one after another, each copy's hosts moved to addresses of their own, so that
  every copy is a connection of its own with its handshakes, greetings and, in the lossy one, its real holes).

Each recording keeps the node capture that holds the most bytes (a server's or worker's), uncompressed.
"""
from __future__ import annotations

import contextlib
import gzip
import multiprocessing
import os
import shutil
import subprocess
from pathlib import Path

from tests.bench.__main__ import OUT, REPO, VENV_BIN, WORKLOAD_PYTHON

CLEAN_BATCHES = 2                  # ~21 MB a node
LOSSY_BATCHES = 10                 # ~110 MB a node
LARGE_BYTES = 1 << 30              # what `replicate` grows the large captures to (at least)
LOSSY_BUFFER_KIB = 8192            # tcpdump -B: small enough to drop under load, as a busy node's does
DROPPED_SHARE = 0.05
SMALL = REPO / "pcaps" / "mxnet_sparse" / "worker1.pcap.gz"


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def busy_cores():
    """Every core kept busy by a spinning process (what else runs on a busy node), stopped on leaving."""
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(len(os.sched_getaffinity(0)))]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.join()


def _record(name: str, batches: int, *, buffer_kib: int | None = None, loaded: bool = False) -> Path:
    """The largest node capture of a real wide_mlp job (2 servers, 2 workers), uncompressed; recorded once."""
    pcap = OUT / f"{name}.pcap"
    if pcap.exists():
        return pcap
    OUT.mkdir(exist_ok=True)
    job_dir = OUT / name
    shutil.rmtree(job_dir, ignore_errors=True)
    argv = [str(VENV_BIN / "python"), "-m", "lab.record", "mxnet", "--job", name, "--model", "wide_mlp",
            "--kvstore", "dist_sync", "--batches", str(batches), "--out", str(OUT),
            "--workload-python", str(WORKLOAD_PYTHON), "--timeout", "1800"]
    if buffer_kib is not None:
        argv += ["--capture-buffer-kib", str(buffer_kib)]
    with busy_cores() if loaded else contextlib.nullcontext():
        subprocess.run(argv, check=True, cwd=REPO)
    largest = max(job_dir.glob("*.pcap.gz"), key=lambda p: p.stat().st_size)
    partial = pcap.with_name(pcap.name + ".partial")
    with gzip.open(largest, "rb") as src, open(partial, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    partial.rename(pcap)
    return pcap


def clean_capture() -> Path:
    return _record("mxnet_clean", CLEAN_BATCHES)


def lossy_capture() -> Path:
    return _record("mxnet_lossy_busy", LOSSY_BATCHES, buffer_kib=LOSSY_BUFFER_KIB, loaded=True)


def dropped_capture() -> Path:
    """The clean capture with DROPPED_SHARE of its data segments left out (seeded: the same file every time)."""
    from tests.support.gloo_matrix import drop_segments

    pcap = OUT / "mxnet_clean_dropped5.pcap"
    if not pcap.exists():
        partial = pcap.with_name(pcap.name + ".partial")
        drop_segments(clean_capture(), partial, DROPPED_SHARE, seed=22)
        partial.rename(pcap)
    return pcap


def small_capture() -> Path:
    pcap = OUT / "mxnet_sparse_worker1.pcap"
    if not pcap.exists():
        OUT.mkdir(exist_ok=True)
        pcap.write_bytes(gzip.decompress(SMALL.read_bytes()))
    return pcap


def replicate(source: Path, target: Path, min_bytes: int = LARGE_BYTES) -> Path:
    """`source` (a little-endian pcap of IPv4 hosts) copied into `target` as often as it takes to reach
    `min_bytes`: copy k after copy k-1 in time (whole seconds later, so microseconds stay as recorded), the
    third octet of every IPv4 address raised by k (198.18.0.2 becomes 198.18.k.2), so that no copy's
    connections continue another's. Checksums are left as recorded (no decoder checks them)."""
    import numpy as np

    from tests.support.gloo_matrix import _ETHERTYPE_IPV4, _LINKS, _PCAP_HEADER, _PCAP_MAGICS, _RECORD_HEADER

    data = source.read_bytes()
    magic, *_, linktype = _PCAP_HEADER.unpack_from(data)
    if magic not in _PCAP_MAGICS or linktype & 0xFFFF not in _LINKS:
        raise ValueError(f"{source}: not a little-endian pcap of a link type replicate knows ({sorted(_LINKS)})")
    ethertype_at, ip_at = _LINKS[linktype & 0xFFFF]
    records, octets = [], []
    pos = _PCAP_HEADER.size
    while pos + _RECORD_HEADER.size <= len(data):
        caplen = _RECORD_HEADER.unpack_from(data, pos)[2]
        packet = pos + _RECORD_HEADER.size
        records.append(pos)
        if caplen >= ip_at + 20 and data[packet + ethertype_at:packet + ethertype_at + 2] == \
                _ETHERTYPE_IPV4.to_bytes(2, "big"):
            octets += [packet + ip_at + 14, packet + ip_at + 18]     # the third octets of source and destination
        pos = packet + caplen
    body = np.frombuffer(data, np.uint8, len(data) - _PCAP_HEADER.size, _PCAP_HEADER.size)
    seconds_at = np.asarray(records, np.int64) - _PCAP_HEADER.size
    octets_at = np.asarray(octets, np.int64) - _PCAP_HEADER.size
    seconds = body[(seconds_at[:, None] + np.arange(4)).ravel()].view("<u4")
    step = int(seconds.max()) - int(seconds.min()) + 1
    copies = -(-min_bytes // len(body))
    if copies > 256 - int(body[octets_at].max(initial=0)):
        raise ValueError(f"{source}: {copies} copies would move its addresses past x.x.255.x")
    partial = target.with_name(target.name + ".partial")
    with open(partial, "wb") as out:
        out.write(data[:_PCAP_HEADER.size])
        for k in range(copies):
            copy = body.copy()
            copy[(seconds_at[:, None] + np.arange(4)).ravel()] = (seconds + k * step).astype("<u4").view(np.uint8)
            copy[octets_at] += k
            out.write(copy.tobytes())
    partial.rename(target)
    return target


def large_captures(directory: Path) -> dict[str, Path]:
    """~1 GB clean and lossy node captures made into `directory` (replicate); the caller removes them."""
    needed = 2 * (LARGE_BYTES + max(clean_capture().stat().st_size, lossy_capture().stat().st_size))
    free = shutil.disk_usage(directory).free
    if free < 2 * needed:
        raise SystemExit(f"{directory}: {free / 2**30:.1f} GB free, the large captures need {needed / 2**30:.1f} GB "
                         f"(and as much again to spare); set DLCSNIFF_BENCH_LARGE=0 to leave them out")
    return {"large clean": replicate(clean_capture(), directory / "mxnet_clean_1g.pcap"),
            "large lossy": replicate(lossy_capture(), directory / "mxnet_lossy_busy_1g.pcap")}


if __name__ == "__main__":
    import sys

    for name in sys.argv[1:] or ("clean", "dropped", "lossy", "small"):
        print(globals()[f"{name}_capture"]())
