"""Pure parsers of probe events (decoders/formats/probe_events.py), on bytes the real probes wrote.

The records below were taken from a real daemon run (probes-0001.events) while a pyzmq 26 / libzmq 4.3.5
program (pid 1622) bound a PUSH socket on 127.0.0.1:5999, connected a PULL socket to it and sent
multipart messages [b"meta<i>", b"x" * 1000 * i]. The expected values come from that program, not from
the parser: ports, frame sizes, ZMQ_SNDMORE on the first frame, the "more" flag libzmq set on receipt.
"""
from __future__ import annotations

import re
import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcsniff.decoders.inputs.flow_owners import attribute_flows
from dlcsniff.decoders.sansio import NEED_DATA
from dlcsniff.decoders.errors import DecodeError
from dlcsniff.sniffer import bpf_objects, ebpf
from dlcsniff.decoders.formats import probe_events as ev
from tests.conftest import REPO

PROBES_DIR = REPO / "sniffer" / "probes"
WORKLOAD_PID = 1622
RECORDED = {
    "LISTEN": bytes.fromhex(
        "010000005606000056060000f9ffffef846c9158b50100000100000000000000707974686f6e00000000000000000000"
        "c0c04b188188ffff02006f170000070a7f00000100000000000000000000000000000000000000000000000000000000"
        "ffffffff00000000"
    ),
    "CONNECT": bytes.fromhex(
        "010000005606000059060000f9ffffefa66c9458b50100000100000000000000707974686f6e00000000000000000000"
        "00804b188188ffff020000006f1707027f0000010000000000000000000000007f000001000000000000000000000000"
        "ffffffff00000000"
    ),
    "CONNECT_ESTABLISHED": bytes.fromhex(
        "010000005606000059060000f9ffffef30a59558b50100000100000000000000707974686f6e00000000000000000000"
        "00804b188188ffff020080b66f1702017f0000010000000000000000000000007f000001000000000000000000000000"
        "ffffffff00000000"
    ),
    "CHILD_SYN_RECV": bytes.fromhex(
        "010000005606000059060000f9ffffefeac49558b50100000100000000000000707974686f6e00000000000000000000"
        "00a54b188188ffff02006f1780b60a037f0000010000000000000000000000007f000001000000000000000000000000"
        "ffffffff00000000"
    ),
    "CHILD_ESTABLISHED": bytes.fromhex(
        "010000005606000059060000f9ffffef97d89558b50100000100000000000000707974686f6e00000000000000000000"
        "00a54b188188ffff02006f1780b603017f0000010000000000000000000000007f000001000000000000000000000000"
        "ffffffff00000000"
    ),
    "ACCEPT": bytes.fromhex(
        "040000005606000059060000f9ffffef1e139658b50100000100000000000000707974686f6e00000000000000000000"
        "00000000000000000200000080b60000000000000000000000000000000000007f000001000000000000000000000000"
        "0d00000000000000"
    ),
    "ZMQ_SEND_META": bytes.fromhex(
        "100000005606000056060000f9ffffeff7cc3594b50100000100000000000000707974686f6e00000000000000000000"
        "13d13594b5010000d070cfe7fd5500000085e840ff7f000005000000000000000200000000000100"
    ),
    "ZMQ_SEND_DATA": bytes.fromhex(
        "100000005606000056060000f9ffffef39e33594b50100000100000000000000707974686f6e00000000000000000000"
        "a3743694b5010000d070cfe7fd5500000085e840ff7f0000e8030000000000000000000000000000"
    ),
    "ZMQ_RECV_META": bytes.fromhex(
        "110000005606000056060000f9ffffef207d3694b50100000100000000000000707974686f6e00000000000000000000"
        "0a813694b50100001081cfe7fd550000f085e840ff7f000005000000000000000000000002000100"
    ),
    "ZMQ_RECV_DATA": bytes.fromhex(
        "110000005606000056060000f9ffffeff5893694b50100000100000000000000707974686f6e00000000000000000000"
        "d58d3694b50100001081cfe7fd550000f085e840ff7f0000e8030000000000000000000002000000"
    ),
}


