"""RoCE / NCCL-IB decoding on generated captures (no RDMA stack here: see tests/support/roce_gen.py).

The captures come from a simulation written from the protocol description, built with scapy's RoCE layer
(whose RoCEv2 ICRC is scapy's own); every field the decoder reads is also read back by tshark's InfiniBand
dissector and compared. The expected messages and counters are what the simulation did, not what the
decoder computes.
"""
from __future__ import annotations

import random
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.contrib.roce import BTH
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import PcapWriter

from dlcsniff.decoders.inputs.capture_file import Packet, open_capture
from dlcsniff.decoders.protocols.nccl_socket.decoder import NcclSocketCaptureDecoder
from dlcsniff.decoders.protocols.roce.decoder import RoceCaptureDecoder, compute_icrc, parse_roce
from dlcsniff.decoders.protocols.roce.nccl_ib import parse_cts
from tests.conftest import require_tool
from tests.support.protocol_driver import rows_of, run_decoder, run_decoders
from tests.support.roce_gen import COUNTERS, CTS_LAYOUTS, NETWORKS, QP_A_SEND, QP_B_RECV, RETH, cts_entries, roce_capture

MESSAGE_FIELDS = ("rdma_op", "size_bytes", "complete", "imm", "va", "rkey", "nccl_role", "nccl_tag", "nccl_fifo_idx",
                  "nccl_bytes", "nccl_sizes_bytes")
# Explicit addresses: scapy would otherwise resolve the destination MAC (ARP) while building a frame.
_ETHER = Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
STREAM_FIELDS = COUNTERS + ("src_rank", "dst_rank", "nccl_direction")


def _check_against_truth(rows, truth) -> None:
    got = {(m["src_ip"], m["dst_ip"], m["dest_qp"], m["psn"]): m for m in rows.messages}
    assert len(got) == len(rows.messages) == len(truth.messages)
    for want in truth.messages:
        row = got[(want.src, want.dst, want.dest_qp, want.psn)]
        assert {f: row[f] for f in MESSAGE_FIELDS} == {f: getattr(want, f) for f in MESSAGE_FIELDS}, want
    streams = {(s["src_ip"], s["dst_ip"], s["dest_qp"]): s for s in rows.extra_streams}
    assert streams.keys() == truth.streams.keys()
    for key, want in truth.streams.items():
        assert {f: streams[key][f] for f in STREAM_FIELDS} == {f: getattr(want, f) for f in STREAM_FIELDS}, key
    for row in rows.messages:
        assert rows.extra_streams[row["extra_stream"]]["dest_qp"] == row["dest_qp"]


