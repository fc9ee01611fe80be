"""decoders.protocols.pslite.pbmeta, the pure-Python reader of ps-lite's meta frame, against google.protobuf (upb),
the independent reader it replaces in the decode: every meta frame the decode of the bundled MXNet and BytePS
captures reads, and fuzzed bodies (random bytes, real metas cut and flipped, protobuf wire built field by field
with the encodings protobuf tolerates). Both must accept and reject the same bodies with the same message, give
the same fields (proto2 presence included), write the same canonical bytes and judge a body shaped as ps-lite
writes it alike."""
from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError as ProtobufDecodeError
from google.protobuf.unknown_fields import UnknownFieldSet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlcsniff.decoders.capture_decoder import decode_capture
from dlcsniff.decoders.errors import DecodeError
from dlcsniff.decoders.protocols.pslite import decoder as pslite
from dlcsniff.decoders.protocols.pslite import pbmeta
from tests.conftest import PCAPS
from tests.decoders.pbmeta_protobuf import PBMeta, PBNode
from tests.decoders.test_pslite import REAL, mutations

CAPTURES = sorted(p for job in ("mxnet_*", "byteps_*") for p in PCAPS.glob(f"{job}/*.pcap.gz"))


def _fields(message) -> dict:
    """A protobuf message as pbmeta's dict: the fields present by name (strings as their bytes)."""
    out = {}
    for field, value in message.ListFields():
        repeated = field.is_repeated
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            value = [_fields(v) for v in value] if repeated else _fields(value)
        elif repeated:
            value = list(value)
        elif isinstance(value, str):
            value = value.encode()
        out[field.name] = value
    return out


def by_protobuf(body: bytes) -> tuple:
    """(the fields or the DecodeError's message, its canonical bytes, shaped as ps-lite writes it) by protobuf, as
    the decode read a meta before pbmeta."""
    pb = PBMeta()
    try:
        pb.ParseFromString(body)
    except (ProtobufDecodeError, ValueError) as exc:
        return f"not a ps.PBMeta protobuf ({len(body)} bytes): {exc}", None, False
    if not pb.IsInitialized():
        return f"ps.PBMeta misses required fields: {', '.join(pb.FindInitializationErrors())}", None, False
    shaped = (all(pb.HasField(name) for name in ("head", "request", "push", "simple_app"))
              and len(UnknownFieldSet(pb)) == 0 and pb.SerializeToString() == body)
    return _fields(pb), pb.SerializeToString(), shaped


def _known(message: dict) -> dict:
    """pbmeta's dict without its unknown fields' bytes and empty repeated fields (absent, to protobuf)."""
    out = {}
    for name, value in message.items():
        if name == pbmeta.UNKNOWN or value == []:
            continue
        if isinstance(value, dict):
            value = _known(value)
        elif isinstance(value, list) and isinstance(value[0], dict):
            value = [_known(v) for v in value]
        out[name] = value
    return out


def by_pbmeta(body: bytes) -> tuple:
    try:
        meta = pbmeta.read(body)
    except DecodeError as exc:
        return str(exc), None, False
    return _known(meta), pbmeta.encode(meta), pslite._is_pslite_shaped(meta, body)


def assert_same(body: bytes) -> None:
    assert by_pbmeta(body) == by_protobuf(body), body.hex()
    assert by_pbmeta(memoryview(body)) == by_protobuf(body)


# -- every meta frame of the bundled captures --------------------------------------------------------------

@pytest.fixture(scope="module")
def decoded_bodies() -> dict[Path, set[bytes]]:
    """The bodies the ps-lite decode of each bundled MXNet and BytePS capture asks pbmeta to read (meta frames,
    and the candidates a resynchronising ZMTP decoder weighs)."""
    read = pbmeta.read
    bodies: dict[Path, set[bytes]] = {}

    def recording(body):
        bodies[capture].add(bytes(body))
        return read(body)

    pbmeta.read = recording
    try:
        for capture in CAPTURES:
            bodies[capture] = set()
            decode_capture(capture, protocols=[pslite.PsliteCaptureDecoder()])
    finally:
        pbmeta.read = read
    return bodies


