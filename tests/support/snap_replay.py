"""The in-kernel ZMTP cut (sniffer/probes/zmtp_snap.c) run on the packets of a capture file, without a network:
each packet goes through the kernel's own BPF_PROG_TEST_RUN, and the program's answer (how many bytes a packet
socket keeps) cuts the record as the daemon's capture socket would. With captures edited first (segments
swapped, held back, repeated, split: what netem or a lossy path would do, which this kernel cannot), the cut
is checked against the same edited capture kept whole.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import random
import struct
from dataclasses import dataclass
from pathlib import Path

from dlcsniff.decoders.inputs.capture_file import open_capture
from dlcsniff.sniffer import bpf_objects, libbpf, snap_filter

LINKTYPE_ETHERNET, LINKTYPE_LINUX_SLL, LINKTYPE_LINUX_SLL2 = 1, 113, 276
LINK_HEADER_BYTES = {LINKTYPE_ETHERNET: 14, LINKTYPE_LINUX_SLL: 16, LINKTYPE_LINUX_SLL2: 20}
ETHERTYPE_AT = {LINKTYPE_ETHERNET: 12, LINKTYPE_LINUX_SLL: 14, LINKTYPE_LINUX_SLL2: 0}
# What BPF_PROG_TEST_RUN is given: an Ethernet frame to a MAC that is not the loopback's (so not "outgoing
# on lo", which the filter leaves to libpcap's own dropping); a socket filter sees it from the IP header on.
_TEST_MACS = bytes.fromhex("020000000001" "020000000002")
_PCAP_HEADER = struct.Struct("<IHHiIII")
_PCAP_RECORD = struct.Struct("<IIII")
_PCAP_NS_MAGIC = 0xA1B23C4D


@dataclass(frozen=True, slots=True)
class Record:
    ts_ns: int
    data: bytes          # from the link-layer header on, as captured
    orig_len: int


@dataclass(frozen=True, slots=True)
class Capture:
    linktype: int
    records: list[Record]

    def write(self, path: Path) -> Path:
        with open(path, "wb") as file:
            file.write(_PCAP_HEADER.pack(_PCAP_NS_MAGIC, 2, 4, 0, 0, 262144, self.linktype))
            for record in self.records:
                seconds, nanoseconds = divmod(record.ts_ns, 1_000_000_000)
                file.write(_PCAP_RECORD.pack(seconds, nanoseconds, len(record.data), record.orig_len))
                file.write(record.data)
        return path

    @property
    def captured_bytes(self) -> int:
        return sum(len(record.data) for record in self.records)


def read_capture(path: Path) -> Capture:
    """Every record of a one-link-type capture file, whole."""
    with open_capture(path) as reader:
        packets = list(reader)
    linktypes = {packet.linktype for packet in packets}
    assert len(linktypes) == 1, f"{path}: link types {linktypes}"
    return Capture(linktypes.pop(), [Record(packet.ts_ns, bytes(packet.data), packet.orig_len) for packet in packets])


# -- the filter, run by the kernel -----------------------------------------------------------------------

class _TestRunOpts(ctypes.Structure):
    """libbpf's struct bpf_test_run_opts (bpf.h)."""
    _fields_ = [("sz", ctypes.c_size_t), ("data_in", ctypes.c_void_p), ("data_out", ctypes.c_void_p),
                ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32),
                ("ctx_in", ctypes.c_void_p), ("ctx_out", ctypes.c_void_p), ("ctx_size_in", ctypes.c_uint32),
                ("ctx_size_out", ctypes.c_uint32), ("retval", ctypes.c_uint32), ("repeat", ctypes.c_int),
                ("duration", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32),
                ("batch_size", ctypes.c_uint32)]


