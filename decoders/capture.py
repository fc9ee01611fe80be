"""Capture files -> link-layer packets with integer-nanosecond epoch timestamps.

The file-reading edge of decoders/: the only module here that opens a file. Formats are recognised by
their magic, never by the file name: pcap (microsecond and nanosecond, either byte order), pcapng (any
number of sections and interfaces, each with its own link type and timestamp resolution/offset), and
either of them gzip-compressed.

The file is streamed in `CHUNK_BYTES` reads, so memory stays flat however large it is. A packet's
`data` is a memoryview into the chunk it was read from: holding on to it keeps that chunk (about
1 MiB) alive, so a consumer that keeps packet bytes for long should copy the few it keeps.
"""
from __future__ import annotations

import gzip
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from decoders.errors import DecodeError

CHUNK_BYTES = 1 << 20
# No capture tool writes a record near this size (libpcap's largest snaplen is 256 KiB); a larger length
# field means the file is corrupt from there on.
MAX_RECORD_BYTES = 1 << 26
NS_PER_S = 1_000_000_000

_GZIP_MAGIC = b"\x1f\x8b"
# pcap global header magic (as the first 4 file bytes) -> (struct byte order, ns per timestamp fraction unit)
_PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1": ("<", 1000),   # 0xa1b2c3d4 little-endian: microseconds
    b"\xa1\xb2\xc3\xd4": (">", 1000),
    b"\x4d\x3c\xb2\xa1": ("<", 1),      # 0xa1b23c4d: nanoseconds
    b"\xa1\xb2\x3c\x4d": (">", 1),
}
_PCAP_MODIFIED_MAGICS = (b"\x34\xcd\xb2\xa1", b"\xa1\xb2\xcd\x34")   # 0xa1b2cd34: "modified pcap"
_PCAP_HEADER_BYTES = 24
_PCAP_RECORD_HEADER_BYTES = 16

# pcapng block types (draft-ietf-opsawg-pcapng)
_SHB = 0x0A0D0D0A        # section header: palindromic, so it reads the same in both byte orders
_IDB = 0x00000001        # interface description
_PB = 0x00000002         # obsolete packet block
_SPB = 0x00000003        # simple packet block
_EPB = 0x00000006        # enhanced packet block
_SHB_BYTES = b"\x0a\x0d\x0d\x0a"
# Shortest well-formed block of each type: header, fixed fields, trailing length.
_MIN_BLOCK_BYTES = {_SHB: 28, _IDB: 20, _PB: 32, _SPB: 16, _EPB: 32}
_BYTE_ORDER_MAGIC = {b"\x4d\x3c\x2b\x1a": "<", b"\x1a\x2b\x3c\x4d": ">"}
_OPT_END = 0
_OPT_IF_NAME = 2
_OPT_IF_TSRESOL = 9
_OPT_IF_TSOFFSET = 14
_DEFAULT_TSRESOL = 6     # microseconds, when an interface has no if_tsresol option


class CaptureError(DecodeError):
    """The file cannot be read as a capture at all (missing, not a capture, unsupported variant)."""


@dataclass(frozen=True, slots=True)
class Packet:
    ts_ns: int                   # capture time, ns since the epoch
    linktype: int                # LINKTYPE_* number of the interface it was captured on
    data: bytes | memoryview     # from the link-layer header on; len(data) is the captured length
    orig_len: int                # length on the wire
    interface: int               # file-wide interface number (pcapng: IDBs in file order, all sections)


@dataclass(frozen=True, slots=True)
class CaptureInterface:
    linktype: int
    snaplen: int                 # 0 = unlimited
    name: str | None


@dataclass(frozen=True, slots=True)
class _Timebase:
    """How one pcapng interface's 64-bit timestamp units become epoch ns: units * mul // div + offset_ns."""
    mul: int
    div: int
    offset_ns: int


def _timebase(tsresol: int, tsoffset_s: int) -> _Timebase:
    if tsresol & 0x80:                      # if_tsresol MSB set: 2^-n seconds per unit
        return _Timebase(NS_PER_S, 1 << (tsresol & 0x7F), tsoffset_s * NS_PER_S)
    if tsresol <= 9:                        # 10^-n seconds per unit
        return _Timebase(10 ** (9 - tsresol), 1, tsoffset_s * NS_PER_S)
    return _Timebase(1, 10 ** (tsresol - 9), tsoffset_s * NS_PER_S)


