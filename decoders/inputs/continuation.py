"""Whether one capture file takes up the TCP traffic where another one ended: evidence, from the packets, that
two files named alike are pieces of one capture and not two hosts' captures of one time. Time alone cannot
tell: node captures whose clocks are seconds apart (worker0.pcap 1.5 s ahead of worker1.pcap) look as if one
followed the other.

A file's edges are its first and its last EDGE_PACKETS packets; per TCP direction (addresses and ports) the
head is the sequence number the first packets start from, the tail the one the last packets reach. A piece
continues the one before when they share directions and none of them starts over: a direction may start a
little before the tail (a segment sent again, RETRANSMIT_SLACK_BYTES: a send window), never further back,
and never from its SYN (a connection opens once: a piece cannot show it opening after the piece before saw it
carry bytes, however few). Two hosts' captures of one time either share no direction (each is of its own host's
connections) or show a shared direction again from further back (both saw it carry its bytes), or from its
opening (a small job's connections carry less than a send window: both saw them open).
"""
from __future__ import annotations

from typing import Iterable

from dlcsniff.decoders.inputs.capture_file import Packet
from dlcsniff.decoders.packet import FIN, SYN, Segment, parse_packet

EDGE_PACKETS = 512
RETRANSMIT_SLACK_BYTES = 4 << 20      # Linux's largest default send buffer (tcp_wmem): 4 MiB
_SEQ_SPACE = 1 << 32
Direction = tuple[bytes, int, bytes, int]


def _segments(packets: Iterable[Packet]) -> Iterable[Segment]:
    for packet in packets:
        segment = parse_packet(packet.linktype, packet.data, packet.ts_ns)
        if segment.__class__ is Segment:
            yield segment


def _behind(seq: int, reference: int) -> int:
    """How many sequence numbers `seq` lies before `reference` (negative: after), in serial arithmetic."""
    return (reference - seq + _SEQ_SPACE // 2) % _SEQ_SPACE - _SEQ_SPACE // 2


def tcp_head(packets: Iterable[Packet]) -> dict[Direction, tuple[int, bool]]:
    """Per TCP direction in `packets` (a file's first), the sequence number its first segment starts at, and
    whether that segment is its SYN."""
    head: dict[Direction, tuple[int, bool]] = {}
    for seg in _segments(packets):
        head.setdefault((seg.src, seg.sport, seg.dst, seg.dport), (seg.seq, bool(seg.flags & SYN)))
    return head


def tcp_tail(packets: Iterable[Packet]) -> dict[Direction, int]:
    """Per TCP direction in `packets` (a file's last), the sequence number after the furthest byte sent."""
    tail: dict[Direction, int] = {}
    for seg in _segments(packets):
        key = (seg.src, seg.sport, seg.dst, seg.dport)
        end = (seg.seq + seg.wire_payload_len + bool(seg.flags & SYN) + bool(seg.flags & FIN)) % _SEQ_SPACE
        if key not in tail or _behind(tail[key], end) > 0:
            tail[key] = end
    return tail


def continues(tail: dict[Direction, int], head: dict[Direction, tuple[int, bool]],
              before: str) -> tuple[bool | None, str]:
    """(whether a file whose first packets show `head` takes up the TCP traffic of the one whose last packets
    show `tail`, named `before`; None: no TCP at one edge, no evidence), and why not."""
    if not tail or not head:
        return None, ""
    shared = tail.keys() & head.keys()
    if not shared:
        return False, f"none of its first TCP connections is among the last ones of {before}"
    reopened = sum(head[key][1] and _behind(head[key][0], tail[key]) > 0 for key in shared)
    if reopened:
        return False, (f"{reopened:,} of its TCP directions open (SYN) that {before} saw carrying bytes already "
                       f"(two captures of one time, their clocks apart?)")
    behind = max(_behind(head[key][0], tail[key]) for key in shared)
    if behind > RETRANSMIT_SLACK_BYTES:
        return False, (f"its TCP connections start over from {behind:,} bytes before where {before} left them "
                       f"(two captures of one time, their clocks apart?)")
    return True, ""
