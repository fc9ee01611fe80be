"""The batch decoder (decoders.tcp_driver) against the per-packet decode: the same tables, always.

The per-packet decode (`decode_capture(batched=False)`) is the one the truth tests check against what
the real programs logged; the batch decoder must give exactly its results (every row, every column, in
the same order; parse statistics, warnings) on every bundled capture, and on real captures damaged,
re-framed and re-encoded at random (hypothesis): dropped, duplicated and reordered packets, snaplen cuts,
packets that are no TCP segments, every link type the vectorised reader handles and some it leaves to
parse_packet, IPv6, pcap and pcapng, and read buffers of any size (so streams cross batch boundaries).
"""
from __future__ import annotations

import json
import dataclasses
import functools
import gzip
import random
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlcsniff.decoders.inputs import capture_file as capture
from dlcsniff.decoders import tcp_driver
from dlcsniff.decoders.errors import CaptureError
from dlcsniff.decoders.inputs.capture_file import open_capture
from dlcsniff.decoders.packet import (LINKTYPE_ETHERNET, LINKTYPE_IPV4, LINKTYPE_LINUX_SLL, LINKTYPE_LINUX_SLL2,
                                      LINKTYPE_LOOP, LINKTYPE_NULL, LINKTYPE_RAW, ParseStats)
from dlcsniff.decoders.capture_decoder import decode_capture
from dlcsniff.decoders.job import FLOW_ID_CAPTURE_SHIFT, build_dataset, decode_paths
from dlcsniff.decoders.tcp import StreamData, StreamGap, TcpReassembler, TcpStream
from dlcsniff.decoders.protocols import protocol_decoders
from dlcsniff.decoders.protocols.base import UNLIMITED_SKIP_BYTES
from dlcsniff.decoders.protocols.gloo.decoder import GlooCaptureDecoder
from dlcsniff.decoders.protocols.zmtp.decoder import ZmtpDecoder
from tests.conftest import PCAPS, require_tool
from tests.support.nccl_gen import TcpCapture
from tests.support.zmtp_tap import Gap, command, drain, frame, greeting_v3, message, random_chunks

JOBS = sorted({str(p.parent.relative_to(PCAPS)) for p in PCAPS.rglob("*.pcap*")})    # every folder of captures
SOURCE = PCAPS / "mxnet_sync_large" / "worker0.pcap.gz"     # multi-segment tensors, SLL2 (tcpdump -i any)


def _decode(paths: list[Path], batched: bool, protocols=None) -> list:
    return [decode_capture(p, flow_id_base=i << FLOW_ID_CAPTURE_SHIFT, batched=batched,
                           protocols=protocols and protocols()) for i, p in enumerate(paths)]


def assert_batched_is_per_packet(paths: list[Path], protocols=None) -> list:
    """Decode both ways (with `protocols()`'s decoders, if given); every per-capture result and every table
    column must agree. Returns the results."""
    batched, per_packet = _decode(paths, True, protocols), _decode(paths, False, protocols)
    for ours, reference in zip(batched, per_packet):
        assert reference.bulk_packets == 0
        for name, value in vars(reference).items():
            if name != "bulk_packets":
                assert getattr(ours, name) == value, f"{ours.capture}: {name} differs"
    ours, reference = build_dataset(batched), build_dataset(per_packet)
    for name, table in reference.tables.items():
        assert ours.tables[name].schema == table.schema
        for column in table.column_names:
            assert ours.tables[name][column].equals(table[column]), f"{name}.{column} differs"
    assert ours.summary == reference.summary
    return batched


# -- every bundled capture ----------------------------------------------------------------------------------

@pytest.mark.parametrize("job", JOBS)
def test_bundled_captures_decode_identically_in_bulk(job):
    paths = sorted((PCAPS / job).glob("*.pcap*"))
    results = assert_batched_is_per_packet(paths)
    tcp_packets = sum(r.packets - r.non_tcp_packets for r in results)
    assert sum(len(r.tables["streams"]["flow_id"]) for r in results) > 0
    # bulk transfers: the common case is the bulk path (not so in a port scan and its hundreds of tiny flows)
    record = PCAPS / job / "job.json"  # the shared real captures have a README instead, and no noise
    noise = json.loads(record.read_text()).get("noise_s") if record.exists() else None
    if tcp_packets > 10_000 and not noise:
        assert sum(r.bulk_packets for r in results) > 0.9 * tcp_packets


