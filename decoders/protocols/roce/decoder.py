"""RoCE (RDMA over Converged Ethernet) packets -> RDMA messages per queue pair, with NCCL's IB semantics.

Wire format (IBTA vol. 1 ch. 9 and the RoCE annexes, as implemented by scapy's contrib/roce.py, Wireshark's
packet-infiniband.c and Linux rxe; NCCL src/transport/net_ib read at the v2.12.12 ... v2.30.3 tags and master):
- RoCEv2: IPv4/IPv6, UDP destination port 4791, then the IB transport packet. RoCEv1: ethertype 0x8915, a
  40-byte GRH (laid out like an IPv6 header, next header 0x1B), then the transport packet.
- Transport packet: BTH (12 bytes, big-endian: opcode | SE M PadCnt TVer | P_Key | FECN BECN resv6 |
  DestQP(24) | AckReq resv7 | PSN(24)), extension headers chosen by the opcode (DETH 8, RETH 16 =
  VA u64 R_Key u32 DMA-length u32, AETH 4 = syndrome u8 MSN u24, ImmDt 4, IETH 4, AtomicETH 28,
  AtomicAckETH 8), payload, PadCnt pad bytes, ICRC (4 bytes, stored little-endian).
- ICRC: CRC-32 over 8 bytes of 0xFF, the IP header (IPv4: TOS, TTL, checksum set to ones; IPv6 / GRH:
  traffic class, flow label, hop limit set to ones), the UDP header (checksum set to ones; none in v1), the
  BTH with its FECN/BECN/resv6 byte set to ones, and everything after it up to the ICRC.
- A message is one packet (ONLY) or FIRST, MIDDLE..., LAST on one queue pair, PSN +1 per packet; a READ
  request consumes one PSN per response packet, which come back carrying the request's PSNs. The responder
  acknowledges with ACK packets whose AETH syndrome says ACK (0x00), RNR NAK (0x20) or NAK (0x60 | code).
  CNP (opcode 0x81) is the congestion notification of RoCEv2 congestion control (DCQCN).
- NCCL (net_ib): its CTS FIFO entries and write immediates are read by decoders.protocols.roce.nccl_ib. Per
  connection NCCL sets up its QPs over a TCP connection (handshake magic + type 4) on which both sides send
  their connection metadata: QP numbers, GIDs, the CTS FIFO address and rkey. Its layout changes between
  versions, so this decoder only looks values up in it.

Streams are (source, destination, destination QP). Retransmission = a request PSN at or behind the highest
seen (go-back-N resends from the lost PSN); capture loss = PSNs never seen.

What a stream is claimed on: a packet whose ICRC verifies proves RoCE, and on such a stream packets with a bad
ICRC are counted and ignored, as the receiving adapter drops them. Where no ICRC verifies (tools that rewrite
frames, captures cut before the ICRC) the stream is claimed, `icrc_verified` false with a warning, only on the
transport's own structure: every BTH well formed (TVer and reserved bits 0, whole 4-byte words, pad on LAST
packets only, ACKs without payload), one transport and P_Key, FIRST and MIDDLE packets one path MTU, WRITEs
as long as their RETH says, and consecutive request PSNs or PSNs answering the other way's requests. Random
bytes pass that at most once in 2^17 per packet and 2^24 per PSN pair; other streams stay unclaimed UDP.

Collectives are not inferred here: they need every capture of the job (decoders.protocols.nccl.collectives).
"""
from __future__ import annotations

import struct
import zlib
from collections import deque
from dataclasses import dataclass, field

from dlcsniff.decoders.packet import (LINKTYPE_ETHERNET, LINKTYPE_IPV4, LINKTYPE_IPV6, LINKTYPE_LINUX_SLL,
                                      LINKTYPE_LINUX_SLL2, LINKTYPE_RAW, ip_to_str)
from dlcsniff.decoders.protocols.base import CaptureRows, Count, LossCounter, ProtocolDecoderBase, TcpDirection
from dlcsniff.decoders.protocols.nccl_socket.decoder import (HANDSHAKE, HEAD_DIGEST_BYTES, NCCL_SOCKET_MAGIC,
                                                             SAMPLE_BYTES, line_protocol)
from dlcsniff.decoders.protocols.roce.nccl_ib import CtsEntry, nccl_imm_bytes, parse_cts
from dlcsniff.decoders.sansio import NEED_DATA, Sentinel

ROCE_V2_UDP_PORT = 4791
ETHERTYPE_ROCE_V1 = 0x8915
GRH_NEXT_HEADER_BTH = 0x1B
CNP_OPCODE = 0x81
NCCL_SOCKET_TYPE_NET_IB = 4
PSN_MODULUS = 1 << 24
_PSN_HALF = 1 << 23
MIN_PATH_MTU = 256
MAX_PENDING_PACKETS = 1024       # packets held behind a PSN hole before the hole is declared lost
KEPT_PAYLOAD_BYTES = 512         # single-packet WRITE payloads up to this size are kept (CTS, size arrays)
SETUP_KEPT_BYTES = 64 << 10      # bytes kept per direction of an NCCL IB set-up connection
MAX_TRACKED_READS = 256          # READ requests per stream whose (possibly repeated) responses are matched
ATOMIC_OPERAND_BYTES = 8         # an atomic reads and writes one u64 at its VA

_ETHERTYPE_IPV4 = 0x0800
_ETHERTYPE_IPV6 = 0x86DD
_VLAN_TPIDS = frozenset((0x8100, 0x88A8, 0x9100))
_IPPROTO_UDP = 17
_U16 = struct.Struct("!H")
_IPV4 = struct.Struct("!B5xHxB")         # version+IHL, flags+fragment offset, protocol
_IPV6 = struct.Struct("!IHB")            # version/class/flow, payload length, next header
_UDP = struct.Struct("!HHH")             # source port, destination port, length
_BTH = struct.Struct("!BBHII")           # opcode, SE/M/PadCnt/TVer, P_Key, FECN/BECN/resv6+DestQP, AckReq/resv7+PSN
BTH_BYTES = 12
_RETH = struct.Struct("!QII")
_U32_BE = struct.Struct("!I")
_ICRC = struct.Struct("<I")
_ICRC_SEED = zlib.crc32(b"\xff" * 8)     # the masked LRH: 8 bytes of ones

