"""Runs a capture-level decoder (decoders.gloo.GlooCaptureDecoder and its kind) over one capture file the
way the decode pipeline drives it: decoders.capture -> decoders.packet -> decoders.tcp, then, per TCP
direction, claim() with its first bytes until the decoder decides, on_data/on_gap/on_end once claimed,
and finish(). While undecided, a direction's bytes are held and replayed once it is claimed; a decoder
still undecided when the direction loses bytes or ends is taken to decline it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dlcsniff.decoders.inputs.capture_file import open_capture
from dlcsniff.decoders.packet import Segment, parse_packet
from dlcsniff.decoders.protocols.base import CaptureRows
from dlcsniff.decoders.tcp import StreamData, StreamEnded, StreamGap, StreamStarted, TcpReassembler

CLAIM_PREFIX_BYTES = 64


@dataclass(slots=True)
class _Offer:
    key: tuple
    syn_seen: bool
    claimed: bool | None = None
    prefix: bytes = b""
    held: list = field(default_factory=list)      # (data bytes, ts_ns) while undecided


def _offer(decoder, stream_id: int, offer: _Offer, final: bool) -> None:
    verdict = decoder.claim(stream_id, offer.key, offer.syn_seen, offer.prefix[:CLAIM_PREFIX_BYTES])
    if verdict is None and not final:
        return
    offer.claimed = bool(verdict)
    if offer.claimed:
        for data, ts_ns in offer.held:
            decoder.on_data(stream_id, memoryview(data), ts_ns)
    offer.held = []


def _dispatch(decoder, offers: dict[int, _Offer], event) -> None:
    if event.__class__ is StreamStarted:
        offers[event.stream_id] = _Offer(event.key, event.syn_seen)
        return
    offer = offers[event.stream_id]
    if offer.claimed is None:
        if event.__class__ is StreamData:
            data = bytes(event.data)
            offer.held.append((data, event.ts_ns))
            if len(offer.prefix) < CLAIM_PREFIX_BYTES:
                offer.prefix += data[:CLAIM_PREFIX_BYTES - len(offer.prefix)]
                _offer(decoder, event.stream_id, offer, final=False)
            return
        _offer(decoder, event.stream_id, offer, final=True)
    if not offer.claimed:
        return
    if event.__class__ is StreamData:
        decoder.on_data(event.stream_id, event.data, event.ts_ns)
    elif event.__class__ is StreamGap:
        decoder.on_gap(event.stream_id, event.size, event.ts_ns)
    elif event.__class__ is StreamEnded:
        decoder.on_end(event.stream_id, event.ts_ns)


def run_capture_decoder(decoder, path: str | Path) -> tuple[CaptureRows, dict[int, tuple]]:
    """Feed one capture file through `decoder`; return its finish() rows and each TCP direction's key
    (src ip, src port, dst ip, dst port) by stream id, as the streams table will show them."""
    tcp = TcpReassembler()
    offers: dict[int, _Offer] = {}
    with open_capture(path) as reader:
        for packet in reader:
            segment = parse_packet(packet.linktype, packet.data, packet.ts_ns)
            if segment.__class__ is Segment:
                for event in tcp.feed(segment):
                    _dispatch(decoder, offers, event)
    for event in tcp.finish():
        _dispatch(decoder, offers, event)
    return decoder.finish(), {stream_id: offer.key for stream_id, offer in offers.items()}
