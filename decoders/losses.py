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

import numpy as np
import pandas as pd

from dlcsniff.decoders.protocols import loss_counters
from dlcsniff.decoders.timeline import connection_names

INCOMPLETE = "incomplete_messages"
INCOMPLETE_SAYS = "messages incomplete (bytes of them not captured)"
EVENT_CAPTURES = ("send_capture", "recv_capture", "observer_capture")


def protocol_losses(streams: pd.DataFrame, events: pd.DataFrame,
                    touched: np.ndarray | None = None) -> dict[str, dict[str, int]]:
    """protocol -> {"incomplete_messages": n, <LossCounter column>: n, ...}, of the protocols that lost
    something, leaving out zero counts; `touched` (one bool per streams row): only what lies on those streams.
    `streams`: streams.parquet's capture, flow_id, addresses, protocol and counter columns; `events`:
    events.parquet's protocol, complete, connection and capture columns."""
    if touched is None:
        touched = np.ones(len(streams), bool)
    connection = connection_names(streams).to_numpy(object)
    losses: dict[str, dict[str, int]] = {}
    on_touched = pd.MultiIndex.from_arrays([streams["capture"].astype(str).to_numpy(object)[touched],
                                            connection[touched]])
    event_touched = np.zeros(len(events), bool)
    for column in EVENT_CAPTURES:
        seen = pd.MultiIndex.from_arrays([events[column].astype(object).to_numpy(object),
                                          events["connection"].astype(object).to_numpy(object)])
        event_touched |= seen.isin(on_touched)
    incomplete = events[event_touched & ~events["complete"].fillna(False).to_numpy(bool)]
    for protocol, n in incomplete.groupby(incomplete["protocol"].astype(str)).size().items():
        losses.setdefault(protocol, {})[INCOMPLETE] = int(n)
    protocol_of = streams["protocol"].to_numpy(object)
    for protocol, counters in loss_counters().items():
        mine = touched & (protocol_of == protocol)
        for counter in counters:
            if not mine.any() or counter.column not in streams:
                continue
            values = pd.Series(streams[counter.column].to_numpy()[mine]).fillna(0).astype(np.int64)
            total = (values.groupby(connection[mine]).max().sum() if counter.messages else values.sum())
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
