"""Gloo over TCP and PyTorch's TCPStore rendezvous: hand-built bytes, the real job's captures, damage, fuzz.

The real job (pcaps/gloo, recorded by `python -m lab.record gloo`): four torch 2.13 ranks, each in
its own network namespace, each writing its own record of every operation, including the Gloo work items
PyTorch's profiler saw it run and their tags (lab/workloads/gloo_job.py). Every capture is decoded
once per module through tests/support/protocol_driver.py (as `dlcsniff decode` drives a protocol decoder).
"""
from __future__ import annotations

import collections
import gzip
import json
import math
import random
import struct

import dpkt
import dpkt.sll2
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlcsniff.decoders.protocols.tcpstore import decoder as tcpstore
from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.protocols.gloo.decoder import GlooCaptureDecoder
from dlcsniff.decoders.protocols.gloo.wire import (P2P, GlooMessage, GlooStreamDecoder, Opcode, PairConnect, Slot,
                                                   parse_preamble, parse_rank_record, parse_slot, split_rank_key)
from dlcsniff.decoders.sansio import Resync
from dlcsniff.decoders.packet import ip_to_str
from dlcsniff.decoders.protocols.base import TcpDirection
from tests.conftest import PCAPS
from tests.support.protocol_driver import drain, gloo_collectives, rows_of, run_decoder
from tests.support.real_streams import real_stream_bytes

JOB = PCAPS / "gloo"
RANKS = range(4)
RNG = random.Random(5)


@pytest.fixture(autouse=True)
def same_random_bytes_in_any_test_order():
    RNG.seed(5)

# -- hand-built wire bytes (gloo/transport/tcp/pair.h: six native u64; gloo/types.cc: the slot layout) ------


def preamble(opcode: int, slot: int, length: int, nbytes: int | None = None, offset: int = 0,
             roffset: int = 0) -> bytes:
    if nbytes is None:
        nbytes = 48 + (length if opcode in (0, 1) else 0)
    return struct.pack("<QQQQQQ", nbytes, opcode, slot, offset, length, roffset)


def slot(prefix: int, tag: int, delta: int = 0) -> int:
    return (prefix << 56) | (tag << 24) | delta


def send(slot_value: int, payload: bytes) -> bytes:
    return preamble(1, slot_value, len(payload)) + payload


def initiator_stream() -> bytes:
    """What a connecting rank writes: its sequence number, then a ring all-reduce step and a p2p send."""
    allreduce = slot(4, 3)
    return (struct.pack("<q", 2) + preamble(2, allreduce, 1000) + send(allreduce, RNG.randbytes(1000))
            + preamble(3, slot(8, 4), 64) + preamble(2, 7, 5000) + send(7, bytes(5000)))


def decode(chunks, *, initiator: bool = True, midstream: bool = False) -> tuple[list, GlooStreamDecoder]:
    """chunks: (bytes, ts_ns) items, or ("gap", size) for bytes the capture lost."""
    decoder = GlooStreamDecoder(initiator=initiator, midstream=midstream)
    events = []
    for first, second in chunks:
        if first == "gap":
            decoder.receive_gap(second, 0)
        else:
            decoder.receive_data(first, second)
        events += drain(decoder)
    decoder.receive_end(0)
    return events + drain(decoder), decoder


def without_times(events: list) -> list:
    return [(e.__class__.__name__, getattr(e, "offset", None), getattr(e, "preamble", None), getattr(e, "sequence_number", None), getattr(e, "missing_bytes", None),
             getattr(e, "complete", None), getattr(e, "lost_bytes", None)) for e in events]


def every_way(stream: bytes, **options) -> list:
    """Whole, one byte at a time, random chunks: identical events (timestamps aside)."""
    whole, _ = decode([(stream, 1)], **options)
    assert without_times(decode([(stream[i:i + 1], 1) for i in range(len(stream))], **options)[0]) \
        == without_times(whole)
    cuts = sorted(RNG.sample(range(1, len(stream)), 12))
    pieces = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
    assert without_times(decode([(piece, 1) for piece in pieces], **options)[0]) == without_times(whole)
    return whole


# -- slots and preambles ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("prefix", "kind"), [(1, "gather"), (2, "all_gather"), (3, "reduce"), (4, "all_reduce"),
                                              (5, "scatter"), (6, "broadcast"), (7, "barrier"), (8, "all_to_all")])
def test_slot_names_the_collective_and_its_sequence_number(prefix, kind):
    parsed = parse_slot(slot(prefix, 0xDEADBEEF, 5))
    assert (parsed.kind, parsed.tag, parsed.delta) == (kind, 0xDEADBEEF, 5)


