"""The protocols dlcsniff decodes: one package each under decoders/protocols/<name>/, one API per stage, one table
per stage.

- `REGISTRY`: the capture decoders (API: decoders.protocols.base), read by the capture decoder (which protocol
  may claim a TCP direction or a packet, and in which order), by the tests (every protocol against every other's
  traffic) and by the capture daemon's in-kernel cut (`ZMTP_KEPT_BODIES`: what of a ZMTP stream the decoders
  read, so what the cut must never drop); `stands_on`: the layers a protocol's decoder reads (ps-lite on ZMTP).
- `JOB_STEPS`: what each protocol does once the whole job is decoded (API: decoders.protocols.job_step): node
  ids, tensors, collectives, its summary counters; `reads` says whose rows it reads (NCCL: TCPStore's ranks).
- `COLUMN_PACKAGES`: whose `columns` module declares columns and tables of the decode output (decoders.schema).
Entries name modules, imported only when they are needed: the daemon and `--help` stay light.

Adding a protocol: a package here with a decoder class (decoders.protocols.base), its columns, optionally its job
step and summary counters, and one line in each table below that concerns it.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable


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
    stands_on: tuple[str, ...] = ()     # the layers under it (decoders/protocols/<layer>/) its decoder reads

    def decoder_class(self) -> type:
        return getattr(importlib.import_module(f"{__name__}.{self.module}"), self.decoder)


# In the order they are asked: a TCP direction goes to the first decoder that claims it; one that needs more
# bytes holds the decision until it has them. ZMTP comes first: its greeting is unmistakable.
REGISTRY: tuple[ProtocolEntry, ...] = (
    ProtocolEntry("pslite", "pslite.decoder", "PsliteCaptureDecoder",
                  "a ZMTP 2.0/3.x greeting from the connection's start; ZMTP 1.0 identity frames or ps-lite metas "
                  "found by resynchronisation when nothing else claims the direction", stands_on=("zmtp",)),
    ProtocolEntry("gloo", "gloo.decoder", "GlooCaptureDecoder",
                  "a TCPStore request, a Gloo connect sequence number followed by a preamble, or preambles "
                  "between listeners the rendezvous named", stands_on=("tcpstore",)),
    ProtocolEntry("nccl_socket", "nccl_socket.decoder", "NcclSocketCaptureDecoder",
                  "NCCL's socket handshake: NCCL_SOCKET_MAGIC and type for net sockets, a communicator magic "
                  "opening two bootstrap connections or more; before 2.16 the socket index and whole size-framed "
                  "messages; every connection one-way (kept at the end only when the capture bears it out)"),
    ProtocolEntry("roce", "roce.decoder", "RoceCaptureDecoder",
                  "RoCEv2 (UDP 4791) / RoCEv1 (ethertype 0x8915) packets with a valid BTH; NCCL's IB set-up "
                  "connection by its handshake (NCCL_SOCKET_MAGIC, type 4)"),
)


@dataclass(frozen=True, slots=True)
class JobEntry:
    """A protocol's (or a layer's) job-wide part: `modules` (dlcsniff.decoders.protocols.<module>) offer the API of
    decoders.protocols.job_step; `reads`: the protocols whose rows it reads (messages.protocol, streams.protocol)."""
    name: str
    modules: tuple[str, ...]
    reads: tuple[str, ...]

    def hooks(self) -> list:
        return [importlib.import_module(f"{__name__}.{module}") for module in self.modules]


# In the order they run: ps-lite names the nodes before anything reads them; the collectives are built by the
# collective libraries' steps, Gloo's (from each capture's messages and sequence spaces) then NCCL's (standing
# on RoCE's and the socket transport's sends, reading TCPStore's ranks), in the table in that order.
JOB_STEPS: tuple[JobEntry, ...] = (
    JobEntry("pslite", ("pslite.job", "pslite.vantage"), reads=("pslite",)),
    JobEntry("gloo", ("gloo.job",), reads=("gloo",)),
    JobEntry("nccl", ("nccl.collectives",), reads=("roce", "nccl_socket", "tcpstore")),
    JobEntry("zmtp", ("zmtp.summary",), reads=("pslite", "zmtp")),
    JobEntry("roce", ("roce.summary",), reads=("roce",)),
)


def job_hooks(name: str) -> list[Callable]:
    """Every job step's `name` hook (decoders.protocols.job_step), in JOB_STEPS order."""
    return [hook for entry in JOB_STEPS for module in entry.hooks() if (hook := getattr(module, name, None))]


# The packages whose `columns` module declares columns of the decode tables (decoders.schema places them).
COLUMN_PACKAGES = ("zmtp", "pslite", "gloo", "tcpstore", "roce", "nccl")


def protocol_columns(table: str) -> list[tuple[str, list[tuple]]]:
    """Every protocol's blocks of columns of one decode table: (the column they follow, their rows)."""
    return [block for package in COLUMN_PACKAGES
            for block in importlib.import_module(f"{__name__}.{package}.columns").COLUMNS.get(table, ())]


def protocol_tables() -> list[tuple[str, tuple]]:
    """Every protocol's own decode tables: (the table they follow, (name, command, description, rows))."""
    return [entry for package in COLUMN_PACKAGES
            for entry in getattr(importlib.import_module(f"{__name__}.{package}.columns"), "TABLES", ())]


SAYS_PLACES = ("flow_kinds", "framing", "messages", "counters")


def protocol_says(summary: dict) -> dict[str, list[str]]:
    """Every protocol's words in the human decode summary (its `says` hook, decoders.protocols.job_step), by place
    (SAYS_PLACES), in JOB_STEPS order."""
    said: dict[str, list[str]] = {place: [] for place in SAYS_PLACES}
    for says in job_hooks("says"):
        for place, words in says(summary).items():
            said[place].append(words)
    return said


def protocol_summary_tables(messages) -> list:
    """Every protocol's tables in the human decode summary (its `says_tables` hook, decoders.protocols.job_step),
    from the job's messages each once (pyarrow), in JOB_STEPS order."""
    return [table for says_tables in job_hooks("says_tables") for table in says_tables(messages)]


def carried_by(layer: str) -> tuple[str, ...]:
    """The registered protocols that stand on `layer` (ps-lite on ZMTP)."""
    return tuple(entry.name for entry in REGISTRY if layer in entry.stands_on)


def zmq_carried() -> tuple[str, ...]:
    """The protocols libzmq's messages carry (over ZMTP): what a capture daemon's libzmq probes see."""
    return carried_by("zmtp")


def loss_counters() -> dict[str, tuple]:
    """streams.protocol -> the LossCounters (decoders.protocols.base) its decoder reports for its streams."""
    return {protocol: counters for entry in REGISTRY for protocol, counters in entry.decoder_class().losses.items()}


def protocol_decoders(names: tuple[str, ...] | None = None) -> list:
    """A fresh decoder of each registered protocol (or of the named ones), in registry order."""
    unknown = set(names or ()) - {entry.name for entry in REGISTRY}
    if unknown:
        raise ValueError(f"unknown protocols: {', '.join(sorted(unknown))}")
    return [entry.decoder_class()() for entry in REGISTRY if names is None or entry.name in names]