@pytest.mark.parametrize("late_from", [2000, 5000])
def test_a_direction_offered_again_decodes_identically_in_bulk(tmp_path, late_from):
    """A Gloo capture started late (editcap -r), where a direction inside a large message is offered again
    once its reverse is claimed (decoders.capture_decoder): the bulk path shows its bytes from the same packet."""
    late = tmp_path / "rank1.pcap"
    with gzip.open(PCAPS / "gloo" / "rank1.pcap.gz") as source:
        (tmp_path / "whole.pcap").write_bytes(source.read())
    subprocess.run([require_tool("editcap"), "-r", str(tmp_path / "whole.pcap"), str(late), f"{late_from}-100000000"],
                   check=True)
    streams = assert_batched_is_per_packet([late])[0].tables["streams"]
    assert streams["protocol"].count("gloo") == 6


def test_a_direction_offered_again_on_a_fast_packet_shows_its_next_bytes_in_bulk(tmp_path):
    """A Gloo pair caught inside a 1 MB message: the reverse's first message comes in a segment the bulk path
    applies fast, and the direction offered again must be shown from its next segment, not skipped to the
    connection's next slow packet (here its FIN). With every decoder, ps-lite's weak claim holds the direction
    (and sees every byte) until it is offered again; with Gloo's alone, nobody does, and the bulk path skips
    what nobody reads."""
    def gloo_send(slot: int, payload: bytes) -> bytes:          # gloo/transport/tcp/pair.h: six native u64
        return struct.pack("<6Q", 48 + len(payload), 1, slot, 0, len(payload), 0) + payload

    rng = random.Random(3)
    cap = TcpCapture(mss=1448)
    conn = cap.connect(("198.18.0.1", 40000), ("198.18.0.2", 5000))
    cap.send(conn, struct.pack("<q", 0) + gloo_send(4 << 56, rng.randbytes(1 << 20)))
    caught = len(cap.frames) - 200                      # the capture starts 100 segments before the message ends
    cap.send(conn, gloo_send(4 << 56 | 1, rng.randbytes(20_000)), from_client=False)
    for step in range(5):
        cap.send(conn, gloo_send(4 << 56 | 2 + step, rng.randbytes(30_000)))
    cap.close(conn)
    path = cap.write(tmp_path / "caught.pcap", drop=set(range(caught)))
    for protocols in (None, lambda: [GlooCaptureDecoder()]):
        result = assert_batched_is_per_packet([path], protocols)[0]
        assert result.tables["streams"]["protocol"] == ["gloo", "gloo"]
        assert result.tables["messages"]["size_bytes"].count(48 + 30_000) == 5


def test_workers_give_the_in_process_dataset_and_its_progress(tmp_path):
    job = PCAPS / "mxnet_sync"
    totals, steps = [], []

    def progress_total(total: int):
        totals.append(total)
        return steps.append

    forked = decode_paths([job], workers=2, progress_total=progress_total)
    in_process = decode_paths([job], workers=0)
    for name, table in in_process.tables.items():
        assert forked.tables[name].equals(table), name
    assert forked.summary == in_process.summary
    assert totals == [sum(p.stat().st_size for p in job.glob("*.pcap*"))] == [sum(steps)]


def test_a_worker_failure_is_the_capture_error_of_its_file(tmp_path):
    bad = tmp_path / "broken.pcap"
    bad.write_bytes(b"this is not a capture at all")
    with pytest.raises(CaptureError, match="broken.pcap: not a pcap or pcapng file"):
        decode_paths([PCAPS / "mxnet_sync" / "worker0.pcap.gz", bad], workers=2)


# -- damaged and re-encoded real captures --------------------------------------------------------------------

@functools.cache
def _source_records() -> tuple[tuple[int, bytes], ...]:
    with open_capture(SOURCE) as reader:
        assert reader.interfaces[0].linktype == LINKTYPE_LINUX_SLL2
        return tuple((p.ts_ns, bytes(p.data)) for p in reader)


_MAC = bytes.fromhex("020000000001020000000002")


