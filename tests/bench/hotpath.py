"""Hot-path benchmark: capture reading, header parsing and TCP reassembly on a real capture.

    .venv/bin/python -m tests.bench.hotpath [--capture FILE] [--size-mb 80]

Without --capture it records one (once; kept in /tmp/dlcsniff-bench): a real TCP transfer over the
loopback of a network namespace whose lo has a 1500-byte MTU and segmentation offloads off, so packets
are the size a real NIC gives (the host's lo would carry 64 KiB ones). Needs root, tcpdump and tshark.

Prints packets/s for our precompiled-struct parser vs dpkt (same packets, in memory, and reading the
file), and the whole decode (read + parse + reassemble), packet by packet and in batches
(decoders.tcp_driver), vs `tshark -q -z conv,tcp`; best of 3 runs each (the machines are shared: figures
vary with load). Exits 0.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import dpkt

from dlcsniff.decoders.inputs.capture_file import open_capture
from dlcsniff.decoders.tcp_driver import BatchDecoder
from dlcsniff.decoders.packet import LINKTYPE_ETHERNET, ParseStats, Segment, parse_packet
from dlcsniff.decoders.tcp import TcpReassembler
from dlcsniff.decoders.protocols.base import UNLIMITED_SKIP_BYTES

BENCH_DIR = Path("/tmp/dlcsniff-bench")
NETNS = f"dlcs-bench-{os.getpid()}"


def record(path: Path, size_mb: int) -> None:
    """Inside the namespace: one transfer of size_mb random MB, captured on its lo."""
    from tests.support.tcpdump import capture_tcp_transfer   # the tests' helper: tcpdump around a socket pair
    request = os.urandom(size_mb << 20)
    transfer = capture_tcp_transfer(path.parent, request, hashlib.sha256(request).digest(),
                                    {path.name: ["-i", "lo"]})
    print(f"recorded {transfer.captures[path.name].packets_captured} packets into {path}")


def ensure_capture(size_mb: int) -> Path:
    path = BENCH_DIR / f"transfer_{size_mb}mb_mtu1500.pcap"
    if path.exists():
        return path
    BENCH_DIR.mkdir(exist_ok=True)
    subprocess.run(["ip", "netns", "add", NETNS], check=True)
    try:
        for cmd in (["ip", "link", "set", "lo", "mtu", "1500", "up"],
                    ["ethtool", "-K", "lo", "tso", "off", "gso", "off", "gro", "off"]):
            subprocess.run(["ip", "netns", "exec", NETNS, *cmd], check=True, capture_output=True)
        subprocess.run(["ip", "netns", "exec", NETNS, sys.executable, "-m", "tests.bench.hotpath",
                        "--record", str(path), "--size-mb", str(size_mb)], check=True)
    finally:
        subprocess.run(["ip", "netns", "del", NETNS], check=True)
    return path


def best_of(runs: int, fn) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def parse_ours(frames: list[bytes]) -> None:
    for frame in frames:
        parse_packet(LINKTYPE_ETHERNET, frame, 0)


def parse_dpkt(frames: list[bytes]) -> None:
    # The same fields parse_packet produces (dpkt decodes the layers eagerly in the constructor).
    for frame in frames:
        eth = dpkt.ethernet.Ethernet(frame)
        ip = eth.data
        tcp = ip.data
        (ip.src, ip.dst, tcp.sport, tcp.dport, tcp.seq, tcp.ack, tcp.flags, tcp.data)


def read_parse_ours(path: Path) -> None:
    with open_capture(path) as reader:
        for packet in reader:
            parse_packet(packet.linktype, packet.data, packet.ts_ns)


def read_parse_dpkt(path: Path) -> None:
    with open(path, "rb") as f:
        for _ts, frame in dpkt.pcap.Reader(f):
            tcp = dpkt.ethernet.Ethernet(frame).data.data
            (tcp.sport, tcp.dport, tcp.seq, tcp.ack, tcp.flags, tcp.data)


def decode_ours(path: Path) -> None:
    reassembler = TcpReassembler()
    feed = reassembler.feed
    with open_capture(path) as reader:
        for packet in reader:
            seg = parse_packet(packet.linktype, packet.data, packet.ts_ns)
            if seg.__class__ is Segment:
                feed(seg)
    reassembler.finish()


class _PayloadBlind:
    """A consumer of stream events that needs none of the payload (as for a stream of no known protocol)."""

    def on_tcp_event(self, event) -> None:
        pass

    def skippable_bytes(self, stream_id: int) -> int:
        return UNLIMITED_SKIP_BYTES

    def skip_bytes(self, stream_id: int, size: int, ts_ns: int) -> None:
        pass


def decode_batched(path: Path) -> None:
    reassembler = TcpReassembler()
    decoder = BatchDecoder(reassembler, _PayloadBlind(), ParseStats())
    with open_capture(path) as reader:
        for batch in reader.batches():
            decoder.feed(batch)
    reassembler.finish()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capture", type=Path, help="a pcap of Ethernet TCP packets (default: record one)")
    parser.add_argument("--size-mb", type=int, default=80)
    parser.add_argument("--record", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.record:
        record(args.record, args.size_mb)
        return 0
    path = args.capture or ensure_capture(args.size_mb)
    with open_capture(path) as reader:
        frames = [bytes(p.data) for p in reader]
    size_mb = path.stat().st_size / 1e6
    n = len(frames)
    print(f"capture: {path} ({size_mb:.0f} MB, {n} packets, {sum(map(len, frames)) / n:.0f} bytes/packet)\n")

    rows = [("parse headers, packets in memory", best_of(3, lambda: parse_ours(frames)),
             best_of(3, lambda: parse_dpkt(frames))),
            ("read file + parse headers", best_of(3, lambda: read_parse_ours(path)),
             best_of(3, lambda: read_parse_dpkt(path)))]
    print(f"{'':36} {'ours pkt/s':>12} {'dpkt pkt/s':>12} {'ours/dpkt':>10}")
    for name, ours, theirs in rows:
        print(f"{name:36} {n / ours:12,.0f} {n / theirs:12,.0f} {theirs / ours:9.2f}x")

    tshark = best_of(3, lambda: subprocess.run(["tshark", "-q", "-z", "conv,tcp", "-r", str(path)], check=True,
                                               capture_output=True))
    print(f"\n{'whole decode (read+parse+reassemble)':36} {'ours s':>12} {'tshark s':>12} {'tshark/ours':>10}")
    for name, decode in (("packet by packet", decode_ours), ("in batches", decode_batched)):
        ours = best_of(3, lambda: decode(path))
        print(f"{name:36} {ours:12.2f} {tshark:12.2f} {tshark / ours:9.2f}x   {size_mb / ours:6.0f} MB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
