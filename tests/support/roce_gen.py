"""Generated RoCE captures with NCCL's IB traffic pattern, and their ground truth (tests only).

No RDMA stack exists on these machines, so the captures are written from the protocol description (the IBTA
transport as summarised in ../shared/protocols.md section 5, NCCL net_ib's CTS/data exchange as described in
decoders/protocols/roce/decoder.py's docstring), NOT from the decoder. Packets are built with scapy's RoCE layer
(scapy.contrib.roce: BTH, AETH, and the RoCEv2 ICRC, which scapy computes on its own); RETH and ImmDt are
small scapy layers defined here. RoCEv1 (GRH) has no ICRC in scapy: `crc32_bitwise` below computes it from
the CRC-32 definition, bit by bit, independently of the decoder's zlib-based ICRC.

Each simulated requester keeps its PSN counter; the responder acknowledges, NAKs a PSN it did not receive
(go-back-N: the requester resends from there), and sends CNPs when packets arrive ECN-marked. Every
deviation the scenario asks for (capture drops, losses before or after the capture point, corrupted ICRCs)
is recorded in the expected counters as it is simulated.
"""
from __future__ import annotations

import ipaddress
import random
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from scapy.contrib.roce import AETH, BTH, GRH, CNPPadding
from scapy.fields import IntField, XIntField, XLongField
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Dot1Q, Ether
from scapy.packet import Packet, Raw

from tests.support.nccl_gen import NCCL_SOCKET_MAGIC, TYPE_NET_IB, TcpCapture

ROCE_PORT = 4791
ACK_SYNDROME = 0x1F          # ACK, 31 credits
NAK_PSN_SEQUENCE = 0x60
RNR_NAK = 0x20 | 0x0E
NETWORKS = ("ipv4", "ipv6", "grh")
CTS_LAYOUTS = ("2.12", "2.21", "2.26", "2.30")


class RETH(Packet):
    name = "RETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), IntField("dlen", 0)]


class ImmDt(Packet):
    name = "ImmDt"
    fields_desc = [XIntField("imm", 0)]


def crc32_bitwise(data: bytes, crc: int = 0) -> int:
    """CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), one bit at a time."""
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0xEDB88320 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def ipv4_icrc(ip: bytes, udp_and_transport: bytes) -> int:
    """RoCEv2 over IPv4 ICRC: 8 bytes of ones (for the LRH), the IP header with TOS, TTL and checksum set to
    ones, the UDP header with its checksum set to ones, the BTH with its FECN/BECN/resv6 byte set to ones,
    the rest (ICRC excluded)."""
    masked_ip = bytearray(ip)
    masked_ip[1] = masked_ip[8] = 0xFF
    masked_ip[10:12] = b"\xff\xff"
    masked = bytearray(udp_and_transport)
    masked[6:8] = b"\xff\xff"
    masked[8 + 4] = 0xFF
    return zlib.crc32(bytes(masked), zlib.crc32(bytes(masked_ip), zlib.crc32(b"\xff" * 8)))


def grh_icrc(grh_and_transport: bytes) -> int:
    """RoCEv1 ICRC: 8 bytes of ones (for the LRH), the GRH with traffic class, flow label and hop limit set
    to ones, the BTH with its FECN/BECN/resv6 byte set to ones, the rest (ICRC placeholder excluded)."""
    masked = bytearray(grh_and_transport[:-4])
    masked[0] |= 0x0F
    masked[1:4] = b"\xff\xff\xff"
    masked[7] = 0xFF
    masked[40 + 4] = 0xFF
    return crc32_bitwise(b"\xff" * 8 + bytes(masked))


# -- the expected results --------------------------------------------------------------------------

@dataclass
class ExpectedMessage:
    src: str
    dst: str
    dest_qp: int
    rdma_op: str
    psn: int
    size_bytes: int
    complete: bool
    imm: int | None = None
    va: int | None = None
    rkey: int | None = None
    nccl_role: str | None = None
    nccl_tag: int | None = None
    nccl_fifo_idx: int | None = None
    nccl_bytes: int | None = None
    nccl_sizes_bytes: list[int] | None = None


COUNTERS = ("packets", "bad_icrc", "cnp", "retransmitted_packets", "naks", "acks", "lost_packets")


