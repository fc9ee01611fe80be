"""Capture-file readers on real tcpdump/editcap/mergecap output, checked against tshark and scapy."""
from __future__ import annotations

import functools
import gzip
import hashlib
import os
import struct
import subprocess
import tracemalloc
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scapy.utils import RawPcapNgReader, RawPcapReader

from dlcsniff.decoders.inputs import capture_file as capture
from dlcsniff.decoders.errors import CaptureError
from dlcsniff.decoders.inputs.capture_file import open_capture
from tests.conftest import require_tool
from tests.support.tcpdump import Transfer, capture_tcp_transfer

pytestmark = pytest.mark.root       # tcpdump around a real socket exchange

# -- a real capture of a real transfer (also used by test_packet, test_tcp and bench/hotpath) -------------


# -- an independent reader: tshark ---------------------------------------------------------------------------


def tshark_frames(path: Path) -> list[tuple[int | None, int, int, int]]:
    """(epoch ns, wire length, captured length, interface id) of every packet, as tshark reads the file.

    tshark also lists pcapng blocks it does not know, as records without a link type: left out here.
    Its interface ids count from 0 in each pcapng section (pcap: none, taken as 0); a block without a
    time gives None."""
    out = subprocess.run([require_tool("tshark"), "-r", str(path), "-T", "fields", "-e", "frame.time_epoch",
                          "-e", "frame.len", "-e", "frame.cap_len", "-e", "frame.interface_id",
                          "-e", "frame.encap_type"],
                         capture_output=True, text=True, check=True).stdout
    frames = []
    for line in out.splitlines():
        epoch, wire_len, cap_len, interface, encapsulation = line.split("\t")
        if encapsulation:
            ts_ns = int(Decimal(epoch) * 1_000_000_000) if epoch else None
            frames.append((ts_ns, int(wire_len), int(cap_len), int(interface or 0)))
    return frames


def read_all(path: Path) -> tuple[list[tuple[int, int, bytes, int, int]], capture.CaptureReader]:
    with open_capture(path) as reader:
        packets = [(p.ts_ns, p.linktype, bytes(p.data), p.orig_len, p.interface) for p in reader]
    return packets, reader


# -- files made by the real tools ----------------------------------------------------------------------------

TCPDUMP_CAPTURES = {
    "lo_us.pcap": ["-i", "lo"],
    "lo_ns.pcap": ["-i", "lo", "--time-stamp-precision=nano"],
    "any_sll.pcap": ["-i", "any", "-y", "LINUX_SLL"],
    "any_sll2.pcap": ["-i", "any", "-y", "LINUX_SLL2"],
}


@pytest.fixture(scope="module")
def transfer(tmp_path_factory) -> Transfer:
    out = tmp_path_factory.mktemp("capture")
    request = os.urandom(3_000_000)
    return capture_tcp_transfer(out, request, hashlib.sha256(request).digest(), TCPDUMP_CAPTURES)


@pytest.fixture(scope="module")
def files(transfer) -> dict[str, Path]:
    """Every format this machine's tools write, from the same real traffic."""
    paths = {name: run.path for name, run in transfer.captures.items()}
    out = paths["lo_us.pcap"].parent
    paths["lo_us.pcapng"] = out / "lo_us.pcapng"
    subprocess.run([require_tool("editcap"), "-F", "pcapng", paths["lo_us.pcap"], paths["lo_us.pcapng"]], check=True)
    paths["lo_ns_tshark.pcapng"] = out / "lo_ns_tshark.pcapng"
    subprocess.run([require_tool("tshark"), "-r", paths["lo_ns.pcap"], "-F", "pcapng", "-w",
                    paths["lo_ns_tshark.pcapng"]], check=True, capture_output=True)
    paths["merged.pcapng"] = out / "merged.pcapng"     # two interfaces: Ethernet (lo) and Linux cooked v2
    subprocess.run([require_tool("mergecap"), "-F", "pcapng", "-w", paths["merged.pcapng"],
                    paths["lo_ns.pcap"], paths["any_sll2.pcap"]], check=True)
    for name in ("lo_ns.pcap", "merged.pcapng"):
        gz = out / (name + ".gz")
        gz.write_bytes(gzip.compress(paths[name].read_bytes()))
        paths[name + ".gz"] = gz
    return paths


