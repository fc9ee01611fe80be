"""The compiled record walk (decoders/inputs/record_walk.c) against its pure-Python reference: the same record
offsets and the same stopping position on every bundled capture, cut anywhere, on hand-made pcapng blocks good
and bad in both byte orders, and on arbitrary bytes; and the same decode whichever walk reads the capture."""
from __future__ import annotations

import gzip
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcsniff.decoders.capture_decoder import decode_capture
from dlcsniff.decoders.inputs import capture_file, record_walk
from tests.conftest import PCAPS

BUNDLED = sorted(p for p in PCAPS.rglob("*.pcap*") if p.name.endswith((".pcap", ".pcap.gz")))
PCAP_HEADER_BYTES = 24
PCAP_MAGICS = (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")


@pytest.fixture(scope="module")
def compiled():
    """The compiled walk, which `make setup` builds: its absence is a set-up bug, not a reason to skip."""
    try:
        from dlcsniff.decoders.inputs import _record_walk
    except ImportError as exc:
        pytest.fail(f"the compiled record walk is not built ({exc}): run `make setup`")
    return _record_walk


def both(compiled, name: str, *args) -> tuple:
    raw, pos = getattr(compiled, name)(*args)
    reference, reference_pos = getattr(record_walk, f"{name}_python")(*args)
    return (raw, pos), (reference.tobytes(), reference_pos)


def test_the_compiled_walk_is_the_one_in_use(compiled):
    assert record_walk.COMPILED
    assert capture_file.pcap_offsets is record_walk.pcap_offsets


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: str(p.relative_to(PCAPS)))
def test_every_bundled_capture_walks_alike_cut_anywhere(compiled, path):
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    assert data[:4] in PCAP_MAGICS, f"{path} is no pcap: walk it with epb_offsets"
    big_endian = data[:4] in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d")
    ours, reference = both(compiled, "pcap_offsets", data, PCAP_HEADER_BYTES, big_endian)
    assert ours == reference
    assert ours[1] == len(data) and len(ours[0]) // 8 > 0          # every record, to the end of the file
    # cuts inside record headers and packets, and a walk from the middle of the buffer
    for cut in range(PCAP_HEADER_BYTES, len(data), max(1, len(data) // 97)):
        ours_cut, reference_cut = both(compiled, "pcap_offsets", memoryview(data).toreadonly()[:cut],
                                       PCAP_HEADER_BYTES, big_endian)
        assert ours_cut == reference_cut and ours_cut[1] <= cut
    at = len(ours[0]) // 16 * 8                                     # the middle record's entry
    ours_middle, reference_middle = both(compiled, "pcap_offsets", data, struct.unpack_from("=q", ours[0], at)[0],
                                         big_endian)
    assert ours_middle == reference_middle and ours_middle[0] == ours[0][at:]


def _epb(endian: str, interface: int, data: bytes, *, block_type: int = 6, pad_to: int | None = None,
         caplen: int | None = None) -> bytes:
    body = struct.pack(endian + "IIIII", interface, 0, 1, len(data) if caplen is None else caplen, len(data))
    body += data + b"\0" * (-len(data) % 4)
    length = 12 + len(body) if pad_to is None else pad_to
    return struct.pack(endian + "II", block_type, length) + body + struct.pack(endian + "I", length)


@pytest.mark.parametrize("endian", ["<", ">"])
def test_enhanced_packet_blocks_good_and_bad_walk_alike(compiled, endian):
    good = [_epb(endian, i % 2, bytes(range(i % 200))) for i in range(50)]
    bad = [_epb(endian, 2, b"x" * 10),                     # an interface the section does not have
           _epb(endian, 0, b"x" * 10, block_type=3),       # another block type
           _epb(endian, 0, b"x" * 10, caplen=400),         # captured bytes beyond the block
           _epb(endian, 0, b"x" * 10, pad_to=30),          # shorter than any packet block
           _epb(endian, 0, b"x" * 10, pad_to=46),          # a length that is no multiple of 4
           _epb(endian, 0, b"x" * 10, pad_to=1 << 20)]     # beyond the buffer
    for stopper in bad:
        data = b"".join(good[:20]) + stopper + b"".join(good[20:])
        ours, reference = both(compiled, "epb_offsets", data, 0, endian == ">", 2)
        assert ours == reference
        assert len(ours[0]) // 8 == 20 and ours[1] == len(b"".join(good[:20]))
    data = b"".join(good)
    for cut in range(0, len(data), 37):
        ours, reference = both(compiled, "epb_offsets", data[:cut], 0, endian == ">", 2)
        assert ours == reference


@settings(max_examples=500, deadline=None)
@given(data=st.binary(max_size=400), start=st.integers(0, 400), big_endian=st.booleans(),
       interfaces=st.integers(0, 3))
def test_arbitrary_bytes_walk_alike(compiled, data, start, big_endian, interfaces):
    start = min(start, len(data))
    ours, reference = both(compiled, "pcap_offsets", data, start, big_endian)
    assert ours == reference
    ours, reference = both(compiled, "epb_offsets", data, start, big_endian, interfaces)
    assert ours == reference


@pytest.mark.parametrize("path", [PCAPS / "mxnet_lossy" / "worker0.pcap.gz", PCAPS / "gloo" / "rank1.pcap.gz"],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_decode_is_the_same_whichever_walk_reads_the_capture(monkeypatch, path):
    compiled_result = decode_capture(path)
    monkeypatch.setattr(capture_file, "pcap_offsets", record_walk.pcap_offsets_python)
    monkeypatch.setattr(capture_file, "epb_offsets", record_walk.epb_offsets_python)
    assert decode_capture(path) == compiled_result