class SnapFilterRun:
    """The snap filter compiled as the daemon compiles it (for a socket whose data starts at the network
    header), loaded as a socket filter, and run by the kernel on one packet at a time. Its flow table
    lives as long as this object: packets of one capture go through one instance, in order."""

    def __init__(self, **defines) -> None:
        """`defines`: build flags of the filter to change (a test's mutant, compiled here), else the object the
        daemon loads."""
        source = bpf_objects.SNAP
        if defines:
            source = dataclasses.replace(source, defines=tuple(sorted({**dict(source.defines), **defines}.items())))
        elf = bpf_objects.compile_object(source) if defines else bpf_objects.object_bytes(source)[0]
        self.program_fd, self.counts_fd = snap_filter.load_snap_filter(
            elf, snap_filter.snap_settings(link_header_bytes=0))
        self._lib = libbpf.load_libbpf()
        self._lib.bpf_prog_test_run_opts.argtypes = [ctypes.c_int, ctypes.POINTER(_TestRunOpts)]

    def keep(self, network_packet: bytes, ethertype: bytes) -> int:
        """Bytes of the packet (from its network header) a packet socket with this filter would keep."""
        frame = _TEST_MACS + ethertype + network_packet
        buffer = ctypes.create_string_buffer(frame, len(frame))
        opts = _TestRunOpts(sz=ctypes.sizeof(_TestRunOpts), data_in=ctypes.cast(buffer, ctypes.c_void_p),
                            data_size_in=len(frame), repeat=1)
        if self._lib.bpf_prog_test_run_opts(self.program_fd, ctypes.byref(opts)) != 0:
            raise OSError(ctypes.get_errno(), "BPF_PROG_TEST_RUN of the snap filter failed")
        return opts.retval

    def counts(self) -> dict[str, int]:
        return {name: libbpf.percpu_total(self._lib, self.counts_fd, index)
                for index, name in enumerate(snap_filter.SNAP_COUNTERS)}

    def cut(self, capture: Capture) -> Capture:
        """The capture as the daemon's socket would have recorded it: each record cut to what the filter
        keeps (wire length unchanged), dropped when it keeps nothing."""
        link = LINK_HEADER_BYTES[capture.linktype]
        at = ETHERTYPE_AT[capture.linktype]
        records = []
        for record in capture.records:
            network = record.data[link:]
            keep = self.keep(network, record.data[at:at + 2])
            if keep == 0:
                continue
            records.append(Record(record.ts_ns, record.data[:link + min(keep, len(network))], record.orig_len))
        return Capture(capture.linktype, records)

    def close(self) -> None:
        os.close(self.program_fd)
        os.close(self.counts_fd)

    def __enter__(self) -> SnapFilterRun:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def cut_capture(capture: Capture, **flags) -> tuple[Capture, dict[str, int]]:
    """The capture cut by a fresh filter (its flow table empty, as at a daemon's start), and its counters."""
    with SnapFilterRun(**flags) as snap:
        return snap.cut(capture), snap.counts()


# -- editing a capture: what a lossy, reordering path does to a flow --------------------------------------

@dataclass(frozen=True, slots=True)
class Segment:
    index: int             # position in the capture
    flow: tuple            # (src ip, src port, dst ip, dst port)
    seq: int
    payload_at: int        # offset of the TCP payload in the record
    payload_bytes: int


def tcp_segments(capture: Capture) -> list[Segment]:
    """The TCP segments carrying data (IPv4), in capture order."""
    link = LINK_HEADER_BYTES[capture.linktype]
    at = ETHERTYPE_AT[capture.linktype]
    found = []
    for index, record in enumerate(capture.records):
        data = record.data
        if data[at:at + 2] != b"\x08\x00" or len(data) < link + 40 or data[link + 9] != 6:
            continue
        ip_header = (data[link] & 0x0F) * 4
        total = struct.unpack_from(">H", data, link + 2)[0]
        tcp = link + ip_header
        src_port, dst_port, seq = struct.unpack_from(">HHI", data, tcp)
        payload_at = tcp + (data[tcp + 12] >> 4) * 4
        payload_bytes = link + total - payload_at
        if payload_bytes <= 0 or len(data) < link + total:
            continue
        found.append(Segment(index, (data[link + 12:link + 16], src_port, data[link + 16:link + 20], dst_port), seq,
                             payload_at, payload_bytes))
    return found


def split_segment(capture: Capture, segment: Segment, first_bytes: int) -> tuple[Record, Record]:
    """One data segment as two (its first `first_bytes` of payload, then the rest), headers rewritten."""
    record = capture.records[segment.index]
    link = LINK_HEADER_BYTES[capture.linktype]
    head = record.data[:segment.payload_at]
    payload = record.data[segment.payload_at:segment.payload_at + segment.payload_bytes]
    parts = []
    for offset, piece in ((0, payload[:first_bytes]), (first_bytes, payload[first_bytes:])):
        data = bytearray(head + piece)
        struct.pack_into(">H", data, link + 2, len(data) - link)
        tcp = link + (data[link] & 0x0F) * 4
        struct.pack_into(">I", data, tcp + 4, (segment.seq + offset) & 0xFFFFFFFF)
        parts.append(Record(record.ts_ns, bytes(data), len(data)))
    return parts[0], parts[1]