def test_slot_without_prefix_is_the_p2p_tag():
    assert parse_slot(12345) == Slot(P2P, 12345, 0)


@pytest.mark.parametrize("bad", [slot(9, 1), slot(0xFF, 1), slot(4, 1) | 0x100, slot(4, 1) | 0xFF00])
def test_slot_outside_gloos_layout_is_refused(bad):
    with pytest.raises(DecodeError):
        parse_slot(bad)


def test_preamble_fields():
    parsed = parse_preamble(b"xx" + preamble(0, slot(6, 2), 100, offset=64, roffset=32) + b"yy", 2)
    assert (parsed.nbytes, parsed.opcode, parsed.slot, parsed.offset, parsed.length, parsed.roffset) == \
        (148, Opcode.SEND_BUFFER, slot(6, 2), 64, 100, 32)
    assert parsed.payload_bytes == 100


@pytest.mark.parametrize("bad", [
    preamble(4, slot(4, 1), 0),                    # opcode beyond NOTIFY_RECV_READY
    preamble(1, slot(4, 1), 100, nbytes=100),      # nbytes != 48 + length
    preamble(2, slot(4, 1), 100, nbytes=148),      # a notification carries no payload
    preamble(1, slot(4, 1), 10, offset=8),         # offsets only address registered buffers
    preamble(1, slot(11, 1), 10),                  # no such collective
    preamble(1, slot(4, 1), 1 << 50),              # beyond any tensor
])
def test_preamble_that_cannot_be_one_is_refused(bad):
    with pytest.raises(DecodeError):
        parse_preamble(bad)


# -- one direction --------------------------------------------------------------------------------------------

def test_initiator_stream_whole_bytewise_chunked():
    events = every_way(initiator_stream())
    assert isinstance(events[0], PairConnect) and events[0].sequence_number == 2
    messages = [e for e in events if isinstance(e, GlooMessage)]
    assert [(m.preamble.opcode, parse_slot(m.preamble.slot).kind, m.preamble.length) for m in messages] == [
        (Opcode.NOTIFY_SEND_READY, "all_reduce", 1000), (Opcode.SEND_UNBOUND_BUFFER, "all_reduce", 1000),
        (Opcode.NOTIFY_RECV_READY, "all_to_all", 64), (Opcode.NOTIFY_SEND_READY, P2P, 5000),
        (Opcode.SEND_UNBOUND_BUFFER, P2P, 5000)]
    assert [m.offset for m in messages] == [8, 56, 1104, 1152, 1200]
    assert all(m.complete for m in messages)


def test_listener_stream_starts_with_a_preamble():
    stream = initiator_stream()[8:]
    events = every_way(stream, initiator=False)
    assert not any(isinstance(e, (PairConnect, Resync)) for e in events) and len(events) == 5


def test_trailing_bytes_change_nothing_before_them_and_count_as_lost():
    stream = initiator_stream()
    whole, _ = decode([(stream, 1)])
    for trailing in (preamble(1, slot(4, 9), 4096)[:20], preamble(1, slot(4, 9), 4096) + bytes(100)):
        events, decoder = decode([(stream + trailing, 1)])
        assert without_times(events[:len(whole)]) == without_times(whole)
        if len(trailing) < 48:                     # half a preamble: held, then lost at the end
            assert len(events) == len(whole) and decoder.lost_bytes == len(trailing)
        else:                                      # a message cut short by the end of the stream
            assert not events[-1].complete and events[-1].missing_bytes == 4096 - 100


def test_timestamps_are_those_of_the_first_and_last_bytes():
    stream = struct.pack("<q", 1) + send(slot(4, 0), bytes(3000))
    events, _ = decode([(stream[:20], 10), (stream[20:2000], 20), (stream[2000:], 30)])
    assert (events[1].ts_first_ns, events[1].ts_last_ns) == (10, 30)


def test_gap_inside_a_payload_only_makes_that_message_incomplete():
    stream = initiator_stream()
    cut = 56 + 48 + 500                            # inside the all-reduce segment's payload
    events, decoder = decode([(stream[:cut], 1), ("gap", 300), (stream[cut + 300:], 2)])
    messages = [e for e in events if isinstance(e, GlooMessage)]
    assert len(messages) == 5 and decoder.resyncs == 0
    assert [m.missing_bytes for m in messages] == [0, 300, 0, 0, 0]
    assert decoder.offset == len(stream)


