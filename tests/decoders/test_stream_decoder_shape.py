"""Every stream decoder has the one shape, decoders.sansio.StreamDecoder: the same four methods with the same
signatures, and the same end. Fed a direction of a bundled capture cut inside its last message, a decoder waits
(NEED_DATA); told the end, it hands out what the cut left as its final events, then NEED_DATA. An empty chunk
before the end, or a second end, changes nothing.

To hold another decoder to it: its class in SHAPED, and a function in CASES that feeds it a real direction.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Callable

import pytest

from dlcsniff.decoders.formats import probe_events as ev
from dlcsniff.decoders.protocols.gloo.wire import GlooMessage, GlooStreamDecoder, is_preamble
from dlcsniff.decoders.protocols.nccl_socket.bootstrap import BootstrapStream
from dlcsniff.decoders.protocols.nccl_socket.decoder import _ControlSocket, _DataSocket
from dlcsniff.decoders.protocols.tcpstore.decoder import (VALIDATE_PREFIX, Query, RequestsEnded, StoreExchange,
                                                          StoreRequestDecoder, StoreResponseDecoder,
                                                          TcpStoreConnection)
from dlcsniff.decoders.protocols.zmtp.decoder import Message, ZmtpDecoder
from dlcsniff.decoders.sansio import NEED_DATA, StreamDecoder
from tests.conftest import PCAPS
from tests.support.protocol_driver import drain
from tests.support.real_streams import real_stream_chunks, reverse

# (RoCE's queue pairs take packets, not bytes, in the same shape: tests/decoders/test_stream_shape_nccl_roce.py,
# which also feeds the NCCL socket decoders their real directions.)
SHAPED = [ZmtpDecoder, GlooStreamDecoder, StoreRequestDecoder, StoreResponseDecoder, BootstrapStream,
          _ControlSocket, _DataSocket]
METHODS = ("receive_data", "receive_gap", "receive_end", "next_event")


def parameters(function) -> list[tuple]:
    return [(p.name, p.kind, p.default, p.annotation) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize("cls", SHAPED, ids=lambda cls: cls.__name__)
def test_the_methods_of_the_shape_with_its_signatures(cls):
    for name in METHODS:
        assert parameters(getattr(cls, name)) == parameters(getattr(StreamDecoder, name)), name


# -- the end, on real directions ------------------------------------------------------------------------------

@dataclass
class Fed:
    """A decoder about to be fed its direction's chunks, and what its final events must be."""
    decoder: StreamDecoder
    chunks: list[tuple[bytes, int]]
    check_final: Callable[[list], None]


@functools.cache
def capture(path: str) -> dict:
    return real_stream_chunks(PCAPS / path)


def whole(chunks) -> bytes:
    return b"".join(data for data, _ in chunks)


def cut_at(chunks: list[tuple[bytes, int]], size: int) -> list[tuple[bytes, int]]:
    """The chunks' first `size` bytes."""
    out, total = [], 0
    for data, ts_ns in chunks:
        if total + len(data) >= size:
            return out + [(data[:size - total], ts_ns)] if size > total else out
        out.append((data, ts_ns))
        total += len(data)
    return out


def zmtp_direction() -> Fed:
    """The client's largest ZMTP direction of the bundled pyzmq job, less the last byte of its last message."""
    streams = capture("zmq/client.pcap.gz")
    chunks = max((c for c in streams.values() if whole(c)[:1] == b"\xff"), key=lambda c: len(whole(c)))
    uncut = ZmtpDecoder()
    for data, ts_ns in chunks:
        uncut.receive_data(data, ts_ns)
    uncut.receive_end(0)
    last = [event for event in drain(uncut) if isinstance(event, Message)][-1]
    assert last.complete and last.frame_sizes[-1] > 1

    def check_final(final):
        assert len(final) == 1 and isinstance(final[0], Message) and not final[0].complete
        assert final[0].frame_sizes == last.frame_sizes and final[0].frames[-1] is None
    return Fed(ZmtpDecoder(), cut_at(chunks, len(whole(chunks)) - 1), check_final)