def parsed(name: str):
    return ev.parse_event(RECORDED[name])


def test_tcp_state_changes_of_the_workload():
    listen = parsed("LISTEN")
    assert (listen.kind, listen.oldstate, listen.newstate) == (ev.Kind.SOCK_STATE, ev.TCP_CLOSE, ev.TCP_LISTEN)
    assert (listen.local_ip, listen.local_port, listen.tgid, listen.comm) == ("127.0.0.1", 5999, WORKLOAD_PID, "python")
    connect = parsed("CONNECT")
    assert (connect.oldstate, connect.newstate, connect.remote_port) == (ev.TCP_CLOSE, ev.TCP_SYN_SENT, 5999)
    assert connect.local_port == 0        # connect() picks the port after the state change
    established = parsed("CONNECT_ESTABLISHED")
    assert established.skaddr == connect.skaddr and established.newstate == ev.TCP_ESTABLISHED
    child = parsed("CHILD_ESTABLISHED")
    assert (child.local_port, child.remote_port) == (5999, established.local_port)
    assert child.skaddr == parsed("CHILD_SYN_RECV").skaddr != established.skaddr
    assert {e.family for e in (listen, connect, established, child)} == {socket.AF_INET}


def test_accept_names_the_process_and_the_peer():
    accept = parsed("ACCEPT")
    assert (accept.kind, accept.remote_ip, accept.remote_port) == (ev.Kind.SOCK_ACCEPT, "127.0.0.1",
                                                                   parsed("CONNECT_ESTABLISHED").local_port)
    assert accept.local_ip is None and accept.fd > 2
    assert accept.tgid == WORKLOAD_PID and accept.comm == "python"
    assert accept.tid != WORKLOAD_PID      # libzmq's I/O thread accepts; comm is the process's


def test_zmq_frames_of_one_message():
    meta, data = parsed("ZMQ_SEND_META"), parsed("ZMQ_SEND_DATA")
    assert [(e.kind, e.function, e.size_bytes, e.flags, e.more) for e in (meta, data)] == [
        (ev.Kind.ZMQ_SEND, "zmq_msg_send", 5, ev.ZMQ_SNDMORE, True),
        (ev.Kind.ZMQ_SEND, "zmq_msg_send", 1000, 0, False)]
    got_meta, got_data = parsed("ZMQ_RECV_META"), parsed("ZMQ_RECV_DATA")
    # libzmq's own "more" flag, read from the zmq_msg_t the program received into
    assert [(e.kind, e.function, e.size_bytes, e.more) for e in (got_meta, got_data)] == [
        (ev.Kind.ZMQ_RECV, "zmq_msg_recv", 5, True), (ev.Kind.ZMQ_RECV, "zmq_msg_recv", 1000, False)]
    assert meta.socket == data.socket != got_meta.socket == got_data.socket
    for frame in (meta, data, got_meta, got_data):
        assert frame.tgid == WORKLOAD_PID and frame.mono_ns <= frame.return_mono_ns
    assert meta.return_mono_ns <= data.mono_ns <= got_meta.mono_ns


def sock_events(*names: str) -> list[ev.SockEvent]:
    return [parsed(name) for name in names]


ALL_SOCK = ("LISTEN", "CONNECT", "CONNECT_ESTABLISHED", "CHILD_SYN_RECV", "CHILD_ESTABLISHED", "ACCEPT")


def flows_by_port(flows: list[ev.Flow]) -> dict[tuple[int, int], ev.Flow]:
    return {(flow.local_port, flow.remote_port): flow for flow in flows}