def test_gap_over_a_preamble_resynchronises_on_the_next_one():
    stream = initiator_stream()
    start, end = 1104 + 10, 1152 + 5               # from inside one notification into the next
    events, decoder = decode([(stream[:start], 1), ("gap", end - start), (stream[end:], 2)])
    resyncs = [e for e in events if isinstance(e, Resync)]
    messages = [e for e in events if isinstance(e, GlooMessage)]
    assert len(resyncs) == 1 and resyncs[0].offset == 1200
    assert [m.offset for m in messages] == [8, 56, 1200]
    assert decoder.lost_bytes == 1200 - 1104 and decoder.offset == len(stream)


def test_capture_started_mid_connection_scans_for_a_preamble():
    stream = initiator_stream()
    events = every_way(stream[300:], midstream=True)
    assert isinstance(events[0], Resync) and events[0].offset == 1104 - 300
    assert len([e for e in events if isinstance(e, GlooMessage)]) == 3


def test_zero_filled_payload_is_not_taken_for_a_preamble():
    stream = send(slot(4, 1), bytes(50_000)) + preamble(3, slot(4, 2), 8)
    events, decoder = decode([(stream[100:], 1)], initiator=False, midstream=True)
    assert [e.offset for e in events if isinstance(e, Resync)] == [50_048 - 100]


# -- real streams -----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def job():
    return json.loads((JOB / "job.json").read_text())


@pytest.fixture(scope="module")
def records():
    return {rank: json.loads((JOB / f"rank{rank}.json").read_text()) for rank in RANKS}


@pytest.fixture(scope="module")
def decoded():
    """rank -> (messages, collectives, streams DataFrames, stream keys)"""
    out = {}
    for rank in RANKS:
        rows, keys = run_decoder(JOB / f"rank{rank}.pcap.gz", GlooCaptureDecoder())
        out[rank] = (pd.DataFrame(rows.messages), gloo_collectives(rows),
                     pd.DataFrame.from_dict(rows.streams, orient="index"), keys)
    return out


@pytest.fixture(scope="module")
def rank1_streams():
    return real_stream_bytes(JOB / "rank1.pcap.gz")


def test_real_gloo_streams_frame_exactly(rank1_streams, decoded):
    streams, keys = decoded[1][2], decoded[1][3]
    gloo = streams[streams["protocol"] == "gloo"]
    assert len(gloo) == 6                               # three peers, both directions
    for stream_id, row in gloo.iterrows():
        data = rank1_streams[keys[stream_id]]
        events, decoder = decode([(data, 1)], initiator=row["gloo_role"] == "initiator")
        messages = [e for e in events if isinstance(e, GlooMessage)]
        # Every byte belongs to a message (after the initiator's 8 bytes): the framing never slipped.
        assert sum(m.preamble.nbytes for m in messages) == len(data) - (8 if row["gloo_role"] == "initiator" else 0)
        assert decoder.resyncs == 0 and decoder.lost_bytes == 0 and all(m.complete for m in messages)


def test_real_stream_bytes_decode_the_same_however_cut(rank1_streams, decoded):
    streams, keys = decoded[1][2], decoded[1][3]
    initiator = streams[(streams["protocol"] == "gloo") & (streams["gloo_role"] == "initiator")].index[0]
    head = rank1_streams[keys[initiator]][:6000]           # sequence number, notifications, payloads
    events = every_way(head)
    assert isinstance(events[0], PairConnect) and sum(isinstance(e, GlooMessage) for e in events) >= 3


# -- the rendezvous -----------------------------------------------------------------------------------------------

def test_rank_key_split():
    assert split_rank_key("/default_pg/0//cpu//0/3") == ("/default_pg/0//cpu//0", 3)
    assert split_rank_key("init/") is None and split_rank_key("3") is None


@pytest.mark.parametrize("bad", [b"", b"\x05" + bytes(7) + b"ab", struct.pack("<Q", 1 << 40) + bytes(200),
                                 struct.pack("<Q", 2) + b"vm" + struct.pack("<Q", 136) + struct.pack("<H", 7)
                                 + bytes(150)])
def test_rank_record_that_cannot_be_one_is_refused(bad):
    with pytest.raises(DecodeError):
        parse_rank_record(bad)


def vec(data: bytes | str) -> bytes:
    data = data.encode() if isinstance(data, str) else data
    return struct.pack("<Q", len(data)) + data


