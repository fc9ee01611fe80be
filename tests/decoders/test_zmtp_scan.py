"""The compiled resynchronisation search (decoders/protocols/zmtp_scan.c) against its pure-Python twin, the
reference (`_ZmtpScanner.scan` over `_judge` and `_plausible_header`): the same verdict on every window, for
either framing, encrypted or not, with and without a frame validator, final or not; and the validator never asked
about a candidate whose chain of headers rejects it anyway. End to end, every bundled capture decodes the same
either way (tests/decoders/test_compiled_twins.py)."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlcsniff.decoders.protocols.zmtp import decoder as zmtp
from dlcsniff.decoders.protocols.pslite.decoder import looks_like_meta
from tests.decoders.pbmeta_protobuf import PBMeta

COMPILED = zmtp._COMPILED_SCAN


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """The compiled search, which `make setup` builds: its absence is a set-up bug, not a reason to skip."""
    if COMPILED is None:
        pytest.fail("the compiled ZMTP scan (decoders/protocols/zmtp_scan.c) is not built: run `make setup`")


def test_the_command_names_are_the_decoders():
    assert set(COMPILED.KNOWN_COMMANDS) == zmtp._KNOWN_COMMANDS


def _frame(flags: int, body: bytes, long: bool) -> bytes:
    return (struct.pack(">BQ", flags | zmtp.FLAG_LONG, len(body)) if long else struct.pack(">BB", flags, len(body))) \
        + body


def _meta() -> bytes:
    return PBMeta(head=0, request=True, push=True, simple_app=False, timestamp=3, customer_id=0, app_id=0,
                  data_type=[8, 9]).SerializeToString()


# pieces a resynchronising decoder meets: frames (data, commands, metas, long ones), random and zero bytes
_PIECES = st.one_of(
    st.binary(max_size=40),
    st.binary(max_size=8).map(lambda b: b"\x00" * len(b)),
    st.builds(_frame, st.sampled_from([0, 1, 4, 5, 8, 0x41]), st.binary(max_size=300), st.booleans()),
    st.builds(lambda name, rest, long: _frame(zmtp.FLAG_COMMAND, bytes([len(name)]) + name + rest, long),
              st.sampled_from(sorted(zmtp._KNOWN_COMMANDS) + [b"BOGUS", b""]), st.binary(max_size=20), st.booleans()),
    st.builds(lambda more, long: _frame(more, _meta(), long), st.sampled_from([0, 1]), st.booleans()),
)


class _Counting:
    def __init__(self, validator):
        self.validator = validator
        self.calls = 0

    def __call__(self, body):
        self.calls += 1
        return self.validator(body)


def _scan(monkeypatch, compiled_scan, window: bytes, final: bool, framing, encrypted: bool, validator, max_buffer):
    monkeypatch.setattr(zmtp, "_COMPILED_SCAN", compiled_scan)
    counting = None if validator is None else _Counting(validator)
    scanner = zmtp._ZmtpScanner(framing, encrypted, counting, max_buffer)
    return scanner.scan(window, final=final), 0 if counting is None else counting.calls


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(_PIECES, max_size=12), final=st.booleans(),
       framing=st.sampled_from([zmtp._Framing.V3, zmtp._Framing.V2]), encrypted=st.booleans(),
       validator=st.sampled_from([None, looks_like_meta, lambda body: len(body) % 3 == 0]),
       max_buffer=st.sampled_from([zmtp.MIN_MAX_BUFFER, 1 << 20]))
def test_compiled_scan_gives_the_reference_verdict(pieces, final, framing, encrypted, validator, max_buffer):
    window = b"".join(pieces)
    with pytest.MonkeyPatch.context() as monkeypatch:
        ours, our_calls = _scan(monkeypatch, COMPILED, window, final, framing, encrypted, validator, max_buffer)
        reference, reference_calls = _scan(monkeypatch, None, window, final, framing, encrypted, validator,
                                           max_buffer)
    assert ours == reference
    assert our_calls <= reference_calls


def test_a_long_frame_past_the_window_waits_for_the_validators_bytes(monkeypatch):
    """A LONG data frame is strong alone: its first body must be there before the validator can vouch for it."""
    window = b"\x11\x22" + _frame(0, b"\x08" * 700, long=True)[:300]
    for compiled_scan in (COMPILED, None):
        monkeypatch.setattr(zmtp, "_COMPILED_SCAN", compiled_scan)
        scanner = zmtp._ZmtpScanner(zmtp._Framing.V3, False, looks_like_meta, 1 << 20)
        assert scanner.scan(window, final=False) == (False, 2, 9 + 700)
        assert scanner.scan(window, final=True)[0] is False