def test_attribute_flows_from_recorded_events():
    client_port = parsed("CONNECT_ESTABLISHED").local_port
    flows = flows_by_port(attribute_flows(sock_events(*ALL_SOCK)))
    assert set(flows) == {(5999, 0), (client_port, 5999), (5999, client_port)}
    listener, active, passive = flows[5999, 0], flows[client_port, 5999], flows[5999, client_port]
    assert (listener.source, active.source, passive.source) == ("listen", "connect", "accept")
    assert (active.active, passive.active, listener.active) == (True, False, None)
    assert {flow.tgid for flow in flows.values()} == {WORKLOAD_PID}
    assert active.established_mono_ns == parsed("CONNECT_ESTABLISHED").mono_ns
    assert active.closed_mono_ns is None


def test_without_accept_the_listener_owns_passive_flows():
    client_port = parsed("CONNECT_ESTABLISHED").local_port
    without_accept = flows_by_port(attribute_flows(sock_events(*ALL_SOCK[:-1])))
    assert without_accept[5999, client_port].source == "listen"
    assert without_accept[5999, client_port].tgid == WORKLOAD_PID
    # no listener in sight: unknown, not guessed
    alone = flows_by_port(attribute_flows(sock_events("CHILD_SYN_RECV", "CHILD_ESTABLISHED")))
    assert alone[5999, client_port].source is None and alone[5999, client_port].tgid is None
    # a listener already open when the daemon started (from /proc) names the owner
    listening = ev.SocketSnapshot(parsed("LISTEN").mono_ns, socket.AF_INET, "127.0.0.1", 5999, "0.0.0.0", 0,
                                  ev.TCP_LISTEN, 4242, 77, "server")
    elsewhere = ev.SocketSnapshot(listening.mono_ns, socket.AF_INET, "127.0.0.1", 6000, "0.0.0.0", 0,
                                  ev.TCP_LISTEN, 4343, 88, "other")
    found = flows_by_port(attribute_flows(sock_events("CHILD_SYN_RECV", "CHILD_ESTABLISHED"),
                                             [elsewhere, listening]))
    assert (found[5999, client_port].tgid, found[5999, client_port].source) == (77, "listen")


def test_a_reused_socket_address_starts_a_new_flow():
    first = sock_events("CONNECT", "CONNECT_ESTABLISHED")
    closed = ev.SockEvent(**{**{f: getattr(first[1], f) for f in ev.SockEvent.__slots__},
                             "oldstate": ev.TCP_ESTABLISHED, "newstate": ev.TCP_CLOSE, "mono_ns": first[1].mono_ns + 10})
    again = [ev.SockEvent(**{**{f: getattr(e, f) for f in ev.SockEvent.__slots__}, "mono_ns": e.mono_ns + 100,
                             "remote_port": 6000}) for e in first]
    flows = attribute_flows([*first, closed, *again])
    assert [(flow.remote_port, flow.closed_mono_ns is not None) for flow in flows] == [(5999, True), (6000, False)]


def test_wrong_sizes_and_kinds_are_decode_errors():
    with pytest.raises(DecodeError, match="expected 88"):
        ev.parse_event(RECORDED["ZMQ_SEND_META"][:-1])
    with pytest.raises(DecodeError, match="unknown event kind 999"):
        ev.parse_event(struct.pack("<H", 999) + bytes(86))
    with pytest.raises(DecodeError, match="no kind"):
        ev.parse_event(b"\x01")
    bad_function = bytearray(RECORDED["ZMQ_SEND_META"])
    bad_function[84:86] = struct.pack("<H", 9)
    with pytest.raises(DecodeError, match="unknown function"):
        ev.parse_event(bytes(bad_function))


def test_every_macro_the_probes_use_is_defined_by_the_python_layouts():
    # what the objects are built with: the record layouts, plus the build's own sizes (the ring buffer's)
    defined = set(ev.layout_cflags()) | {name for source in bpf_objects.SOURCES for name, _ in source.defines}
    assert set(ev.layout_cflags()) <= {name for name, _ in bpf_objects.PROBES.defines}
    used = set()
    for path in PROBES_DIR.glob("*.[ch]"):
        text = path.read_text()
        # a file's own constants (the in-kernel cut's chunk sizes, compiled by clang on its own) are not layouts
        own = set(re.findall(r"^#define\s+([A-Z_]+)", text, flags=re.M))
        used |= set(re.findall(r"\b((?:KIND|ZMQ_FN|NCCL_FN)_[A-Z_]+|[A-Z][A-Z_]*_BYTES)\b", text)) - own
    assert used and used <= defined, used - defined