# (query, request arguments, response bytes or None, expected request keys/values/number, response values/number)
STORE_CASES = [
    (0, struct.pack("<I", 0x3C85F7CE), None, ((), (), 0x3C85F7CE), None),
    (13, struct.pack("<I", 77), struct.pack("<I", 77), ((), (), 77), ((), 77)),
    (1, vec("k") + vec(b"v1"), None, (("k",), (b"v1",), None), None),
    (2, vec("k") + vec(b"v1") + vec(b"v2"), vec(b"v2"), (("k",), (b"v1", b"v2"), None), ((b"v2",), None)),
    (3, vec("k"), vec(b"v2"), (("k",), (), None), ((b"v2",), None)),
    (4, vec("n") + struct.pack("<q", 5), struct.pack("<q", 12), (("n",), (), 5), ((), 12)),
    (5, struct.pack("<Q", 2) + vec("a") + vec("b"), b"\x01", (("a", "b"), (), None), ((), 1)),
    (6, struct.pack("<Q", 1) + vec("a"), b"\x00", (("a",), (), None), ((), 0)),
    (7, b"", struct.pack("<q", 9), ((), (), None), ((), 9)),
    (8, vec("a"), struct.pack("<q", 1), (("a",), (), None), ((), 1)),
    (9, vec("a") + vec(b"xy"), None, (("a",), (b"xy",), None), None),
    (10, struct.pack("<Q", 2) + vec("a") + vec("b"), vec(b"1") + vec(b""), (("a", "b"), (), None),
     ((b"1", b""), None)),
    (11, struct.pack("<Q", 2) + vec("a") + vec(b"1") + vec("b") + vec(b"2"), None,
     (("a", "b"), (b"1", b"2"), None), None),
    (12, b"", b"\x01", ((), (), None), ((), 1)),
    (14, vec("q") + vec(b"item"), None, (("q",), (b"item",), None), None),
    (15, vec("q"), struct.pack("<q", 1) + vec(b"item"), (("q",), (), None), ((b"item",), 1)),
    (15, vec("q"), struct.pack("<q", 0), (("q",), (), None), ((), 0)),
    (16, vec("q"), struct.pack("<q", 3), (("q",), (), None), ((), 3)),
    (17, b"", struct.pack("<q", 2) + vec("a") + vec("b"), ((), (), None), ((b"a", b"b"), 2)),
    (18, vec("bar") + struct.pack("<q", 4), b"\x00", (("bar",), (), 4), ((), 0)),
]


def exchange_fields(exchange: tcpstore.StoreExchange) -> tuple:
    """Everything but the capture times."""
    request, response = exchange.request, exchange.response
    return (request.offset, request.size_bytes, request.query, request.keys, request.values, request.number,
            response and (response.offset, response.size_bytes, response.values, response.number))


def end_store(connection: tcpstore.TcpStoreConnection, ts_ns: int) -> list:
    """End both directions of a store connection; the exchanges that makes."""
    connection.requests.receive_end(ts_ns)
    connection.responses.receive_end(ts_ns)
    return drain(connection)


def test_every_tcpstore_query_whole_bytewise_and_with_trailing_bytes():
    requests = b"".join(bytes([query]) + args for query, args, *_ in STORE_CASES)
    responses = b"".join(response for _, _, response, *_ in STORE_CASES if response is not None)

    def run(request_chunks, response_chunks):
        connection = tcpstore.TcpStoreConnection()
        exchanges = []
        for chunk in request_chunks:
            connection.requests.receive_data(chunk, 1)
            exchanges += drain(connection)
        for chunk in response_chunks:
            connection.responses.receive_data(chunk, 2)
            exchanges += drain(connection)
        return connection, sorted(exchanges, key=lambda e: e.request.offset)

    connection, exchanges = run([requests], [responses])
    assert connection.failed is None and len(exchanges) == len(STORE_CASES)
    for exchange, (query, _, response, request_fields, response_fields) in zip(exchanges, STORE_CASES):
        request = exchange.request
        assert (request.query, (request.keys, request.values, request.number)) == (query, request_fields)
        got = exchange.response and (exchange.response.values, exchange.response.number)
        assert got == response_fields
    bytewise = run([requests[i:i + 1] for i in range(len(requests))],
                   [responses[i:i + 1] for i in range(len(responses))])[1]
    assert [exchange_fields(e) for e in bytewise] == [exchange_fields(e) for e in exchanges]
    # Trailing bytes: half of one more GET, and a byte of its answer, change nothing before them.
    trailing_connection, trailing = run([requests + b"\x03" + vec("key")[:5]], [responses + b"\x07"])
    assert [exchange_fields(e) for e in trailing] == [exchange_fields(e) for e in exchanges]
    assert end_store(trailing_connection, 3) == [] and trailing_connection.lost_bytes == 7


