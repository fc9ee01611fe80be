"""The job-wide API: what a protocol (or a layer under one) does once every capture of the job is decoded, named
by its `JobEntry` in decoders.protocols.JOB_STEPS. Its module offers any of:

    resolve_job(job: JobColumns)          what only the whole job reveals (ps-lite's node ids and tensors, the
                                          collectives of Gloo and NCCL: built here only), on the job's column
                                          lists, in place
    summary(streams, tables) -> dict      the protocol's counters in the decode summary (keys of its own), from
                                          the job's streams and tables (pyarrow, by name)
    event_summary(events) -> dict         its counters of the job's messages, each once (events.parquet, pyarrow)
    unclaimed(counts) -> (udp, packets)   traffic it declined after all, from one capture's counters: datagrams
                                          by service port and other packets, for the summary's `unclaimed`
    warnings(capture, counts) -> list     what the summary warns of, from one capture's counters
    message_sides(obs, messages, nodes)   the timeline (decoders.timeline): which observations are its messages
                                          and which of those are the sender's / receiver's own capture (obs:
                                          numpy columns by name; messages, nodes: pyarrow)
    reference_captures(sent) -> list      the captures it would take as the job's reference clock, best first
    says(summary) -> dict[str, str]       its words in the human decode summary (dlcsniff decode), by place:
                                          "flow_kinds" (after "TCP directions"), "framing" (a line after the TCP
                                          line), "messages" (after the messages' incomplete count), "counters" (a
                                          line after the capture daemons')
    says_tables(messages) -> list         its tables in the human decode summary (SummaryTable), from the job's
                                          messages each once (pyarrow: the row each event takes its fields from)

The generic code (decoders.job) calls them in the order of JOB_STEPS, so a step reads what the steps before it
wrote (NCCL reads TCPStore's ranks from the messages, after ps-lite's step named every node).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class SummaryTable:
    """A table of the human decode summary: its title, its columns (name, justified left), its rows as text."""
    title: str
    columns: tuple[tuple[str, bool], ...]
    rows: list[tuple[str, ...]]


@dataclass
class JobColumns:
    """The job's decode tables as column lists while the job steps run.

    streams, messages: the captures' streams and messages, concatenated (every column of decoders.schema).
    capture_table: a capture-level table of a protocol's own (ps-lite's node lists), concatenated over captures.
    tables: the decode tables a step builds whole (ps-lite's nodes), by name.
    collectives: the collectives table's columns, as each step builds its own, in step order.
    summary: what a step says in the decode summary."""
    streams: dict[str, list]
    messages: dict[str, list]
    capture_table: Callable[[str], dict[str, list]]
    tables: dict[str, dict[str, list]] = field(default_factory=dict)
    collectives: list[dict[str, list]] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
