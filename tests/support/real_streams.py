"""The TCP directions of a capture file, reassembled as the capture decoder sees them (decoders.tcp), for tests
that feed a stream decoder real bytes directly."""
from __future__ import annotations

import collections

from dlcsniff.decoders.inputs.capture_file import open_capture
from dlcsniff.decoders.packet import Segment, ip_to_str, parse_packet
from dlcsniff.decoders.tcp import StreamData, StreamStarted, TcpReassembler

StreamName = tuple[str, int, str, int]       # (src ip, src port, dst ip, dst port), the addresses as text


def real_stream_chunks(path) -> dict[StreamName, list[tuple[bytes, int]]]:
    """Every TCP direction of a capture: its reassembled chunks with their capture times, by key."""
    tcp = TcpReassembler()
    keys, chunks = {}, collections.defaultdict(list)
    with open_capture(path) as reader:
        for packet in reader:
            segment = parse_packet(packet.linktype, packet.data, packet.ts_ns)
            if isinstance(segment, Segment):
                for event in tcp.feed(segment):
                    if isinstance(event, StreamStarted):
                        src, sport, dst, dport = event.key
                        keys[event.stream_id] = (ip_to_str(src), sport, ip_to_str(dst), dport)
                    elif isinstance(event, StreamData):
                        chunks[event.stream_id].append((bytes(event.data), event.ts_ns))
    return {keys[sid]: parts for sid, parts in chunks.items()}


def real_stream_bytes(path) -> dict[StreamName, bytes]:
    """Every TCP direction of a capture, reassembled, by key."""
    return {key: b"".join(data for data, _ in parts) for key, parts in real_stream_chunks(path).items()}


def reverse(key: StreamName) -> StreamName:
    """The other direction of the same connection."""
    return (key[2], key[3], key[0], key[1])
