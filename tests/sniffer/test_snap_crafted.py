"""The in-kernel ZMTP cut (sniffer/probes/zmtp_snap.c) on segments crafted from the protocol definition
(root, the real kernel program under a real daemon).

A ZMTP 3.1 stream (greeting, READY, ps-lite-shaped [meta, keys, values, lens] messages) is cut into TCP
segments so that frame headers straddle segment boundaries, and sent with scapy from one network namespace
to another while a daemon captures the receiving interface. Two more connections send the same stream with
neighbouring segments swapped, as packets of one flow reach a capture socket out of order on veth pairs:
where the filter can follow on (inside a value body; a hole of values; a hole holding a header, waited
for), and two header segments swapped (the filter waits, stores the early one, and walks the framing through
it once the late one came). dpkt reads the capture (an independent reader) and the checks come from the
stream as it was built: no byte a decoder needs (greeting, command, frame header, meta, keys, lens) is ever
cut; the values of the large frames are cut wherever only the segment that came early is not; `dlcsniff
decode` rebuilds every message of every connection.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import dpkt
import pytest

from lab.netns import Cluster
from tests.conftest import require_root
from tests.support.daemon import TOOL_PYTHON, RunningDaemon
from tests.support.daemon import decode_zmtp
from tests.support.zmtp_tap import command, frame, greeting_v3

pytestmark = pytest.mark.root

PORT = 7400
SOURCE_PORTS = {"in order": 40001, "reordered": 40002, "header after a header": 40003}
ISN = 1_000_000
SEGMENT_BYTES = 1000
MESSAGES = [[40 + 7 * index, 8, 100_000 + index, 4] for index in range(6)]
DAEMON_STOP_TIMEOUT_S = 10.0
FALLBACK_AFTER_BYTES = 250_000    # the swap of two header segments comes after this: two messages were cut

# Sends the segments (JSON: [[source port, tcp flags, stream offset, hex payload], ...]) in order, as raw
# IP packets: the receiving kernel has no listener and answers with resets, which the test ignores.
SENDER = r"""
import json, sys
from scapy.all import IP, TCP, Raw, conf, send
destination, isn, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
packets = []
for source_port, flags, offset, payload in json.load(sys.stdin):
    seq = isn if "S" in flags else isn + 1 + offset
    packet = IP(dst=destination) / TCP(sport=source_port, dport=port, flags=flags, seq=seq, ack=1 if "A" in flags else 0,
                                       window=65535)
    packets.append(packet / Raw(bytes.fromhex(payload)) if payload else packet)
send(packets, verbose=False, inter=0.0005)
"""


def build_stream() -> tuple[bytes, list[tuple[int, int]], list[tuple[int, int]], list[tuple[int, int]]]:
    """The stream, the byte ranges a decoder needs, the value ranges of frames over 64 KiB, and the frame
    headers (start, end)."""
    rng = random.Random(7)
    stream = bytearray(greeting_v3())
    needed = [(0, len(stream))]
    ready = command(b"READY", b"\x0bSocket-Type\x00\x00\x00\x04PUSH")
    needed.append((len(stream), len(stream) + len(ready)))
    stream += ready
    values, headers = [], []
    for sizes in MESSAGES:
        for index, size in enumerate(sizes):
            body = rng.randbytes(size)
            encoded = frame(body, more=index < len(sizes) - 1)
            header = len(encoded) - size
            start = len(stream)
            headers.append((start, start + header))
            if index == 2:                                    # the values: only their header is needed
                needed.append((start, start + header))
                values.append((start + header, start + len(encoded)))
            else:
                needed.append((start, start + len(encoded)))
            stream += encoded
    return bytes(stream), needed, values, headers


def segment_bounds(stream: bytes, headers: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Segments of about SEGMENT_BYTES, with extra cuts through frame headers (a long header cut after 3
    bytes, a short one after its flags byte), but every other long header alone in its segment."""
    cuts = set(range(SEGMENT_BYTES, len(stream), SEGMENT_BYTES))
    for number, (start, end) in enumerate(headers):
        if end - start == 9 and number % 8 == 6:
            cuts |= {start, end}
        else:
            cuts.add(start + (3 if end - start == 9 else 1))
    cuts = sorted(cut for cut in cuts if 0 < cut < len(stream))
    return list(zip([0, *cuts], [*cuts, len(stream)]))


def reorder(bounds: list[tuple[int, int]], values: list[tuple[int, int]], headers: list[tuple[int, int]]) -> list:
    """Swap neighbours where the filter can follow on: both inside one value body; the later one holding a
    frame header while the earlier one lies in a value body (the hole is values: followed arithmetically);
    the earlier one holding a header while the later one lies inside the next value body (the filter waits
    for the hole, then follows on)."""
    order = list(bounds)

    def in_values(segment):
        return any(v0 <= segment[0] and segment[1] <= v1 for v0, v1 in values)

    def has_header(segment):
        return any(segment[0] <= h < segment[1] for h, _ in headers)

    at = 0
    for late_ok, early_ok in ((in_values, in_values), (in_values, has_header), (has_header, in_values)):
        at = next(i for i in range(at + 2, len(order) - 1) if late_ok(order[i]) and early_ok(order[i + 1]))
        order[at], order[at + 1] = order[at + 1], order[at]
    return order


def reorder_across_headers(bounds: list[tuple[int, int]], headers: list[tuple[int, int]]) -> list:
    """Swap two neighbours that both hold frame headers: the packet that comes early is kept whole, and the
    filter finds the framing again in what it stored of it."""
    order = list(bounds)
    at = next(i for i in range(len(order) - 1)
              if all(any(order[j][0] <= h < order[j][1] for h, _ in headers) for j in (i, i + 1))
              and order[i][0] > FALLBACK_AFTER_BYTES)
    order[at], order[at + 1] = order[at + 1], order[at]
    return order