# AETH syndrome (bits 7..5)
AETH_ACK, AETH_RNR_NAK, AETH_NAK = 0x00, 0x20, 0x60
_AETH_TYPE_MASK = 0xE0

FIRST, MIDDLE, LAST, ONLY = "FIRST", "MIDDLE", "LAST", "ONLY"
_STARTS = frozenset((FIRST, ONLY))
_ENDS = frozenset((LAST, ONLY))
_HEADER_BYTES = {"D": 8, "R": 16, "A": 4, "K": 8, "T": 28, "I": 4, "V": 4}   # DETH RETH AETH AtomicAckETH
#                                                                              AtomicETH ImmDt IETH


@dataclass(frozen=True, slots=True)
class Opcode:
    code: int
    name: str
    kind: str                    # SEND WRITE READ_REQUEST READ_RESPONSE ACK ATOMIC ATOMIC_ACK CNP
    position: str                # FIRST MIDDLE LAST ONLY
    reth_at: int                 # offset after the BTH, or -1
    aeth_at: int
    imm_at: int
    header_bytes: int            # extension headers after the BTH


def _opcode(code: int, name: str, kind: str, position: str, headers: str) -> Opcode:
    at = {}
    offset = 0
    for h in headers:
        at[h] = offset
        offset += _HEADER_BYTES[h]
    return Opcode(code, name, kind, position, at.get("R", -1), at.get("A", -1), at.get("I", -1), offset)