# -- the probe file ---------------------------------------------------------------------------------------

CLOCK = ev.ClockSync(mono_ns=1_000_000, realtime_ns=1_700_000_000_000_000_000)


def probe_file() -> bytes:
    records = [ev.daemon_record(ev.Kind.CLOCK, {"mono_ns": CLOCK.mono_ns, "realtime_ns": CLOCK.realtime_ns})]
    records += [ev.frame(RECORDED[name]) for name in RECORDED]
    records.append(ev.daemon_record(ev.Kind.PROCESS, {"mono_ns": 5, "tgid": WORKLOAD_PID, "comm": "python",
                                                      "cmdline": ["python", "zmqload.py"], "cgroup": "/", "netns": 7}))
    return ev.file_header({"set": 3}) + b"".join(records)


def decode_in_pieces(data: bytes, piece_bytes: int) -> tuple[ev.ProbeFileDecoder, list]:
    decoder = ev.ProbeFileDecoder()
    found = []
    for start in range(0, len(data), piece_bytes):
        decoder.receive_data(data[start:start + piece_bytes])
        while (item := decoder.next_event()) is not NEED_DATA:
            found.append(item)
    decoder.receive_end()
    while (item := decoder.next_event()) is not NEED_DATA:
        found.append(item)
    return decoder, found


@pytest.mark.parametrize("piece_bytes", [1 << 20, 1, 7])
def test_probe_file_fed_whole_or_in_pieces(piece_bytes):
    decoder, found = decode_in_pieces(probe_file(), piece_bytes)
    assert decoder.header == {"set": 3} and decoder.truncated_bytes == 0
    assert found[0] == CLOCK
    assert found[1:-1] == [parsed(name) for name in RECORDED]
    assert found[-1] == ev.ProcessInfo(5, WORKLOAD_PID, "python", ("python", "zmqload.py"), "/", 7)


@pytest.mark.parametrize("cut", [1, 3, 50])
def test_a_cut_last_record_is_reported_and_the_rest_decoded(cut):
    data = probe_file()
    header, found, bad, truncated = ev.parse_probe_file(data + ev.frame(RECORDED["LISTEN"])[:cut])
    assert truncated == cut and not bad
    assert len(found) == len(RECORDED) + 2


def test_a_bad_record_is_skipped_and_reading_goes_on():
    data = ev.file_header({}) + ev.frame(struct.pack("<H", 500) + b"junk") + ev.frame(RECORDED["LISTEN"])
    _, found, bad, _ = ev.parse_probe_file(data)
    assert found == [parsed("LISTEN")]
    assert len(bad) == 1 and "unknown event kind 500" in bad[0].reason


def test_corrupt_lengths_and_foreign_files_raise():
    with pytest.raises(DecodeError, match="corrupt from here"):
        ev.parse_probe_file(ev.file_header({}) + struct.pack("<I", 1 << 30) + bytes(8))
    with pytest.raises(DecodeError, match="not a dlcsniff probe file"):
        ev.parse_probe_file(b"\xd4\xc3\xb2\xa1" + bytes(40))
    with pytest.raises(DecodeError, match="not a dlcsniff probe file"):
        ev.parse_probe_file(b"")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_fuzz_anything_after_the_header_decodes_or_raises_decode_error(tail):
    try:
        ev.parse_probe_file(ev.file_header({}) + tail)
    except DecodeError:
        pass


def test_epoch_clock_uses_the_latest_pair_before_each_time():
    clock = ev.EpochClock([ev.ClockSync(100, 1_000_100), ev.ClockSync(1000, 2_000_000)])
    assert clock.epoch_ns(50) == 1_000_050          # before the first pair: the first pair
    assert clock.epoch_ns(999) == 1_000_999
    assert clock.epoch_ns(1000) == 2_000_000 and clock.epoch_ns(1500) == 2_000_500
    with pytest.raises(DecodeError, match="no clock pair"):
        ev.EpochClock([])


