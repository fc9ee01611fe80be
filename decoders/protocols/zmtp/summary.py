"""ZMTP's counters in the decode summary (decoders.protocols.job_step): the bytes its decoder skipped to find its
framing again, its messages and commands as the captures saw them (a message seen at both ends: twice)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

# the streams ZMTP frames: those ps-lite claimed and the other ZMTP ones
ZMTP_STREAMS = ("pslite", "zmtp")


def summary(streams: pd.DataFrame, tables: dict[str, pa.Table]) -> dict:
    tcp = streams[streams["syn_seen"].notna()]
    zmtp = tables["zmtp"].select(["command"]).to_pandas()
    return {
        # every protocol's: losses_by_protocol
        "zmtp_lost_bytes": int(tcp.loc[tcp["protocol"].isin(ZMTP_STREAMS), "lost_bytes"].sum()),
        "zmtp_messages": int(zmtp["command"].isna().sum()),
        "zmtp_commands": int(zmtp["command"].notna().sum()),
    }


def says(summary: dict) -> dict[str, str]:
    if not (summary["zmtp_messages"] or summary["zmtp_commands"]):
        return {}
    return {"framing": f"ZMTP, as the captures saw it (a message seen at both ends twice): "
                       f"{summary['zmtp_messages']:,} messages, {summary['zmtp_commands']:,} commands"}
