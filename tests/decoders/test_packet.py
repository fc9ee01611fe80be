"""Link/network/transport header parsing, checked field by field against scapy's dissection."""
from __future__ import annotations

import hashlib
import os
import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scapy.layers.inet import ICMP, IP, TCP, UDP, IPOption_NOP, IPOption_RR
from scapy.layers.inet6 import (ICMPv6EchoRequest, IPv6, IPv6ExtHdrDestOpt, IPv6ExtHdrFragment,
                                IPv6ExtHdrHopByHop, IPv6ExtHdrRouting)
from scapy.layers.l2 import ARP, CookedLinux, CookedLinuxV2, Dot1AD, Dot1Q, Ether, Loopback
from scapy.packet import Raw

from dlcsniff.decoders.inputs.capture_file import open_capture
from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.packet import (ACK, FIN, PSH, RST, SUPPORTED_LINKTYPES, SYN, URG, Datagram, ParseStats, Segment,
                             check_linktype, ip_to_str, parse_packet)
from tests.support.tcpdump import capture_tcp_transfer

TS = 1_795_000_000_123_456_789
PAYLOAD = Raw(b"ps-lite meta and tensor bytes " * 7)


def _expected(pkt) -> tuple:
    """What parse_packet must return for a scapy packet, in the Segment / Datagram field order."""
    ip = pkt[IP] if IP in pkt else pkt[IPv6]
    family, version = (socket.AF_INET, 4) if ip.version == 4 else (socket.AF_INET6, 6)
    src, dst = socket.inet_pton(family, ip.src), socket.inet_pton(family, ip.dst)
    if TCP in pkt:
        tcp = pkt[TCP]
        payload = bytes(tcp.payload)
        return (Segment, TS, src, dst, tcp.sport, tcp.dport, tcp.seq, tcp.ack, int(tcp.flags), payload,
                len(payload), version, tcp.window)
    udp = pkt[UDP]
    payload = bytes(udp.payload)
    return (Datagram, TS, src, dst, udp.sport, udp.dport, payload, len(payload), version)


def _fields(result) -> tuple:
    if result.__class__ is Segment:
        return (Segment, result.ts_ns, result.src, result.dst, result.sport, result.dport, result.seq,
                result.ack, result.flags, bytes(result.payload), result.wire_payload_len, result.ip_version,
                result.window)
    return (Datagram, result.ts_ns, result.src, result.dst, result.sport, result.dport, bytes(result.payload),
            result.wire_payload_len, result.ip_version)


def _eth(**kw):
    # Explicit addresses: left out, scapy would resolve them (ARP / neighbour solicitation on the network).
    return Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02", **kw)


def _tcp(**kw):
    return TCP(sport=40123, dport=9091, seq=0xFFFFFF00, ack=12345, flags="PA", window=0x1F2E, **kw) / PAYLOAD


def _ipv4(**kw):
    return IP(src="198.18.0.1", dst="198.18.0.2", **kw)


def _ipv6():
    return IPv6(src="2001:db8::1", dst="2001:db8::2:0:1")


def _null(family: int, order: str, ip_pkt) -> bytes:
    return struct.pack(order + "I", family) + bytes(ip_pkt)


IPV4_TCP = _ipv4() / _tcp()
IPV6_TCP = _ipv6() / _tcp()
IPV4_UDP = _ipv4() / UDP(sport=5000, dport=4791) / PAYLOAD
IPV6_UDP = _ipv6() / UDP(sport=5000, dport=4791) / PAYLOAD

