"""The protocols dlcsniff decodes: one module each, one API (decoders.protocols.base), one table.

`REGISTRY` is read by the capture decoder (which protocol may claim a TCP direction or a packet, and in which
order), by the tests (every protocol against every other's traffic) and by the capture daemon's in-kernel cut
(`ZMTP_KEPT_BODIES`: what of a ZMTP stream the decoders read, so what the cut must never drop). Entries name
their module and class, imported only when a capture is decoded: the daemon and `--help` stay light.

Adding a protocol: a module here with one class offering the API of decoders.protocols.base, and one line below.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BodyKeepRule:
    """Which ZMTP data frame bodies the decoders keep: a message's first `first_frames` frames whatever their
    size (ps-lite's routing id, meta and keys), the others up to `max_body_bytes` (lens frames; tensor values
    are larger)."""
    first_frames: int
    max_body_bytes: int


ZMTP_KEPT_BODIES = BodyKeepRule(first_frames=2, max_body_bytes=64 * 1024)


@dataclass(frozen=True, slots=True)
class ProtocolEntry:
    name: str           # streams.protocol / messages.protocol of what it decodes
    module: str         # dlcsniff.decoders.protocols.<module>
    decoder: str        # the class offering decoders.protocols.base.ProtocolDecoder
    evidence: str       # what a claim rests on

    def decoder_class(self) -> type:
        return getattr(importlib.import_module(f"{__name__}.{self.module}"), self.decoder)


# In the order they are asked: a TCP direction goes to the first decoder that claims it; one that needs more
# bytes holds the decision until it has them. ZMTP comes first: its greeting is unmistakable.
REGISTRY: tuple[ProtocolEntry, ...] = (
    ProtocolEntry("pslite", "pslite", "PsliteCaptureDecoder",
                  "a ZMTP 2.0/3.x greeting from the connection's start; ZMTP 1.0 identity frames or ps-lite metas "
                  "found by resynchronisation when nothing else claims the direction"),
    ProtocolEntry("gloo", "gloo", "GlooCaptureDecoder",
                  "a TCPStore request, a Gloo connect sequence number followed by a preamble, or preambles "
                  "between listeners the rendezvous named"),
    ProtocolEntry("nccl_socket", "nccl_socket", "NcclSocketCaptureDecoder",
                  "NCCL's socket handshake: NCCL_SOCKET_MAGIC and type for net sockets, a communicator magic "
                  "opening two bootstrap connections or more; before 2.16 the socket index and whole size-framed "
                  "messages; every connection one-way (kept at the end only when the capture bears it out)"),
    ProtocolEntry("roce", "roce", "RoceCaptureDecoder",
                  "RoCEv2 (UDP 4791) / RoCEv1 (ethertype 0x8915) packets with a valid BTH; NCCL's IB set-up "
                  "connection by its handshake (NCCL_SOCKET_MAGIC, type 4)"),
)


def protocol_decoders(names: tuple[str, ...] | None = None) -> list:
    """A fresh decoder of each registered protocol (or of the named ones), in registry order."""
    unknown = set(names or ()) - {entry.name for entry in REGISTRY}
    if unknown:
        raise ValueError(f"unknown protocols: {', '.join(sorted(unknown))}")
    return [entry.decoder_class()() for entry in REGISTRY if names is None or entry.name in names]