def test_every_meta_of_the_bundled_captures(decoded_bodies):
    assert len(CAPTURES) >= 60
    nodes = [c for c in CAPTURES if c.parent.name.startswith("mxnet_") and c.name.startswith(("scheduler", "server",
                                                                                               "worker"))]
    assert all(decoded_bodies[c] for c in nodes)          # every MXNet node's capture holds dmlc metas
    shaped = 0
    for capture, bodies in decoded_bodies.items():
        for body in bodies:
            assert_same(body)
            shaped += by_protobuf(body)[2]
    assert shaped > 1000                                  # real metas, read and judged canonical by both


# -- bodies built by hand ----------------------------------------------------------------------------------

def _varint(value: int, padding: int = 0) -> bytes:
    """protobuf's varint, with `padding` more bytes than needed (a non-minimal encoding protobuf reads)."""
    out = bytearray()
    while True:
        out.append(value & 0x7F | 0x80)
        value >>= 7
        if not value:
            break
    out[-1] &= 0x7F
    if padding:
        out[-1] |= 0x80
        out += b"\x80" * (padding - 1) + b"\x00"
    return bytes(out)


def _group(number: int, depth: int) -> bytes:
    return _varint(number << 3 | 3) * depth + _varint(number << 3 | 4) * depth


def _nested(control: bytes) -> bytes:
    return b"\x1a" + _varint(len(control)) + control


@pytest.mark.parametrize("body", [
    b"",
    bytes.fromhex("0801" "0801" "08ffffffffffffffffff01" "08ffffffffffffffffff7f" "0880808080808080808001"),
    bytes.fromhex("2002" "28" "8080808010" "30ffffffffffffffffff01"),           # bools: any non-zero varint
    bytes.fromhex("4a00" "4a03010203" "4801" "4a0c" "ffffffffffffffffff01" "8001"),  # packed and not, negatives
    bytes.fromhex("4a0201" "00"), bytes.fromhex("4a0180"), bytes.fromhex("4a03" "8080"),
    bytes.fromhex("1a020801" "1a021805" "1a04" "12020802"),                    # control merged; a node appended
    bytes.fromhex("1a00"), bytes.fromhex("1a0212001a00"), bytes.fromhex("1a04" "0802" "1200" "1a0412001200"),
    bytes.fromhex("1a06" "0802" "1202ff00"), bytes.fromhex("1a05" "0802" "1202" "08"),
    bytes.fromhex("0d01020304" "11" "0102030405060708" "1204" "41424344" "1b1c" "0b0c"),  # other wire types: unknown
    bytes.fromhex("0d010203"), bytes.fromhex("1205414243"), bytes.fromhex("0c"), bytes.fromhex("0b"),
    bytes.fromhex("0b14"), bytes.fromhex("0e"), bytes.fromhex("0f00"), bytes.fromhex("00"), bytes.fromhex("0400"),
    bytes.fromhex("f8ffffff0f00"), bytes.fromhex("f8ffffff1f00"), bytes.fromhex("8880808000" "01"),
    bytes.fromhex("888080808000" "01"), bytes.fromhex("08ffffffffffffffffff80"), bytes.fromhex("08ff"),
    bytes.fromhex("1a0808021204" "08011a01" "ff"),                             # a hostname that is not UTF-8
    bytes.fromhex("1a0e" "0802" "120a" "0800" "1a04" + b"h\xc3\xa9!".hex() + "3000" "f001" "05"),
    REAL["push"] + bytes.fromhex("f00101"), REAL["push"] + bytes.fromhex("4a0108"), REAL["push"] + b"\x0b\x0c",
    _varint(1 << 3, padding=2) + b"\x05" + REAL["push"][2:],
    *(_group(30, depth) for depth in (99, 100, 101)),
    *(_nested(b"\x08\x01" + _group(7, depth)) for depth in (98, 99, 100)),
    *(_nested(b"\x08\x02\x12" + _varint(2 + 2 * depth) + b"\x08\x00" + _group(9, depth)) for depth in (97, 98, 99)),
    *(REAL[name] for name in sorted(REAL)),
])
def test_hand_built_bodies(body):
    assert_same(body)