# (name, link type, frame bytes, the scapy packet holding the IP layer and what follows)
CASES = [
    ("ethernet", 1, _eth() / IPV4_TCP, None),
    ("ethernet-ipv6", 1, _eth() / IPV6_TCP, None),
    ("ethernet-udp", 1, _eth() / IPV4_UDP, None),
    ("802.1q", 1, _eth() / Dot1Q(vlan=7) / IPV4_TCP, None),
    ("802.1ad+802.1q", 1, _eth() / Dot1AD(vlan=100) / Dot1Q(vlan=7) / IPV6_UDP, None),
    ("ipv4-options", 1, _eth() / _ipv4(options=[IPOption_RR(routers=["10.0.0.1", "10.0.0.2"]), IPOption_NOP()])
     / _tcp(options=[("MSS", 1460), ("SAckOK", b""), ("Timestamp", (1, 2)), ("NOP", None), ("WScale", 7)]), None),
    ("ipv6-extensions", 1, _eth() / _ipv6() / IPv6ExtHdrHopByHop() / IPv6ExtHdrRouting(addresses=["2001:db8::9"])
     / IPv6ExtHdrDestOpt() / _tcp(), None),
    ("sll", 113, CookedLinux(pkttype=4) / IPV4_TCP, None),
    ("sll-ipv6-udp", 113, CookedLinux() / IPV6_UDP, None),
    ("sll2", 276, CookedLinuxV2(ifindex=3) / IPV6_TCP, None),
    ("sll2-udp", 276, CookedLinuxV2() / IPV4_UDP, None),
    ("null-host-order", 0, Loopback(type=2) / IPV4_TCP, None),
    ("null-other-order", 0, _null(2, ">", IPV4_TCP), IPV4_TCP),
    ("null-ipv6-24", 0, _null(24, "<", IPV6_TCP), IPV6_TCP),
    ("null-ipv6-28", 0, _null(28, ">", IPV6_TCP), IPV6_TCP),
    ("null-ipv6-30", 0, _null(30, "<", IPV6_UDP), IPV6_UDP),
    ("loop", 108, _null(2, ">", IPV4_TCP), IPV4_TCP),
    ("loop-ipv6-le", 108, _null(30, "<", IPV6_TCP), IPV6_TCP),
    ("raw-ipv4", 101, IPV4_TCP, None),
    ("raw-ipv6", 101, IPV6_UDP, None),
    ("ipv4", 228, IPV4_UDP, None),
    ("ipv6", 229, IPV6_TCP, None),
]


@pytest.mark.parametrize("name, linktype, frame, ip_pkt", CASES, ids=[c[0] for c in CASES])
def test_every_link_type_against_scapy(name, linktype, frame, ip_pkt):
    raw = bytes(frame)
    dissected = ip_pkt if ip_pkt is not None else frame.__class__(raw)
    stats = ParseStats()
    result = parse_packet(linktype, raw, TS, stats)
    assert _fields(result) == _expected(dissected)
    assert isinstance(result.payload, memoryview)
    assert stats == ParseStats()


def test_payload_is_a_view_of_the_packet_not_a_copy():
    buffer = bytearray(bytes(_eth() / IPV4_TCP))
    seg = parse_packet(1, memoryview(buffer), TS)
    assert seg.payload.obj is buffer
    buffer[-1] ^= 0xFF
    assert seg.payload[-1] == buffer[-1]


@pytest.mark.parametrize("trailer", [b"\x00" * 6, b"\x00" * 6 + b"\xde\xad\xbe\xef"])
def test_ethernet_padding_and_fcs_are_not_payload(trailer):
    """A 54-byte SYN is padded to the 60-byte Ethernet minimum (and may carry the FCS): the IP length rules."""
    frame = _eth() / _ipv4() / TCP(flags="S")
    seg = parse_packet(1, bytes(frame) + trailer, TS)
    assert bytes(seg.payload) == b"" and seg.wire_payload_len == 0 and seg.flags == SYN
    data = bytes(_eth() / IPV4_TCP)
    seg = parse_packet(1, data + trailer, TS)
    assert bytes(seg.payload) == bytes(PAYLOAD) and seg.wire_payload_len == len(PAYLOAD)


@pytest.mark.parametrize("frame", [_eth() / IPV4_TCP, _eth() / IPV6_UDP], ids=["tcp", "udp"])
def test_snaplen_cut_payload_keeps_the_wire_length(frame):
    raw = bytes(frame)
    for cut in (len(raw) - 1, len(raw) - len(PAYLOAD) + 3, len(raw) - len(PAYLOAD)):
        result = parse_packet(1, raw[:cut], TS)
        assert result.wire_payload_len == len(PAYLOAD)
        assert bytes(result.payload) == bytes(PAYLOAD)[: cut - (len(raw) - len(PAYLOAD))]