def test_tcpstore_connection_must_start_with_validate():
    connection = tcpstore.TcpStoreConnection()
    connection.requests.receive_data(b"\x03" + vec("k"), 1)
    assert drain(connection) == []
    assert connection.failed and "VALIDATE" in connection.failed


def store_chunks() -> tuple[list[bytes], list[bytes | None]]:
    """STORE_CASES as a client writes them: one chunk per request, each answered (or not) before the next."""
    return ([bytes([query]) + args for query, args, *_ in STORE_CASES],
            [response for _, _, response, *_ in STORE_CASES])


def test_tcpstore_loss_costs_only_the_messages_it_hit():
    requests, responses = store_chunks()
    lost_requests, lost_responses = {3, 9}, {6, 15}       # COMPARE_SET, DELETE_KEY; CHECK, QUEUE_POP answers
    connection = tcpstore.TcpStoreConnection()
    exchanges = []
    for i, (request, response) in enumerate(zip(requests, responses)):
        ts = 10 * i
        if i in lost_requests:
            connection.requests.receive_gap(len(request), ts)
        else:
            connection.requests.receive_data(request, ts)
        exchanges += drain(connection)
        if response is not None:
            if i in lost_responses:
                connection.responses.receive_gap(len(response), ts + 5)
            else:
                connection.responses.receive_data(response, ts + 5)
            exchanges += drain(connection)
    exchanges += end_store(connection, 1000)
    assert connection.failed is None
    by_offset = {e.request.offset: e for e in exchanges}
    offsets = [sum(map(len, requests[:i])) for i in range(len(requests))]
    for i, (query, _, response, request_fields, response_fields) in enumerate(STORE_CASES):
        if i in lost_requests:
            assert offsets[i] not in by_offset
            continue
        exchange = by_offset[offsets[i]]
        assert (exchange.request.query, (exchange.request.keys, exchange.request.values,
                                         exchange.request.number)) == (query, request_fields)
        got = exchange.response and (exchange.response.values, exchange.response.number)
        assert got == (None if i in lost_responses else response_fields), i


def test_tcpstore_responses_handed_over_before_their_requests_are_paired_in_time():
    """A direction with a hole is reassembled late: its later bytes may reach the decoder after the
    responses to them."""
    requests, responses = store_chunks()
    connection = tcpstore.TcpStoreConnection()
    connection.requests.receive_data(requests[0], 0)
    exchanges = drain(connection)
    connection.requests.receive_gap(len(requests[1]), 15)
    exchanges += drain(connection)
    for i in range(1, len(requests)):
        if responses[i] is not None:
            connection.responses.receive_data(responses[i], 10 * i + 5)
            exchanges += drain(connection)
    for i in range(2, len(requests)):
        connection.requests.receive_data(requests[i], 10 * i)
        exchanges += drain(connection)
    exchanges += end_store(connection, 1000)
    answered = {e.request.query: e.response.values for e in exchanges if e.response is not None}
    assert answered[tcpstore.Query.GET] == (b"v2",) and answered[tcpstore.Query.MULTI_GET] == (b"1", b"")
    assert len([e for e in exchanges if e.request.query != tcpstore.Query.VALIDATE]) == len(requests) - 2


@pytest.mark.parametrize(("prefix", "verdict"), [
    (bytes([3]) + vec("/default_pg/0//cpu//0/3"), True),            # GET of a rank's record
    (bytes([13]) + struct.pack("<I", 5) + bytes([4]) + vec("init/") + struct.pack("<q", 1), True),
    (bytes([6]) + struct.pack("<Q", 1) + vec("init/"), True),        # WAIT on one key
    (bytes([13]) + struct.pack("<I", 5), None), (bytes([3, 5, 0]), None),
    (bytes([3]) + vec(b"\x00\x01\x02\x03\x04\x05\x06\x07"), False), (bytes([40]), False),
    (struct.pack("<6Q", 48, 2, 4 << 56, 0, 1000, 0), False),       # a Gloo preamble
])
def test_a_store_client_caught_without_its_start_is_recognised(prefix, verdict):
    assert tcpstore.looks_like_request(prefix) is verdict


def store_messages(decoded, rank: int) -> pd.DataFrame:
    messages = decoded[rank][0]
    return messages[messages["protocol"] == "tcpstore"]