EDITS = ("swap", "hold back", "hold back long", "repeat", "split reversed")


def edited(capture: Capture, rng: random.Random, edits: int, kinds: tuple[str, ...] = EDITS) -> tuple[Capture, dict]:
    """The capture with `edits` random edits of its data segments, each one of `kinds`:
    swap — a segment and the next one of its direction change places;
    hold back — a segment comes 2-40 packets of its direction later;
    hold back long — a segment comes 150-600 packets later (a loss, then its retransmission);
    repeat — a segment comes again 1-40 packets later (a retransmission of bytes already seen);
    split reversed — a segment is sent as two, the second half first.
    Returns the edited capture and how many edits of each kind were made."""
    records: list[Record | None] = list(capture.records)
    segments = tcp_segments(capture)
    by_flow: dict[tuple, list[Segment]] = {}
    for segment in segments:
        by_flow.setdefault(segment.flow, []).append(segment)
    busy_flows = [flow for flow, items in by_flow.items() if len(items) > 50]
    inserted_after: dict[int, list[Record]] = {}
    touched: set[int] = set()
    made = dict.fromkeys(kinds, 0)
    for _ in range(edits):
        kind = rng.choice(kinds)
        flow = by_flow[rng.choice(busy_flows)]
        position = rng.randrange(1, len(flow) - 1)
        segment = flow[position]
        if segment.index in touched:
            continue
        if kind == "swap":
            later = flow[position + 1]
            if later.index in touched:
                continue
            records[segment.index], records[later.index] = records[later.index], records[segment.index]
            touched |= {segment.index, later.index}
        elif kind in ("hold back", "hold back long", "repeat"):
            low, high = (150, 600) if kind == "hold back long" else (2, 40) if kind == "hold back" else (1, 40)
            target = flow[min(len(flow) - 1, position + rng.randint(low, high))].index
            inserted_after.setdefault(target, []).append(records[segment.index])
            if kind != "repeat":
                records[segment.index] = None
            touched.add(segment.index)
        else:
            if segment.payload_bytes < 2:
                continue
            first, second = split_segment(capture, segment, rng.randrange(1, segment.payload_bytes))
            records[segment.index] = second
            inserted_after.setdefault(segment.index, []).append(first)
            touched.add(segment.index)
        made[kind] += 1
    out = []
    for index, record in enumerate(records):
        if record is not None:
            out.append(record)
        out.extend(inserted_after.get(index, ()))
    return Capture(capture.linktype, out), made


def followed_in_order(capture: Capture) -> list[bool]:
    """Per record: a data segment of a flow seen from its SYN that came exactly where the flow's bytes stood,
    every byte before it seen and none after (no hole open, nothing early). The filter cuts such a packet
    as it would in a capture that was never reordered."""
    seen: dict[tuple, tuple[int, list[list[int]]]] = {}    # flow -> (first stream byte's seq, byte ranges seen)
    in_order = [False] * len(capture.records)
    link = LINK_HEADER_BYTES[capture.linktype]
    at = ETHERTYPE_AT[capture.linktype]
    for index, record in enumerate(capture.records):
        data = record.data
        if data[at:at + 2] != b"\x08\x00" or data[link + 9] != 6:
            continue
        tcp = link + (data[link] & 0x0F) * 4
        flow = (data[link + 12:link + 20], data[tcp:tcp + 4])
        seq = struct.unpack_from(">I", data, tcp + 4)[0]
        payload = link + struct.unpack_from(">H", data, link + 2)[0] - (tcp + (data[tcp + 12] >> 4) * 4)
        if data[tcp + 13] & 0x02:                     # SYN: the stream starts after it
            seen[flow] = ((seq + 1) & 0xFFFFFFFF, [])
            continue
        if flow not in seen or payload <= 0:
            continue
        base, ranges = seen[flow]
        start = (seq - base) & 0xFFFFFFFF
        end = start + payload
        in_order[index] = ranges == [[0, start]] or (start == 0 and not ranges)
        ranges.append([start, end])
        ranges.sort()
        merged = [ranges[0]]
        for low, high in ranges[1:]:
            if low <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], high)
            else:
                merged.append([low, high])
        seen[flow] = (base, merged)
    return in_order