def test_flag_constants_match_scapy():
    for name, bit in (("F", FIN), ("S", SYN), ("R", RST), ("P", PSH), ("A", ACK), ("U", URG)):
        seg = parse_packet(101, bytes(_ipv4() / TCP(flags=name)), TS)
        assert seg.flags == bit == int(TCP(flags=name).flags)


def test_unset_ip_length_from_segmentation_offload_uses_the_captured_length():
    raw = bytearray(bytes(_ipv4() / _tcp()))
    struct.pack_into("!H", raw, 2, 0)
    seg = parse_packet(228, bytes(raw), TS)
    assert bytes(seg.payload) == bytes(PAYLOAD) and seg.wire_payload_len == len(PAYLOAD)


# -- packets that are not TCP/UDP, counted by reason ----------------------------------------------------------

def _ipv4_with(**fields) -> bytes:
    raw = bytearray(bytes(_eth() / IPV4_TCP))
    for offset, value in fields.values():
        raw[14 + offset] = value
    return bytes(raw)


NOT_PARSED = [
    ("arp", 1, bytes(_eth() / ARP()), "non_ip"),
    ("802.3-llc", 1, bytes(_eth(type=0x0026) / Raw(b"\x42" * 40)), "non_ip"),
    ("sll-arp", 113, bytes(CookedLinux() / ARP()), "non_ip"),
    ("null-unknown-family", 0, _null(7, "<", IPV4_TCP), "non_ip"),
    ("raw-version-5", 101, b"\x50" + bytes(IPV4_TCP)[1:], "non_ip"),
    ("icmp", 1, bytes(_eth() / _ipv4() / ICMP()), "non_tcp_udp"),
    ("icmpv6", 1, bytes(_eth() / _ipv6() / ICMPv6EchoRequest()), "non_tcp_udp"),
    ("ipv4-more-fragments", 1, bytes(_eth() / _ipv4(flags="MF") / _tcp()), "fragments"),
    ("ipv4-fragment-offset", 1, bytes(_eth() / _ipv4(frag=185) / Raw(b"x" * 40)), "fragments"),
    ("ipv6-fragment", 1, bytes(_eth() / _ipv6() / IPv6ExtHdrHopByHop() / IPv6ExtHdrFragment() / _tcp()),
     "fragments"),
    ("ethernet-cut", 1, bytes(_eth() / IPV4_TCP)[:13], "truncated_headers"),
    ("vlan-cut", 1, bytes(_eth() / Dot1Q() / IPV4_TCP)[:16], "truncated_headers"),
    ("ipv4-cut", 1, bytes(_eth() / IPV4_TCP)[:30], "truncated_headers"),
    ("tcp-cut", 1, bytes(_eth() / IPV4_TCP)[:14 + 20 + 10], "truncated_headers"),
    ("tcp-options-cut", 1, bytes(_eth() / _ipv4() / _tcp(options=[("MSS", 1460)] * 4))[:14 + 20 + 24],
     "truncated_headers"),
    ("ipv6-extension-cut", 1, bytes(_eth() / _ipv6() / IPv6ExtHdrHopByHop() / _tcp())[:14 + 40 + 1],
     "truncated_headers"),
    ("udp-cut", 1, bytes(_eth() / IPV4_UDP)[:14 + 20 + 5], "truncated_headers"),
    ("sll2-cut", 276, bytes(CookedLinuxV2() / IPV4_TCP)[:1], "truncated_headers"),
    ("ipv4-version-6-in-ipv4-frame", 1, _ipv4_with(v=(0, 0x65)), "malformed"),
    ("ipv4-ihl-3", 1, _ipv4_with(v=(0, 0x43)), "malformed"),
    ("ipv4-total-length-below-header", 1, _ipv4_with(a=(2, 0), b=(3, 12)), "malformed"),
    ("tcp-data-offset-3", 1, _ipv4_with(o=(20 + 12, 0x30)), "malformed"),
    ("ipv6-version-4-in-ipv6-frame", 1, b"\x00" * 12 + b"\x86\xdd" + bytes(IPV4_TCP), "malformed"),
    ("unknown-linktype", 147, bytes(_eth() / IPV4_TCP), "unknown_linktype"),
]