def _ipv6_of(ip: bytes) -> bytes:
    """The IPv4 packet's TCP segment in an IPv6 packet, 2001:db8::<v4 address> on both ends."""
    header_len, total_len = (ip[0] & 0x0F) * 4, struct.unpack_from("!H", ip, 2)[0]
    prefix = bytes.fromhex("20010db8") + bytes(8)
    return (struct.pack("!IHBB", 0x6 << 28, total_len - header_len, ip[9], 64) + prefix + ip[12:16]
            + prefix + ip[16:20] + ip[header_len:])


def _reframe(data: bytes, link: str) -> tuple[int, bytes] | None:
    """An SLL2 packet with another link header (None: the link type cannot carry it)."""
    ethertype, payload = struct.unpack_from("!H", data)[0], data[20:]
    if link == "sll2":
        return LINKTYPE_LINUX_SLL2, data
    if link == "ipv6" and ethertype == 0x0800:
        ethertype, payload = 0x86DD, _ipv6_of(payload)
    if link in ("ethernet", "ipv6"):
        return LINKTYPE_ETHERNET, _MAC + struct.pack("!H", ethertype) + payload
    if link == "vlan":
        return LINKTYPE_ETHERNET, _MAC + struct.pack("!HHH", 0x8100, 7, ethertype) + payload
    if link == "sll":
        return LINKTYPE_LINUX_SLL, struct.pack("!HHH8sH", 0, 1, 6, _MAC[:8], ethertype) + payload
    if ethertype != 0x0800:
        return None
    if link in ("null_le", "null_be", "loop"):
        family = struct.pack("<I" if link == "null_le" else ">I", 2)
        return (LINKTYPE_LOOP if link == "loop" else LINKTYPE_NULL), family + payload
    return {"raw": LINKTYPE_RAW, "ipv4": LINKTYPE_IPV4}[link], payload


def _not_tcp(rng: random.Random) -> bytes:
    """An SLL2 packet that is no TCP segment: ARP, a UDP datagram, or ICMP."""
    kind = rng.choice(["arp", "udp", "icmp"])
    if kind == "arp":
        return struct.pack("!H18x", 0x0806) + bytes(28)
    body = bytes(8 + rng.randrange(64))
    protocol = 17 if kind == "udp" else 1
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(body), 0, 0, 64, protocol, 0, b"\xc6\x12\x00\x01",
                     b"\xc6\x12\x00\x02")
    return struct.pack("!H18x", 0x0800) + ip + body


def _pcap(records: list[tuple[int, int, bytes, int]], linktype: int, nanoseconds: bool) -> bytes:
    out = [struct.pack("<IHHiIII", 0xA1B23C4D if nanoseconds else 0xA1B2C3D4, 2, 4, 0, 0, 262144, linktype)]
    for ts_ns, _, data, orig_len in records:
        frac = ts_ns % 10**9 if nanoseconds else ts_ns % 10**9 // 1000
        out.append(struct.pack("<IIII", ts_ns // 10**9, frac, len(data), orig_len) + data)
    return b"".join(out)


def _block(block_type: int, body: bytes) -> bytes:
    body += bytes(-len(body) % 4)
    return struct.pack("<II", block_type, 12 + len(body)) + body + struct.pack("<I", 12 + len(body))


def _pcapng(records: list[tuple[int, int, bytes, int]], tsresol: int) -> bytes:
    """One section; an interface per link type (in order of first use), with if_tsresol."""
    interfaces: dict[int, int] = {}
    blocks = [_block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))]
    for ts_ns, linktype, data, orig_len in records:
        if linktype not in interfaces:
            interfaces[linktype] = len(interfaces)
            option = struct.pack("<HHB3x", 9, 1, tsresol) + struct.pack("<HH", 0, 0)
            blocks.append(_block(1, struct.pack("<HHI", linktype, 0, 0) + option))
        units = ts_ns * 2**(tsresol & 0x7F) // 10**9 if tsresol & 0x80 else ts_ns // 10**(9 - tsresol)
        blocks.append(_block(6, struct.pack("<IIIII", interfaces[linktype], units >> 32, units & 0xFFFFFFFF,
                                            len(data), orig_len) + data))
    return b"".join(blocks)