def test_tcpstore_queries_of_torch_2_13(decoded):
    # Rank 0 hosts the store: its capture holds every rank's client connection.
    store = store_messages(decoded, 0)
    assert store["stream_id"].nunique() == 4
    per_connection = store.sort_values("ts_first_ns").groupby("stream_id")
    assert (per_connection["store_query"].first() == "VALIDATE").all()
    assert (store.loc[store["store_query"] == "VALIDATE", "store_number"] == tcpstore.VALIDATION_MAGIC).all()
    pings = store[store["store_query"] == "PING"]
    assert len(pings) == 4 and pings["complete"].all() and (pings["response_bytes"] == 4).all()
    joined = store[(store["store_query"] == "ADD") & (store["store_key"] == "init/")]
    assert sorted(joined["store_number"]) == [1, 2, 3, 4]   # the store's count of ranks arriving
    assert store["complete"].all()
    assert set(store["store_query"]) <= {"VALIDATE", "PING", "ADD", "SET", "WAIT", "GET", "CHECK", "MULTI_GET"}


def test_rendezvous_publishes_every_rank_at_its_address(decoded, job):
    ips = {node["rank"]: node["ip"] for node in job["nodes"]}
    for rank in RANKS:
        sets = store_messages(decoded, rank)
        sets = sets[sets["store_query"] == "SET"]
        keys = {split_rank_key(key) for key in sets["store_key"]}
        if rank == 0:
            assert {rank_number for _, rank_number in keys} == set(RANKS)
        else:
            assert {rank_number for _, rank_number in keys} == {rank}      # a client sets its own key only
    # The streams' ranks come from those records: each matches the address the recorder gave the rank.
    for rank in RANKS:
        _, _, streams, keys = decoded[rank]
        gloo = streams[streams["protocol"] == "gloo"]
        for stream_id, row in gloo.iterrows():
            key = keys[stream_id]
            assert ips[row["rank"]] == key[0] and ips[row["peer_rank"]] == key[2]
        assert gloo["lost_bytes"].sum() == 0 and gloo["resyncs"].sum() == 0


def test_rank_records_from_the_real_rendezvous(rank1_streams, job):
    """Decode rank 1's store connection directly: the values it GETs are the records ranks SET."""
    client = next(key for key, data in rank1_streams.items() if data.startswith(tcpstore.VALIDATE_PREFIX))
    requests, responses = rank1_streams[client], rank1_streams[(client[2], client[3], client[0], client[1])]
    connection = tcpstore.TcpStoreConnection()
    connection.requests.receive_data(requests, 1)
    exchanges = drain(connection)
    connection.responses.receive_data(responses, 2)
    exchanges += drain(connection) + end_store(connection, 3)
    assert connection.failed is None
    gets = {e.request.keys[0]: e.response.values[0] for e in exchanges if e.request.query == tcpstore.Query.GET}
    ips = {node["rank"]: node["ip"] for node in job["nodes"]}
    assert len(gets) == 4
    for key, value in gets.items():
        record = parse_rank_record(value)
        _, rank = split_rank_key(key)
        assert ip_to_str(record.ip) == ips[rank] and len(record.pair_ids) == job["world_size"]
    # Fed interleaved one byte at a time, both directions give the same exchanges.
    bytewise = tcpstore.TcpStoreConnection()
    again = []
    for i in range(max(len(requests), len(responses))):
        if i < len(requests):
            bytewise.requests.receive_data(requests[i:i + 1], 1)
            again += drain(bytewise)
        if i < len(responses):
            bytewise.responses.receive_data(responses[i:i + 1], 2)
            again += drain(bytewise)
    again += end_store(bytewise, 3)

    def in_request_order(found):     # an exchange is emitted when complete: order follows the feeding
        return [exchange_fields(e) for e in sorted(found, key=lambda e: e.request.offset)]
    assert in_request_order(again) == in_request_order(exchanges)


# -- every operation of the real job ----------------------------------------------------------------------------

def recorded_collective_works(record: dict):
    """(operation, work, tag) for every collective Gloo work the rank's profiler saw."""
    for operation in record["operations"]:
        works = [work for work in operation["gloo_works"] if work["name"] not in ("send", "recv")]
        assert len(works) == len(operation["gloo_tags"])
        yield from ((operation, work, tag) for work, tag in zip(works, operation["gloo_tags"]))


def work_bytes(operation: dict, work: dict) -> int:
    """The tensor the work moved, from the profiler's input shapes (float32); other kinds: the record's size."""
    if work["name"] in ("all_reduce", "all_to_all"):
        return 4 * sum(math.prod(shape) for shape in work["input_shapes"])
    return operation["tensor_bytes"]


def find(collectives: pd.DataFrame, kind: str, seq: int) -> pd.DataFrame:
    return collectives[(collectives["kind"] == kind) & (collectives["seq"] == seq)]


