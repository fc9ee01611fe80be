"""What each protocol lost in a job, counted once: the decode summary's `losses_by_protocol`, and what each
capture limit cost (decoders.capture_limits).

A protocol's losses are
- its messages the job saw incomplete (`incomplete_messages`: events.parquet, each message once, incomplete
  when a capture that saw it missed some of its bytes);
- the counters its decoder keeps per stream (decoders.protocols.base.LossCounter, declared by each protocol:
  ps-lite's messages whose header was not captured, the bytes skipped to find the framing again...). A count of
  messages takes each connection once, as the capture that lost most of it (a message unreadable in both ends'
  captures is one message); bytes and packets are summed over the captures, like the capture's other byte
  counts (TCP payload, holes).
Restricted to some streams (`touched`: those a snaplen cut, those with holes, a capture's), the same counts
take only what lies on them: a message is touched when one of the captures that saw it saw it on such a stream.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dlcsniff.decoders.arrow_numpy import filled
from dlcsniff.decoders.connections import connection_names
from dlcsniff.decoders.protocols import loss_counters

if TYPE_CHECKING:
    import pyarrow as pa

INCOMPLETE = "incomplete_messages"
INCOMPLETE_SAYS = "messages incomplete (bytes of them not captured)"
EVENT_CAPTURES = ("send_capture", "recv_capture", "observer_capture")


def protocol_losses(streams: pa.Table, events: pa.Table,
                    touched: np.ndarray | None = None) -> dict[str, dict[str, int]]:
    """protocol -> {"incomplete_messages": n, <LossCounter column>: n, ...}, of the protocols that lost
    something, leaving out zero counts; `touched` (one bool per streams row): only what lies on those streams.
    `streams`: streams.parquet's capture, flow_id, addresses, protocol and counter columns; `events`:
    events.parquet's protocol, complete, connection and capture columns."""
    if touched is None:
        touched = np.ones(len(streams), bool)
    connection = np.array(connection_names(streams).to_pylist(), dtype=object)
    losses: dict[str, dict[str, int]] = {}
    on_touched = set(zip(np.array(streams["capture"].to_pylist(), dtype=object)[touched], connection[touched]))
    event_connection = events["connection"].to_pylist()
    event_touched = np.zeros(len(events), bool)
    for column in EVENT_CAPTURES:
        event_touched |= np.fromiter(((capture, name) in on_touched for capture, name in
                                      zip(events[column].to_pylist(), event_connection)), bool, len(events))
    complete = filled(events["complete"], False).astype(bool)
    incomplete: dict[str, int] = {}
    for protocol in np.array(events["protocol"].to_pylist(), dtype=object)[event_touched & ~complete]:
        if protocol is not None:
            incomplete[protocol] = incomplete.get(protocol, 0) + 1
    for protocol, n in sorted(incomplete.items()):
        losses.setdefault(protocol, {})[INCOMPLETE] = n
    protocol_of = np.array(streams["protocol"].to_pylist(), dtype=object)
    for protocol, counters in loss_counters().items():
        mine = touched & (protocol_of == protocol)
        for counter in counters:
            if not mine.any() or counter.column not in streams.column_names:
                continue
            values = filled(streams[counter.column], 0).astype(np.int64)[mine]
            if counter.messages:        # each connection once (a stream without a name counts in none)
                most: dict[str, int] = {}
                for name, value in zip(connection[mine], values.tolist()):
                    if name is not None:
                        most[name] = max(most.get(name, value), value)
                total = sum(most.values())
            else:
                total = int(values.sum())
            if total:
                losses.setdefault(protocol, {})[counter.column] = int(total)
    return dict(sorted(losses.items()))


def _counts_messages(protocol: str, name: str) -> bool:
    return name == INCOMPLETE or any(c.column == name and c.messages for c in loss_counters().get(protocol, ()))


def messages_affected(losses: dict[str, dict[str, int]]) -> int:
    """The messages the losses name (incomplete or unreadable), over every protocol."""
    return sum(n for protocol, found in losses.items() for name, n in found.items() if _counts_messages(protocol, name))


def uncounted_messages_lost(losses: dict[str, dict[str, int]]) -> bool:
    """Whether the losses include bytes or packets lost: the messages they held are lost, and no decoder can
    count them."""
    return any(not _counts_messages(protocol, name) for protocol, found in losses.items() for name in found)


def says_losses(losses: dict[str, dict[str, int]]) -> str:
    """The losses in words, each protocol under its own name: "pslite 8 messages incomplete (...), 2,696 B
    skipped to find the ZMTP framing again; gloo ..."."""
    says = {(protocol, c.column): c.says for protocol, counters in loss_counters().items() for c in counters}
    return "; ".join(protocol + " " + ", ".join(
        f"{n:,} {INCOMPLETE_SAYS if name == INCOMPLETE else says[protocol, name]}"
        for name, n in found.items()) for protocol, found in losses.items())