DAMAGE = st.fixed_dictionaries({
    "start": st.one_of(st.just(0), st.integers(0, 50_000)),   # 0: from the connections' set-up
    "length": st.integers(300, 2500),
    "link": st.sampled_from(["sll2", "ethernet", "vlan", "sll", "null_le", "null_be", "loop", "raw", "ipv4",
                             "ipv6", "mixed"]),
    "format": st.sampled_from(["pcap_us", "pcap_ns", "pcapng_ns", "pcapng_us", "pcapng_binary"]),
    "drop": st.sampled_from([0.0, 0.002, 0.03]),
    "duplicate": st.sampled_from([0.0, 0.01, 0.05]),
    "reorder": st.sampled_from([0, 2, 6]),
    "snaplen": st.sampled_from([None, None, 96, 700, 1200]),   # 1200: mostly inside value bodies
    "not_tcp": st.sampled_from([0.0, 0.02]),
    "cut_tail": st.booleans(),
    "chunk_bytes": st.sampled_from([1 << 12, 1 << 16, 4 << 20]),
    "min_bulk_share": st.sampled_from([0.0, tcp_driver._MIN_BULK_SHARE]),
    "seed": st.integers(0, 2**16),
})


@given(damage=DAMAGE)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_damaged_reencoded_real_captures_decode_identically_in_bulk(tmp_path, monkeypatch, damage):
    rng = random.Random(damage["seed"])
    source = _source_records()
    picked = list(source[damage["start"]:damage["start"] + damage["length"]])
    damaged: list[tuple[int, bytes]] = []
    for ts_ns, data in picked:
        if rng.random() < damage["not_tcp"]:
            damaged.append((ts_ns, _not_tcp(rng)))
        if rng.random() >= damage["drop"]:
            damaged.append((ts_ns, data))
            if rng.random() < damage["duplicate"]:
                damaged.append((ts_ns + 1000, data))
    if damage["reorder"]:
        window = damage["reorder"]
        for at in range(0, len(damaged) - window, window):
            part = damaged[at:at + window]
            rng.shuffle(part)
            damaged[at:at + window] = part
    records = []
    for i, (ts_ns, data) in enumerate(damaged):
        link = damage["link"] if damage["link"] != "mixed" else ("sll2", "ethernet", "ipv6")[i % 3]
        reframed = _reframe(data, link)
        if reframed is not None:
            linktype, packet = reframed
            captured = packet if damage["snaplen"] is None else packet[:damage["snaplen"]]
            records.append((ts_ns, linktype, captured, len(packet)))
    fmt = damage["format"]
    if fmt.startswith("pcap_"):
        if len({linktype for _, linktype, _, _ in records}) > 1:
            fmt = "pcapng_ns"                  # pcap has one link type per file
        else:
            blob = _pcap(records, records[0][1] if records else LINKTYPE_LINUX_SLL2, fmt == "pcap_ns")
    if fmt.startswith("pcapng"):
        blob = _pcapng(records, {"pcapng_ns": 9, "pcapng_us": 6, "pcapng_binary": 0x80 | 30}[fmt])
    if damage["cut_tail"] and records:
        blob = blob[:len(blob) - rng.randrange(1, len(records[-1][2]) + 8)]
    path = tmp_path / "damaged.cap"
    path.write_bytes(blob)
    monkeypatch.setattr(capture, "CHUNK_BYTES", damage["chunk_bytes"])
    monkeypatch.setattr(tcp_driver, "_MIN_BULK_SHARE", damage["min_bulk_share"])
    assert_batched_is_per_packet([path])


def test_link_types_left_to_parse_packet_are_counted_like_it_counts_them(tmp_path):
    """VLAN-tagged Ethernet is parse_packet's: the same segments, through the per-packet path."""
    records = []
    for ts_ns, data in _source_records()[:400]:
        linktype, packet = _reframe(data, "vlan")
        records.append((ts_ns, linktype, packet, len(packet)))
    path = tmp_path / "vlan.pcap"
    path.write_bytes(_pcap(records, LINKTYPE_ETHERNET, True))
    (result,) = assert_batched_is_per_packet([path])
    assert result.bulk_packets == 0 and sum(result.tables["streams"]["bytes"]) > 0


# -- TCP state after every batch ------------------------------------------------------------------------------

class _Recorder:
    """A consumer that sees every byte (skips nothing), or none (skips everything)."""

    def __init__(self, skips: bool):
        self.skips = skips
        self.events = []

    def on_tcp_event(self, event) -> None:
        if isinstance(event, StreamData):
            event = dataclasses.replace(event, data=bytes(event.data))
        self.events.append(event)

    def skippable_bytes(self, stream_id: int) -> int:
        return UNLIMITED_SKIP_BYTES if self.skips else 0

    def skip_bytes(self, stream_id: int, size: int, ts_ns: int, cut: int) -> None:
        self.events.append(("skipped", stream_id, size, ts_ns, cut))

    def on_other_packet(self, linktype: int, data, ts_ns: int) -> None:
        pass    # compared in tests/decoders/test_capture_decoder.py: RoCE and NCCL tables of both paths are equal


