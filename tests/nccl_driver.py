"""Runs capture-level decoders over a capture file the way the decode pipeline drives them (tests only).

open_capture -> parse_packet -> TcpReassembler; each new TCP direction is offered to the decoders in turn
with its first bytes (up to CLAIM_PREFIX_BYTES, offered again as more arrive while a decoder answers None);
the one that answers True gets the direction from offset 0 (on_data / on_gap / on_end). Packets that are
not TCP go to the decoders' on_packet. Until the lead switches these tests to decoders.pipeline, this keeps
them on the real readers and reassembler.
"""
from __future__ import annotations

from pathlib import Path

from dlcsniff.decoders.inputs.capture_file import open_capture
from dlcsniff.decoders.packet import ParseStats, Segment, ip_to_str, parse_packet
from dlcsniff.decoders.protocols.base import CaptureRows
from dlcsniff.decoders.tcp import StreamData, StreamEnded, StreamGap, StreamStarted, TcpReassembler

CLAIM_PREFIX_BYTES = 64


class _Offer:
    """A TCP direction no decoder has taken yet: its first bytes, and which decoders may still want it."""

    def __init__(self, key: tuple, syn_seen: bool, decoders: list):
        self.key = key
        self.syn_seen = syn_seen
        self.undecided = list(decoders)
        self.prefix = bytearray()
        self.chunks: list[tuple[bytes, int]] = []


def run_decoders(path: str | Path, decoders: list) -> tuple[list[CaptureRows], dict[int, tuple]]:
    """Each decoder's CaptureRows for the capture at `path`, and each TCP stream id's key
    (src ip, src port, dst ip, dst port) with the addresses as text."""
    owners: dict[int, object] = {}          # stream id -> the decoder that claimed it
    offers: dict[int, _Offer] = {}
    packet_decoders = [d for d in decoders if hasattr(d, "on_packet")]
    tcp = TcpReassembler()

    def offer(stream_id: int, state: _Offer) -> None:
        prefix = bytes(state.prefix[:CLAIM_PREFIX_BYTES])
        for decoder in list(state.undecided):
            verdict = decoder.claim(stream_id, state.key, state.syn_seen, prefix)
            if verdict is True:
                owners[stream_id] = decoder
                del offers[stream_id]
                for data, ts_ns in state.chunks:
                    decoder.on_data(stream_id, memoryview(data), ts_ns)
                return
            if verdict is False or len(prefix) >= CLAIM_PREFIX_BYTES:
                state.undecided.remove(decoder)
        if not state.undecided:
            del offers[stream_id]

    def handle(ev) -> None:
        if isinstance(ev, StreamStarted):
            offers[ev.stream_id] = _Offer(ev.key, ev.syn_seen, decoders)
            return
        owner = owners.get(ev.stream_id)
        if isinstance(ev, StreamData):
            if owner is not None:
                owner.on_data(ev.stream_id, ev.data, ev.ts_ns)
            elif ev.stream_id in offers:
                state = offers[ev.stream_id]
                state.chunks.append((bytes(ev.data), ev.ts_ns))
                state.prefix += ev.data[:CLAIM_PREFIX_BYTES - len(state.prefix)]
                offer(ev.stream_id, state)
        elif isinstance(ev, StreamGap):
            if owner is not None:
                owner.on_gap(ev.stream_id, ev.size, ev.ts_ns)
            else:
                offers.pop(ev.stream_id, None)     # the first bytes are lost: nobody can recognise it
        elif isinstance(ev, StreamEnded):
            if owner is not None:
                owner.on_end(ev.stream_id, ev.ts_ns)
            offers.pop(ev.stream_id, None)

    stats = ParseStats()
    with open_capture(path) as reader:
        for packet in reader:
            seg = parse_packet(packet.linktype, packet.data, packet.ts_ns, stats)
            if isinstance(seg, Segment):
                for ev in tcp.feed(seg):
                    handle(ev)
            else:
                any(d.on_packet(packet) for d in packet_decoders)
        for ev in tcp.finish():
            handle(ev)
    keys = {s.stream_id: (ip_to_str(s.key[0]), s.key[1], ip_to_str(s.key[2]), s.key[3]) for s in tcp.streams}
    return [d.finish() for d in decoders], keys


def run_decoder(path: str | Path, decoder) -> tuple[CaptureRows, dict[int, tuple]]:
    rows, keys = run_decoders(path, [decoder])
    return rows[0], keys