def captured_segments(pcap: Path, source_port: int) -> list[tuple[int, int, int]]:
    """(stream offset, payload bytes on the wire, payload bytes captured) of the data segments from one
    source port, as dpkt reads them."""
    found = []
    with open(pcap, "rb") as file:
        for _, data in dpkt.pcap.Reader(file):
            ip = dpkt.ethernet.Ethernet(data).data
            if not isinstance(ip, dpkt.ip.IP) or ip.p != dpkt.ip.IP_PROTO_TCP:
                continue
            tcp_header = bytes(ip)[ip.hl * 4:]
            if len(tcp_header) < 20:
                continue
            tcp = dpkt.tcp.TCP(tcp_header[:((tcp_header[12] >> 4) * 4)])
            if tcp.sport != source_port or tcp.flags & dpkt.tcp.TH_SYN:
                continue
            header_bytes = 14 + ip.hl * 4 + tcp.off * 4
            wire = ip.len - ip.hl * 4 - tcp.off * 4
            if wire:
                found.append((tcp.seq - ISN - 1, wire, max(0, len(data) - header_bytes)))
    return found


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    require_root()
    stream, needed, values, headers = build_stream()
    bounds = segment_bounds(stream, headers)
    orders = {"in order": bounds, "reordered": reorder(bounds, values, headers),
              "header after a header": reorder_across_headers(bounds, headers)}
    out = tmp_path_factory.mktemp("crafted") / "capture"
    with Cluster(f"snc{os.getpid() % 100000}", ["sender", "receiver"]) as cluster:
        receiver = cluster.host("receiver")
        daemon = RunningDaemon(["--iface", receiver.interface, "--out", str(out), "--ports", str(PORT)],
                               netns=receiver.netns)
        try:
            daemon.wait_ready()
            segments = []
            for name, order in orders.items():
                segments.append([SOURCE_PORTS[name], "S", 0, ""])
                segments += [[SOURCE_PORTS[name], "PA", start, stream[start:end].hex()] for start, end in order]
            sender = cluster.popen("sender", [str(TOOL_PYTHON), "-c", SENDER, receiver.ip, str(ISN), str(PORT)],
                                   stdin=subprocess.PIPE, stderr=subprocess.PIPE)
            _, errors = sender.communicate(json.dumps(segments).encode(), timeout=120)
            assert sender.returncode == 0, errors.decode()
            daemon.stop(timeout_s=DAEMON_STOP_TIMEOUT_S)
        finally:
            daemon.kill()
    return stream, needed, values, orders, out


def test_no_byte_a_decoder_needs_is_ever_cut(crafted):
    stream, needed, _, orders, out = crafted
    (pcap,) = out.glob("capture-*.pcap")
    for name, order in orders.items():
        seen = captured_segments(pcap, SOURCE_PORTS[name])
        assert [(offset, wire) for offset, wire, _ in seen] == [(start, end - start) for start, end in order], name
        for offset, wire, captured in seen:
            for start, end in needed:
                overlap_end = min(end, offset + wire)
                if start < offset + wire and end > offset:
                    assert captured >= overlap_end - offset, (name, offset, wire, captured, (start, end))


def test_large_values_are_cut_where_the_stream_can_be_followed(crafted):
    _, _, values, orders, out = crafted
    (pcap,) = out.glob("capture-*.pcap")
    seen = captured_segments(pcap, SOURCE_PORTS["in order"])
    cut = sum(wire - captured for _, wire, captured in seen)
    value_bytes = sum(end - start for start, end in values)
    # every value byte but those sharing a segment with a header the filter keeps
    assert value_bytes - len(values) * 2 * SEGMENT_BYTES <= cut <= value_bytes
    # reordered where it can follow on: only the late segments themselves are kept whole
    reordered = sum(wire - captured for _, wire, captured in captured_segments(pcap, SOURCE_PORTS["reordered"]))
    assert cut - 3 * SEGMENT_BYTES <= reordered < cut
    # two header segments swapped: every segment is cut as in order but the one that came early (kept whole,
    # and stored: the framing is walked through it once the late one came)
    early = next(sent for first, sent in zip(orders["in order"], orders["header after a header"]) if first != sent)
    in_order = {offset: captured for offset, _, captured in seen}
    swapped = captured_segments(pcap, SOURCE_PORTS["header after a header"])
    assert all(captured == in_order[offset] for offset, _, captured in swapped if offset != early[0])
    assert next(captured == wire for offset, wire, captured in swapped if offset == early[0])
    assert sum(wire - captured for _, wire, captured in swapped) > cut - SEGMENT_BYTES
    run = json.loads((out / "capture.json").read_text())["runs"][-1]
    assert run["payload"]["mode"] == "zmtp-cut" and run["payload"]["cut_bytes"] >= cut + reordered
    # no direction was given up on; each hole that might have held a header was waited for, and resumed
    assert run["payload"]["full_flows"] == 0
    assert run["payload"]["waits"] == run["payload"]["resumed"] >= 2


def test_decode_rebuilds_every_message_of_every_connection(crafted, tmp_path):
    *_, out = crafted
    streams, messages = decode_zmtp(out, tmp_path / "decoded")
    for name, source_port in SOURCE_PORTS.items():
        flows = set(streams.loc[(streams["src_port"] == source_port) & (streams["dst_port"] == PORT), "flow_id"])
        data = messages[messages["flow_id"].isin(flows)]
        assert [list(sizes) for sizes in data["frame_sizes"]] == MESSAGES, name
        assert data["complete"].all(), name