@pytest.mark.parametrize("name, linktype, raw, reason", NOT_PARSED, ids=[c[0] for c in NOT_PARSED])
def test_packets_that_are_not_tcp_or_udp_are_counted_by_reason(name, linktype, raw, reason):
    stats = ParseStats()
    assert parse_packet(linktype, raw, TS, stats) is None
    assert parse_packet(linktype, raw, TS) is None          # without stats, too
    assert stats.as_dict() == {**ParseStats().as_dict(), reason: 1}


def test_unsupported_link_type_is_one_clear_line():
    for linktype in SUPPORTED_LINKTYPES:
        check_linktype(linktype)
    with pytest.raises(DecodeError) as err:
        check_linktype(147)
    message = str(err.value)
    assert "link type 147 is not supported" in message and "ETHERNET (1)" in message and "\n" not in message


def test_ip_to_str():
    assert ip_to_str(socket.inet_pton(socket.AF_INET, "198.18.3.4")) == "198.18.3.4"
    assert ip_to_str(socket.inet_pton(socket.AF_INET6, "2001:db8:0:0:0:0:2:1")) == "2001:db8::2:1"


# -- fuzz: any bytes give a result or exactly one counted reason, never an exception --------------------------

LINKTYPES = [*SUPPORTED_LINKTYPES, 147]
FRAMES = [(linktype, bytes(frame)) for _, linktype, frame, _ in CASES] + [(l, r) for _, l, r, _ in NOT_PARSED]


def _check_one_outcome(linktype: int, raw: bytes) -> None:
    stats = ParseStats()
    result = parse_packet(linktype, raw, TS, stats)
    counted = sum(stats.as_dict().values())
    if result is None:
        assert counted == 1
    else:
        assert counted == 0 and len(result.payload) <= result.wire_payload_len
        assert bytes(result.payload) in raw


@given(st.sampled_from(LINKTYPES), st.binary(max_size=120))
@settings(max_examples=500, deadline=None)
def test_fuzz_random_bytes(linktype, raw):
    _check_one_outcome(linktype, raw)


@given(st.sampled_from(FRAMES), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
       st.integers(0, 10_000))
@settings(max_examples=500, deadline=None)
def test_fuzz_mutated_real_frames(frame, changes, cut):
    linktype, raw = frame
    mutated = bytearray(raw)
    for position, value in changes:
        mutated[position % len(mutated)] = value
    _check_one_outcome(linktype, bytes(mutated[:cut]))


# -- real packets: a real transfer captured by tcpdump, every packet checked against scapy --------------------

@pytest.fixture(scope="module")
def real_captures(tmp_path_factory):
    request = os.urandom(400_000)
    transfer = capture_tcp_transfer(tmp_path_factory.mktemp("packet"), request, hashlib.sha256(request).digest(),
                                    {"lo.pcap": ["-i", "lo"], "sll.pcap": ["-i", "any", "-y", "LINUX_SLL"],
                                     "sll2.pcap": ["-i", "any", "-y", "LINUX_SLL2"]})
    return transfer


@pytest.mark.root
@pytest.mark.parametrize("name, dissector", [("lo.pcap", Ether), ("sll.pcap", CookedLinux),
                                             ("sll2.pcap", CookedLinuxV2)])
def test_real_packets_against_scapy(real_captures, name, dissector):
    stats = ParseStats()
    n = 0
    with open_capture(real_captures.captures[name].path) as reader:
        for packet in reader:
            result = parse_packet(packet.linktype, packet.data, TS, stats)
            assert _fields(result) == _expected(dissector(bytes(packet.data)))
            assert result.sport == real_captures.port or result.dport == real_captures.port
            n += 1
    assert n == real_captures.captures[name].packets_captured > 10
    assert stats == ParseStats()