def _describe_start(head: bytes) -> str:
    if not head:
        return "the file is empty"
    text = "".join(chr(b) if 32 <= b < 127 else "." for b in head)
    return f"its first bytes are {head.hex(' ')} ({text!r})"


class CaptureReader:
    """One pass over a capture file: iterate it for `Packet`s. Use as a context manager.

    State readable at any time: `path`, `format` ("pcap" | "pcapng"), `compressed`, `interfaces`,
    `packets` (yielded so far), `bytes_read` / `total_bytes` (position in / size of the file on disk,
    for progress bars), `warnings`, `truncated_bytes` (bytes of an incomplete last record),
    `skipped_records` (malformed packet records passed over).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.warnings: list[str] = []
        self.packets = 0
        self.truncated_bytes = 0
        self.skipped_records = 0
        self.interfaces: list[CaptureInterface] = []
        try:
            self._raw = open(self.path, "rb", buffering=0)
        except FileNotFoundError:
            raise CaptureError(f"{self.path}: no such file") from None
        except OSError as exc:
            raise CaptureError(f"{self.path}: cannot open: {exc.strerror}") from None
        self.total_bytes = os.fstat(self._raw.fileno()).st_size
        self._last_bytes_read = 0
        self._buf = b""
        self._buf_offset = 0                 # offset of _buf[0] in the (decompressed) capture
        self._input_error: str | None = None  # why decompression stopped, if it did
        try:
            self._records = self._open_format()
        except BaseException:
            self._raw.close()
            raise

    # -- opening -------------------------------------------------------------------------------
    def _open_format(self) -> Iterator[Packet]:
        self.compressed = self._raw.read(2) == _GZIP_MAGIC
        self._raw.seek(0)
        self._input = gzip.GzipFile(fileobj=self._raw, mode="rb") if self.compressed else self._raw
        head = self._fill(_PCAP_HEADER_BYTES)
        what = "gzip-compressed file" if self.compressed else "file"
        magic = head[:4]
        if magic in _PCAP_MAGICS:
            endian, frac_ns = _PCAP_MAGICS[magic]
            if len(head) < _PCAP_HEADER_BYTES:
                raise CaptureError(f"{self.path}: pcap {what} ends inside its {_PCAP_HEADER_BYTES}-byte header")
            major, minor, _zone, _sigfigs, snaplen, network = struct.unpack_from(endian + "HHiIII", head, 4)
            if major != 2:
                raise CaptureError(f"{self.path}: unsupported pcap version {major}.{minor} (only 2.x exists)")
            # The link-type field's upper bits may carry FCS-length flags; the type is the low 16 bits.
            self.interfaces.append(CaptureInterface(network & 0xFFFF, snaplen, None))
            self.format = "pcap"
            return self._pcap_records(endian, frac_ns, network & 0xFFFF, _PCAP_HEADER_BYTES)
        if magic == _SHB_BYTES:
            if len(head) < 16:
                raise CaptureError(f"{self.path}: pcapng {what} ends inside its section header")
            order = _BYTE_ORDER_MAGIC.get(head[8:12])
            if order is None:
                raise CaptureError(f"{self.path}: pcapng {what} without a valid byte-order magic: "
                                   f"{_describe_start(bytes(head[:16]))}")
            major, minor = struct.unpack_from(order + "HH", head, 12)
            if major != 1:
                raise CaptureError(f"{self.path}: unsupported pcapng version {major}.{minor} (only 1.x exists)")
            self.format = "pcapng"
            return self._pcapng_records()
        if magic in _PCAP_MODIFIED_MAGICS:
            raise CaptureError(f"{self.path}: unsupported pcap variant (the 'modified pcap' format of a "
                               f"patched libpcap); convert it with `editcap -F pcap`")
        if self._input_error is not None:
            raise CaptureError(f"{self.path}: not a readable gzip-compressed file ({self._input_error})")
        raise CaptureError(f"{self.path}: not a pcap or pcapng {what}: {_describe_start(bytes(head[:16]))}")

    # -- input ---------------------------------------------------------------------------------
    def _read(self, size: int) -> bytes:
        if self._input_error is not None:
            return b""
        try:
            return self._input.read(size)
        except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
            self._input_error = str(exc)
            self.warnings.append(f"{self.path}: compressed data ends early or is corrupt ({exc}); "
                                 f"decoded up to there")
            return b""

    def _fill(self, need: int) -> bytes:
        """Keep the unread part of the buffer and append input until it holds `need` bytes (or input ends)."""
        parts = [self._buf]
        have = len(self._buf)
        while have < need:
            chunk = self._read(max(CHUNK_BYTES, need - have))
            if not chunk:
                break
            parts.append(chunk)
            have += len(chunk)
        self._buf = b"".join(parts) if len(parts) > 1 else parts[0]
        return self._buf

    def _refill(self, buf: bytes, pos: int, need: int) -> bytes:
        """The buffer from `pos` on, extended to hold `need` bytes when the input has them."""
        self._buf_offset += pos
        self._buf = buf[pos:]
        return self._fill(need)

    def _stop_truncated(self, available: int, what: str) -> None:
        if available:
            self.truncated_bytes = available
            self.warnings.append(f"{self.path}: capture ends inside a {what} at byte {self._buf_offset} "
                                 f"({available} bytes of it present; was the capture killed?); "
                                 f"{self.packets} packets decoded before it")

    def _skip(self, offset: int, why: str) -> None:
        """A record that cannot be a packet, in a file whose structure is still sound: skip and count it."""
        if not self.skipped_records:
            self.warnings.append(f"{self.path}: skipped a malformed record at byte {self._buf_offset + offset}: "
                                 f"{why} (see skipped_records for how many)")
        self.skipped_records += 1

    def _stop_corrupt(self, offset: int, why: str) -> None:
        self.warnings.append(f"{self.path}: corrupt {self.format} data at byte {self._buf_offset + offset}: "
                             f"{why}; {self.packets} packets decoded before it, the rest is skipped")

    # -- pcap ----------------------------------------------------------------------------------
    def _pcap_records(self, endian: str, frac_ns: int, linktype: int, start: int) -> Iterator[Packet]:
        unpack_header = struct.Struct(endian + "IIII").unpack_from    # ts_sec ts_frac incl_len orig_len
        header_bytes = _PCAP_RECORD_HEADER_BYTES
        buf = self._buf
        pos = start
        end = len(buf)
        view = memoryview(buf)
        while True:
            if end - pos < header_bytes:
                buf = self._refill(buf, pos, header_bytes)
                view, pos, end = memoryview(buf), 0, len(buf)
                if end < header_bytes:
                    self._stop_truncated(end, "record header")
                    return
            ts_s, ts_frac, caplen, orig_len = unpack_header(buf, pos)
            data_end = pos + header_bytes + caplen
            if data_end > end:
                if caplen > MAX_RECORD_BYTES:
                    self._stop_corrupt(pos, f"record claims {caplen} captured bytes")
                    return
                buf = self._refill(buf, pos, header_bytes + caplen)
                view, pos, end = memoryview(buf), 0, len(buf)
                data_end = header_bytes + caplen
                if data_end > end:
                    self._stop_truncated(end, "packet record")
                    return
            self.packets += 1
            yield Packet(ts_s * NS_PER_S + ts_frac * frac_ns, linktype, view[pos + header_bytes:data_end],
                         orig_len, 0)
            pos = data_end

    # -- pcapng --------------------------------------------------------------------------------
    def _pcapng_records(self) -> Iterator[Packet]:
        buf = self._buf
        pos = 0
        end = len(buf)
        view = memoryview(buf)
        endian = "<"
        block_header = struct.Struct("<II")
        epb = pb = None
        section: list[tuple[int, int, _Timebase, int]] = []   # this section's interfaces: linktype,
        #                                                          file-wide number, timebase, snaplen
        last_ts_ns = 0
        while True:
            if end - pos < 12:
                buf = self._refill(buf, pos, 12)
                view, pos, end = memoryview(buf), 0, len(buf)
                if end < 12:
                    self._stop_truncated(end, "block header")
                    return
            block_type = block_header.unpack_from(buf, pos)[0]
            if block_type == _SHB:
                order = _BYTE_ORDER_MAGIC.get(buf[pos + 8:pos + 12])
                if order is None:
                    self._stop_corrupt(pos, "section header without a valid byte-order magic")
                    return
                if order != endian or epb is None:
                    endian = order
                    block_header = struct.Struct(endian + "II")
                    epb = struct.Struct(endian + "IIIII").unpack_from    # if_id ts_high ts_low caplen orig_len
                    pb = struct.Struct(endian + "HHIIII").unpack_from    # if_id drops ts_high ts_low caplen len
                section = []
            block_len = block_header.unpack_from(buf, pos)[1]
            if block_len < 12 or block_len & 3 or block_len > MAX_RECORD_BYTES:
                self._stop_corrupt(pos, f"block of type {block_type:#x} claims a length of {block_len} bytes")
                return
            if end - pos < block_len:
                buf = self._refill(buf, pos, block_len)
                view, pos, end = memoryview(buf), 0, len(buf)
                if end < block_len:
                    self._stop_truncated(end, "block")
                    return
            if block_len < _MIN_BLOCK_BYTES.get(block_type, 12):
                if block_type == _SHB:
                    self._stop_corrupt(pos, f"section header block of only {block_len} bytes")
                    return
                self._skip(pos, f"block of type {block_type:#x} too short ({block_len} bytes)")
                pos += block_len
                continue
            if block_type == _EPB:   # the common case first
                if_id, ts_high, ts_low, caplen, orig_len = epb(buf, pos + 8)
                data_start = pos + 28
            elif block_type == _SPB:
                if not section:
                    self._skip(pos, "simple packet block before any interface description")
                    pos += block_len
                    continue
                orig_len = struct.unpack_from(endian + "I", buf, pos + 8)[0]
                snaplen = section[0][3]
                caplen = min(orig_len, block_len - 16, snaplen or orig_len)
                linktype, interface, _, _ = section[0]
                self.packets += 1
                yield Packet(last_ts_ns, linktype, view[pos + 12:pos + 12 + caplen], orig_len, interface)
                pos += block_len
                continue
            elif block_type == _PB:
                if_id, _drops, ts_high, ts_low, caplen, orig_len = pb(buf, pos + 8)
                data_start = pos + 28
            else:
                if block_type == _IDB:
                    section.append(self._interface(buf, pos, block_len, endian))
                elif block_type == _SHB:
                    major, minor = struct.unpack_from(endian + "HH", buf, pos + 12)
                    if major != 1:
                        self._stop_corrupt(pos, f"a section of unsupported pcapng version {major}.{minor}")
                        return
                pos += block_len          # other blocks (name resolution, statistics, custom...) carry no packets
                continue
            if if_id >= len(section):
                self._skip(pos, f"packet block for undefined interface {if_id}")
                pos += block_len
                continue
            if data_start + caplen > pos + block_len - 4:
                self._skip(pos, f"packet block of {block_len} bytes claims {caplen} captured bytes")
                pos += block_len
                continue
            linktype, interface, tb, _ = section[if_id]
            last_ts_ns = ((ts_high << 32) | ts_low) * tb.mul // tb.div + tb.offset_ns
            self.packets += 1
            yield Packet(last_ts_ns, linktype, view[data_start:data_start + caplen], orig_len, interface)
            pos += block_len

    def _interface(self, buf: bytes, pos: int, block_len: int, endian: str) -> tuple[int, int, _Timebase, int]:
        linktype, _reserved, snaplen = struct.unpack_from(endian + "HHI", buf, pos + 8)
        name = None
        tsresol, tsoffset_s = _DEFAULT_TSRESOL, 0
        option_header = struct.Struct(endian + "HH")
        opt = pos + 16
        options_end = pos + block_len - 4
        while opt + 4 <= options_end:
            code, length = option_header.unpack_from(buf, opt)
            value = opt + 4
            if code == _OPT_END or value + length > options_end:
                break
            if code == _OPT_IF_TSRESOL and length >= 1:
                tsresol = buf[value]
            elif code == _OPT_IF_TSOFFSET and length >= 8:
                tsoffset_s = struct.unpack_from(endian + "q", buf, value)[0]
            elif code == _OPT_IF_NAME:
                name = bytes(buf[value:value + length]).decode("utf-8", "replace")
            opt = value + ((length + 3) & ~3)
        interface = len(self.interfaces)
        self.interfaces.append(CaptureInterface(linktype, snaplen, name))
        return linktype, interface, _timebase(tsresol, tsoffset_s), snaplen

    # -- iteration and lifetime ----------------------------------------------------------------
    def __iter__(self) -> Iterator[Packet]:
        return self._records

    @property
    def bytes_read(self) -> int:
        if not self._raw.closed:
            self._last_bytes_read = self._raw.tell()
        return self._last_bytes_read

    def close(self) -> None:
        if not self._raw.closed:
            self._last_bytes_read = self._raw.tell()
        self._records.close()
        if self._input is not self._raw:
            self._input.close()
        self._raw.close()

    def __enter__(self) -> CaptureReader:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def open_capture(path: str | os.PathLike) -> CaptureReader:
    """Open a pcap / pcapng file, gzip-compressed or not, for one pass of `Packet`s."""
    return CaptureReader(path)
