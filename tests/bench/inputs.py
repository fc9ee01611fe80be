"""Benchmarks of what `decode` does to its inputs (`make bench` calls `run()`).

- `filter`: a capture decoded without a selection, with `--filter` (libpcap's BPF interpreter on every packet)
  and with a time window: seconds (best of 3, in this process) and the cost of the filter per packet. On the
  bundled MXNet job's worker0 (2,796 packets) and on the bench's large MXNet capture (multi-MB tensors).
- `pieces`: the large capture cut by `tcpdump -C 20` into 20 MB pieces, decoded as one capture, against the
  whole file: what recognising the pieces costs (each piece read to its end once before decoding, to see
  that it ends where the next one starts).

    .venv/bin/python -c "import json, tests.bench.inputs as b; print(json.dumps(b.run(), indent=1))"
"""
from __future__ import annotations

import gzip
import os
import subprocess
import tempfile
import time
from pathlib import Path

from dlcsniff.decoders.capture_decoder import decode_capture
from dlcsniff.decoders.inputs.capture_set import expand_inputs
from dlcsniff.decoders.inputs.selection import PacketSelection, TimeBound

REPO = Path(__file__).resolve().parent.parent.parent
REPEAT = 3
FILTERS = ("tcp", "tcp port 9100 or tcp port 9200 or udp port 4791")


def _best(run) -> tuple[float, object]:
    run()                       # warm: imports, the page cache
    timed = []
    for _ in range(REPEAT):
        start = time.perf_counter()
        result = run()
        timed.append((time.perf_counter() - start, result))
    return min(timed, key=lambda t: t[0])


def _filter_costs(pcap: Path) -> dict:
    plain, result = _best(lambda: decode_capture(pcap))
    packets = result.packets
    runs = {"no selection": {"seconds": round(plain, 3)}}
    for expression in FILTERS:
        seconds, result = _best(lambda: decode_capture(pcap, selection=PacketSelection(filter=expression)))
        runs[f"--filter {expression!r}"] = {"seconds": round(seconds, 3), "kept": result.packets_decoded,
                                            "us_per_packet": round((seconds - plain) * 1e6 / packets, 2)}
    window = PacketSelection(start=TimeBound(0, True), end=TimeBound(3600 * 10**9, True))
    seconds, _ = _best(lambda: decode_capture(pcap, selection=window))
    runs["--start +0s --end +1h (keeps all)"] = {"seconds": round(seconds, 3),
                                                 "us_per_packet": round((seconds - plain) * 1e6 / packets, 2)}
    return {"capture": str(pcap), "packets": packets, "mb": round(pcap.stat().st_size / 2**20, 1), "runs": runs}


def _pieces_cost(pcap: Path) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["tcpdump", "-Z", "root", "-r", str(pcap), "-w", f"{tmp}/node.pcap", "-C", "20"], check=True,
                       capture_output=True)
        whole, _ = _best(lambda: decode_capture(pcap))
        recognising, captures = _best(lambda: expand_inputs([Path(tmp)]))
        pieces, _ = _best(lambda: decode_capture(captures[0]))
        return {"pieces": len(captures[0].files), "decode_whole_s": round(whole, 3),
                "decode_pieces_s": round(pieces, 3), "recognising_pieces_s": round(recognising, 3)}


def run() -> dict:
    from tests.bench.__main__ import bench_capture

    large = bench_capture(12)
    with tempfile.TemporaryDirectory() as tmp:
        small = Path(tmp) / "worker0.pcap"
        small.write_bytes(gzip.decompress((REPO / "pcaps" / "mxnet_sync" / "worker0.pcap.gz").read_bytes()))
        return {"filter": {"bundled": _filter_costs(small), "large": _filter_costs(large)},
                "pieces": _pieces_cost(large), "cores": os.cpu_count(), "load_average": os.getloadavg()}
