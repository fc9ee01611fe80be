"""What a capture-level application decoder hands back to the pipeline when a capture is done."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd


@dataclass(slots=True)
class CaptureRows:
    """Rows keyed by the decode tables' column names (see decoders.dataset); columns a row lacks are null.

    messages: rows for messages.parquet; each names its TCP direction by "stream_id" (the reassembler's
        number, mapped to flow_id by the pipeline) or, for non-TCP traffic, carries no stream_id.
    streams: stream_id -> columns that extend or override that TCP direction's streams.parquet row.
    extra_streams: streams.parquet rows that are not TCP directions (RoCE: one per source, destination, QP).
    collectives: rows for collectives.parquet.
    """
    messages: list[dict] = field(default_factory=list)
    streams: dict[int, dict] = field(default_factory=dict)
    extra_streams: list[dict] = field(default_factory=list)
    collectives: list[dict] = field(default_factory=list)


def frame_rows(frame: pd.DataFrame) -> list[dict]:
    """A DataFrame as row dicts of plain values, missing ones None (pyarrow refuses pandas' NA)."""
    return frame.astype(object).where(frame.notna(), None).to_dict("records")