@pytest.mark.parametrize("rank", RANKS)
def test_every_recorded_collective_is_found_with_kind_seq_and_size(decoded, records, rank):
    collectives = decoded[rank][1]
    works = list(recorded_collective_works(records[rank]))
    assert [tag for _, _, tag in works] == list(range(len(works))) and len(works) > 10
    for operation, work, tag in works:
        found = find(collectives, work["name"], tag)
        assert len(found) == 1, (operation["order"], work["name"], tag)
        row = found.iloc[0]
        assert row["world_size"] == 4 and row["local_rank"] == rank and row["complete"]
        assert set(row["peers"]) <= set(RANKS) - {rank} and (row["peers"] or work["name"] == "barrier")
        truth = work_bytes(operation, work)
        assert abs(row["tensor_bytes"] - truth) <= 0.02 * truth, (work["name"], tag, row["tensor_bytes"], truth)
    # Nothing else on the wire: every collective row is one the program ran.
    assert len(collectives[~collectives["kind"].isin(["send", "recv"])]) == len(works)


@pytest.mark.parametrize("rank", RANKS)
def test_every_recorded_send_and_recv_is_found(decoded, records, rank):
    collectives = decoded[rank][1]
    seen = collections.Counter()
    p2p = [op for op in records[rank]["operations"] if op["kind"] in ("send", "recv")]
    assert len(p2p) == 4
    for operation in p2p:
        seq = seen[(operation["kind"], operation["peer"], operation["tag"])]
        seen[(operation["kind"], operation["peer"], operation["tag"])] += 1
        found = find(collectives, operation["kind"], seq)
        found = found[found["peers"].map(lambda peers: peers == [operation["peer"]])]
        assert len(found) == 1, operation
        assert found.iloc[0]["tensor_bytes"] == operation["tensor_bytes"]


def test_reduce_scatter_is_all_reduce_on_the_wire(decoded, records):
    """PyTorch 2.13's Gloo backend runs reduce_scatter as all-reduces: the wire can only show those."""
    operations = [op for op in records[1]["operations"] if op["kind"] == "reduce_scatter"]
    assert {work["name"] for op in operations for work in op["gloo_works"]} == {"all_reduce"}
    assert "reduce_scatter" not in set(decoded[1][1]["kind"])


# -- a lossy capture -------------------------------------------------------------------------------------------

def rewrite(source, target, keep) -> tuple[int, list]:
    """Copy a capture with only the packets keep(index, packet bytes) accepts (dpkt, independently of
    dlcsniff's readers); return how many were left out and the packets' times (s)."""
    with gzip.open(source, "rb") as f:
        reader = dpkt.pcap.Reader(f)
        linktype, packets = reader.datalink(), [(ts, bytes(buf)) for ts, buf in reader]
    left_out = 0
    with open(target, "wb") as f:
        writer = dpkt.pcap.Writer(f, linktype=linktype, nano=True)
        for index, (ts, buf) in enumerate(packets):
            if keep(index, buf):
                writer.writepkt(buf, ts=ts)
            else:
                left_out += 1
    return left_out, [ts for ts, _ in packets]


def carries_tcp_data(buf: bytes) -> bool:
    ip = dpkt.sll2.SLL2(buf).data
    return isinstance(ip, dpkt.ip.IP) and isinstance(ip.data, dpkt.tcp.TCP) and bool(ip.data.data)


def test_lossy_captures_show_every_operation_with_its_size(records, tmp_path):
    """10 % of the TCP segments carrying data left out: every collective still found with kind, seq and its
    tensor within 1 % (from what the messages left state and the sequence space), ranks still resolved."""
    for rank in RANKS:
        lossy = tmp_path / f"rank{rank}.pcap"
        rng = random.Random(rank)
        dropped, _ = rewrite(JOB / f"rank{rank}.pcap.gz", lossy,
                             lambda _, buf: not (carries_tcp_data(buf) and rng.random() < 0.10))
        assert dropped > 1000
        rows, _ = run_decoder(lossy, GlooCaptureDecoder())
        collectives = gloo_collectives(rows)
        streams = pd.DataFrame.from_dict(rows.streams, orient="index")
        gloo = streams[streams["protocol"] == "gloo"]
        assert gloo["resyncs"].sum() > 0 and gloo["lost_bytes"].sum() > 0, "the damage hit no preamble"
        assert len(gloo) == 6 and gloo["rank"].notna().all() and gloo["peer_rank"].notna().all()
        assert not collectives["complete"].all()
        for operation, work, tag in recorded_collective_works(records[rank]):
            found = find(collectives, work["name"], tag)
            assert len(found) == 1, (rank, work["name"], tag)
            truth = work_bytes(operation, work)
            assert abs(found.iloc[0]["tensor_bytes"] - truth) <= 0.01 * truth, (rank, work["name"], tag)