def _stream_state(tcp: TcpReassembler) -> list[dict]:
    return [{name: getattr(s, name) for name in TcpStream.__slots__} for s in tcp.streams]


@functools.cache
def _reordered_capture(directory: Path) -> Path:
    """The source capture with packets shuffled within windows of 4 (acknowledgements then often come
    before the data they acknowledge) and one in 200 dropped."""
    rng = random.Random(5)
    records = [r for r in _source_records() if rng.random() >= 0.005]
    for at in range(0, len(records) - 4, 4):
        part = records[at:at + 4]
        rng.shuffle(part)
        records[at:at + 4] = part
    path = directory / "reordered.pcap"
    path.write_bytes(_pcap([(ts, LINKTYPE_LINUX_SLL2, data, len(data)) for ts, data in records],
                           LINKTYPE_LINUX_SLL2, True))
    return path


@functools.cache
def _dropped_capture(directory: Path) -> Path:
    """The source capture with 5 % of its data segments left out, as an editing tool drops them: a hole every
    twenty segments or so, each given up only once acknowledged and the reorder window has passed (or the
    per-stream bound is reached), so the stream is buffered past holes most of the time."""
    from tests.support.gloo_matrix import drop_segments

    path = directory / "dropped.pcap"
    drop_segments(SOURCE, path, 0.05, seed=22)
    return path


@functools.cache
def _cut_capture(directory: Path) -> Path:
    """The source capture with every packet cut to 1200 bytes, as a snaplen does: most segments lose the
    tail of their payload, which stays on the wire (uncaptured, not lost)."""
    path = directory / "cut.pcap"
    path.write_bytes(_pcap([(ts, LINKTYPE_LINUX_SLL2, data[:1200], len(data)) for ts, data in _source_records()],
                           LINKTYPE_LINUX_SLL2, True))
    return path


@pytest.mark.parametrize("acks_in_numpy", [True, False])
@pytest.mark.parametrize("skips", [False, True])
@pytest.mark.parametrize("variant", ["whole", "reordered", "cut", "dropped"])
def test_streams_after_each_batch_are_those_of_the_per_packet_decode(monkeypatch, tmp_path_factory, acks_in_numpy,
                                                                     skips, variant):
    """Every TcpStream field (acknowledgement state of the reorder window included) equals the per-packet
    one after every batch; a consumer that sees every byte gets exactly the per-packet events."""
    monkeypatch.setattr(tcp_driver, "_VECTOR_ACKS_FROM", 0 if acks_in_numpy else 1 << 30)
    monkeypatch.setattr(tcp_driver, "_MIN_BULK_SHARE", 0.0)      # bulk for every batch, however damaged
    monkeypatch.setattr(capture, "CHUNK_BYTES", 1 << 20)
    stats = ParseStats(), ParseStats()
    batched, reference = TcpReassembler(), TcpReassembler()
    ours, theirs = _Recorder(skips), _Recorder(False)
    decoder = tcp_driver.BatchDecoder(batched, ours, stats[0])
    path = {"whole": lambda: SOURCE, "reordered": lambda: _reordered_capture(tmp_path_factory.getbasetemp()),
            "cut": lambda: _cut_capture(tmp_path_factory.getbasetemp()),
            "dropped": lambda: _dropped_capture(tmp_path_factory.getbasetemp())}[variant]()
    with open_capture(path) as reader:
        for batch in reader.batches():
            decoder.feed(batch)
            for packet in batch.packets():
                tcp_driver.feed_packet(reference, theirs, packet.linktype, packet.data, packet.ts_ns, stats[1])
            assert _stream_state(batched) == _stream_state(reference)
    # buffering past holes (dropped) is done in bulk as well: only the packets that give a hole up, start one
    # from a clean state, or repeat bytes take the per-packet path
    assert decoder.bulk_packets > (0.04 if variant == "reordered" else 0.9) * reader.packets
    assert any(s.acked_offset > 0 for s in batched.streams)
    if skips:
        # What a consumer may skip unseen: captured bytes, and bytes the snaplen cut (uncaptured, not lost).
        def unseen(event) -> bool:
            return isinstance(event, (StreamData, tuple)) or isinstance(event, StreamGap) and not event.lost

        assert [e for e in ours.events if not unseen(e)] == [e for e in theirs.events if not unseen(e)]
    else:
        assert ours.events == theirs.events
    assert stats[0] == stats[1]


