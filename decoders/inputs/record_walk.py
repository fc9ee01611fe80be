"""Where the packet records lying whole in a read buffer start: the hot loop of reading a capture.

One contract, two implementations: the compiled `_record_walk` (record_walk.c, built by `make setup`; see
decoders.compiled) and the pure-Python functions here, which are the fallback when it is not built and the
reference the tests hold it to. `pcap_offsets` / `epb_offsets` are whichever is in use.

    pcap_offsets(buf, pos, big_endian) -> (offsets, pos)
        pcap records (a 16-byte header: ts_sec, ts_frac, caplen, orig_len; then the packet) from pos on, as
        long as a record's header and captured bytes lie whole in buf.
    epb_offsets(buf, pos, big_endian, interfaces) -> (offsets, pos)
        pcapng enhanced packet blocks from pos on, as long as each is well-formed: type 6, a length that is a
        multiple of 4, at least 32 and inside buf, an interface id below `interfaces`, its captured bytes
        inside the block.

offsets: array("q") of the records' starts; pos: where the walk stopped (the first record that is not whole
or not an enhanced packet block, or the end of buf).
"""
from __future__ import annotations

import struct
from array import array

from dlcsniff.decoders.compiled import compiled_module

_PCAP_CAPLEN = {False: struct.Struct("<8xI").unpack_from, True: struct.Struct(">8xI").unpack_from}
_EPB_CHECKED = {False: struct.Struct("<III8xI").unpack_from, True: struct.Struct(">III8xI").unpack_from}
PCAP_RECORD_HEADER_BYTES = 16
_EPB = 6
_EPB_MIN_BYTES = 32
_EPB_HEADER_BYTES = 28


def pcap_offsets_python(buf, pos: int, big_endian: bool) -> tuple[array, int]:
    caplen_at = _PCAP_CAPLEN[bool(big_endian)]
    end = len(buf)
    offsets = array("q")
    append = offsets.append
    while end - pos >= PCAP_RECORD_HEADER_BYTES:
        data_end = pos + PCAP_RECORD_HEADER_BYTES + caplen_at(buf, pos)[0]
        if data_end > end:
            break
        append(pos)
        pos = data_end
    return offsets, pos


def epb_offsets_python(buf, pos: int, big_endian: bool, interfaces: int) -> tuple[array, int]:
    checked = _EPB_CHECKED[bool(big_endian)]
    end = len(buf)
    offsets = array("q")
    append = offsets.append
    while end - pos >= _EPB_MIN_BYTES:
        block_type, block_len, if_id, caplen = checked(buf, pos)
        if (block_type != _EPB or block_len < _EPB_MIN_BYTES or block_len & 3 or block_len > end - pos
                or if_id >= interfaces or _EPB_HEADER_BYTES + caplen > block_len - 4):
            break
        append(pos)
        pos += block_len
    return offsets, pos


def _as_array(walk):
    def offsets(*args) -> tuple[array, int]:
        raw, pos = walk(*args)
        found = array("q")
        found.frombytes(raw)
        return found, pos
    return offsets


_COMPILED = compiled_module("dlcsniff.decoders.inputs._record_walk")
COMPILED = _COMPILED is not None     # whether the compiled walk is in use
pcap_offsets = _as_array(_COMPILED.pcap_offsets) if COMPILED else pcap_offsets_python
epb_offsets = _as_array(_COMPILED.epb_offsets) if COMPILED else epb_offsets_python
