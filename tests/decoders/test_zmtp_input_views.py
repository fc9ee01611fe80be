"""A ZMTP decoder waiting for more input keeps no view of the input it was given. The capture reader hands the
decoders views of its read buffers (a few MB each) and reuses a buffer once nothing views it; a decoder that
kept a view while a large message goes by (ps-lite's meta and keys wait for the values frame that follows them)
kept the whole buffer alive, on every stream at once: the 1 GB MXNet capture of `make bench` peaked at 208 MB.

Real directions of the bundled MXNet job (ps-lite over ZMTP), each chunk given as a view of a buffer of its own:
after every chunk the decoder is drained to NEED_DATA, and then no buffer may be viewed any more (a bytearray
with a view cannot be resized). The events are those of the same chunks given as bytes.
"""
from __future__ import annotations

import pytest

from dlcsniff.decoders.protocols.zmtp.decoder import Message, ZmtpDecoder
from tests.conftest import PCAPS
from tests.support.protocol_driver import drain
from tests.support.real_streams import real_stream_chunks


def viewed(buffer: bytearray) -> bool:
    try:
        buffer.append(0)
    except BufferError:
        return True
    buffer.pop()
    return False


def zmtp_directions(capture: str) -> list[list[tuple[bytes, int]]]:
    streams = real_stream_chunks(PCAPS / capture)
    return [chunks for chunks in streams.values() if chunks and chunks[0][0][:1] == b"\xff"]


@pytest.mark.parametrize("capture", ["mxnet_sync/worker0.pcap.gz", "mxnet_sync/server0.pcap.gz"])
def test_a_waiting_decoder_views_none_of_its_input(capture):
    directions = zmtp_directions(capture)
    assert directions
    messages_spanning_chunks = kept_bodies = 0
    for chunks in directions:
        as_bytes, as_views = ZmtpDecoder(), ZmtpDecoder()
        expected, got, held = [], [], []
        for data, ts_ns in chunks:
            as_bytes.receive_data(data, ts_ns)
            expected += [_plain(e) for e in drain(as_bytes)]
            buffer = bytearray(data)
            as_views.receive_data(memoryview(buffer), ts_ns)
            # (an event's kept bodies are views: its consumer's to keep or drop, as the capture decoder does)
            events = [_plain(e) for e in drain(as_views)]
            messages_spanning_chunks += not events
            got += events
            held.append(buffer)
            assert not any(viewed(b) for b in held)
        # the events, with their bodies as bytes, are those of the bytes
        assert got == expected
        kept_bodies += sum(isinstance(e, tuple) and any(e[3]) for e in got)
    assert kept_bodies and messages_spanning_chunks, "nothing kept or nothing waited: the test would see nothing"


def _plain(event):
    if isinstance(event, Message):
        return (event.ts_first_ns, event.ts_last_ns, event.frame_sizes,
                tuple(None if f is None else bytes(f) for f in event.frames), event.complete)
    return event