def _segment(src: int, dst: int, seq: int, ack: int, flags: int, payload: bytes = b"") -> bytes:
    """An SLL2 + IPv4 + TCP packet between 198.18.0.<src>:<40000+src> and 198.18.0.<dst>:<40000+dst>."""
    tcp = struct.pack("!HHIIBBHHH", 40000 + src, 40000 + dst, seq, ack, 5 << 4, flags, 65535, 0, 0) + payload
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0, bytes([198, 18, 0, src]),
                     bytes([198, 18, 0, dst]))
    return struct.pack("!H18x", 0x0800) + ip + tcp


@pytest.mark.parametrize("acks_in_numpy", [True, False])
def test_acknowledgements_ahead_of_the_data_they_acknowledge(tmp_path, monkeypatch, acks_in_numpy):
    """Rises of the acknowledged offset while it is already past the delivered data (the capture saw the
    acknowledgements first) do not restart the reorder window: the same state as feed() leaves."""
    monkeypatch.setattr(tcp_driver, "_VECTOR_ACKS_FROM", 0 if acks_in_numpy else 1 << 30)
    syn, ack_flag, psh = 0x02, 0x10, 0x08
    packets = [_segment(1, 2, 999, 0, syn), _segment(2, 1, 4999, 1000, syn | ack_flag),
               _segment(1, 2, 1000, 5000, ack_flag)]
    data = [_segment(1, 2, 1000 + 100 * k, 5000, ack_flag | psh, bytes([k]) * 100) for k in range(40)]
    # data[k] in capture order, "a<n>": B's acknowledgement of n segments. The last rises (a20, a25) come
    # while more than the delivered data is acknowledged already: the reorder window runs from a15.
    order = [0, 1, 2, 3, "a4", "a6", "a9", 4, 5, 6, "a10", 7, 8, 9, 10, "a11", "a15", 11, 12, "a20", "a25", 13]
    for item in order:
        packets.append(data[item] if isinstance(item, int)
                       else _segment(2, 1, 5000, 1000 + 100 * int(item[1:]), ack_flag))
    records = [(1_700_000_000_000_000_000 + k * 1_000_000, LINKTYPE_LINUX_SLL2, p, len(p))
               for k, p in enumerate(packets)]
    path = tmp_path / "acks_ahead.pcap"
    path.write_bytes(_pcap(records, LINKTYPE_LINUX_SLL2, True))
    streams = []
    for batched in (True, False):
        tcp = TcpReassembler()
        decoder = tcp_driver.BatchDecoder(tcp, _Recorder(False), ParseStats())
        with open_capture(path) as reader:
            for item in reader.batches() if batched else reader:
                decoder.feed(item)
        streams.append(_stream_state(tcp))
        assert decoder.bulk_packets == (len(packets) - 2 if batched else 0)     # all but the SYNs
    assert streams[0] == streams[1]
    assert streams[1][0]["_acked_offset"] == 2500 and streams[1][0]["_acked_ts_ns"] == records[3 + 16][0]


# -- Gloo's arithmetic skip ---------------------------------------------------------------------------------

class _CountingSkips:
    """Gloo's capture decoder, counting the payload bytes the driver let it account for unseen."""

    def __init__(self):
        self.decoder = GlooCaptureDecoder()
        self.skipped = self.cut = 0

    def __getattr__(self, name):
        return getattr(self.decoder, name)

    def skip(self, stream_id: int, size: int, ts_ns: int, cut: int) -> None:
        self.skipped += size
        self.cut += cut
        self.decoder.skip(stream_id, size, ts_ns, cut)


