"""Gloo's job step (decoders.protocols.job_step): the job's Gloo collectives, built where NCCL's are, once every
capture is decoded.

Each capture's operations come from its own Gloo messages (decoders.protocols.gloo.collectives: one row per
operation per capture, as each rank saw it), sized by the algorithm model against what the messages state and
what that capture's TCP directions count (decoders.protocols.gloo.sizes). The capture decoder leaves each
direction's sequence space as a capture table, `gloo_sequence_space` (SEQUENCE_SPACE), one row per decoded
message in stream order (a direction without one: a row without a message), so the step needs nothing else of
the capture.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from dlcsniff.decoders.protocols.base import frame_rows
from dlcsniff.decoders.protocols.gloo import sizes as gloo_sizes
from dlcsniff.decoders.protocols.job_step import JobColumns

if TYPE_CHECKING:
    import pandas as pd

SEQUENCE_SPACE = "gloo_sequence_space"
CONTEXT = ("pg", "peer_rank", "outgoing")       # what the sizes' fit reads of a direction's messages


def sequence_space_rows(stream_id: int, context: dict, space_start: int, space_end: int,
                        messages: list[tuple[tuple[str, int] | None, int, int]]) -> list[dict]:
    """One direction's rows of SEQUENCE_SPACE: its context, where messages may start and its length, and per
    message (in stream order) its collective key (None: a send/recv), offset and size."""
    base = {"stream_id": stream_id, **{name: context[name] for name in CONTEXT},
            "space_start": space_start, "space_end": space_end}
    if not messages:
        return [{**base, "kind": None, "seq": None, "offset": None, "nbytes": None}]
    return [{**base, "kind": None if key is None else key[0], "seq": None if key is None else key[1],
             "offset": offset, "nbytes": nbytes} for key, offset, nbytes in messages]


def _stream_views(space: list[dict]) -> list[tuple[dict, gloo_sizes.SequenceSpace]]:
    """The capture's directions, in the order the capture decoder listed them, as the sizes' fit takes them."""
    by_direction: dict[int, list[dict]] = {}
    for row in space:
        by_direction.setdefault(row["flow_id"] if "flow_id" in row else row["stream_id"], []).append(row)
    views = []
    for rows in by_direction.values():
        first = rows[0]
        decoded = [row for row in rows if row["offset"] is not None]
        keys = [None if row["kind"] is None else (row["kind"], row["seq"]) for row in decoded]
        views.append(({name: first[name] for name in CONTEXT},
                      gloo_sizes.SequenceSpace(keys, [row["offset"] for row in decoded],
                                               [row["nbytes"] for row in decoded],
                                               first["space_start"], first["space_end"])))
    return views


def capture_collectives(messages: pd.DataFrame, space: list[dict]) -> pd.DataFrame:
    """One capture's Gloo collectives (decoders.protocols.gloo.collectives COLUMNS, sized), from its Gloo message
    rows and its SEQUENCE_SPACE rows (directions named by stream number or by flow id)."""
    from dlcsniff.decoders.protocols.gloo.collectives import collectives_from_messages
    return gloo_sizes.fitted(collectives_from_messages(messages), messages, _stream_views(space))


def resolve_job(job: JobColumns) -> None:
    """The job step: each capture's Gloo collectives, after the captures' own collectives rows."""
    messages = job.messages
    gloo_rows: dict[str, list[int]] = {}
    for row, (protocol, capture) in enumerate(zip(messages["protocol"], messages["capture"])):
        if protocol == "gloo":
            gloo_rows.setdefault(capture, []).append(row)
    if not gloo_rows:
        return
    from dlcsniff.decoders.arrow_without_pandas import pandas
    pd = pandas()               # only for jobs with Gloo traffic: the decoders stay quick to import

    space = job.capture_table(SEQUENCE_SPACE)
    space_rows: dict[str, list[dict]] = {}
    for row, capture in enumerate(space.get("capture", ())):
        space_rows.setdefault(capture, []).append({name: values[row] for name, values in space.items()})
    built: list[dict] = []
    for capture, rows in gloo_rows.items():
        frame = pd.DataFrame({name: [values[row] for row in rows] for name, values in messages.items()
                              if name != "capture"})
        built += [{**values, "capture": capture}
                  for values in frame_rows(capture_collectives(frame, space_rows.get(capture, [])))]
    names = dict.fromkeys(name for values in built for name in values)
    job.collectives.append({name: [values.get(name) for values in built] for name in names})
