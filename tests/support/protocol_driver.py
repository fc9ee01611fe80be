"""Runs chosen protocol decoders over one capture file exactly as `dlcsniff decode` drives them
(decoders.capture_decoder.CaptureDecoder behind the batch TCP driver), and gives back each decoder's rows as it
emitted them: TCP directions named by the reassembler's stream number, not yet by flow id."""
from __future__ import annotations

from pathlib import Path

from dlcsniff.decoders.capture_decoder import CaptureDecoder
from dlcsniff.decoders.inputs.capture_file import open_capture
from dlcsniff.decoders.packet import ParseStats, ip_to_str
from dlcsniff.decoders.protocols.base import CaptureRows, Count, ExtraStream, Row, StreamColumns
from dlcsniff.decoders.sansio import NEED_DATA
from dlcsniff.decoders.tcp_driver import BatchDecoder


def drain(decoder) -> list:
    """Every event a sans-IO decoder has ready (next_event until NEED_DATA)."""
    events = []
    while (event := decoder.next_event()) is not NEED_DATA:
        events.append(event)
    return events


def rows_of(decoder) -> CaptureRows:
    """A protocol decoder's events after the end of its capture, gathered back into CaptureRows."""
    rows = CaptureRows()
    for event in drain(decoder):
        if event.__class__ is Row and event.table == "messages":
            rows.messages.append(event.values)
        elif event.__class__ is Row:
            rows.tables.setdefault(event.table, []).append(event.values)
        elif event.__class__ is StreamColumns:
            rows.streams.setdefault(event.stream_id, {}).update(event.values)
        elif event.__class__ is ExtraStream:
            rows.extra_streams.append(event.values)
        else:
            assert event.__class__ in (Row, Count), event
    return rows


def run_decoders(path: str | Path, decoders: list, *, batched: bool = True) -> tuple[list[CaptureRows], dict[int, tuple]]:
    """Each decoder's rows for the capture at `path`, and each TCP stream id's key (src ip, src port, dst ip,
    dst port) with the addresses as text."""
    capture = CaptureDecoder(protocols=decoders)
    driver = BatchDecoder(capture.tcp, capture, ParseStats())
    with open_capture(path) as reader:
        for item in reader.batches() if batched else reader:
            capture.observe_link_layer(item)
            driver.feed(item)
    capture.end_of_input()
    keys = {s.stream_id: (ip_to_str(s.key[0]), s.key[1], ip_to_str(s.key[2]), s.key[3]) for s in capture.tcp.streams}
    return [rows_of(decoder) for decoder in decoders], keys


def run_decoder(path: str | Path, decoder) -> tuple[CaptureRows, dict[int, tuple]]:
    rows, keys = run_decoders(path, [decoder])
    return rows[0], keys


def gloo_collectives(rows: CaptureRows):
    """The Gloo collectives the job step builds from one capture's rows (decoders.protocols.gloo.job): its Gloo
    messages and its directions' sequence spaces, as a DataFrame."""
    import pandas as pd

    from dlcsniff.decoders.protocols.gloo.job import SEQUENCE_SPACE, capture_collectives
    messages = pd.DataFrame([row for row in rows.messages if row.get("protocol") == "gloo"])
    return capture_collectives(messages, rows.tables.get(SEQUENCE_SPACE, []))
