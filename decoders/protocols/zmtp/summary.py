"""ZMTP's counters in the decode summary (decoders.protocols.job_step): the bytes its decoder skipped to find its
framing again, its messages and commands as the captures saw them (a message seen at both ends: twice)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dlcsniff.decoders.arrow_numpy import filled, valid

if TYPE_CHECKING:
    import pyarrow as pa

# the streams ZMTP frames: those ps-lite claimed and the other ZMTP ones
ZMTP_STREAMS = ("pslite", "zmtp")


def summary(streams: pa.Table, tables: dict[str, pa.Table]) -> dict:
    framed = valid(streams["syn_seen"]) & np.array([protocol in ZMTP_STREAMS
                                                    for protocol in streams["protocol"].to_pylist()], dtype=bool)
    command = tables["zmtp"]["command"]
    return {
        # every protocol's: losses_by_protocol
        "zmtp_lost_bytes": int(filled(streams["lost_bytes"], 0)[framed].astype(np.int64).sum()),
        "zmtp_messages": command.null_count,
        "zmtp_commands": len(command) - command.null_count,
    }


def says(summary: dict) -> dict[str, str]:
    if not (summary["zmtp_messages"] or summary["zmtp_commands"]):
        return {}
    return {"framing": f"ZMTP, as the captures saw it (a message seen at both ends twice): "
                       f"{summary['zmtp_messages']:,} messages, {summary['zmtp_commands']:,} commands"}