@pytest.fixture(scope="module")
def captures(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("roce")
    return {(network, layout): roce_capture(out / f"{network}-{layout}.pcap", network=network, layout=layout)
            for network in NETWORKS for layout in CTS_LAYOUTS}


@pytest.mark.parametrize("layout", CTS_LAYOUTS)
@pytest.mark.parametrize("network", NETWORKS)
def test_every_message_cts_and_counter_found(captures, network, layout):
    truth = captures[(network, layout)]
    rows, keys = run_decoder(truth.path, RoceCaptureDecoder())
    _check_against_truth(rows, truth)
    # the NCCL IB set-up connection is claimed (both directions) and named
    setup = [sid for sid, key in keys.items() if key in (truth.setup_connector, truth.setup_connector[2:] +
                                                         truth.setup_connector[:2])]
    assert len(setup) == 2 and all(rows.streams[sid]["protocol"] == "nccl_ib_setup" for sid in setup)
    connector = next(sid for sid in setup if keys[sid] == truth.setup_connector)
    tied = {s["dest_qp"] for s in rows.extra_streams if s["nccl_setup_stream_id"] == connector}
    assert tied == {QP_A_SEND, QP_B_RECV}                # connection 2 had no set-up in the capture
    assert all(s["nccl_setup_stream_id"] is None for s in rows.extra_streams if s["dest_qp"] not in tied)


def test_the_simulation_covers_what_the_issue_asks_for(captures):
    """Guard against a generator that silently stopped producing the hard cases."""
    truth = captures[("ipv4", "2.30")]
    totals = {c: sum(getattr(s, c) for s in truth.streams.values()) for c in COUNTERS}
    assert all(totals[c] >= 2 for c in ("bad_icrc", "cnp", "retransmitted_packets", "naks", "lost_packets")), totals
    roles = [m.nccl_role for m in truth.messages]
    assert roles.count("cts") >= 15 and roles.count("data") >= 18
    assert {m.rdma_op for m in truth.messages} == {"SEND", "SEND_IMM", "WRITE", "WRITE_IMM", "READ"}
    assert any(not m.complete for m in truth.messages if m.rdma_op == "READ")
    assert any(m.nccl_sizes_bytes and m.nccl_role == "data" for m in truth.messages)


def _tshark_rows(path: Path) -> dict[int, list[str]]:
    fields = ["frame.number", "infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn",
              "infiniband.bth.padcnt", "infiniband.reth.va", "infiniband.reth.r_key", "infiniband.reth.dmalen",
              "infiniband.aeth.syndrome", "infiniband.aeth.msn", "infiniband.immdt", "infiniband.invariant.crc"]
    out = subprocess.run([require_tool("tshark"), "-r", str(path), "-Y", "infiniband", "-T", "fields",
                          "-E", "separator=;", *[a for f in fields for a in ("-e", f)]],
                         capture_output=True, text=True, check=True).stdout
    return {int(line.split(";")[0]): line.split(";")[1:] for line in out.splitlines()}


@pytest.mark.parametrize("network", NETWORKS)
def test_tshark_reads_the_same_field_values(captures, network):
    truth = captures[(network, "2.26")]
    shark = _tshark_rows(truth.path)
    decoded = 0
    with open_capture(truth.path) as reader:
        for number, packet in enumerate(reader, 1):
            pkt = parse_roce(packet.linktype, packet.data, packet.ts_ns)
            if pkt is None:
                assert number not in shark
                continue
            decoded += 1
            opcode, qp, psn, pad, va, rkey, length, syndrome, msn, imm, icrc = shark[number]
            assert (int(opcode), int(qp, 16), int(psn)) == (pkt.opcode.code, pkt.dest_qp, pkt.psn)
            if pkt.reth is not None:
                assert (int(va, 16), int(rkey, 16), int(length)) == pkt.reth
            assert (int(syndrome) if syndrome else None) == pkt.syndrome
            assert (int(imm.split(",")[0], 16) if imm else None) == pkt.imm
            if pkt.opcode.name != "CNP":        # tshark 4.0 leaves the CNP's ICRC undissected
                assert int(icrc, 16) == int.from_bytes(pkt.icrc.to_bytes(4, "little"), "big")
                assert int(pad) == (-pkt.payload_bytes) % 4     # the payload length leaves the pad out
    assert decoded == len(shark) > 400


def test_icrc_agrees_with_scapy_and_ignores_only_the_masked_fields():
    rng = random.Random(5)
    for _ in range(40):
        v6 = rng.random() < 0.5
        net = (IPv6(src="fd00::1", dst="fd00::2", tc=rng.randrange(256), fl=rng.randrange(1 << 20),
                    hlim=rng.randrange(1, 256)) if v6 else
               IP(src="198.18.0.1", dst="198.18.0.2", tos=rng.randrange(256), ttl=rng.randrange(1, 256)))
        bth = BTH(opcode=0x0A, dqpn=rng.randrange(1 << 24), psn=rng.randrange(1 << 24), fecn=rng.randrange(2),
                  becn=rng.randrange(2), padcount=0)
        frame = bytearray(bytes(_ETHER / net / UDP(sport=49152, dport=4791)
                                / bth / RETH(va=rng.getrandbits(64), rkey=7, dlen=64) / Raw(rng.randbytes(64))))
        network_at = 14
        bth_at = network_at + (40 if v6 else 20) + 8
        stored = struct.unpack_from("<I", frame, len(frame) - 4)[0]
        assert compute_icrc(frame, network_at, bth_at, len(frame)) == stored
        masked = network_at + (7 if v6 else 8)           # hop limit / TTL: routers change it
        frame[masked] ^= 0x55
        assert compute_icrc(frame, network_at, bth_at, len(frame)) == stored
        frame[len(frame) - 10] ^= 0x01                    # a payload bit
        assert compute_icrc(frame, network_at, bth_at, len(frame)) != stored


@pytest.mark.parametrize("network", ("ipv4", "grh"))
def test_vlan_tags_and_ethernet_trailers_change_nothing(tmp_path, network):
    """802.1Q-tagged frames (RoCE runs on a PFC priority) longer than their packet (Ethernet padding /
    FCS): lengths come from the headers, not from the frame."""
    truth = roce_capture(tmp_path / "trailer.pcap", network=network, layout="2.30", trailer=b"\xde\xad\xbe\xef",
                         vlan=42)
    _check_against_truth(run_decoder(truth.path, RoceCaptureDecoder())[0], truth)
    assert len(_tshark_rows(truth.path)) == sum(s.packets for s in truth.streams.values())   # tshark sees them all


class _ByteByByte(RoceCaptureDecoder):
    def receive_data(self, stream_id, data, ts_ns):
        for i in range(len(data)):
            super().receive_data(stream_id, data[i:i + 1], ts_ns)


def test_setup_connection_fed_byte_by_byte_or_whole_gives_the_same_rows(captures):
    truth = captures[("ipv6", "2.30")]
    whole = run_decoder(truth.path, RoceCaptureDecoder())[0]
    one_by_one = run_decoder(truth.path, _ByteByByte())[0]
    assert whole == one_by_one
    _check_against_truth(one_by_one, truth)


def test_truncated_capture_decodes_headers_and_counts_unchecked_icrcs(tmp_path, captures):
    """snaplen 96: payloads and ICRCs are cut off; sizes still come from the headers (RETH, UDP length)."""
    truth = captures[("ipv4", "2.30")]
    cut = tmp_path / "cut.pcap"
    subprocess.run([require_tool("editcap"), "-s", "96", str(truth.path), str(cut)], check=True, capture_output=True)
    rows = run_decoder(cut, RoceCaptureDecoder())[0]
    sizes = {(m["dst_ip"], m["dest_qp"], m["psn"]): (m["rdma_op"], m["size_bytes"]) for m in rows.messages}
    for want in truth.messages:
        if want.complete and (want.nccl_role != "cts"):
            assert sizes[(want.dst, want.dest_qp, want.psn)] == (want.rdma_op, want.size_bytes)
    assert not any(m["nccl_role"] == "cts" for m in rows.messages)      # the CTS contents were cut off
    assert sum(s["icrc_unchecked"] for s in rows.extra_streams) > 300
    assert sum(s["bad_icrc"] for s in rows.extra_streams) == 0


def test_frames_that_are_not_roce_or_are_broken_are_left_alone(tmp_path):
    path = tmp_path / "junk.pcap"
    good = _ETHER / IP(src="198.18.0.1", dst="198.18.0.2") / UDP(sport=5, dport=4791) / BTH(opcode=0x04, dqpn=9) \
        / Raw(b"hello!!!")
    ip = IP(src="198.18.0.1", dst="198.18.0.2")
    frames = [bytes(_ETHER / ip / UDP(dport=53) / Raw(bytes(30))),                      # DNS-ish
              bytes(good)[:14 + 20 + 8 + 5],                                            # BTH cut short
              bytes(_ETHER / ip / UDP(dport=4791) / Raw(b"\x1f" + bytes(15))),          # unknown opcode 0x1f
              bytes(_ETHER / ip / UDP(dport=4791) / Raw(bytes([0x0A]) + bytes(13))),     # RETH missing
              bytes(good)]
    writer = PcapWriter(str(path), linktype=1)
    writer.write_header(None)
    for i, frame in enumerate(frames):
        writer.write_packet(frame, sec=1_700_000_000, usec=i)
    writer.close()
    rows = run_decoder(path, RoceCaptureDecoder())[0]
    assert [(m["rdma_op"], m["size_bytes"], m["complete"]) for m in rows.messages] == [("SEND", 8, True)]
    assert [(s["packets"], s["bad_icrc"]) for s in rows.extra_streams] == [(1, 0)]


@pytest.mark.parametrize("layout", CTS_LAYOUTS)
def test_cts_layouts_are_told_apart(layout):
    entries = [{"addr": 0x7F00_0000_1000 * (r + 1), "size": 4096 + r, "rkeys": [0x1234 + r, 0x99], "nreqs": 3,
                "tag": 5, "idx": 77} for r in range(3)]
    decoded = parse_cts(cts_entries(layout, entries))
    assert [(e.addr, e.size, e.rkeys[0], e.nreqs, e.tag, e.idx) for e in decoded] == \
        [(e["addr"], e["size"], e["rkeys"][0], 3, 5, 77) for e in entries]
    rng = random.Random(layout)
    assert all(parse_cts(rng.randbytes(n)) is None for n in (32, 64, 128, 512) for _ in range(50))


def test_socket_decoder_leaves_the_ib_setup_connection_to_the_roce_decoder(captures):
    truth = captures[("ipv4", "2.30")]
    (sockets, roce), _ = run_decoders(truth.path, [NcclSocketCaptureDecoder(), RoceCaptureDecoder()])
    assert sockets.streams == {} and sockets.messages == []
    _check_against_truth(roce, truth)



@pytest.fixture(scope="module")
def frames(captures) -> list[tuple[int, bytes]]:
    with open_capture(captures[("ipv4", "2.30")].path) as reader:
        ipv4 = [(p.linktype, bytes(p.data)) for p in reader]
    with open_capture(captures[("grh", "2.21")].path) as reader:
        return ipv4 + [(p.linktype, bytes(p.data)) for p in reader]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_fuzz_mutated_frames_never_raise(frames, data):
    """Mutated and cut RoCE frames (and the set-up stream's packets) go through the decoder without an
    exception; what it cannot read it leaves alone."""
    decoder = RoceCaptureDecoder()
    for _ in range(data.draw(st.integers(1, 30))):
        linktype, frame = frames[data.draw(st.integers(0, len(frames) - 1))]
        frame = bytearray(frame[:data.draw(st.integers(0, len(frame)))])
        for pos, value in data.draw(st.lists(st.tuples(st.integers(0, 2000), st.integers(0, 255)), max_size=6)):
            if frame:
                frame[pos % len(frame)] = value
        decoder.receive_packet(Packet(1_700_000_000_000_000_000, linktype, bytes(frame), len(frame), 0))
    decoder.end_of_capture()
    rows_of(decoder)


def _tshark_signals(path: Path, network: str) -> list[tuple]:
    """(src, dst, dest QP, UDP source port, opcode, AETH syndrome, capture time in ns) of every RoCE frame, as
    tshark reads them."""
    ip = "ip" if network == "ipv4" else "ipv6"
    fields = [f"{ip}.src", f"{ip}.dst", "infiniband.bth.destqp", "udp.srcport", "infiniband.bth.opcode",
              "infiniband.aeth.syndrome", "frame.time_epoch"]
    out = subprocess.run([require_tool("tshark"), "-r", str(path), "-Y", "infiniband", "-T", "fields",
                          "-E", "separator=;", *[a for f in fields for a in ("-e", f)]],
                         capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        src, dst, qp, sport, opcode, syndrome, epoch = line.split(";")
        seconds, _, fraction = epoch.partition(".")
        rows.append((src, dst, int(qp, 16), int(sport), int(opcode), int(syndrome) if syndrome else None,
                     int(seconds) * 1_000_000_000 + int(fraction.ljust(9, "0")[:9])))
    return rows


@pytest.mark.parametrize("network", ["ipv4", "ipv6"])
def test_udp_source_ports_and_signal_times_match_tshark(captures, network):
    """The UDP source ports of each stream (what ECMP hashes on) with their packets, and when each CNP and NAK
    was captured, as tshark reads them; as many retransmission times as the simulation retransmitted."""
    truth = captures[(network, "2.30")]
    rows, _ = run_decoder(truth.path, RoceCaptureDecoder())
    frames = _tshark_signals(truth.path, network)
    streams = {(s["src_ip"], s["dst_ip"], s["dest_qp"]): s for s in rows.extra_streams}
    assert len(streams) == len(truth.streams)
    for key, stream in streams.items():
        mine = [frame for frame in frames if frame[:3] == key]
        ports = sorted({frame[3] for frame in mine})
        assert stream["udp_src_ports"] == ports
        assert stream["udp_src_port_packets"] == [sum(frame[3] == port for frame in mine) for port in ports]
        assert stream["cnp_times_ns"] == [frame[6] for frame in mine if frame[4] == 0x81]
        assert stream["nak_times_ns"] == [frame[6] for frame in mine if frame[5] is not None and frame[5] & 0xE0
                                       in (0x20, 0x60)]
        assert len(stream["retransmitted_times_ns"]) == truth.streams[key].retransmitted_packets
        assert set(stream["retransmitted_times_ns"]) <= {frame[6] for frame in mine}
    assert sum(len(s["cnp_times_ns"]) for s in streams.values()) >= 2
    assert sum(len(s["nak_times_ns"]) for s in streams.values()) >= 2
