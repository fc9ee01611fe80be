"""ZMTP's counters in the decode summary (decoders.protocols.job_step): the bytes its decoder skipped to find its
framing again, its messages and commands as the captures saw them (a message seen at both ends: twice)."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

# the streams ZMTP frames: those ps-lite claimed and the other ZMTP ones
ZMTP_STREAMS = ("pslite", "zmtp")


def summary(streams: pa.Table, tables: dict[str, pa.Table]) -> dict:
    framed = pc.and_(pc.is_valid(streams["syn_seen"]),
                     pc.is_in(streams["protocol"], value_set=pa.array(ZMTP_STREAMS, pa.string())))
    command = tables["zmtp"]["command"]
    return {
        # every protocol's: losses_by_protocol
        "zmtp_lost_bytes": int(pc.sum(streams.filter(framed)["lost_bytes"]).as_py() or 0),
        "zmtp_messages": command.null_count,
        "zmtp_commands": len(command) - command.null_count,
    }


def says(summary: dict) -> dict[str, str]:
    if not (summary["zmtp_messages"] or summary["zmtp_commands"]):
        return {}
    return {"framing": f"ZMTP, as the captures saw it (a message seen at both ends twice): "
                       f"{summary['zmtp_messages']:,} messages, {summary['zmtp_commands']:,} commands"}