@dataclass
class ExpectedStream:
    packets: int = 0
    bad_icrc: int = 0
    cnp: int = 0
    retransmitted_packets: int = 0
    naks: int = 0
    acks: int = 0
    lost_packets: int = 0
    src_rank: int | None = None
    dst_rank: int | None = None
    nccl_direction: str | None = None


@dataclass
class RoceCapture:
    path: Path
    messages: list[ExpectedMessage] = field(default_factory=list)
    streams: dict[tuple[str, str, int], ExpectedStream] = field(default_factory=dict)
    setup_connector: tuple[str, int, str, int] | None = None    # TCP key of the NCCL set-up connection


# -- building packets ------------------------------------------------------------------------------

_ETHER_IPV4 = bytes.fromhex("020000000102" "020000000101" "0800")
_IPV4_HEADER = struct.Struct("!BBHHHBBH4s4s")
_UDP_BTH = struct.Struct("!HHHHBBHII")


def _ipv4_checksum(header: bytes) -> int:
    total = sum(struct.unpack("!10H", header))
    total = (total & 0xFFFF) + (total >> 16)
    return ~((total & 0xFFFF) + (total >> 16)) & 0xFFFF


class RoceWire:
    """RoCE frames of one network flavour, appended to a TcpCapture's frames on its clock.

    `snap_payload`: keep at most this many payload bytes of a packet in the capture (a snaplen: the frame
    keeps its wire length, the ICRC and the rest are not captured). With it, IPv4 frames are packed here with
    struct (scapy is too slow for the hundreds of thousands of packets of a 64 MB collective), from the same
    header layouts, the ICRC of whole ones computed by `ipv4_icrc` (the IBTA definition, as scapy's
    contrib/roce.py computes it)."""

    def __init__(self, cap: TcpCapture, truth: RoceCapture, network: str, trailer: bytes = b"",
                 vlan: int | None = None, snap_payload: int | None = None):
        self.cap, self.truth, self.network, self.trailer = cap, truth, network, trailer
        self.snap_payload = snap_payload
        ether = Ether(src="02:00:00:00:01:01", dst="02:00:00:00:01:02")
        self.ether = ether if vlan is None else ether / Dot1Q(vlan=vlan, prio=3)   # RoCE's PFC priority
        self.hosts: dict[str, str] = {}

    def address(self, host: str) -> str:
        """The text form decoders report for a host's RoCE address (a GID in RoCEv1)."""
        if self.network == "ipv4":
            return host
        return "fd00::" + host.replace(".", ":") if self.network == "ipv6" else "::ffff:" + host

    def gid(self, host: str) -> bytes:
        """The host's RoCE GID: its IPv6 address, or its IPv4 address mapped into IPv6."""
        return ipaddress.IPv6Address(self.address(host) if self.network == "ipv6" else "::ffff:" + host).packed

    def stream(self, src: str, dst: str, dest_qp: int) -> ExpectedStream:
        return self.truth.streams.setdefault((self.address(src), self.address(dst), dest_qp), ExpectedStream())

    def packet(self, src: str, dst: str, dest_qp: int, opcode: int, psn: int, *, headers: list[Packet] = (),
               payload: bytes = b"", ecn_ce: bool = False, capture: bool = True, bad_icrc: bool = False,
               becn: bool = False) -> None:
        """Put one packet on the wire; `capture` False: the capture does not record it (but it happened)."""
        pad = -len(payload) % 4
        self.cap.now_us += 3
        stream = self.stream(src, dst, dest_qp)
        if not capture:
            return
        stream.packets += 1
        if self.snap_payload is not None and self.network == "ipv4" and not bad_icrc and not self.trailer:
            self._packed_frame(src, dst, dest_qp, opcode, psn, headers, payload, pad, ecn_ce, becn)
            return
        transport = BTH(opcode=opcode, dqpn=dest_qp, psn=psn & 0xFFFFFF, padcount=pad, becn=int(becn),
                        ackreq=int(opcode < 0x0C))
        for header in headers:
            transport = transport / header
        if payload or pad:
            transport = transport / Raw(payload + b"\x00" * pad)
        if self.network == "grh":
            grh = GRH(tclass=0x03 if ecn_ce else 0x02, flowlabel=0x12345, nexthdr=0x1B, hoplmt=64,
                      sgid=int.from_bytes(self.gid(src), "big"), dgid=int.from_bytes(self.gid(dst), "big"))
            transport.icrc = 0
            body = bytes(transport)
            grh.paylen = len(body)
            raw = bytes(grh) + body
            icrc = grh_icrc(raw) ^ (0xDEADBEEF if bad_icrc else 0)
            ether = self.ether.copy()
            ether.lastlayer().type = 0x8915
            frame = bytes(ether) + raw[:-4] + struct.pack("<I", icrc)
        else:
            udp = UDP(sport=0xC000 | (dest_qp & 0x3FFF), dport=ROCE_PORT)
            if self.network == "ipv4":
                net = IP(src=src, dst=dst, tos=0x03 if ecn_ce else 0x02, ttl=64, flags="DF")
            else:
                net = IPv6(src=self.address(src), dst=self.address(dst), tc=0x03 if ecn_ce else 0x02, hlim=64)
            frame = bytes(self.ether / net / udp / transport)
            if bad_icrc:
                frame = frame[:-4] + bytes(b ^ 0xFF for b in frame[-4:])
        self.cap.frames.append((self.cap.now_us, frame + self.trailer))
        if bad_icrc:
            stream.bad_icrc += 1

    def _packed_frame(self, src: str, dst: str, dest_qp: int, opcode: int, psn: int, headers: list[Packet],
                      payload: bytes, pad: int, ecn_ce: bool, becn: bool) -> None:
        """An IPv4 RoCEv2 frame, whole or, past `snap_payload` payload bytes, cut by the capture."""
        extension = b"".join(bytes(h) for h in headers)
        transport_bytes = 12 + len(extension) + len(payload) + pad + 4            # BTH ... ICRC
        ip_len = 20 + 8 + transport_bytes
        ip = _IPV4_HEADER.pack(0x45, 0x03 if ecn_ce else 0x02, ip_len, 1, 0x4000, 64, 17, 0,
                               ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed)
        ip = ip[:10] + struct.pack("!H", _ipv4_checksum(ip)) + ip[12:]
        udp_bth = _UDP_BTH.pack(0xC000 | (dest_qp & 0x3FFF), ROCE_PORT, 8 + transport_bytes, 0, opcode,
                                pad << 4, 0xFFFF, (becn << 30) | (dest_qp & 0xFFFFFF),
                                (int(opcode < 0x0C) << 31) | (psn & 0xFFFFFF))
        if len(payload) > self.snap_payload:
            frame = _ETHER_IPV4 + ip + udp_bth + extension + payload[:self.snap_payload]
            self.cap.frames.append((self.cap.now_us, frame, 14 + ip_len))
            return
        body = udp_bth + extension + payload + bytes(pad)
        self.cap.frames.append((self.cap.now_us, _ETHER_IPV4 + ip + body + struct.pack("<I", ipv4_icrc(ip, body))))

    def ack(self, responder: str, requester: str, requester_qp: int, psn: int, msn: int,
            syndrome: int = ACK_SYNDROME) -> None:
        self.packet(responder, requester, requester_qp, 0x11, psn, headers=[AETH(syndrome=syndrome, msn=msn)])
        stream = self.stream(responder, requester, requester_qp)
        if syndrome & 0xE0 == 0:
            stream.acks += 1
        else:
            stream.naks += 1

    def cnp(self, notifier: str, sender: str, sender_qp: int) -> None:
        self.packet(notifier, sender, sender_qp, 0x81, 0, headers=[CNPPadding()], becn=True)
        self.stream(notifier, sender, sender_qp).cnp += 1