def gloo_direction() -> Fed:
    """Rank 1's largest Gloo direction of the bundled Gloo job, cut halfway through its last payload."""
    streams = capture("gloo/rank1.pcap.gz")
    chunks = max((c for c in streams.values() if not whole(c).startswith(VALIDATE_PREFIX)),
                 key=lambda c: len(whole(c)))
    initiator = not is_preamble(whole(chunks), 0)
    uncut = GlooStreamDecoder(initiator=initiator)
    for data, ts_ns in chunks:
        uncut.receive_data(data, ts_ns)
    messages = [event for event in drain(uncut) if isinstance(event, GlooMessage)]
    last = [message for message in messages if message.preamble.payload_bytes > 1][-1]
    kept = last.preamble.payload_bytes // 2

    def check_final(final):
        assert len(final) == 1 and isinstance(final[0], GlooMessage) and final[0].offset == last.offset
        assert not final[0].complete and final[0].missing_bytes == last.preamble.payload_bytes - kept
    return Fed(GlooStreamDecoder(initiator=initiator), cut_at(chunks, last.offset + 48 + kept), check_final)


def store_connection() -> tuple[list, list, list[StoreExchange]]:
    """Rank 1's TCPStore client connection of the bundled Gloo job: both directions' chunks, its exchanges."""
    streams = capture("gloo/rank1.pcap.gz")
    client = next(key for key, chunks in streams.items() if whole(chunks).startswith(VALIDATE_PREFIX))
    requests, responses = streams[client], streams[reverse(client)]
    connection = TcpStoreConnection()
    exchanges = []
    for direction, chunks in ((connection.requests, requests), (connection.responses, responses)):
        for data, ts_ns in chunks:
            direction.receive_data(data, ts_ns)
            exchanges += drain(connection)
        direction.receive_end(0)
        exchanges += drain(connection)
    assert connection.failed is None and all(exchange.response for exchange in exchanges
                                             if exchange.request.query in (Query.GET, Query.MULTI_GET))
    return requests, responses, exchanges


def store_requests() -> Fed:
    """Rank 1's requests to the store, less the last byte: the last request is lost, then the end."""
    requests, _, exchanges = store_connection()
    last = max((exchange.request for exchange in exchanges), key=lambda request: request.offset)
    decoder = StoreRequestDecoder()

    def check_final(final):
        assert final == [RequestsEnded()] and decoder.lost_bytes == last.size_bytes - 1
    return Fed(decoder, cut_at(requests, len(whole(requests)) - 1), check_final)


def store_responses() -> Fed:
    """The store's responses to rank 1, told every request, less their last byte: the last query answered gets
    no response."""
    requests, responses, exchanges = store_connection()
    answered = [exchange for exchange in exchanges if exchange.response is not None]
    last = max(answered, key=lambda exchange: exchange.response.offset)
    connection = TcpStoreConnection()
    for data, ts_ns in requests:
        connection.requests.receive_data(data, ts_ns)
        drain(connection)
    connection.requests.receive_end(0)
    drain(connection)
    decoder = connection.responses

    def check_final(final):
        assert final == [StoreExchange(last.request, None)]
        assert decoder.lost_bytes == last.response.size_bytes - 1
    return Fed(decoder, cut_at(responses, len(whole(responses)) - 1), check_final)


CASES = [zmtp_direction, gloo_direction, store_requests, store_responses]


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.__name__)
def test_the_end_gives_the_final_events_then_need_data(case):
    fed = case()
    decoder = fed.decoder
    for data, ts_ns in fed.chunks:
        decoder.receive_data(data, ts_ns)
        drain(decoder)
    last_ts_ns = fed.chunks[-1][1]
    decoder.receive_data(b"", last_ts_ns)
    assert decoder.next_event() is NEED_DATA            # an empty chunk is no end: the cut message waits
    decoder.receive_end(last_ts_ns + 1)
    fed.check_final(drain(decoder))
    assert decoder.next_event() is NEED_DATA
    decoder.receive_end(last_ts_ns + 2)
    assert drain(decoder) == []


def test_a_probe_file_ends_the_same_way_without_times_or_gaps():
    """A probe file is read whole, its records timed by the daemon: ProbeFileDecoder has the shape's data and end,
    without capture times or gaps."""
    records = ev.daemon_record(ev.Kind.CLOCK, {"mono_ns": 1, "realtime_ns": 2})
    data = ev.file_header({"set": 1}) + records * 3
    decoder = ev.ProbeFileDecoder()
    decoder.receive_data(data[:-1])
    decoder.receive_data(b"")
    assert len(drain(decoder)) == 2 and decoder.truncated_bytes == 0
    decoder.receive_end()
    assert drain(decoder) == [] and decoder.truncated_bytes == len(records) - 1