_RC_UC_OPCODES = [(0x00, "SEND_FIRST", "SEND", FIRST, ""), (0x01, "SEND_MIDDLE", "SEND", MIDDLE, ""),
                  (0x02, "SEND_LAST", "SEND", LAST, ""), (0x03, "SEND_LAST_WITH_IMMEDIATE", "SEND", LAST, "I"),
                  (0x04, "SEND_ONLY", "SEND", ONLY, ""), (0x05, "SEND_ONLY_WITH_IMMEDIATE", "SEND", ONLY, "I"),
                  (0x06, "RDMA_WRITE_FIRST", "WRITE", FIRST, "R"), (0x07, "RDMA_WRITE_MIDDLE", "WRITE", MIDDLE, ""),
                  (0x08, "RDMA_WRITE_LAST", "WRITE", LAST, ""),
                  (0x09, "RDMA_WRITE_LAST_WITH_IMMEDIATE", "WRITE", LAST, "I"),
                  (0x0A, "RDMA_WRITE_ONLY", "WRITE", ONLY, "R"),
                  (0x0B, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", "WRITE", ONLY, "RI")]
_RC_ONLY_OPCODES = [(0x0C, "RDMA_READ_REQUEST", "READ_REQUEST", ONLY, "R"),
                    (0x0D, "RDMA_READ_RESPONSE_FIRST", "READ_RESPONSE", FIRST, "A"),
                    (0x0E, "RDMA_READ_RESPONSE_MIDDLE", "READ_RESPONSE", MIDDLE, ""),
                    (0x0F, "RDMA_READ_RESPONSE_LAST", "READ_RESPONSE", LAST, "A"),
                    (0x10, "RDMA_READ_RESPONSE_ONLY", "READ_RESPONSE", ONLY, "A"),
                    (0x11, "ACKNOWLEDGE", "ACK", ONLY, "A"), (0x12, "ATOMIC_ACKNOWLEDGE", "ATOMIC_ACK", ONLY, "AK"),
                    (0x13, "COMPARE_SWAP", "ATOMIC", ONLY, "T"), (0x14, "FETCH_ADD", "ATOMIC", ONLY, "T"),
                    (0x16, "SEND_LAST_WITH_INVALIDATE", "SEND", LAST, "V"),
                    (0x17, "SEND_ONLY_WITH_INVALIDATE", "SEND", ONLY, "V")]
OPCODES: dict[int, Opcode] = {
    **{c: _opcode(c, "RC_" + n, k, p, h) for c, n, k, p, h in _RC_UC_OPCODES + _RC_ONLY_OPCODES},
    **{0x20 + c: _opcode(0x20 + c, "UC_" + n, k, p, h) for c, n, k, p, h in _RC_UC_OPCODES},
    0x64: _opcode(0x64, "UD_SEND_ONLY", "SEND", ONLY, "D"),
    0x65: _opcode(0x65, "UD_SEND_ONLY_WITH_IMMEDIATE", "SEND", ONLY, "DI"),
    CNP_OPCODE: _opcode(CNP_OPCODE, "CNP", "CNP", ONLY, ""),
}
_REQUEST_KINDS = frozenset(("SEND", "WRITE", "READ_REQUEST", "ATOMIC"))
_RESPONSE_KINDS = frozenset(("READ_RESPONSE", "ACK", "ATOMIC_ACK"))
_PATH_MTUS = frozenset((256, 512, 1024, 2048, 4096))        # IBTA path MTUs
MAX_ANSWER_PSNS = 64             # response PSNs kept per stream, to find the requests they answer


# -- one packet --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RocePacket:
    """The transport headers of one RoCE packet (wire lengths, whatever the capture kept)."""
    ts_ns: int
    version: int                 # 1 (GRH) or 2 (UDP)
    src: bytes                   # IP address (v2) or GID (v1)
    dst: bytes
    opcode: Opcode
    dest_qp: int
    psn: int
    fecn: bool
    becn: bool
    ecn_ce: bool                 # IP ECN "congestion experienced" (the mark a CNP answers)
    udp_src_port: int | None     # RoCEv2: the UDP source port (the entropy ECMP hashes on); None for RoCEv1
    payload_bytes: int           # after the extension headers, without pad and ICRC
    reth: tuple[int, int, int] | None     # (VA, R_Key, DMA length); atomics: (VA, R_Key, 8) from AtomicETH
    syndrome: int | None         # AETH
    imm: int | None              # ImmDt as an unsigned big-endian integer
    icrc: int | None             # the ICRC the packet carries (None: the capture cut it off)
    icrc_ok: bool | None
    payload: memoryview | None   # the captured payload (None when cut)
    head: memoryview             # the payload's first bytes the capture kept (all of it, or up to the cut)
    pkey: int = 0xFFFF
    well_formed: bool = True     # TVer 0, reserved bits 0, pad and length as the opcode allows (module doc)


def _network(linktype: int, data: memoryview) -> tuple[int, int]:
    """(ethertype, offset of the network header) for the link types that can carry RoCE."""
    if linktype == LINKTYPE_ETHERNET:
        ethertype, offset = _U16.unpack_from(data, 12)[0], 14
        while ethertype in _VLAN_TPIDS:
            ethertype, offset = _U16.unpack_from(data, offset + 2)[0], offset + 4
        return ethertype, offset
    if linktype == LINKTYPE_LINUX_SLL:
        return _U16.unpack_from(data, 14)[0], 16
    if linktype == LINKTYPE_LINUX_SLL2:
        return _U16.unpack_from(data, 0)[0], 20
    if linktype in (LINKTYPE_RAW, LINKTYPE_IPV4, LINKTYPE_IPV6):
        return (_ETHERTYPE_IPV4 if data[0] >> 4 == 4 else _ETHERTYPE_IPV6), 0
    return 0, 0


def compute_icrc(frame: bytes | memoryview, network_offset: int, bth_offset: int, end: int) -> int:
    """The ICRC of the RoCE packet whose network header (IPv4, IPv6 or GRH) starts at `network_offset`,
    BTH at `bth_offset`, and which ends (ICRC included) at `end`."""
    frame = memoryview(frame)
    network = bytearray(frame[network_offset:bth_offset])
    if network[0] >> 4 == 4:
        header_bytes = (network[0] & 0x0F) * 4
        network[1] = 0xFF                        # TOS (DSCP + ECN)
        network[8] = 0xFF                        # TTL
        network[10:12] = b"\xff\xff"             # header checksum
    else:                                        # IPv6 header or GRH: same layout
        header_bytes = 40
        network[0] |= 0x0F                       # traffic class ...
        network[1:4] = b"\xff\xff\xff"           # ... and flow label
        network[7] = 0xFF                        # hop limit
    if len(network) > header_bytes:              # RoCEv2: the UDP header follows
        network[header_bytes + 6:header_bytes + 8] = b"\xff\xff"
    bth = bytearray(frame[bth_offset:bth_offset + BTH_BYTES])
    bth[4] = 0xFF                                # FECN, BECN, resv6
    crc = zlib.crc32(network, _ICRC_SEED)
    crc = zlib.crc32(bth, crc)
    return zlib.crc32(frame[bth_offset + BTH_BYTES:end - 4], crc)


def parse_roce(linktype: int, data: bytes | memoryview, ts_ns: int) -> RocePacket | None:
    """The RoCE packet in one captured frame, or None if the frame is not RoCE (or its headers are cut)."""
    data = memoryview(data)
    try:
        ethertype, net = _network(linktype, data)
        if ethertype == _ETHERTYPE_IPV4:
            version_ihl, fragment, protocol = _IPV4.unpack_from(data, net)
            header_len = (version_ihl & 0x0F) * 4
            if protocol != _IPPROTO_UDP or fragment & 0x3FFF or version_ihl >> 4 != 4 or header_len < 20:
                return None
            udp = net + header_len
            src, dst = data[net + 12:net + 16], data[net + 16:net + 20]
            ecn_ce = data[net + 1] & 3 == 3
        elif ethertype in (_ETHERTYPE_IPV6, ETHERTYPE_ROCE_V1):
            first_word, payload_len, next_header = _IPV6.unpack_from(data, net)
            if ethertype == ETHERTYPE_ROCE_V1:
                if next_header != GRH_NEXT_HEADER_BTH:
                    return None
                udp = None
            elif next_header == _IPPROTO_UDP:
                udp = net + 40
            else:
                return None
            src, dst = data[net + 8:net + 24], data[net + 24:net + 40]
            ecn_ce = (first_word >> 20) & 3 == 3
            end = net + 40 + payload_len
        else:
            return None
        if udp is not None:
            sport, dport, udp_len = _UDP.unpack_from(data, udp)
            if dport != ROCE_V2_UDP_PORT:
                return None
            bth = udp + 8
            end = udp + udp_len
        else:
            sport = None
            bth = net + 40
        code, flags, pkey, resv_qp, ack_psn = _BTH.unpack_from(data, bth)
        opcode = OPCODES.get(code)
        if opcode is None:
            return None
        ext = bth + BTH_BYTES
        payload_at = ext + opcode.header_bytes
        pad = (flags >> 4) & 3
        payload_bytes = end - 4 - pad - payload_at
        if payload_bytes < 0:
            return None
        if opcode.reth_at >= 0:
            reth = _RETH.unpack_from(data, ext + opcode.reth_at)
        elif opcode.kind == "ATOMIC":        # AtomicETH: VA u64, R_Key u32, then the 8-byte operands
            reth = _RETH.unpack_from(data, ext)[:2] + (ATOMIC_OPERAND_BYTES,)
        else:
            reth = None
        syndrome = data[ext + opcode.aeth_at] if opcode.aeth_at >= 0 else None
        imm = _U32_BE.unpack_from(data, ext + opcode.imm_at)[0] if opcode.imm_at >= 0 else None
    except (struct.error, IndexError):
        return None
    captured = len(data) >= end
    icrc = _ICRC.unpack_from(data, end - 4)[0] if captured else None
    well_formed = (not flags & 0x0F and not (resv_qp >> 24) & 0x3F and not (ack_psn >> 24) & 0x7F
                   and not (payload_bytes + pad) % 4 and not (pad and opcode.position in (FIRST, MIDDLE))
                   and not (payload_bytes and opcode.kind in ("ACK", "ATOMIC_ACK")))
    return RocePacket(ts_ns, 2 if udp is not None else 1, bytes(src), bytes(dst), opcode, resv_qp & 0xFFFFFF,
                      ack_psn & 0xFFFFFF, bool(resv_qp >> 31), bool((resv_qp >> 30) & 1), ecn_ce, sport, payload_bytes,
                      reth, syndrome, imm, icrc, None if icrc is None else compute_icrc(data, net, bth, end) == icrc,
                      data[payload_at:payload_at + payload_bytes] if captured else None,
                      data[payload_at:payload_at + payload_bytes], pkey, well_formed)


def unverified_warning(capture: str, counts: dict[str, int]) -> str | None:
    """The summary's word on the streams of one capture claimed without a verified ICRC (from its counters)."""
    streams = counts.get("roce_unverified_streams", 0)
    if not streams:
        return None
    bad, cut = counts.get("roce_unverified_bad_icrc", 0), counts.get("roce_unverified_icrc_unchecked", 0)
    return (f"{capture}: {streams} RoCE queue-pair streams claimed without a verified ICRC ({bad:,} packets whose "
            f"ICRC failed, {cut:,} cut before it: a capture tool that rewrites frames or cuts them short), on their "
            "transport headers alone: opcodes of one transport, PSNs in sequence or answered, pad and lengths "
            "consistent (streams.icrc_verified = false)")


# -- messages and queue pairs --------------------------------------------------------------------------

class RdmaMessage:
    """One RDMA message of a queue pair (SEND, WRITE, READ, ATOMIC), the event `_QueuePair.next_event` hands back
    once the queue pair has assembled it. The capture decoder adds what other streams say to it: a READ's
    responses (they come the other way) and the NCCL roles of the capture's writes."""
    __slots__ = ("kind", "psn", "ts_first_ns", "ts_last_ns", "payload_bytes", "packets", "missing_packets",
                 "has_first", "has_last", "va", "rkey", "dma_length", "imm", "content", "response_psns",
                 "span", "nccl_role", "nccl_tag", "nccl_fifo_idx", "nccl_nreqs", "nccl_bytes", "nccl_sizes",
                 "nccl_addrs", "head_crc32", "line_protocol")

    def __init__(self, kind: str, psn: int, ts_ns: int):
        self.kind = kind                 # SEND, WRITE, READ, ATOMIC
        self.psn = psn
        self.ts_first_ns = self.ts_last_ns = ts_ns
        self.payload_bytes = 0           # unique payload bytes seen (READ: response bytes)
        self.packets = 0
        self.missing_packets = 0
        self.has_first = self.has_last = False
        self.va = self.rkey = self.dma_length = self.imm = None
        self.content: bytes | None = None
        self.response_psns: set[int] | None = None   # READ: response PSNs seen
        self.span = 0                    # READ: most response packets it can take
        self.nccl_role = self.nccl_tag = self.nccl_fifo_idx = self.nccl_nreqs = self.nccl_bytes = None
        self.nccl_sizes = self.nccl_addrs = None
        self.head_crc32: int | None = None    # CRC-32 of the first HEAD_DIGEST_BYTES payload bytes, if captured
        self.line_protocol: str | None = None  # NCCL's LL / LL128 / Simple, from the first payload bytes

    @property
    def complete(self) -> bool:
        if self.kind == "READ":
            return self.has_last and not self.missing_packets and self.payload_bytes == self.dma_length
        return self.has_first and self.has_last and not self.missing_packets

    @property
    def size_bytes(self) -> int:
        if self.dma_length is not None and (self.kind in ("READ", "ATOMIC") or not self.complete):
            return self.dma_length
        return self.payload_bytes

    def add(self, pkt: RocePacket) -> None:
        self.payload_bytes += pkt.payload_bytes
        self.packets += 1
        self.ts_last_ns = max(self.ts_last_ns, pkt.ts_ns)


@dataclass(frozen=True, slots=True)
class ReadResponse:
    """A READ response packet: the READ it answers was requested on the stream the other way, which the capture
    decoder matches it to (`RoceCaptureDecoder._read_response`)."""
    packet: RocePacket


class _QueuePair:
    """A stream decoder for one stream: the packets from `src` to `dst` for destination QP `dest_qp`.

    A queue pair is a packet sequence, not bytes, so the one shape of decoders.sansio takes packets as its data
    unit: `receive_data(packet, ts_ns)` for each parsed RocePacket of the stream, `receive_gap` when the capture
    reports packets lost (their PSNs say which), `receive_end(ts_ns)` at the end of the capture, and
    `next_event()`: `RdmaMessage` as each message is assembled in PSN order, `ReadResponse` for the capture
    decoder to match, then NEED_DATA. Its counters (packets, ICRCs, CNPs, ACKs, retransmissions) and the
    evidence that it is RoCE at all (module doc) are its state.
    """

    def __init__(self, index: int, pkt: RocePacket):
        self.index = index
        self.src, self.dst, self.dest_qp, self.version = pkt.src, pkt.dst, pkt.dest_qp, pkt.version
        self.transport = pkt.opcode.name.split("_", 1)[0]
        self.first_ts_ns = self.last_ts_ns = pkt.ts_ns
        self.packets = self.bytes = self.bad_icrc = self.icrc_unchecked = self.cnp = self.ecn_ce_packets = 0
        self.retransmitted_packets = self.lost_packets = self.acks = self.naks = self.unmatched_responses = 0
        self.udp_src_ports: dict[int, int] = {}     # RoCEv2 source port -> packets
        # when each CNP, NAK and retransmitted packet was seen (to tell which operation they hit)
        self.cnp_times_ns: list[int] = []
        self.nak_times_ns: list[int] = []
        self.retransmitted_times_ns: list[int] = []
        self.path_mtu: int | None = None
        self.expected_psn: int | None = None    # extended PSN (unwrapped) of the next request packet
        self.highest_psn: int | None = None
        self.read_reserve_end: int | None = None   # after a READ of unknown span: PSNs it may have taken
        self.pending: dict[int, RocePacket] = {}    # request packets beyond a PSN hole
        self.current: RdmaMessage | None = None
        self.reads: list[RdmaMessage] = []       # READ requests whose responses may still come
        self._events: deque[RdmaMessage | ReadResponse] = deque()
        self.peer: _QueuePair | None = None       # the stream the other way on the same QP pair, when known
        self.src_rank = self.dst_rank = self.nccl_direction = self.nccl_setup_stream_id = None
        # the evidence it is RoCE (module doc)
        self.verified = 0                # packets whose ICRC verified
        self.icrc_proves: bool | None = None   # its first packet with an ICRC verified (None: none had one yet)
        self.pkey = pkt.pkey
        self.malformed = 0               # packets of another transport or P_Key, or not well formed
        self.segment_bytes: int | None = None  # the payload of its first FIRST / MIDDLE packet
        self.first_request_psn: int | None = None
        self.last_request_psn: int | None = None
        self.consecutive_psns = 0        # request packets whose PSN follows the previous request's
        self.answer_psns: list[int] = []      # PSNs of its first ACK / READ response / atomic ACK packets

    # -- the stream decoder's shape ---------------------------------------------------------------------
    def receive_data(self, packet: RocePacket, ts_ns: int) -> None:
        """One packet of the stream (`ts_ns` is its capture time, `packet.ts_ns`)."""
        self._count(packet)
        if not self._reads_icrc(packet):
            return
        kind = packet.opcode.kind
        if kind in _REQUEST_KINDS:
            self._request(packet)
        elif kind == "READ_RESPONSE":
            self._events.append(ReadResponse(packet))
        elif kind == "CNP":
            self.cnp += 1
            self.cnp_times_ns.append(ts_ns)
        else:                                        # ACK, ATOMIC_ACK
            syndrome_type = packet.syndrome & _AETH_TYPE_MASK
            if syndrome_type == AETH_ACK:
                self.acks += 1
            elif syndrome_type in (AETH_NAK, AETH_RNR_NAK):
                self.naks += 1
                self.nak_times_ns.append(ts_ns)

    def receive_gap(self, size: int, ts_ns: int, *, lost: bool = True) -> None:
        """The capture reports `size` packets lost: which ones the PSNs say, so the holes before the packets
        held now are lost at once instead of waited for."""
        self._advance(flush=True)

    def receive_end(self, ts_ns: int) -> None:
        """The capture is over: the holes still open are lost, the message under way ends incomplete."""
        self._advance(flush=True)
        self._close_current()

    def next_event(self) -> RdmaMessage | ReadResponse | Sentinel:
        return self._events.popleft() if self._events else NEED_DATA

    # -- counters and evidence -------------------------------------------------------------------------
    def _count(self, pkt: RocePacket) -> None:
        self.packets += 1
        self.bytes += pkt.payload_bytes
        self.last_ts_ns = max(self.last_ts_ns, pkt.ts_ns)
        self.ecn_ce_packets += pkt.ecn_ce
        if pkt.udp_src_port is not None:
            self.udp_src_ports[pkt.udp_src_port] = self.udp_src_ports.get(pkt.udp_src_port, 0) + 1
        if pkt.icrc_ok is None:
            self.icrc_unchecked += 1
        elif pkt.icrc_ok:
            self.verified += 1
        else:
            self.bad_icrc += 1
        self._weigh(pkt)

    def _weigh(self, pkt: RocePacket) -> None:
        """The packet's share of the evidence that the stream is RoCE, should no ICRC verify (module doc)."""
        op = pkt.opcode
        if op.kind == "CNP":                 # sent to a requester's QP, beside its ACKs
            return
        if self.transport == "CNP":          # the stream's first packet was a CNP
            self.transport = op.name.split("_", 1)[0]
        segment = op.position in (FIRST, MIDDLE)
        if segment and self.segment_bytes is None:
            self.segment_bytes = pkt.payload_bytes
        if (not pkt.well_formed or pkt.pkey != self.pkey or not op.name.startswith(self.transport)
                or (segment and (pkt.payload_bytes != self.segment_bytes or pkt.payload_bytes not in _PATH_MTUS))):
            self.malformed += 1
        if op.kind in _REQUEST_KINDS:
            if self.first_request_psn is None:
                self.first_request_psn = pkt.psn
            elif (pkt.psn - self.last_request_psn) & (PSN_MODULUS - 1) == 1:
                self.consecutive_psns += 1
            self.last_request_psn = pkt.psn
        elif op.kind in _RESPONSE_KINDS and len(self.answer_psns) < MAX_ANSWER_PSNS:
            self.answer_psns.append(pkt.psn)

    def _reads_icrc(self, pkt: RocePacket) -> bool:
        """Whether to read the packet as its receiver would: not when its ICRC failed on a stream whose ICRCs
        prove something (its first one verified, or one has since). A stream whose first ICRC failed reads every
        packet until one verifies."""
        if pkt.icrc_ok is not None and (self.icrc_proves is None or pkt.icrc_ok):
            self.icrc_proves = pkt.icrc_ok
        return pkt.icrc_ok is not False or self.icrc_proves is False

    def answers(self, requests: _QueuePair) -> bool:
        """Whether some response PSN on this stream is one of the PSNs `requests` (the other way) used."""
        if requests.first_request_psn is None or requests.expected_psn is None:
            return False
        used = requests.expected_psn - requests.first_request_psn
        return any((psn - requests.first_request_psn) & (PSN_MODULUS - 1) < used for psn in self.answer_psns)

    def learn_path_mtu(self, payload_bytes: int) -> None:
        """FIRST and MIDDLE packets carry exactly one path MTU of payload."""
        if self.path_mtu is None and payload_bytes >= MIN_PATH_MTU:
            self.path_mtu = payload_bytes

    # -- requests in PSN order -----------------------------------------------------------------------
    def _request(self, pkt: RocePacket) -> None:
        if self.expected_psn is None:
            self.expected_psn = pkt.psn
            self.highest_psn = pkt.psn - 1
        delta = (pkt.psn - self.expected_psn) & (PSN_MODULUS - 1)
        psn = self.expected_psn + (delta - PSN_MODULUS if delta >= _PSN_HALF else delta)
        if psn <= self.highest_psn:
            self.retransmitted_packets += 1
            self.retransmitted_times_ns.append(pkt.ts_ns)
        else:
            self.highest_psn = psn
        if psn < self.expected_psn or psn in self.pending:
            return
        self.pending[psn] = pkt
        self._advance(flush=False)

    def _advance(self, flush: bool) -> None:
        """Assemble the pending packets that continue the PSN sequence; with `flush` (or too many waiting)
        the holes before them are lost to the capture."""
        pending = self.pending
        while pending:
            pkt = pending.pop(self.expected_psn, None)
            if pkt is not None:
                self._assemble(pkt, self.expected_psn)
                continue
            first = min(pending)
            if self.read_reserve_end is not None and first <= self.read_reserve_end:
                self.expected_psn = first          # the READ took these PSNs for its responses
            elif flush or len(pending) > MAX_PENDING_PACKETS:
                self._lose(first - self.expected_psn)
                self.expected_psn = first
            else:
                return
            self.read_reserve_end = None

    def _lose(self, count: int) -> None:
        self.lost_packets += count
        cur = self.current
        if cur is not None:
            cur.missing_packets += count

    def _assemble(self, pkt: RocePacket, psn: int) -> None:
        op = pkt.opcode
        self.expected_psn = psn + 1
        self.read_reserve_end = None
        if op.kind == "ATOMIC":             # one packet, its operands in the header: a message of its own
            self._close_current()
            msg = self._start("ATOMIC", pkt)
            msg.va, msg.rkey, msg.dma_length = pkt.reth
            msg.has_first = msg.has_last = True
            msg.add(pkt)
            self._events.append(msg)
            return
        if op.kind == "READ_REQUEST":       # a message of its own too, whose responses come the other way
            self._close_current()
            msg = self._start("READ", pkt)
            msg.va, msg.rkey, msg.dma_length = pkt.reth
            msg.has_first = True
            msg.response_psns = set()
            responses = max(1, -(-msg.dma_length // (self.path_mtu or MIN_PATH_MTU)))
            msg.span = responses
            if self.path_mtu is not None:
                self.expected_psn = psn + responses
            else:
                self.read_reserve_end = psn + responses - 1
            self.reads.append(msg)
            del self.reads[:-MAX_TRACKED_READS]
            self._events.append(msg)
            return
        cur = self.current
        if cur is not None and op.position not in _STARTS and cur.missing_packets and self._ended_in_hole(cur):
            self._close_current()
            cur = None
        if op.position in _STARTS:
            self._close_current()
            cur = self.current = self._start(op.kind, pkt)
            cur.has_first = True
            if pkt.reth is not None:
                cur.va, cur.rkey, cur.dma_length = pkt.reth
            if op.position == ONLY and pkt.payload is not None and pkt.payload_bytes <= KEPT_PAYLOAD_BYTES:
                cur.content = bytes(pkt.payload)
            if pkt.payload_bytes and len(pkt.head) >= min(HEAD_DIGEST_BYTES, pkt.payload_bytes):
                cur.head_crc32 = zlib.crc32(pkt.head[:HEAD_DIGEST_BYTES])
                cur.line_protocol = line_protocol(bytes(pkt.head[:SAMPLE_BYTES]),
                                                  pkt.reth[2] if pkt.reth is not None else pkt.payload_bytes)
        elif cur is None or cur.kind != op.kind:
            self._close_current()
            cur = self.current = self._start(op.kind, pkt)      # its first packets were never seen
        cur.add(pkt)
        if op.position in (FIRST, MIDDLE):
            self.learn_path_mtu(pkt.payload_bytes)
        if pkt.imm is not None:
            cur.imm = pkt.imm
        if op.position in _ENDS:
            cur.has_last = True
            self._close_current()

    def _close_current(self) -> None:
        """The message under way is done (its last packet came, or another message began): its event."""
        if self.current is not None:
            self._events.append(self.current)
            self.current = None

    def _ended_in_hole(self, msg: RdmaMessage) -> bool:
        """Whether the packets lost inside `msg` must have held its end (its RETH length is reached)."""
        return (msg.dma_length is not None and self.path_mtu is not None
                and msg.payload_bytes + msg.missing_packets * self.path_mtu >= msg.dma_length)

    @staticmethod
    def _start(kind: str, pkt: RocePacket) -> RdmaMessage:
        return RdmaMessage(kind, pkt.psn, pkt.ts_ns)

    def find_read(self, psn: int) -> RdmaMessage | None:
        """The READ request (on this stream) whose response PSNs include `psn`."""
        for msg in self.reads:
            if (psn - msg.psn) & (PSN_MODULUS - 1) < msg.span:
                return msg
        return None


# -- the capture-level decoder ---------------------------------------------------------------------------

def _writes_fit_their_reth(messages: list[RdmaMessage]) -> bool:
    """Every whole RDMA WRITE carried the length its RETH announced."""
    return all(msg.payload_bytes == msg.dma_length for msg in messages
               if msg.kind == "WRITE" and msg.complete and msg.dma_length is not None)


def _gid(address: bytes) -> bytes:
    """The RoCE GID of an IP address: IPv4 addresses are IPv4-mapped IPv6 GIDs."""
    return b"\x00" * 10 + b"\xff\xff" + address if len(address) == 4 else address


@dataclass(slots=True)
class _SetupConnection:
    """An NCCL IB set-up TCP connection: what each side sent (first SETUP_KEPT_BYTES)."""
    connector_stream: int                         # the NCCL sender's side (it connects)
    acceptor_stream: int | None = None
    connector_bytes: bytearray = field(default_factory=bytearray)
    acceptor_bytes: bytearray = field(default_factory=bytearray)


class RoceCaptureDecoder(ProtocolDecoderBase):
    """RoCE packets of one capture (`receive_packet`), plus NCCL's IB set-up TCP connections (claimed).

    Each stream's packets go to its `_QueuePair` stream decoder; the messages it hands back are matched across
    streams here (READ responses, NCCL's CTS entries and the writes that fill them, set-up connections).

    Rows at the end of the capture: one message row per RDMA message (SEND, WRITE, READ, ATOMIC; NCCL roles
    annotated), one extra stream row per (source, destination, destination QP); messages name theirs by
    "extra_stream" (the row's index in `extra_streams`).
    """

    name = "roce"
    losses = {"roce": (LossCounter("lost_packets", "packets missing from the PSN sequences"),)}

    def __init__(self):
        super().__init__()
        self._qps: dict[tuple[bytes, bytes, int], _QueuePair] = {}
        self._by_hosts: dict[tuple[bytes, bytes], list[_QueuePair]] = {}
        self._messages: dict[_QueuePair, list[RdmaMessage]] = {}     # each stream's messages, from its events
        self._setups: dict[int, _SetupConnection] = {}          # TCP stream id -> its set-up connection
        self._setup_keys: dict[tuple, _SetupConnection] = {}    # connector TCP key -> set-up connection

    # -- RoCE packets --------------------------------------------------------------------------------
    def receive_packet(self, packet) -> bool:
        pkt = parse_roce(packet.linktype, packet.data, packet.ts_ns)
        if pkt is None:
            return False
        key = (pkt.src, pkt.dst, pkt.dest_qp)
        qp = self._qps.get(key)
        if qp is None:
            qp = self._qps[key] = _QueuePair(len(self._qps), pkt)
            self._by_hosts.setdefault((pkt.src, pkt.dst), []).append(qp)
            self._messages[qp] = []
        qp.receive_data(pkt, pkt.ts_ns)
        self._take_events(qp)
        return True

    def _take_events(self, qp: _QueuePair) -> None:
        while (event := qp.next_event()) is not NEED_DATA:
            if event.__class__ is ReadResponse:
                self._read_response(qp, event.packet)
            else:
                self._messages[qp].append(event)

    def _read_response(self, qp: _QueuePair, pkt: RocePacket) -> None:
        read = None
        for requester in self._by_hosts.get((pkt.dst, pkt.src), ()):
            if requester.peer in (None, qp) and qp.peer in (None, requester):
                read = requester.find_read(pkt.psn)
                if read is not None:
                    break
        if read is None:
            qp.unmatched_responses += 1
            return
        requester.peer, qp.peer = qp, requester
        if pkt.psn in read.response_psns:
            qp.retransmitted_packets += 1
            qp.retransmitted_times_ns.append(pkt.ts_ns)
            return
        read.response_psns.add(pkt.psn)
        read.add(pkt)
        position = pkt.opcode.position
        if position in (FIRST, MIDDLE):
            qp.learn_path_mtu(pkt.payload_bytes)
            requester.learn_path_mtu(pkt.payload_bytes)
        if position in _ENDS:
            read.has_last = True
            read.missing_packets = ((pkt.psn - read.psn) & (PSN_MODULUS - 1)) + 1 - len(read.response_psns)
            read.span = len(read.response_psns) + read.missing_packets
        elif read.has_last:
            read.missing_packets -= 1             # a response the capture had skipped came again

    # -- NCCL IB set-up connections (TCP) ------------------------------------------------------------
    def claim(self, direction: TcpDirection, prefix: bytes) -> bool | None:
        stream_id, key = direction.stream_id, direction.key
        setup = self._setup_keys.get((key[2], key[3], key[0], key[1]))
        if setup is not None and setup.acceptor_stream is None:
            setup.acceptor_stream = stream_id
            self._setups[stream_id] = setup
            return True
        if len(prefix) < HANDSHAKE.size:
            return None
        if HANDSHAKE.unpack_from(prefix) != (NCCL_SOCKET_MAGIC, NCCL_SOCKET_TYPE_NET_IB):     # net_ib.cc
            return False
        setup = _SetupConnection(stream_id)
        self._setups[stream_id] = setup
        self._setup_keys[key] = setup
        return True

    def receive_data(self, stream_id: int, data: memoryview, ts_ns: int) -> None:
        setup = self._setups[stream_id]
        kept = setup.connector_bytes if stream_id == setup.connector_stream else setup.acceptor_bytes
        if len(kept) < SETUP_KEPT_BYTES:
            kept += data[:SETUP_KEPT_BYTES - len(kept)]

    def receive_gap(self, stream_id: int, size: int, ts_ns: int, lost: bool) -> None:
        """Lost set-up bytes only make the value look-ups miss."""

    def receive_end(self, stream_id: int, ts_ns: int) -> None:
        """Nothing is pending on a set-up connection."""

    # -- results -------------------------------------------------------------------------------------
    def end_of_capture(self) -> None:
        self._emit_rows(self._rows())

    def _rows(self) -> CaptureRows:
        qps = list(self._qps.values())
        for qp in qps:
            qp.receive_end(qp.last_ts_ns)
            self._take_events(qp)
        claimed = self._claimed(qps)
        # A stream that shows no RoCE: its datagrams are counted as unclaimed, not claimed as a queue pair.
        unproven = [qp for qp in qps if qp not in claimed]
        for version, name in ((2, "roce_v2_datagrams_unproven"), (1, "roce_v1_packets_unproven")):
            count = sum(qp.packets for qp in unproven if qp.version == version)
            if count:
                self._emit(Count(name, count))
        unverified = [qp for qp in qps if qp in claimed and not qp.verified]
        for name, count in (("roce_unverified_streams", len(unverified)),
                            ("roce_unverified_bad_icrc", sum(qp.bad_icrc for qp in unverified)),
                            ("roce_unverified_icrc_unchecked", sum(qp.icrc_unchecked for qp in unverified))):
            if count:
                self._emit(Count(name, count))
        qps = [qp for qp in qps if qp in claimed]
        for index, qp in enumerate(qps):
            qp.index = index
        self._nccl_semantics(qps)
        self._nccl_connections(qps)
        streams = {stream_id: {"protocol": "nccl_ib_setup"} for stream_id in self._setups}
        extra = [self._stream_row(qp) for qp in qps]
        messages = [self._message_row(qp, msg) for qp in qps for msg in self._messages[qp]]
        return CaptureRows(messages=messages, streams=streams, extra_streams=extra)

    def _claimed(self, qps: list[_QueuePair]) -> set[_QueuePair]:
        """The streams that show RoCE: a verified ICRC, or else the transport's structure (module doc)."""
        claimed = {qp for qp in qps if qp.verified}
        plausible = [qp for qp in qps if not qp.verified and not qp.malformed
                     and _writes_fit_their_reth(self._messages[qp])]
        claimed.update(qp for qp in plausible if qp.consecutive_psns)
        for responder in plausible:
            for requester in self._by_hosts.get((responder.dst, responder.src), ()):
                if (requester.verified or requester in plausible) and responder.answers(requester):
                    claimed.update((responder, requester))
        return claimed

    def _nccl_semantics(self, qps: list[_QueuePair]) -> None:
        """CTS writes, and each data write matched to the CTS entry whose buffer it fills (in time order)."""
        writes = sorted(((msg.ts_first_ns, qp.index, i, qp, msg) for qp in qps
                         for i, msg in enumerate(self._messages[qp])
                         if msg.kind == "WRITE"), key=lambda w: w[:3])
        fifos: dict[tuple[bytes, bytes], list[CtsEntry]] = {}      # (sender, receiver) -> open entries
        last_matched: dict[_QueuePair, list[CtsEntry]] = {}       # the CTS a QP last wrote data for
        for _, _, _, qp, msg in writes:
            if msg.imm is None and msg.content is not None and msg.has_first and msg.has_last:
                entries = parse_cts(msg.content)
                if entries is not None:
                    msg.nccl_role = "cts"
                    msg.nccl_tag, msg.nccl_fifo_idx, msg.nccl_nreqs = entries[0].tag, entries[0].idx, len(entries)
                    msg.nccl_sizes = [e.size for e in entries]
                    msg.nccl_addrs = [e.addr for e in entries]
                    qp.dst_rank = entries[0].tag
                    fifo = fifos.setdefault((qp.dst, qp.src), [])
                    for old in fifo:           # a buffer is offered again only once its last receive is done
                        if any(old.addr == e.addr and old.rkeys == e.rkeys for e in entries):
                            old.closed = True
                    fifo[:] = [e for e in fifo if not e.closed] + entries
                    continue
            entry = None
            if msg.va:
                entry = next((e for e in fifos.get((qp.src, qp.dst), ()) if not e.closed and msg.rkey in e.rkeys
                              and e.addr <= msg.va < e.addr + max(e.size, 1)), None)
            if entry is not None:
                group = [e for e in fifos[(qp.src, qp.dst)] if e.idx == entry.idx]
                last_matched[qp] = group
                entry.matched_bytes += msg.size_bytes
                if msg.imm is not None and entry.nreqs == 1 and nccl_imm_bytes(msg.imm) <= entry.size:
                    entry.send_bytes = msg.nccl_bytes = nccl_imm_bytes(msg.imm)
            elif msg.imm is not None and qp in last_matched:
                group = last_matched[qp]
                sent = nccl_imm_bytes(msg.imm)
                if msg.size_bytes == 0 and len(group) == 1 and sent <= group[0].size:   # adaptive routing
                    entry = group[0]
                    entry.send_bytes = msg.nccl_bytes = sent
                elif len(group) > 1 and msg.size_bytes == 4 * len(group) and msg.content is not None:
                    entry = group[0]
                    msg.nccl_sizes = list(struct.unpack(f"<{len(group)}i", msg.content))
                    for e, size in zip(group, msg.nccl_sizes):
                        e.send_bytes = size
            if entry is None:
                continue
            msg.nccl_role = "data"
            msg.nccl_tag, msg.nccl_fifo_idx, msg.nccl_nreqs = entry.tag, entry.idx, entry.nreqs
            qp.src_rank = entry.tag
            for e in last_matched.get(qp, ()):
                if e.send_bytes is not None and e.matched_bytes >= e.send_bytes:
                    e.closed = True

    def _nccl_connections(self, qps: list[_QueuePair]) -> None:
        """Tie QPs to the NCCL connection whose set-up advertised them (the destination's GID and QP number
        in what that side sent), and give every stream of the connection the sending rank."""
        for setup in {id(s): s for s in self._setups.values()}.values():
            members = []
            for qp in qps:
                qpn = qp.dest_qp.to_bytes(4, "little")
                gid = _gid(qp.dst)
                for direction, sent in (("cts", setup.connector_bytes), ("data", setup.acceptor_bytes)):
                    if gid in sent and qpn in sent:
                        qp.nccl_direction = direction
                        qp.nccl_setup_stream_id = setup.connector_stream
                        members.append(qp)
                        break
            ranks = {qp.src_rank for qp in members if qp.nccl_direction == "data" and qp.src_rank is not None}
            ranks |= {qp.dst_rank for qp in members if qp.nccl_direction == "cts" and qp.dst_rank is not None}
            if len(ranks) == 1:
                rank = ranks.pop()
                for qp in members:
                    if qp.nccl_direction == "data":
                        qp.src_rank = rank
                    else:
                        qp.dst_rank = rank

    @staticmethod
    def _stream_row(qp: _QueuePair) -> dict:
        return {"protocol": "roce", "src_ip": ip_to_str(qp.src), "dst_ip": ip_to_str(qp.dst), "dest_qp": qp.dest_qp,
                "packets": qp.packets, "bytes": qp.bytes, "bad_icrc": qp.bad_icrc, "cnp": qp.cnp,
                "retransmitted_packets": qp.retransmitted_packets, "naks": qp.naks,
                "ts_first_ns": qp.first_ts_ns, "ts_last_ns": qp.last_ts_ns, "acks": qp.acks,
                "lost_packets": qp.lost_packets, "icrc_unchecked": qp.icrc_unchecked,
                "ecn_ce_packets": qp.ecn_ce_packets, "unmatched_responses": qp.unmatched_responses,
                "roce_version": qp.version, "transport": qp.transport, "path_mtu_bytes": qp.path_mtu,
                "icrc_verified": bool(qp.verified),
                "src_rank": qp.src_rank, "dst_rank": qp.dst_rank, "nccl_direction": qp.nccl_direction,
                "nccl_setup_stream_id": qp.nccl_setup_stream_id,
                "udp_src_ports": sorted(qp.udp_src_ports), "udp_src_port_packets": [
                    qp.udp_src_ports[port] for port in sorted(qp.udp_src_ports)],
                "cnp_times_ns": qp.cnp_times_ns, "nak_times_ns": qp.nak_times_ns,
                "retransmitted_times_ns": qp.retransmitted_times_ns}

    @staticmethod
    def _message_row(qp: _QueuePair, msg: RdmaMessage) -> dict:
        op = msg.kind if msg.imm is None else msg.kind + "_IMM"
        return {"protocol": "roce", "extra_stream": qp.index, "src_ip": ip_to_str(qp.src),
                "dst_ip": ip_to_str(qp.dst), "ts_first_ns": msg.ts_first_ns, "ts_last_ns": msg.ts_last_ns,
                "size_bytes": msg.size_bytes, "complete": msg.complete, "rdma_op": op, "dest_qp": qp.dest_qp,
                "psn": msg.psn, "packets": msg.packets, "imm": msg.imm, "va": msg.va, "rkey": msg.rkey,
                "nccl_role": msg.nccl_role, "nccl_tag": msg.nccl_tag, "nccl_fifo_idx": msg.nccl_fifo_idx,
                "nccl_nreqs": msg.nccl_nreqs, "nccl_bytes": msg.nccl_bytes, "nccl_sizes_bytes": msg.nccl_sizes,
                "nccl_addrs": msg.nccl_addrs, "src_rank": qp.src_rank, "dst_rank": qp.dst_rank,
                "head_crc32": msg.head_crc32, "nccl_proto": msg.line_protocol if msg.nccl_role == "data" else None,
                "icrc_verified": bool(qp.verified)}
