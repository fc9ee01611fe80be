"""One captured packet -> a TCP `Segment` or UDP `Datagram` (link, network and transport headers).

Pure functions over bytes: no reassembly (see decoders.tcp), no IP defragmentation (fragments are
counted and skipped: these jobs' TCP never fragments, and RoCE sets DF). Checksums are not verified:
a capture on the sending host sees checksums the NIC has not filled in yet.

Header parsing is plain precompiled `struct.Struct.unpack_from` on a memoryview, not dpkt: several times
faster (tests/bench/hotpath.py measures both), and payloads stay views where dpkt copies each into a new
bytes object.
"""
from __future__ import annotations

import functools
import socket
import struct
from dataclasses import dataclass, fields

from dlcsniff.decoders.errors import DecodeError

# TCP flag bits (RFC 9293)
FIN = 0x01
SYN = 0x02
RST = 0x04
PSH = 0x08
ACK = 0x10
URG = 0x20

# LINKTYPE_* numbers (tcpdump.org/linktypes.html)
LINKTYPE_NULL = 0            # BSD loopback: 4-byte address family in the capturing host's byte order
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW = 101           # raw IPv4 or IPv6, told apart by the version nibble
LINKTYPE_LOOP = 108          # OpenBSD loopback: address family in network byte order
LINKTYPE_LINUX_SLL = 113     # `tcpdump -i any`
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276    # `tcpdump -i any -y LINUX_SLL2`
SUPPORTED_LINKTYPES: dict[int, str] = {
    LINKTYPE_NULL: "NULL", LINKTYPE_ETHERNET: "ETHERNET", LINKTYPE_RAW: "RAW", LINKTYPE_LOOP: "LOOP",
    LINKTYPE_LINUX_SLL: "LINUX_SLL", LINKTYPE_IPV4: "IPV4", LINKTYPE_IPV6: "IPV6",
    LINKTYPE_LINUX_SLL2: "LINUX_SLL2",
}

_ETHERTYPE_IPV4 = 0x0800
_ETHERTYPE_IPV6 = 0x86DD
_VLAN_TPIDS = frozenset((0x8100, 0x88A8, 0x9100))     # 802.1Q, 802.1ad, pre-standard QinQ
_AF_INET = 2
_AF_INET6 = frozenset((24, 28, 30))                  # BSD values: NetBSD/OpenBSD, FreeBSD, macOS
_IPPROTO_TCP = 6
_IPPROTO_UDP = 17
_IPV6_SKIPPED_EXTENSIONS = frozenset((0, 43, 60))    # hop-by-hop, routing, destination options
_IPV6_FRAGMENT = 44

_ETHERNET_HEADER_BYTES = 14
_SLL_HEADER_BYTES = 16       # packet type, ARPHRD, address length, 8 address bytes, protocol (offset 14)
_SLL2_HEADER_BYTES = 20      # protocol (offset 0), reserved, ifindex, ARPHRD, packet type, address length, address
_NULL_HEADER_BYTES = 4
_IPV6_HEADER_BYTES = 40
_UDP_HEADER_BYTES = 8
_TCP_MIN_HEADER_BYTES = 20

_U16 = struct.Struct("!H")
_NULL_FAMILY = struct.Struct("<I")
_IPV4 = struct.Struct("!BxHxxHxB2x4s4s")  # version+IHL, total length, flags+fragment offset, protocol, src, dst
_IPV6 = struct.Struct("!BxxxHB1x16s16s")  # version (high nibble), payload length, next header, src, dst
_TCP = struct.Struct("!HHIIH")            # ports, seq, ack, data offset (high nibble) + flags
_UDP_PORTS = struct.Struct("!HH")         # the UDP length repeats the IP one


@dataclass(slots=True)
class Segment:
    ts_ns: int
    src: bytes                   # packed IP address (4 or 16 bytes)
    dst: bytes
    sport: int
    dport: int
    seq: int
    ack: int
    flags: int                   # FIN | SYN | RST | PSH | ACK | URG ... bits
    payload: memoryview          # the captured part of the TCP payload
    wire_payload_len: int        # payload length the IP header claims: > len(payload) when snaplen cut it
    ip_version: int
    window: int                  # the receive window the sender advertises, unscaled (0: it takes no more bytes)


@dataclass(slots=True)
class Datagram:
    ts_ns: int
    src: bytes
    dst: bytes
    sport: int
    dport: int
    payload: memoryview
    wire_payload_len: int
    ip_version: int