EXPECTED = {   # file -> (format, compressed, link types of its interfaces)
    "lo_us.pcap": ("pcap", False, [1]),
    "lo_ns.pcap": ("pcap", False, [1]),
    "any_sll.pcap": ("pcap", False, [113]),
    "any_sll2.pcap": ("pcap", False, [276]),
    "lo_us.pcapng": ("pcapng", False, [1]),
    "lo_ns_tshark.pcapng": ("pcapng", False, [1]),
    "merged.pcapng": ("pcapng", False, [1, 276]),
    "lo_ns.pcap.gz": ("pcap", True, [1]),
    "merged.pcapng.gz": ("pcapng", True, [1, 276]),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_reader_agrees_with_tshark(files, transfer, name):
    path = files[name]
    packets, reader = read_all(path)
    fmt, compressed, linktypes = EXPECTED[name]
    assert (reader.format, reader.compressed) == (fmt, compressed)
    assert [i.linktype for i in reader.interfaces] == linktypes
    assert reader.warnings == [] and reader.truncated_bytes == 0 and reader.skipped_records == 0
    assert reader.packets == len(packets)
    assert reader.bytes_read == reader.total_bytes == path.stat().st_size
    ours = [(ts, orig_len, len(data), interface) for ts, _, data, orig_len, interface in packets]
    assert ours == tshark_frames(path)
    for _, linktype, _, _, interface in packets:
        assert linktype == linktypes[interface]
    # tcpdump's own count: every packet it wrote comes out of the file
    if name in transfer.captures:
        assert len(packets) == transfer.captures[name].packets_captured


def _scapy_packets(path: Path) -> list[tuple[int, bytes]]:
    """(epoch ns, bytes) per packet, from scapy's raw readers (exact integer timestamps)."""
    with open(path, "rb") as f:
        is_pcapng = f.read(4) == b"\x0a\x0d\x0d\x0a"
    out = []
    reader = RawPcapNgReader(str(path)) if is_pcapng else RawPcapReader(str(path))
    scale = 1 if getattr(reader, "nano", False) else 1000
    while True:
        try:       # scapy cuts packets at 65535 bytes unless asked for more; lo carries 65549-byte frames
            data, meta = reader._read_packet(size=1 << 20)
        except EOFError:
            break
        if is_pcapng:
            out.append((((meta.tshigh << 32) | meta.tslow) * 1_000_000_000 // meta.tsresol, data))
        else:
            out.append((meta.sec * 1_000_000_000 + meta.usec * scale, data))
    reader.close()
    return out


@pytest.mark.parametrize("name", ["lo_us.pcap", "lo_ns.pcap", "any_sll2.pcap", "lo_us.pcapng", "merged.pcapng"])
def test_packet_bytes_agree_with_scapy(files, name):
    packets, _ = read_all(files[name])
    assert [(ts, data) for ts, _, data, _, _ in packets] == _scapy_packets(files[name])


@pytest.mark.parametrize("chunk_bytes", [1, 7, 1000])
@pytest.mark.parametrize("name", ["lo_ns.pcap", "merged.pcapng", "merged.pcapng.gz"])
def test_read_size_never_changes_the_result(files, monkeypatch, name, chunk_bytes):
    """h11-style: the same packets whatever the read boundaries (1 = a record's bytes one read at a time)."""
    whole, _ = read_all(files[name])
    monkeypatch.setattr(capture, "CHUNK_BYTES", chunk_bytes)
    assert read_all(files[name])[0] == whole


def test_trailing_bytes_after_last_record_are_a_truncation(files, tmp_path):
    path = tmp_path / "trailing.pcap"
    path.write_bytes(files["lo_ns.pcap"].read_bytes() + b"\x01\x02\x03")
    packets, reader = read_all(path)
    assert packets == read_all(files["lo_ns.pcap"])[0]
    assert reader.truncated_bytes == 3 and len(reader.warnings) == 1


# -- truncated captures (a killed tcpdump) --------------------------------------------------------------------


def _record_ends(path: Path) -> list[int]:
    """Byte offset where each pcap record ends, walking the headers independently of the reader."""
    raw = path.read_bytes()
    ends, pos = [], 24
    while pos < len(raw):
        caplen = struct.unpack_from("<I", raw, pos + 8)[0]
        pos += 16 + caplen
        ends.append(pos)
    return ends


@pytest.mark.parametrize("cut_into", ["header", "data"])
def test_truncated_pcap_decodes_up_to_the_cut(files, tmp_path, cut_into):
    full = files["lo_ns.pcap"]
    ends = _record_ends(full)
    keep = len(ends) // 2
    cut = ends[keep - 1] + (7 if cut_into == "header" else 16 + 5)
    path = tmp_path / "cut.pcap"
    path.write_bytes(full.read_bytes()[:cut])
    packets, reader = read_all(path)
    assert packets == read_all(full)[0][:keep]
    assert reader.truncated_bytes == cut - ends[keep - 1]
    assert len(reader.warnings) == 1 and "killed" in reader.warnings[0] and str(path) in reader.warnings[0]


def test_truncated_pcapng_and_gzip_decode_up_to_the_cut(files, tmp_path):
    full = files["merged.pcapng"].read_bytes()
    expected = read_all(files["merged.pcapng"])[0]
    cut = tmp_path / "cut.pcapng"
    cut.write_bytes(full[: len(full) * 2 // 3])
    packets, reader = read_all(cut)
    assert 0 < len(packets) < len(expected) and packets == expected[: len(packets)]
    assert reader.truncated_bytes > 0 and len(reader.warnings) == 1

    gz = files["merged.pcapng.gz"].read_bytes()
    cut_gz = tmp_path / "cut.pcapng.gz"
    cut_gz.write_bytes(gz[: len(gz) // 2])
    packets, reader = read_all(cut_gz)
    assert 0 < len(packets) < len(expected) and packets == expected[: len(packets)]
    assert any("compressed data ends early" in w for w in reader.warnings)


# -- not a capture ------------------------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(CaptureError, match=r"nothere\.pcap: no such file"):
        open_capture(tmp_path / "nothere.pcap")


def test_directory(tmp_path):
    with pytest.raises(CaptureError, match="cannot open"):
        open_capture(tmp_path)


def test_an_empty_file_is_a_capture_of_nothing_with_a_warning(tmp_path):
    path = tmp_path / "killed.pcap"
    path.write_bytes(b"")
    with open_capture(path) as reader:
        assert list(reader) == [] and reader.packets == 0
        assert reader.warnings == [f"{path}: the file is empty (not even a capture header): no packets"]


@pytest.mark.parametrize("content, shown", [
    (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "47 45 54 20 2f 20 48 54"),
    (b"\xd4\xc3", "d4 c3"),
])
def test_not_a_capture_names_the_file_and_its_first_bytes(tmp_path, content, shown):
    path = tmp_path / "notes.pcap"
    path.write_bytes(content)
    with pytest.raises(CaptureError) as err:
        open_capture(path)
    assert str(path) in str(err.value) and "not a pcap or pcapng file" in str(err.value)
    assert shown in str(err.value)


def test_not_a_capture_inside_gzip(tmp_path):
    path = tmp_path / "x.pcap.gz"
    path.write_bytes(gzip.compress(b"hello world, not packets"))
    with pytest.raises(CaptureError, match="not a pcap or pcapng gzip-compressed file"):
        open_capture(path)


def test_corrupt_gzip(tmp_path):
    path = tmp_path / "x.pcap.gz"
    path.write_bytes(b"\x1f\x8b" + b"\x00" * 30)
    with pytest.raises(CaptureError, match=r"x\.pcap\.gz: not a readable gzip-compressed file"):
        open_capture(path)


def test_unsupported_pcap_version_and_variant(files, tmp_path):
    raw = bytearray(files["lo_us.pcap"].read_bytes())
    struct.pack_into("<H", raw, 4, 3)
    path = tmp_path / "v3.pcap"
    path.write_bytes(raw)
    with pytest.raises(CaptureError, match=r"unsupported pcap version 3\.4"):
        open_capture(path)
    raw[:4] = b"\x34\xcd\xb2\xa1"
    path.write_bytes(raw)
    with pytest.raises(CaptureError, match="modified pcap"):
        open_capture(path)


def test_corrupt_record_length_stops_with_a_warning(files, tmp_path):
    raw = bytearray(files["lo_us.pcap"].read_bytes())
    third = _record_ends(files["lo_us.pcap"])[1]
    struct.pack_into("<I", raw, third + 8, 0x7FFFFFFF)
    path = tmp_path / "corrupt.pcap"
    path.write_bytes(raw)
    packets, reader = read_all(path)
    assert len(packets) == 2
    assert "claims 2147483647 captured bytes" in reader.warnings[0]


# -- pcap written big-endian, records larger than a read -----------------------------------------------------


def _pcap(endian: str, nano: bool, linktype: int, records: list[tuple[int, int, bytes, int]]) -> bytes:
    magic = 0xA1B23C4D if nano else 0xA1B2C3D4
    out = [struct.pack(endian + "IHHiIII", magic, 2, 4, 0, 0, 262144, linktype)]
    for sec, frac, data, orig_len in records:
        out.append(struct.pack(endian + "IIII", sec, frac, len(data), orig_len) + data)
    return b"".join(out)


def test_big_endian_pcap_of_real_packets(files, tmp_path):
    real = read_all(files["lo_ns.pcap"])[0]
    records = [(ts // 10**9, ts % 10**9, data, orig_len) for ts, _, data, orig_len, _ in real]
    path = tmp_path / "be.pcap"
    path.write_bytes(_pcap(">", True, 1, records))
    packets, reader = read_all(path)
    assert packets == real and reader.warnings == []
    assert [(ts, orig_len, len(data), i) for ts, _, data, orig_len, i in packets] == tshark_frames(path)


def test_record_larger_than_a_read_chunk(tmp_path):
    big = os.urandom(3 * capture.CHUNK_BYTES + 5)
    path = tmp_path / "big.pcap"
    path.write_bytes(_pcap("<", False, 147, [(1, 2, b"ab", 2), (3, 4, big, len(big)), (5, 6, b"c", 9)]))
    packets, _ = read_all(path)
    assert packets == [(1_000_002_000, 147, b"ab", 2, 0), (3_000_004_000, 147, big, len(big), 0),
                       (5_000_006_000, 147, b"c", 9, 0)]


def _large_copy(files, tmp_path) -> tuple[Path, int]:
    """lo_us.pcap's records repeated into a capture of over 64 MB, and how many times."""
    one = files["lo_us.pcap"].read_bytes()
    body = one[24:]
    copies = 64 * 2**20 // len(body) + 1
    path = tmp_path / "large.pcap"
    with open(path, "wb") as f:
        f.write(one[:24])
        for _ in range(copies):
            f.write(body)
    return path, copies


def _peak_reading(path: Path) -> tuple[int, int, int]:
    """(packets, bytes read, peak traced allocation) of reading the capture through."""
    tracemalloc.start()
    try:
        with open_capture(path) as reader:
            n = sum(1 for _ in reader)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return n, reader.bytes_read, peak


def test_memory_stays_flat_on_a_large_file(files, tmp_path):
    """A 64 MB capture is streamed: peak allocation is a few read chunks, not the file (the hash beside the
    reading may hold a few chunks it has not hashed yet)."""
    path, copies = _large_copy(files, tmp_path)
    n, bytes_read, peak = _peak_reading(path)
    assert bytes_read == path.stat().st_size > 64 * 2**20
    assert n == len(read_all(files["lo_us.pcap"])[0]) * copies
    assert peak < 8 * capture.CHUNK_BYTES


class _InlineDigest:
    """sha256 hashed at once (no buffer waits for a thread)."""

    def __init__(self):
        self._digest = hashlib.sha256()

    def update(self, data) -> None:
        self._digest.update(data)

    def wait(self) -> None:
        pass

    def hexdigest(self) -> str:
        return self._digest.hexdigest()

    def close(self) -> None:
        pass


def test_read_buffers_are_reused_though_refills_carry_bytes_over(files, tmp_path, monkeypatch):
    """Nearly every refill carries the unread part of a record over into the next buffer; buffers are made with
    room for it, so the reader cycles through two of them. A buffer of just the size asked (CHUNK_BYTES + the
    bytes carried over) fit no later refill: every refill made a new one, until six were kept (6 chunks at the
    peak). The hash is taken inline here, so no buffer is held for it."""
    monkeypatch.setattr(capture, "BackgroundDigest", _InlineDigest)
    path, copies = _large_copy(files, tmp_path)
    n, bytes_read, peak = _peak_reading(path)
    assert bytes_read == path.stat().st_size and n == len(read_all(files["lo_us.pcap"])[0]) * copies
    assert peak < 3 * capture.CHUNK_BYTES


@pytest.mark.parametrize("compress", [False, True])
def test_the_hash_beside_decoding_is_the_files_and_its_thread_ends(files, tmp_path, compress):
    """The input is hashed on a thread while it is read (decoders.inputs.background_digest): over many read
    chunks, every byte is hashed once and in order (the file's own sha256, as stored: compressed when it is),
    and no thread is left once the digest is taken (the CLI's fast exit needs none)."""
    import threading
    one = files["lo_us.pcap"].read_bytes()
    data = one[:24] + one[24:] * (12 * capture.CHUNK_BYTES // len(one[24:]) + 1)
    path = tmp_path / ("large.pcap.gz" if compress else "large.pcap")
    path.write_bytes(gzip.compress(data, compresslevel=1) if compress else data)
    threads = threading.active_count()
    with open_capture(path) as reader:
        n = sum(1 for _ in reader)
        digest = reader.sha256()
        assert threading.active_count() == threads
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert n == len(read_all(files["lo_us.pcap"])[0]) * (12 * capture.CHUNK_BYTES // len(one[24:]) + 1)
    with open_capture(path) as reader:      # closed before the end: the thread ends too
        next(iter(reader))
    assert threading.active_count() == threads


# -- pcapng blocks tcpdump never writes: built from the spec (draft-ietf-opsawg-pcapng) -----------------------


def _block(endian: str, block_type: int, body: bytes) -> bytes:
    body += b"\x00" * (-len(body) % 4)
    length = 12 + len(body)
    return struct.pack(endian + "II", block_type, length) + body + struct.pack(endian + "I", length)


def _option(endian: str, code: int, value: bytes) -> bytes:
    return struct.pack(endian + "HH", code, len(value)) + value + b"\x00" * (-len(value) % 4)


def _shb(endian: str) -> bytes:
    return _block(endian, 0x0A0D0D0A, struct.pack(endian + "IHHq", 0x1A2B3C4D, 1, 0, -1))


def _idb(endian: str, linktype: int, snaplen: int, *options: bytes) -> bytes:
    opts = b"".join(options) + (_option(endian, 0, b"") if options else b"")
    return _block(endian, 1, struct.pack(endian + "HHI", linktype, 0, snaplen) + opts)


def _epb(endian: str, interface: int, units: int, data: bytes, orig_len: int | None = None) -> bytes:
    return _block(endian, 6, struct.pack(endian + "IIIII", interface, units >> 32, units & 0xFFFFFFFF,
                                         len(data), len(data) if orig_len is None else orig_len) + data)


T_S = 1_795_000_000


def _handmade_pcapng(real: list[bytes]) -> bytes:
    """Both byte orders, two sections, per-interface if_tsresol (10^-n and 2^-n) and if_tsoffset,
    simple and obsolete packet blocks, unknown blocks; six packets of real bytes."""
    le, be, t = "<", ">", T_S
    return b"".join([
        _shb(le),
        _idb(le, 1, 0, _option(le, 2, b"lo")),                                   # default resolution: us
        _idb(le, 1, 0, _option(le, 9, bytes([9])), _option(le, 14, struct.pack("<q", 100))),
        _block(le, 0x00000004, b"\x00" * 8),                                      # name resolution: skipped
        _epb(le, 0, t * 10**6 + 123456, real[0]),
        _epb(le, 1, (t - 100) * 10**9 + 987654321, real[1], orig_len=len(real[1]) + 40),
        _block(le, 0x0BAD, b"unknown block type"),                                # skipped
        _block(le, 3, struct.pack("<I", len(real[2])) + real[2]),                 # simple packet block
        _block(le, 2, struct.pack("<HHIIII", 0, 0, 0, 5, len(real[3]), len(real[3])) + real[3]),  # obsolete
        _shb(be),                                                                 # a new section, big-endian
        _idb(be, 1, 0, _option(be, 9, bytes([0x80 | 20]))),                      # 2^-20 s units
        _epb(be, 0, (t << 20) + (1 << 19), real[4]),
        _idb(be, 276, 0),
        _epb(be, 0, (t << 20) + 3, real[5]),
    ])


def test_handmade_pcapng_sections_interfaces_and_blocks(files, tmp_path):
    real = [data for _, _, data, _, _ in read_all(files["lo_us.pcap"])[0][:6]]
    t = T_S
    path = tmp_path / "made.pcapng"
    path.write_bytes(_handmade_pcapng(real))
    packets, reader = read_all(path)
    assert reader.warnings == [] and reader.format == "pcapng"
    assert [(i.linktype, i.name) for i in reader.interfaces] == [(1, "lo"), (1, None), (1, None), (276, None)]
    ts_ns = [t * 10**9 + 123_456_000,
             t * 10**9 + 987_654_321,                 # (t - 100) s + 100 s offset
             t * 10**9 + 987_654_321,                 # simple packet block: no timestamp, the previous one
             5 * 10**3,                               # obsolete block: 5 us since the epoch
             t * 10**9 + 500_000_000,
             t * 10**9 + 3 * 10**9 // 2**20]
    assert packets == [
        (ts_ns[0], 1, real[0], len(real[0]), 0), (ts_ns[1], 1, real[1], len(real[1]) + 40, 1),
        (ts_ns[2], 1, real[2], len(real[2]), 0), (ts_ns[3], 1, real[3], len(real[3]), 0),
        (ts_ns[4], 1, real[4], len(real[4]), 2), (ts_ns[5], 1, real[5], len(real[5]), 2),
    ]
    # tshark agrees, except that it gives a simple packet block no time at all
    theirs = tshark_frames(path)
    assert [(len(d), o, i if i < 2 else i - 2) for _, _, d, o, i in packets] == [(c, w, i) for _, w, c, i in theirs]
    assert [t if k != 2 else None for k, t in enumerate(ts_ns)] == [t for t, _, _, _ in theirs]


def test_pcapng_bad_packet_blocks_are_skipped_and_counted(files, tmp_path):
    real = read_all(files["lo_us.pcap"])[0][0][2]
    le = "<"
    blob = b"".join([_shb(le), _idb(le, 1, 0), _epb(le, 7, 1, real), _epb(le, 0, 2, real),
                     _epb(le, 5, 3, real), _epb(le, 0, 4, real)])
    path = tmp_path / "bad_if.pcapng"
    path.write_bytes(blob)
    packets, reader = read_all(path)
    assert [p[0] for p in packets] == [2000, 4000]
    assert reader.skipped_records == 2 and len(reader.warnings) == 1
    assert "undefined interface 7" in reader.warnings[0]


def test_unsupported_pcapng_version(tmp_path):
    path = tmp_path / "v2.pcapng"
    path.write_bytes(_block("<", 0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 2, 0, -1)))
    with pytest.raises(CaptureError, match=r"unsupported pcapng version 2\.0"):
        open_capture(path)


# -- fuzz: mutated and cut real files never crash the reader ------------------------------------------------


@functools.cache
def _fuzz_seeds(lo_us: Path, lo_ns: Path) -> tuple[bytes, ...]:
    """Small real files: 4 pcap records, the hand-made pcapng (200-byte slices of real packets), gzipped."""
    small = [data[:200] for _, _, data, _, _ in read_all(lo_us)[0][:6]]
    pcap = lo_ns.read_bytes()[:_record_ends(lo_ns)[4]]
    pcapng = _handmade_pcapng(small)
    return pcap, pcapng, gzip.compress(pcap), gzip.compress(pcapng)


@given(data=st.data())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fuzz_mutated_captures_only_raise_capture_error_at_open(files, tmp_path, data):
    seeds = _fuzz_seeds(files["lo_us.pcap"], files["lo_ns.pcap"])
    seed = bytearray(seeds[data.draw(st.integers(0, len(seeds) - 1))])
    for _ in range(data.draw(st.integers(1, 8))):
        seed[data.draw(st.integers(0, len(seed) - 1))] = data.draw(st.integers(0, 255))
    blob = bytes(seed[:data.draw(st.integers(0, len(seed)))])
    path = tmp_path / "fuzz.cap"
    path.write_bytes(blob)
    try:
        reader = open_capture(path)
    except CaptureError as err:
        assert str(path) in str(err)
        return
    with reader:
        n = sum(1 for _ in reader)
    assert reader.packets == n and reader.bytes_read <= reader.total_bytes