class Requester:
    """One direction of an RC queue pair: the requester's PSNs towards `dest_qp` on `dst`."""

    def __init__(self, wire: RoceWire, src: str, dst: str, dest_qp: int, own_qp: int, mtu: int = 1024,
                 first_psn: int = 0):
        self.wire, self.src, self.dst, self.dest_qp, self.own_qp, self.mtu = wire, src, dst, dest_qp, own_qp, mtu
        self.next_psn = first_psn
        self.msn = 0

    def _expect(self, **kw) -> ExpectedMessage:
        msg = ExpectedMessage(self.wire.address(self.src), self.wire.address(self.dst), self.dest_qp, **kw)
        self.wire.truth.messages.append(msg)
        return msg

    def message(self, kind: str, data: bytes, *, va: int | None = None, rkey: int | None = None,
                imm: int | None = None, capture_drops: frozenset = frozenset(), lost_after_capture: int | None = None,
                lost_before_capture: int | None = None, corrupt: int | None = None,
                ecn_ce: frozenset = frozenset(), **nccl) -> ExpectedMessage:
        """A SEND or WRITE. Packet indexes in `capture_drops` are missing from the capture only; the packet
        at `lost_after_capture` / `lost_before_capture` is lost in the network after / before the capture
        point, `corrupt` arrives with a bad ICRC: in those three cases the responder NAKs that PSN and the
        requester resends from it (go-back-N)."""
        chunks = [data[i:i + self.mtu] for i in range(0, len(data), self.mtu)] or [b""]
        n = len(chunks)
        base = {"SEND": 0x00, "WRITE": 0x06}[kind]
        first_psn = self.next_psn
        stream = self.wire.stream(self.src, self.dst, self.dest_qp)

        def send(i: int, *, capture: bool = True, bad: bool = False) -> None:
            if n == 1:
                opcode = {"SEND": 0x04 if imm is None else 0x05, "WRITE": 0x0A if imm is None else 0x0B}[kind]
            elif i == 0:
                opcode = base
            elif i < n - 1:
                opcode = base + 1
            else:
                opcode = base + (2 if imm is None else 3)
            headers = []
            if kind == "WRITE" and (i == 0):
                headers.append(RETH(va=va, rkey=rkey, dlen=len(data)))
            if imm is not None and i == n - 1:
                headers.append(ImmDt(imm=imm))
            self.wire.packet(self.src, self.dst, self.dest_qp, opcode, first_psn + i, headers=headers,
                             payload=chunks[i], capture=capture, bad_icrc=bad, ecn_ce=i in ecn_ce)

        failed = next((k for k in (lost_after_capture, lost_before_capture, corrupt) if k is not None), None)
        for i in range(n):
            dropped = i in capture_drops or i == lost_before_capture
            send(i, capture=not dropped, bad=i == corrupt)
            if i in capture_drops:
                stream.lost_packets += 1
        if failed is not None:           # the responder saw a later PSN first: NAK, then go-back-N
            self.wire.ack(self.dst, self.src, self.own_qp, first_psn + failed, self.msn, NAK_PSN_SEQUENCE)
            for i in range(failed, n):
                send(i)
                stream.retransmitted_packets += 1
        self.next_psn = first_psn + n
        self.msn += 1
        self.wire.ack(self.dst, self.src, self.own_qp, self.next_psn - 1, self.msn)
        op = kind if imm is None else kind + "_IMM"
        complete = not capture_drops
        return self._expect(rdma_op=op, psn=first_psn & 0xFFFFFF, size_bytes=len(data), complete=complete,
                            imm=imm, va=va, rkey=rkey, **nccl)

    def read(self, va: int, rkey: int, length: int, *, capture_drops: frozenset = frozenset(),
             repeated: frozenset = frozenset()) -> ExpectedMessage:
        """An RDMA READ: the request, then the responses carrying its PSNs (those in `capture_drops` missing
        from the capture, those in `repeated` sent twice)."""
        n = max(1, -(-length // self.mtu))
        psn = self.next_psn
        self.wire.packet(self.src, self.dst, self.dest_qp, 0x0C, psn, headers=[RETH(va=va, rkey=rkey, dlen=length)])
        back = self.wire.stream(self.dst, self.src, self.own_qp)
        for i in range(n):
            size = min(self.mtu, length - i * self.mtu)
            opcode = 0x10 if n == 1 else 0x0D if i == 0 else 0x0F if i == n - 1 else 0x0E
            headers = [AETH(syndrome=ACK_SYNDROME, msn=self.msn)] if opcode != 0x0E else []
            for repeat in range(2 if i in repeated else 1):
                self.wire.packet(self.dst, self.src, self.own_qp, opcode, psn + i, headers=headers,
                                 payload=bytes(size), capture=i not in capture_drops)
                back.retransmitted_packets += repeat
        self.next_psn = psn + n
        self.msn += 1
        return self._expect(rdma_op="READ", psn=psn & 0xFFFFFF, size_bytes=length, complete=not capture_drops,
                            va=va, rkey=rkey)


# -- NCCL's IB transport -----------------------------------------------------------------------------

def cts_entries(layout: str, entries: list[dict]) -> bytes:
    """ncclIbSendFifo entries as the receiver writes them (layouts by NCCL version)."""
    out = b""
    for e in entries:
        keys = e["rkeys"]
        if layout == "2.12":
            out += struct.pack("<QiIIIQ", e["addr"], e["size"], keys[0], e["nreqs"], e["tag"], e["idx"])
        elif layout == "2.21":
            out += struct.pack("<Qi2IIIxxxxQ24x", e["addr"], e["size"], *(keys + [0, 0])[:2], e["nreqs"], e["tag"],
                               e["idx"])
        elif layout == "2.26":
            out += struct.pack("<QQ4IIIQ16x", e["addr"], e["size"], *(keys + [0] * 4)[:4], e["nreqs"], e["tag"],
                               e["idx"])
        else:
            out += struct.pack("<QQ8IIIQ", e["addr"], e["size"], *(keys + [0] * 8)[:8], e["nreqs"], e["tag"],
                               e["idx"])
    return out


def host_order_imm(size: int) -> int:
    """The ImmDt (read big-endian, as decoders and tshark report it) that carries `size` the way NCCL sends it:
    imm_data = size, no htonl (net_ib.cc ncclIbMultiSend), i.e. little-endian bytes from an x86 host."""
    return int.from_bytes(size.to_bytes(4, "little"), "big")


class NcclIbConnection:
    """One NCCL net-IB connection: the sender's data QP writing to the receiver, the receiver's CTS writes.

    `offer` is the receiver's CTS for the next FIFO slot (NCCL posts them ahead of the data, up to NCCL_STEPS
    steps: net.cc recvProxyProgress); `transfer` one isend into the oldest buffer offered (offered then if
    none is). The entry lands in FIFO slot (idx - 1) mod 256 (2.20: NCCL_NET_MAX_REQUESTS *
    NCCL_NET_IB_MAX_RECVS entries of 8 receives)."""

    STEPS = 8
    FIFO_SLOTS = 256

    def __init__(self, wire: RoceWire, sender: str, receiver: str, sender_rank: int, sender_qp: int,
                 receiver_qp: int, layout: str, rng: random.Random, step_bytes: int = 1 << 16):
        self.wire, self.layout, self.rng, self.step_bytes = wire, layout, rng, step_bytes
        self.sender_rank = sender_rank
        self.data = Requester(wire, sender, receiver, receiver_qp, sender_qp)
        self.cts = Requester(wire, receiver, sender, sender_qp, receiver_qp)
        self.fifo_addr, self.fifo_rkey = 0x7F10_0000_0000 + rng.getrandbits(20) * 4096, rng.getrandbits(32) | 1
        self.buffer_addr, self.buffer_rkey = 0x7F20_0000_0000 + rng.getrandbits(20) * 4096, rng.getrandbits(32) | 1
        self.cmpl_addr, self.cmpl_rkey = 0x7F30_0000_0000 + rng.getrandbits(20) * 4096, rng.getrandbits(32) | 1
        self.fifo_head = 0
        self.offered: list[tuple[int, int, list[dict]]] = []     # CTS written, data not yet
        self.entry_bytes = 32 if layout == "2.12" else 64
        wire.stream(sender, receiver, receiver_qp).src_rank = sender_rank    # the CTS tag names the sender
        wire.stream(receiver, sender, sender_qp).dst_rank = sender_rank

    def offer(self, nreqs: int = 1, size: int | None = None) -> None:
        """The receiver's CTS for the next FIFO slot, offering `size` bytes per receive (default: a step)."""
        self.fifo_head += 1
        idx = self.fifo_head
        slot = (idx - 1) % self.FIFO_SLOTS
        step = (idx - 1) % self.STEPS
        size = self.step_bytes // nreqs if size is None else size
        entries = [{"addr": self.buffer_addr + step * self.step_bytes * 2 + r * (self.step_bytes // 4),
                    "size": size, "rkeys": [self.buffer_rkey], "nreqs": nreqs,
                    "tag": self.sender_rank, "idx": idx} for r in range(nreqs)]
        self.cts.message("WRITE", cts_entries(self.layout, entries),
                         va=self.fifo_addr + slot * 8 * self.entry_bytes, rkey=self.fifo_rkey,
                         nccl_role="cts", nccl_tag=self.sender_rank, nccl_fifo_idx=idx,
                         nccl_sizes_bytes=[e["size"] for e in entries])
        self.offered.append((idx, slot, entries))

    def transfer(self, sizes: list[int], *, adaptive_routing: bool = False, payload: bytes | None = None,
                 **loss) -> None:
        """One isend (len(sizes) == 1, of `payload` if given) or a multi-receive; `loss` applies to the first
        data write. An empty send is a 0-byte write with immediate 0 (ncclIbMultiSend, num_sge 0)."""
        if not self.offered:
            self.offer(len(sizes))
        idx, slot, entries = self.offered.pop(0)
        role = {"nccl_role": "data", "nccl_tag": self.sender_rank, "nccl_fifo_idx": idx}
        if len(sizes) == 1 and not adaptive_routing:
            data = self.rng.randbytes(sizes[0]) if payload is None else payload
            self.data.message("WRITE", data, va=entries[0]["addr"], rkey=self.buffer_rkey,
                              imm=host_order_imm(sizes[0]), nccl_bytes=sizes[0], **role, **loss)
            return
        for r, size in enumerate(sizes):
            self.data.message("WRITE", self.rng.randbytes(size), va=entries[r]["addr"], rkey=self.buffer_rkey,
                              **role, **(loss if r == 0 else {}))
        if len(sizes) == 1:          # adaptive routing: the immediate travels in an empty write
            self.data.message("WRITE", b"", va=0, rkey=0, imm=host_order_imm(sizes[0]), nccl_bytes=sizes[0],
                              **role)
        else:
            self.data.message("WRITE", struct.pack(f"<{len(sizes)}i", *sizes), va=self.cmpl_addr + slot * 32,
                              rkey=self.cmpl_rkey, imm=sizes[0], nccl_sizes_bytes=list(sizes), **role)

    def set_up(self, client_port: int, listen_port: int) -> None:
        """NCCL's IB set-up connection (the sender connects: magic + type 4, then each side its metadata)."""
        cap = self.wire.cap
        setup = cap.connect((self.data.src, client_port), (self.data.dst, listen_port))
        cap.send(setup, struct.pack("<Qi", NCCL_SOCKET_MAGIC, TYPE_NET_IB))
        cap.send(setup, self.setup_metadata("sender"))
        cap.send(setup, self.setup_metadata("receiver"), from_client=False)
        cap.send(setup, struct.pack("<i", 1))
        cap.close(setup)

    def setup_metadata(self, side: str) -> bytes:
        """What each side sends on the set-up connection (master's layout, which the decoder does not parse):
        device list, then ncclIbConnectionMetadata {qpInfo[128] {qpn, ece, ece_supported, devIndex},
        devs[4] {lid, ib_port, mtu, link_layer, gid, rkey, remoteGid}, devName[64], addr, ndevs, tc, sl}."""
        sender = side == "sender"
        host = self.data.src if sender else self.data.dst
        qpn = self.data.own_qp if sender else self.data.dest_qp
        gid = self.wire.gid(host)
        dev_list = struct.pack("<5i", 1, 0, 0, 0, 0) + b"\x01"
        qp_info = struct.pack("<I3Iii", qpn, 0x15B3, 0, 0, 1, 0) + bytes(23 * 127)
        devs = struct.pack("<IB3xiB3x16sI16s", 0, 1, 5, 2, gid, self.fifo_rkey if sender else self.cmpl_rkey,
                           bytes(16)) + bytes(56 * 3)
        meta = (qp_info + devs + b"mlx5_0".ljust(64, b"\x00") + bytes(4)
                + struct.pack("<Qiii", self.fifo_addr if sender else self.cmpl_addr, 1, 0, 0))
        return dev_list + meta


# -- scenarios ---------------------------------------------------------------------------------------

RANK_A, RANK_B = 0, 1
HOST_A, HOST_B = "198.18.1.1", "198.18.1.2"
QP_A_SEND, QP_B_RECV = 0x000111, 0x000222          # connection 1: A sends to B (with its set-up connection)
QP_B_SEND, QP_A_RECV = 0x000333, 0x000444          # connection 2: B sends to A (no set-up in the capture)
QP_A_GENERIC, QP_B_GENERIC = 0x000555, 0x000666    # plain RDMA traffic (SEND, READ)


def roce_capture(path: Path, *, network: str = "ipv4", layout: str = "2.30", trailer: bytes = b"",
                 vlan: int | None = None, seed: int = 3) -> RoceCapture:
    """NCCL's CTS/data exchange both ways (all data-write forms), retransmissions, capture losses, bad ICRCs,
    CNPs, NAKs, READs and SENDs, and one NCCL IB set-up TCP connection."""
    rng = random.Random(seed)
    cap = TcpCapture(seed=seed)
    truth = RoceCapture(path)
    wire = RoceWire(cap, truth, network, trailer, vlan)
    c1 = NcclIbConnection(wire, HOST_A, HOST_B, RANK_A, QP_A_SEND, QP_B_RECV, layout, rng)
    c2 = NcclIbConnection(wire, HOST_B, HOST_A, RANK_B, QP_B_SEND, QP_A_RECV, layout, rng)

    setup = cap.connect((HOST_A, 45000), (HOST_B, 46000))
    truth.setup_connector = (HOST_A, 45000, HOST_B, 46000)
    cap.send(setup, struct.pack("<Qi", NCCL_SOCKET_MAGIC, TYPE_NET_IB))
    cap.send(setup, c1.setup_metadata("sender")[:21])
    cap.send(setup, c1.setup_metadata("receiver")[:21], from_client=False)
    cap.send(setup, c1.setup_metadata("sender")[21:])
    cap.send(setup, c1.setup_metadata("receiver")[21:], from_client=False)
    cap.send(setup, struct.pack("<i", 1))
    wire.stream(HOST_A, HOST_B, QP_B_RECV).nccl_direction = "data"     # the QPs that set-up advertised
    wire.stream(HOST_B, HOST_A, QP_A_SEND).nccl_direction = "cts"

    c1.transfer([65536])                                   # one step, 64 packets
    c2.transfer([48])                                      # tiny: one packet with immediate
    c1.transfer([0])                                       # empty send: a 0-byte write with immediate
    c2.transfer([5000], lost_after_capture=2)              # go-back-N: packets 2..4 appear twice
    c1.transfer([20000], lost_before_capture=5)            # hole filled by the retransmission
    c2.transfer([9000], corrupt=3)                         # bad ICRC, dropped by the receiver, resent
    c1.transfer([12000], capture_drops=frozenset({4, 5}))  # the capture missed two packets: incomplete
    c1.transfer([2000], corrupt=0)                         # a bad ICRC on the RETH-bearing first packet
    c2.transfer([3000, 1500], adaptive_routing=False)      # multi-receive: two writes, then the sizes
    c1.transfer([7000], adaptive_routing=True)             # plain write, then a 0-byte write with immediate
    c1.transfer([30000], ecn_ce=frozenset({10, 20}))       # ECN-marked: the receiver sends CNPs
    wire.cnp(HOST_B, HOST_A, QP_A_SEND)
    wire.cnp(HOST_B, HOST_A, QP_A_SEND)
    for _ in range(9):                                     # wrap the 8 receive buffers: addresses are reused
        c2.transfer([rng.randrange(1, 40000)])

    generic = Requester(wire, HOST_A, HOST_B, QP_B_GENERIC, QP_A_GENERIC, first_psn=0xFFFFF0)   # PSNs wrap
    generic.message("SEND", rng.randbytes(3000), imm=0xABCD)
    generic.message("SEND", rng.randbytes(100))
    generic.read(0x1000_0000, 0x4242, 10_000)
    generic.read(0x1000_8000, 0x4242, 700, repeated=frozenset({0}))
    generic.read(0x1001_0000, 0x4242, 5000, capture_drops=frozenset({2}))
    generic.message("WRITE", rng.randbytes(2048), va=0x2000_0000, rkey=0x99)
    wire.ack(HOST_B, HOST_A, QP_A_GENERIC, generic.next_psn, generic.msn, RNR_NAK)
    cap.close(setup)
    cap.write(path)
    return truth
