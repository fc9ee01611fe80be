"""What a capture tool that alters RoCE frames leaves in a capture, made from a capture that verifies (tests only).

Some RDMA sniffers record frames whose ICRC no longer matches them (the frame taken before the adapter computed
its ICRC, or rewritten on the way); some cut frames short so that the ICRC is not there at all (a snap length:
`editcap -s`). `rewrite_icrcs` does the first to every RoCEv2 packet of a capture, zeroing the ICRC and leaving
every header alone; `icrc_verdicts` checks each RoCE packet's ICRC with scapy's own computation
(scapy.contrib.roce), independently of the decoder.
"""
from __future__ import annotations

import collections
import gzip
import struct
from pathlib import Path

from scapy.contrib.roce import BTH
from scapy.layers.l2 import Ether
from scapy.utils import PcapWriter, RawPcapReader

ROCE_V2_PORT = 4791
_ETHERTYPE_IPV4 = 0x0800
_IPPROTO_UDP = 17


def plain(source: Path, directory: Path) -> Path:
    """The capture uncompressed (a .pcap.gz of pcaps/realcaps), or itself."""
    if source.suffix != ".gz":
        return source
    out = directory / source.name.removesuffix(".gz")
    out.write_bytes(gzip.decompress(source.read_bytes()))
    return out


def _icrc_at(frame: bytes) -> int | None:
    """Where the ICRC of an Ethernet / IPv4 / UDP 4791 frame lies, when the frame holds it."""
    if len(frame) < 42 or struct.unpack_from("!H", frame, 12)[0] != _ETHERTYPE_IPV4 or frame[23] != _IPPROTO_UDP:
        return None
    udp = 14 + (frame[14] & 0x0F) * 4
    dport, length = struct.unpack_from("!HH", frame, udp + 2)
    end = udp + length
    return end - 4 if dport == ROCE_V2_PORT and len(frame) >= end else None


def rewrite_icrcs(source: Path, dest: Path) -> int:
    """`source` with the ICRC of every RoCEv2 packet it holds whole set to zero; returns how many were."""
    rewritten = 0
    reader = RawPcapReader(str(source))
    writer = PcapWriter(str(dest), linktype=reader.linktype, sync=False)
    writer.write_header(None)
    for frame, meta in reader:
        at = _icrc_at(frame)
        if at is not None:
            frame = frame[:at] + bytes(4) + frame[at + 4:]
            rewritten += 1
        writer.write_packet(frame, sec=meta.sec, usec=meta.usec, wirelen=meta.wirelen)
    writer.close()
    reader.close()
    return rewritten


def icrc_verdicts(path: Path) -> collections.Counter:
    """Per RoCE packet: True when the ICRC it carries is the one scapy computes for it, False when not, None
    when the capture cut the packet before its ICRC."""
    verdicts: collections.Counter = collections.Counter()
    for frame, meta in RawPcapReader(str(path)):
        packet = Ether(frame)
        if BTH not in packet:
            continue
        if len(frame) < meta.wirelen:
            verdicts[None] += 1
            continue
        rebuilt = Ether(frame)
        rebuilt[BTH].icrc = None
        verdicts[Ether(bytes(rebuilt))[BTH].icrc == packet[BTH].icrc] += 1
    return verdicts