@pytest.mark.parametrize("snaplen", [None, 200, 700])
def test_gloo_payload_skipped_in_bulk_decodes_as_seen(tmp_path, snaplen):
    """The bundled Gloo job's rank 0 (allreduce payload in full-size segments), whole and cut by a snaplen (the
    cut payload counts as missing, as the per-packet path's StreamGap(lost=False) makes it): in bulk, most of the
    payload is skipped unseen, and every table is that of the per-packet decode."""
    with open_capture(PCAPS / "gloo" / "rank0.pcap.gz") as reader:
        linktype = reader.interfaces[0].linktype
        records = [(p.ts_ns, linktype, bytes(p.data)[:snaplen], len(p.data)) for p in reader]
    path = tmp_path / "rank0.pcap"
    path.write_bytes(_pcap(records, linktype, True))
    counting = []

    def protocols():
        decoders = protocol_decoders()
        counting.append(_CountingSkips())
        return [counting[-1] if isinstance(d, GlooCaptureDecoder) else d for d in decoders]

    results = assert_batched_is_per_packet([path], protocols)
    in_bulk = counting[0]
    payload = sum(size or 0 for size in results[0].tables["messages"]["payload_bytes"])
    assert in_bulk.skipped > payload // 2
    assert (in_bulk.cut > 0) == (snaplen is not None)


# -- the ZMTP decoder's arithmetic skip --------------------------------------------------------------------

def _zmtp_stream(rng: random.Random) -> bytes:
    parts = [greeting_v3(), command(b"READY", b"\x0bSocket-Type\x00\x00\x00\x06DEALER")]
    for _ in range(30):
        sizes = [rng.choice([0, 3, 200, 5000, 70_000]) for _ in range(rng.randint(1, 4))]
        parts.append(message(*(rng.randbytes(size) for size in sizes)))
        if rng.random() < 0.2:
            parts.append(command(b"PING", b"\x00\x10"))
    return b"".join(parts)


@pytest.mark.parametrize("seed", range(8))
def test_zmtp_skip_is_receive_data_unseen(seed):
    """Chunks within skippable_bytes skipped instead of received: the same events (timestamps and kept
    bodies included) and the same counters; only never-kept payload is skipped."""
    rng = random.Random(seed)
    stream = _zmtp_stream(rng)
    cut = rng.randrange(len(stream) // 2)
    pieces = random_chunks(stream[:cut], seed, 3000) + [Gap(rng.randrange(1, 9000), 7)] \
        + random_chunks(stream[cut:], seed + 1, 3000)
    keep = dict(keep_body=lambda index, size: size < 4096)
    received, skipping = ZmtpDecoder(**keep), ZmtpDecoder(**keep)
    events_received, events_skipping, skipped = [], [], 0
    for piece in pieces:
        if isinstance(piece, Gap):
            for decoder in (received, skipping):
                decoder.receive_gap(piece.size, piece.ts_ns)
        else:
            data, ts_ns = piece
            received.receive_data(data, ts_ns)
            if len(data) <= skipping.skippable_bytes():
                skipping.skip(len(data), ts_ns)
                skipped += len(data)
            else:
                skipping.receive_data(data, ts_ns)
        events_received += drain(received)
        events_skipping += drain(skipping)
    for decoder, events in ((received, events_received), (skipping, events_skipping)):
        decoder.receive_end(0)
        events += drain(decoder)
    assert skipped > len(stream) // 4
    assert [dataclasses.replace(e, frames=tuple(None if f is None else bytes(f) for f in e.frames))
            if hasattr(e, "frames") else e for e in events_skipping] == \
           [dataclasses.replace(e, frames=tuple(None if f is None else bytes(f) for f in e.frames))
            if hasattr(e, "frames") else e for e in events_received]
    counters = ("version", "messages", "commands", "frames", "lost_bytes", "resyncs", "socket_type")
    assert [getattr(skipping, c) for c in counters] == [getattr(received, c) for c in counters]


def test_zmtp_skip_inside_a_kept_body_or_a_header_is_never_offered():
    decoder = ZmtpDecoder(keep_body=lambda index, size: index == 0)
    decoder.receive_data(greeting_v3() + frame(b"m" * 300, more=True) + frame(b"v" * 9000)[:100], 1)
    drain(decoder)
    assert decoder.skippable_bytes() == 9000 - (100 - 9) - 1     # the value frame's rest but its last byte
    decoder.receive_data(frame(b"x" * 9000)[100:], 2)
    drain(decoder)
    assert decoder.skippable_bytes() == 0                          # at a frame header
    decoder.receive_data(frame(b"k" * 50, more=True)[:10], 3)
    drain(decoder)
    assert decoder.skippable_bytes() == 0                          # inside a kept body
