"""The compiled header reader (decoders/tcp_headers.c) against the batch decoder's numpy reader it stands in for:
the same segments and fields on every batch of every bundled capture, and on packets built to walk every branch
(each link type, IPv4 and IPv6 headers plausible or not, TCP data offsets, cut anywhere), one link type per batch
or one per packet. End to end, the batch decoder with the compiled reader is held to the per-packet decode by
test_tcp_driver."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcsniff.decoders import tcp_driver
from dlcsniff.decoders.inputs.capture_file import RecordBatch, open_capture
from dlcsniff.decoders.packet import (LINKTYPE_ETHERNET, LINKTYPE_IPV4, LINKTYPE_IPV6, LINKTYPE_LINUX_SLL,
                                      LINKTYPE_LINUX_SLL2, LINKTYPE_LOOP, LINKTYPE_NULL, LINKTYPE_RAW)
from tests.conftest import PCAPS

FIELDS = ("index", "sport", "dport", "seq", "ack", "flags", "payload_start", "payload_len", "wire_len", "window",
          "key")


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """The compiled reader, which `make setup` builds: its absence is a set-up bug, not a reason to skip."""
    if tcp_driver._COMPILED_HEADERS is None:
        pytest.fail("the compiled header reader (decoders/tcp_headers.c) is not built: run `make setup`")


def assert_same_headers(buf, start: np.ndarray, caplen: np.ndarray, linktype) -> int:
    u8 = np.frombuffer(buf, dtype=np.uint8)
    ours = tcp_driver._Headers(u8, start, caplen, linktype)
    reference = tcp_driver._Headers(u8, start, caplen, linktype, numpy=True)
    for name in FIELDS:
        a, b = getattr(ours, name), getattr(reference, name)
        assert a.shape == b.shape and a.dtype == b.dtype and (a == b).all(), name
    return len(ours.index)


@pytest.mark.parametrize("path", sorted(PCAPS.rglob("*.pcap*")), ids=lambda p: str(p.relative_to(PCAPS)))
def test_every_batch_of_every_bundled_capture_reads_alike(path):
    with open_capture(path) as reader:
        for batch in reader.batches():
            if batch.__class__ is RecordBatch and (columns := batch.columns()) is not None:
                assert_same_headers(batch.buf, columns.data_start, columns.caplen, columns.linktype)


LINKS = [LINKTYPE_ETHERNET, LINKTYPE_LINUX_SLL, LINKTYPE_LINUX_SLL2, LINKTYPE_NULL, LINKTYPE_LOOP, LINKTYPE_RAW,
         LINKTYPE_IPV4, LINKTYPE_IPV6, 147]


@st.composite
def packets(draw) -> tuple[int, bytes]:
    """(link type, packet): link header, IPv4 or IPv6 header, TCP header and payload, each field plausible or
    not, the whole cut anywhere."""
    linktype = draw(st.sampled_from(LINKS))
    ip_version = draw(st.sampled_from([4, 6, 4, 6, 5]))
    ethertype = draw(st.sampled_from([0x0800 if ip_version == 4 else 0x86DD, 0x0800, 0x86DD, 0x8100, 0x0806]))
    family = draw(st.sampled_from([2, 24, 28, 30, 7]))
    if linktype == LINKTYPE_ETHERNET:
        link = bytes(12) + struct.pack("!H", ethertype)
    elif linktype == LINKTYPE_LINUX_SLL:
        link = bytes(14) + struct.pack("!H", ethertype)
    elif linktype == LINKTYPE_LINUX_SLL2:
        link = struct.pack("!H", ethertype) + bytes(18)
    elif linktype in (LINKTYPE_NULL, LINKTYPE_LOOP):
        link = struct.pack(draw(st.sampled_from(["<I", ">I"])), family)
    else:
        link = b""
    tcp_header_len = draw(st.sampled_from([20, 32, 60]))
    tcp = (struct.pack("!HHIIBBH", draw(st.integers(0, 65535)), draw(st.integers(0, 65535)),
                       draw(st.integers(0, 2**32 - 1)), draw(st.integers(0, 2**32 - 1)),
                       draw(st.sampled_from([tcp_header_len // 4, 0, 4, 15])) << 4, draw(st.integers(0, 255)),
                       draw(st.sampled_from([0, 1, 65535, 29200])))
           + bytes(tcp_header_len - 16))
    payload = bytes(draw(st.integers(0, 300)))
    protocol = draw(st.sampled_from([6, 6, 17, 1]))
    if ip_version == 6:
        payload_len = draw(st.sampled_from([len(tcp) + len(payload), 0, 10, 5000]))
        ip = (struct.pack("!BBHHBB", draw(st.sampled_from([6, 4])) << 4, 0, 0, payload_len, protocol, 64)
              + draw(st.binary(min_size=32, max_size=32)))
    else:
        ihl = draw(st.sampled_from([5, 6, 15, 4, 0]))
        total_len = draw(st.sampled_from([4 * ihl + len(tcp) + len(payload), 0, 30, 9000]))
        ip = (struct.pack("!BBHHHBBH", (draw(st.sampled_from([4, 6])) << 4) | ihl, 0, total_len, 0,
                          draw(st.sampled_from([0, 0x4000, 0x2000, 0x0005])), 64, protocol, 0)
              + draw(st.binary(min_size=8, max_size=8)) + bytes(max(0, 4 * ihl - 20)))
    packet = link + ip + tcp + payload
    return linktype, packet[:draw(st.integers(0, len(packet)))]


@settings(max_examples=400, deadline=None)
@given(batch=st.lists(packets(), min_size=1, max_size=12), gap=st.integers(0, 5), per_packet=st.booleans())
def test_built_packets_of_every_shape_read_alike(batch, gap, per_packet):
    if not per_packet:
        batch = [(batch[0][0], packet) for _, packet in batch]
    buf, start = bytearray(16), []          # a batch's buffer begins with a record header
    for _, packet in batch:
        buf += bytes(gap)
        start.append(len(buf))
        buf += packet
    start = np.array(start, dtype=np.int64)
    caplen = np.array([len(packet) for _, packet in batch], dtype=np.int64)
    linktype = np.array([lt for lt, _ in batch], dtype=np.int64) if per_packet else batch[0][0]
    assert_same_headers(memoryview(bytes(buf)), start, caplen, linktype)


def test_the_built_packets_reach_the_segments_read():
    """The generator is no blind spot: a plain IPv4 and a plain IPv6 segment of each link type are read."""
    for linktype in LINKS[:-1]:
        for version, ethertype, family in ((4, 0x0800, 2), (6, 0x86DD, 28)):
            if linktype in (LINKTYPE_IPV4, LINKTYPE_IPV6) and version != (4 if linktype == LINKTYPE_IPV4 else 6):
                continue
            link = {LINKTYPE_ETHERNET: bytes(12) + struct.pack("!H", ethertype),
                    LINKTYPE_LINUX_SLL: bytes(14) + struct.pack("!H", ethertype),
                    LINKTYPE_LINUX_SLL2: struct.pack("!H", ethertype) + bytes(18),
                    LINKTYPE_NULL: struct.pack("<I", family), LINKTYPE_LOOP: struct.pack(">I", family)}.get(linktype, b"")
            tcp = struct.pack("!HHIIBB", 1, 2, 3, 4, 5 << 4, 0x18) + bytes(6) + b"data"
            ip = (struct.pack("!BBHHHBBH", 0x45, 0, 20 + len(tcp), 0, 0, 64, 6, 0) + bytes(8) if version == 4 else
                  struct.pack("!BBHHBB", 0x60, 0, 0, len(tcp), 6, 64) + bytes(32))
            packet = link + ip + tcp
            assert assert_same_headers(memoryview(packet), np.array([0]), np.array([len(packet)]), linktype) == 1