@dataclass(slots=True)
class ParseStats:
    """Why packets did not become a Segment or Datagram; the caller passes one in to count them."""
    unknown_linktype: int = 0
    non_ip: int = 0              # ARP, LLDP, 802.3 frames...
    non_tcp_udp: int = 0         # ICMP, IGMP, ESP...
    fragments: int = 0           # IPv4 fragments and IPv6 fragment headers: not reassembled
    truncated_headers: int = 0   # the capture cut the packet inside a header
    malformed: int = 0           # a header contradicts itself (IP version, header length)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class UnsupportedLinktype(DecodeError):
    pass


def check_linktype(linktype: int) -> None:
    """Raise an UnsupportedLinktype with a one-line explanation if parse_packet cannot read this link type."""
    if linktype not in SUPPORTED_LINKTYPES:
        supported = ", ".join(f"{name} ({number})" for number, name in SUPPORTED_LINKTYPES.items())
        raise UnsupportedLinktype(f"link type {linktype} is not supported; supported link types: {supported}")


def parse_packet(linktype: int, data: bytes | memoryview, ts_ns: int,
                 stats: ParseStats | None = None) -> Segment | Datagram | None:
    """The TCP segment or UDP datagram in one captured packet, or None (the reason counted in `stats`)."""
    if data.__class__ is not memoryview:
        data = memoryview(data)
    try:
        if linktype == LINKTYPE_ETHERNET:
            ethertype = _U16.unpack_from(data, 12)[0]
            offset = _ETHERNET_HEADER_BYTES
            while ethertype in _VLAN_TPIDS:
                ethertype = _U16.unpack_from(data, offset + 2)[0]
                offset += 4
        elif linktype == LINKTYPE_LINUX_SLL2:
            ethertype = _U16.unpack_from(data, 0)[0]
            offset = _SLL2_HEADER_BYTES
        elif linktype == LINKTYPE_LINUX_SLL:
            ethertype = _U16.unpack_from(data, 14)[0]
            offset = _SLL_HEADER_BYTES
        elif linktype == LINKTYPE_NULL or linktype == LINKTYPE_LOOP:
            family = _NULL_FAMILY.unpack_from(data, 0)[0]
            if family > 0xFFFF:          # written in the other byte order than read
                family = int.from_bytes(data[:4], "big")
            ethertype = _ETHERTYPE_IPV4 if family == _AF_INET else (
                _ETHERTYPE_IPV6 if family in _AF_INET6 else 0)
            offset = _NULL_HEADER_BYTES
        elif linktype == LINKTYPE_RAW:
            version = data[0] >> 4
            ethertype = _ETHERTYPE_IPV4 if version == 4 else (_ETHERTYPE_IPV6 if version == 6 else 0)
            offset = 0
        elif linktype == LINKTYPE_IPV4:
            ethertype, offset = _ETHERTYPE_IPV4, 0
        elif linktype == LINKTYPE_IPV6:
            ethertype, offset = _ETHERTYPE_IPV6, 0
        else:
            if stats is not None:
                stats.unknown_linktype += 1
            return None
        if ethertype == _ETHERTYPE_IPV4:
            return _ipv4(data, offset, ts_ns, stats)
        if ethertype == _ETHERTYPE_IPV6:
            return _ipv6(data, offset, ts_ns, stats)
    except (struct.error, IndexError):
        if stats is not None:
            stats.truncated_headers += 1
        return None
    if stats is not None:
        stats.non_ip += 1
    return None


_SLL_PACKET_TYPE_OFFSET = 0      # u16 (network order) in a Linux cooked v1 header
_SLL2_PACKET_TYPE_OFFSET = 10    # u8 in a Linux cooked v2 header
_PACKET_OUTGOING = 4             # linux/if_packet.h PACKET_OUTGOING: sent by this host


DIRECTION_LINKTYPES = frozenset({LINKTYPE_LINUX_SLL, LINKTYPE_LINUX_SLL2})   # whose packets say who sent them