# -- the ring buffer as the daemon walks it (sniffer/ebpf.py) -------------------------------------------------

def _ring(size: int, records: list[tuple[int, bytes]], start: int = 0) -> tuple[memoryview, int]:
    """A BPF ring buffer's data area as the kernel lays it out, mapped twice in a row: records of
    (flags, payload) from position `start`, each a u32 length|flags, a u32 page offset and the payload
    padded to 8 bytes. Returns (the double mapping, the producer position)."""
    area = bytearray(size)
    position = start
    for flags, payload in records:
        record = struct.pack("<II", len(payload) | flags, 0) + payload
        record += bytes(-len(record) % 8)
        for index, byte in enumerate(record):
            area[(position + index) % size] = byte
        position += len(record)
    return memoryview(bytes(area + area)), position


def test_ring_records_walks_committed_records_across_the_wrap_and_skips_discarded_ones():
    payloads = [b"a" * 13, b"discarded", b"b" * 24, b"wraps around the end" * 2, b"c"]
    flags = [0, ebpf._RINGBUF_DISCARD, 0, 0, 0]
    data, producer = _ring(256, list(zip(flags, payloads)), start=200)     # the third record wraps
    position = [200]
    assert [bytes(view) for view in ebpf.ring_records(data, 255, position, producer)] == [
        payloads[0], payloads[2], payloads[3], payloads[4]]
    assert position == [producer]
    assert list(ebpf.ring_records(data, 255, position, producer)) == []


def test_ring_records_stops_at_a_record_still_being_written():
    data, producer = _ring(64, [(0, b"done"), (ebpf._RINGBUF_BUSY, b"half-written"), (0, b"after")])
    position = [0]
    assert [bytes(view) for view in ebpf.ring_records(data, 63, position, producer)] == [b"done"]
    assert position == [16]       # the busy record is read next time, once committed


def test_a_connection_made_before_the_probes_is_owned_by_the_task_that_closes_it():
    """Seen only from its end (made before the probes attached): close() turns it ESTABLISHED -> FIN_WAIT1 inside
    the closing task, which owns it; the FIN that follows, handled in softirq by whatever task ran, names no one."""
    established = parsed("CONNECT_ESTABLISHED")

    def change(oldstate: int, newstate: int, tgid: int, at_ns: int) -> ev.SockEvent:
        return ev.SockEvent(**{**{f: getattr(established, f) for f in ev.SockEvent.__slots__}, "tgid": tgid,
                               "oldstate": oldstate, "newstate": newstate, "mono_ns": established.mono_ns + at_ns})

    closed_here = [change(ev.TCP_ESTABLISHED, ev.TCP_FIN_WAIT1, WORKLOAD_PID, 10),
                   change(ev.TCP_FIN_WAIT1, ev.TCP_CLOSE, 0, 20)]
    (flow,) = attribute_flows(closed_here)
    assert (flow.tgid, flow.source, flow.active) == (WORKLOAD_PID, "close", None)
    # closed by the peer first: the FIN in softirq (no owner), then the last close() here
    peer_first = [change(ev.TCP_ESTABLISHED, ev.TCP_CLOSE_WAIT, 0, 10),
                  change(ev.TCP_CLOSE_WAIT, ev.TCP_LAST_ACK, WORKLOAD_PID, 20)]
    (flow,) = attribute_flows(peer_first)
    assert (flow.tgid, flow.source) == (WORKLOAD_PID, "close")
    # a connection the probes saw made keeps its connect() owner
    made = [*sock_events("CONNECT", "CONNECT_ESTABLISHED"), change(ev.TCP_ESTABLISHED, ev.TCP_FIN_WAIT1, 4242, 10)]
    (flow,) = attribute_flows(made)
    assert (flow.tgid, flow.source) == (WORKLOAD_PID, "connect")