def test_capture_started_mid_job_finds_the_later_operations(records, tmp_path):
    """No rendezvous, no connection set-up: streams are caught at a message boundary, ranks stay unknown."""
    later = found = 0
    for rank in (0, 3):
        cut = tmp_path / f"rank{rank}.pcap"
        _, times = rewrite(JOB / f"rank{rank}.pcap.gz", cut, lambda index, _: index >= 12_000)
        rows, _ = run_decoder(cut, GlooCaptureDecoder())
        collectives = gloo_collectives(rows)
        assert collectives["local_rank"].isna().all() and (collectives["world_size"] == 4).all()
        cut_ns = int(times[12_000] * 1e9)
        for operation, work, tag in recorded_collective_works(records[rank]):
            if operation["start_ns"] > cut_ns + 5_000_000:
                later += 1
                found += len(find(collectives, work["name"], tag)) == 1
    assert later > 10 and found >= 0.9 * later, f"{found} of {later}"


@pytest.mark.parametrize("capture", ["mxnet_sync/worker0.pcap.gz", "zmq/client.pcap.gz"])
def test_other_protocols_are_not_claimed(capture):
    rows, keys = run_decoder(PCAPS / capture, GlooCaptureDecoder())
    assert len(keys) > 4 and not rows.streams and not rows.messages


# -- fuzz ----------------------------------------------------------------------------------------------------------

wire_pieces = st.one_of(
    st.binary(max_size=80),
    st.builds(lambda op, pre, tag, n: preamble(op, slot(pre, tag), n) + bytes(n if op in (0, 1) else 0),
              st.integers(0, 3), st.integers(0, 8), st.integers(0, 50), st.integers(0, 300)),
    st.integers(1, 400).map(lambda n: ("gap", n)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(wire_pieces, max_size=12), st.booleans(), st.booleans())
def test_fuzz_stream_decoder_never_raises_and_accounts_for_every_byte(pieces, initiator, midstream):
    decoder = GlooStreamDecoder(initiator=initiator, midstream=midstream)
    fed = 0
    last_offset = -1
    for ts_ns, piece in enumerate(pieces):
        if isinstance(piece, tuple):
            decoder.receive_gap(piece[1], ts_ns)
            fed += piece[1]
        else:
            decoder.receive_data(piece, ts_ns)
            fed += len(piece)
        for event in drain(decoder):
            if isinstance(event, GlooMessage):
                assert event.offset > last_offset and event.offset + event.preamble.nbytes <= fed
                last_offset = event.offset
    decoder.receive_end(len(pieces))
    assert decoder.offset == fed


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.binary(max_size=60)), max_size=10))
def test_fuzz_tcpstore_connection_fails_cleanly(chunks):
    connection = tcpstore.TcpStoreConnection()
    for to_server, data in [(True, tcpstore.VALIDATE_PREFIX), *chunks]:
        (connection.requests if to_server else connection.responses).receive_data(data, 0)
        for exchange in drain(connection):
            assert isinstance(exchange.request.query, tcpstore.Query)
    end_store(connection, 0)
    assert connection.failed is None or isinstance(connection.failed, str)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_parsers_raise_only_decode_errors(data):
    for parse in (parse_preamble, parse_rank_record):
        try:
            parse(data)
        except DecodeError:
            pass
    if len(data) >= 8:
        try:
            parse_slot(int.from_bytes(data[:8], "little"))
        except DecodeError:
            pass


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=70), st.booleans()), min_size=1, max_size=6))
def test_fuzz_capture_decoder_claims_and_finishes_cleanly(streams):
    decoder = GlooCaptureDecoder()
    for stream_id, (prefix, syn_seen) in enumerate(streams):
        key = (bytes([198, 18, 0, stream_id % 3]), 1000 + stream_id, bytes([198, 18, 0, 9]), 2000)
        verdict = decoder.claim(TcpDirection(stream_id, key, syn_seen), prefix[:64])
        assert verdict in (True, False, None)
        if verdict:
            decoder.receive_data(stream_id, memoryview(prefix), 1)
            decoder.receive_gap(stream_id, 10, 2, True)
            decoder.receive_end(stream_id, 3)
    decoder.end_of_capture()
    rows = rows_of(decoder)
    assert all(row["protocol"] in ("gloo", "tcpstore") for row in rows.messages)