def test_the_defaults_of_absent_fields_are_protobufs():
    """What the decode reports for fields a meta leaves out: protobuf's defaults (or None, for the fields where
    presence says more than the value)."""
    meta = pslite.parse_dmlc_meta(bytes.fromhex("1a06" "0802" "1202" "0802"))
    pb, node = PBMeta(), PBNode()
    assert (meta.body, meta.request, meta.push, meta.pull, meta.simple_app) == (
        pb.body, pb.request, pb.push, pb.pull, pb.simple_app)
    assert (meta.nodes[0].hostname, meta.nodes[0].is_recovery) == (node.hostname, node.is_recovery)
    assert (meta.head, meta.timestamp, meta.priority, meta.data_types, meta.nodes[0].id) == (None, None, None, (), None)


@pytest.mark.parametrize("hostname", [b"h\xc3\xa9", b"\xff", b"\xed\xa0\x80", b"\xc0\x80", b"\xf4\x90\x80\x80", b"a\x00b",
                                      b"\xef\xbf\xbe", b"\xe0\x80"])
def test_hostnames_as_protobuf_hands_them_over(hostname):
    """proto2 strings are not UTF-8 checked: protobuf hands over a str when the bytes are UTF-8 and the bytes
    otherwise, which the decode escaped; pbmeta's hostname must read the same."""
    node = b"\x08\x00\x1a" + _varint(len(hostname)) + hostname            # role server, hostname
    body = _nested(b"\x08\x02\x12" + _varint(len(node)) + node)            # cmd ADD_NODE, the node
    value = PBMeta.FromString(body).control.node[0].hostname
    expected = value if isinstance(value, str) else value.decode("utf-8", "backslashreplace")
    assert pslite.parse_dmlc_meta(body).nodes[0].hostname == expected


# -- fuzz ---------------------------------------------------------------------------------------------------

_VALUES = st.one_of(st.integers(0, 0x7F), st.integers(0, 2**64 - 1),
                    st.sampled_from([2**31 - 1, 2**31, 2**32, 2**32 + 1, 2**63, 2**64 - 1, 2**64 - 2**31]))
_NUMBERS = st.one_of(st.integers(1, 13), st.integers(0, 15), st.sampled_from([16, 30, 2**29 - 1]))


@st.composite
def _wire(draw, depth: int = 0) -> bytes:
    """Protobuf fields of any number and wire type, mostly well formed: varints padded, lengths off by one,
    submessages and groups nested, packed runs, ends cut."""
    fields = []
    for _ in range(draw(st.integers(0, 6))):
        number = draw(_NUMBERS)
        wire_type = draw(st.sampled_from([0, 0, 0, 2, 2, 2, 1, 3, 4, 5, 6, 7]))
        tag = _varint(number << 3 | wire_type, draw(st.sampled_from([0, 0, 0, 0, 1, 4, 5])))
        if wire_type == 0:
            payload = _varint(draw(_VALUES), draw(st.sampled_from([0, 0, 0, 1, 9 - draw(st.integers(0, 9)), 10])))
        elif wire_type in (1, 5):
            payload = draw(st.binary(min_size=4 if wire_type == 5 else 8, max_size=4 if wire_type == 5 else 8))
        elif wire_type == 2:
            inner = draw(st.one_of(
                st.binary(max_size=12),
                _wire(depth + 1) if depth < 3 else st.binary(max_size=12),
                st.lists(_VALUES, max_size=4).map(lambda values: b"".join(map(_varint, values)))))
            size = max(0, len(inner) + draw(st.sampled_from([0, 0, 0, 0, 0, 1, -1])))
            payload = _varint(size) + inner
        elif wire_type == 3:
            inner = draw(_wire(depth + 1)) if depth < 3 else b""
            end = number if draw(st.integers(0, 5)) else draw(_NUMBERS)
            payload = inner + _varint(end << 3 | 4)
        else:
            payload = draw(st.binary(max_size=2)) if wire_type != 4 else b""
        fields.append(tag + payload)
    body = b"".join(fields)
    return body[:draw(st.integers(0, len(body)))] if draw(st.integers(0, 9)) == 0 else body


FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.one_of(_wire(), st.builds(lambda meta, more: meta + more, st.sampled_from(sorted(REAL.values())), _wire())))
def test_fuzz_wire(body):
    assert_same(body)


@FUZZ
@given(st.one_of(st.binary(max_size=200), mutations(list(REAL.values()))))
def test_fuzz_bytes(body):
    assert_same(body)
