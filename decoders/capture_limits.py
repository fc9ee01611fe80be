"""What the captures could not hold, said loudly: each limit a warning of the decode summary, with what it cost
the decoders (each protocol's losses on the streams it touched, decoders.losses) and what to do instead.

- `snaplen`: the snap length cut TCP payload the decoders read: claimed streams the cut made lose something
  (incomplete or unreadable messages, framing lost), or TCP directions no decoder claimed (what they carried
  cannot be known: the cut may have hidden a protocol's first bytes). A cut that cost nothing is no limit: the
  capture daemon's cut of the tensor values no decoder reads (`zmtp-cut`), a snap length above every packet.
- `holes`: TCP directions whose capture missed more than HOLE_FRACTION of their bytes (the capture fell
  behind: a busy machine, a small capture buffer).
- `kernel_drops`: packets the capture tool recorded as dropped before it got them (a pcapng's interface
  statistics; a capture daemon's capture.json), per capture, whatever they were.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dlcsniff.decoders.arrow_numpy import filled, valid
from dlcsniff.decoders.losses import messages_affected, protocol_losses, says_losses, uncounted_messages_lost

if TYPE_CHECKING:
    import pyarrow as pa

HOLE_FRACTION = 0.01
# A snap length this large cuts no packet of an Ethernet network: a cut comes from elsewhere (a filter's)
WHOLE_PACKET_SNAPLEN = 65535
TAKE_WHOLE_PACKETS = ("capture whole packets (tcpdump -s 0), or with `dlcsniff capture`, which cuts only the "
                      "tensor values no decoder reads")
KEEP_UP = ("give the capture tool a larger buffer (tcpdump -B KiB, dumpcap -B MiB, dlcsniff capture --buffer-size), "
           "or capture with `dlcsniff capture`, which writes less by cutting the tensor values no decoder reads")


def capture_limits(captures: list[dict], streams: pa.Table, events: pa.Table) -> tuple[list[dict], list[str]]:
    """(the limits found, as summary entries; their warnings). `captures`: the decode summary's (their files'
    snaplen and dropped); `streams`, `events`: the job's tables (see decoders.losses.protocol_losses)."""
    tcp = valid(streams["syn_seen"])        # TCP directions (RoCE streams have no handshake)
    found: list[dict] = []
    warnings: list[str] = []
    for limit in (_snaplen(captures, streams, events, tcp), _holes(streams, events, tcp),
                  _kernel_drops(captures, streams, events)):
        if limit is not None:
            entry, warning = limit
            found.append(entry)
            warnings.append(warning)
    return found, warnings


def _cost(streams: pa.Table, events: pa.Table, touched: np.ndarray) -> tuple[dict, str]:
    losses = protocol_losses(streams, events, touched)
    affected = messages_affected(losses)
    said = (f"{_count(affected, 'message')} affected ({says_losses(losses)})" if losses
            else "no message of a protocol dlcsniff decodes affected")
    if uncounted_messages_lost(losses):
        said += "; the messages in what was skipped or missed are lost, and not counted"
    return {"losses": losses, "messages_affected": affected}, said


def _count(n: int, thing: str) -> str:
    return f"{n:,} {thing}" + ("" if n == 1 else "s")


def _numbers(streams: pa.Table, name: str) -> np.ndarray:
    """A column of counts (null: 0)."""
    return filled(streams[name], 0).astype(np.int64)


def _captures(streams: pa.Table) -> np.ndarray:
    return np.array(streams["capture"].to_pylist(), dtype=object)


def _names(streams: pa.Table, rows: np.ndarray) -> list[str]:
    return sorted(set(_captures(streams)[rows]))


def _snaplen(captures: list[dict], streams: pa.Table, events: pa.Table, tcp: np.ndarray):
    uncaptured = _numbers(streams, "uncaptured_bytes")
    cut = tcp & (uncaptured > 0)
    unclaimed = cut & (np.array(streams["protocol"].to_pylist(), dtype=object) == "tcp")
    cost, said = _cost(streams, events, cut)
    if not cost["losses"] and not unclaimed.any():
        return None
    names = _names(streams, cut)
    snaplens = {cap["capture"]: min((f["snaplen"] for f in cap["files"] if f["snaplen"]), default=0)
                for cap in captures if cap["capture"] in names}
    stated = {name: f"the files' snaplen: {snaplens[name]:,} B" if 0 < snaplens.get(name, 0) < WHOLE_PACKET_SNAPLEN
              else "cut by its capture tool" for name in names}
    by_length = "; ".join(f"{', '.join(n for n in names if stated[n] == said_of)} ({said_of})"
                          for said_of in dict.fromkeys(stated.values()))
    entry = {"limit": "snaplen", "captures": names, "snaplen_bytes": snaplens,
             "cut_bytes": int(uncaptured[cut].sum()),
             "unclaimed_directions_cut": int(unclaimed.sum()), **cost}
    unclaimed_said = (f"; {_count(int(unclaimed.sum()), 'TCP direction')} no decoder claimed cut too (what they "
                      "carried cannot be known)" if unclaimed.any() else "")
    return entry, (f"capture limit (snap length): packets cut short in {by_length} hid what the decoders read: {said}"
                   f"{unclaimed_said}. To decode them, {TAKE_WHOLE_PACKETS}")


def _holes(streams: pa.Table, events: pa.Table, tcp: np.ndarray):
    missing = _numbers(streams, "missing_bytes")
    total = missing + _numbers(streams, "bytes") + _numbers(streams, "uncaptured_bytes")
    fraction = np.divide(missing, total, out=np.zeros(len(total)), where=total > 0)
    holed = tcp & (fraction > HOLE_FRACTION)
    if not holed.any():
        return None
    cost, said = _cost(streams, events, holed)
    names = _names(streams, holed)
    entry = {"limit": "holes", "captures": names, "directions": int(holed.sum()),
             "missing_bytes": int(missing[holed].sum()), "largest_fraction": float(fraction[holed].max()), **cost}
    share = ("–".join(dict.fromkeys(f"{f:.1%}" for f in (fraction[holed].min(), fraction[holed].max()))))
    return entry, (f"capture limit (holes): the capture lost packets: {_count(int(holed.sum()), 'TCP direction')} in "
                   f"{', '.join(names)} lost {share} of their bytes ({int(missing[holed].sum()):,} B): {said}. "
                   f"So that the capture keeps up, {KEEP_UP}")


def _kernel_drops(captures: list[dict], streams: pa.Table, events: pa.Table):
    dropped = {cap["capture"]: sum(f["dropped"] or 0 for f in cap["files"]) for cap in captures}
    dropped = {name: n for name, n in dropped.items() if n}
    if not dropped:
        return None
    cost, said = _cost(streams, events, np.isin(_captures(streams), list(dropped)))
    entry = {"limit": "kernel_drops", "captures": sorted(dropped), "dropped_packets": dropped, **cost}
    return entry, ("capture limit (kernel drops): packets dropped before the capture tool got them, as it recorded: "
                   + ", ".join(f"{n:,} in {name}" for name, n in sorted(dropped.items()))
                   + f": {said}. So that the capture keeps up, {KEEP_UP}")