def outgoing_source(linktype: int, data: bytes | memoryview) -> bytes | None:
    """The IP source address of a packet the capturing host sent, when the link layer says so (Linux cooked
    captures, `tcpdump -i any`, mark each packet with its direction); None for any other packet."""
    try:
        if linktype == LINKTYPE_LINUX_SLL2:
            sent, offset = data[_SLL2_PACKET_TYPE_OFFSET] == _PACKET_OUTGOING, _SLL2_HEADER_BYTES
            ethertype = _U16.unpack_from(data, 0)[0]
        elif linktype == LINKTYPE_LINUX_SLL:
            sent = _U16.unpack_from(data, _SLL_PACKET_TYPE_OFFSET)[0] == _PACKET_OUTGOING
            offset, ethertype = _SLL_HEADER_BYTES, _U16.unpack_from(data, 14)[0]
        else:
            return None
        if not sent:
            return None
        if ethertype == _ETHERTYPE_IPV4 and len(data) >= offset + 16:
            return bytes(data[offset + 12:offset + 16])
        if ethertype == _ETHERTYPE_IPV6 and len(data) >= offset + 24:
            return bytes(data[offset + 8:offset + 24])
    except (IndexError, struct.error):
        return None
    return None


def _ipv4(data: memoryview, offset: int, ts_ns: int, stats: ParseStats | None) -> Segment | Datagram | None:
    version_ihl, total_len, fragment, protocol, src, dst = _IPV4.unpack_from(data, offset)
    header_len = (version_ihl & 0x0F) * 4
    if version_ihl >> 4 != 4 or header_len < 20 or (total_len and total_len < header_len):
        if stats is not None:
            stats.malformed += 1
        return None
    if fragment & 0x3FFF:            # more-fragments flag or a fragment offset
        if stats is not None:
            stats.fragments += 1
        return None
    if total_len == 0:               # segmentation offload on the capturing host: length left unset
        total_len = len(data) - offset
    return _transport(protocol, data, offset + header_len, total_len - header_len, src, dst, ts_ns, 4, stats)


def _ipv6(data: memoryview, offset: int, ts_ns: int, stats: ParseStats | None) -> Segment | Datagram | None:
    version, payload_len, next_header, src, dst = _IPV6.unpack_from(data, offset)
    if version >> 4 != 6:
        if stats is not None:
            stats.malformed += 1
        return None
    offset += _IPV6_HEADER_BYTES
    if payload_len == 0:             # jumbogram or offload: the captured length is all there is
        payload_len = len(data) - offset
    while next_header in _IPV6_SKIPPED_EXTENSIONS:
        extension_len = (data[offset + 1] + 1) * 8
        next_header = data[offset]
        offset += extension_len
        payload_len -= extension_len
    if next_header == _IPV6_FRAGMENT:
        if stats is not None:
            stats.fragments += 1
        return None
    return _transport(next_header, data, offset, payload_len, src, dst, ts_ns, 6, stats)


def _transport(protocol: int, data: memoryview, offset: int, ip_payload_len: int, src: bytes, dst: bytes,
               ts_ns: int, ip_version: int, stats: ParseStats | None) -> Segment | Datagram | None:
    # Ethernet pads short frames: the IP length, not the captured length, says where the payload ends.
    captured_end = min(offset + ip_payload_len, len(data))
    if protocol == _IPPROTO_TCP:
        sport, dport, seq, ack, offset_flags = _TCP.unpack_from(data, offset)
        header_len = (offset_flags >> 12) * 4
        if header_len < _TCP_MIN_HEADER_BYTES or header_len > ip_payload_len:
            if stats is not None:
                stats.malformed += 1
            return None
        if offset + header_len > captured_end:
            if stats is not None:
                stats.truncated_headers += 1
            return None
        return Segment(ts_ns, src, dst, sport, dport, seq, ack, offset_flags & 0xFF,
                       data[offset + header_len:captured_end], ip_payload_len - header_len, ip_version,
                       _U16.unpack_from(data, offset + 14)[0])
    if protocol == _IPPROTO_UDP:
        if ip_payload_len < _UDP_HEADER_BYTES:
            if stats is not None:
                stats.malformed += 1
            return None
        if offset + _UDP_HEADER_BYTES > captured_end:
            if stats is not None:
                stats.truncated_headers += 1
            return None
        sport, dport = _UDP_PORTS.unpack_from(data, offset)
        return Datagram(ts_ns, src, dst, sport, dport, data[offset + _UDP_HEADER_BYTES:captured_end],
                        ip_payload_len - _UDP_HEADER_BYTES, ip_version)
    if stats is not None:
        stats.non_tcp_udp += 1
    return None


@functools.lru_cache(maxsize=65536)
def ip_to_str(address: bytes) -> str:
    """Packed IPv4 (4 bytes) or IPv6 (16 bytes) address -> its usual text form."""
    return socket.inet_ntop(socket.AF_INET if len(address) == 4 else socket.AF_INET6, address)
