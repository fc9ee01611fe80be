"""Capture files -> link-layer packets with integer-nanosecond epoch timestamps.

The file-reading edge of decoders/: the only module here that opens a file. Formats are recognised by
their magic, never by the file name: pcap (microsecond and nanosecond, either byte order), pcapng (any
number of sections and interfaces, each with its own link type and timestamp resolution/offset), and
either of them compressed with gzip, xz or zstd.

The input is read front to back in `CHUNK_BYTES` reads, never seeked, so memory stays flat however
large it is and a pipe reads like a file: `-` is standard input, and a fifo or character device is read as
the stream it is (its `total_bytes` is None: progress without a total). The records found
whole in a read buffer come out together as a `RecordBatch` (`CaptureReader.batches()`, for vectorised
readers) or one by one as `Packet`s (iterating the reader). A packet's `data` is a read-only memoryview
into that buffer: holding on to it keeps the buffer (about `CHUNK_BYTES`) alive, and out of the reuse of
buffers nothing refers to any more, so a consumer that keeps packet bytes for long should copy the few
it keeps.
"""
from __future__ import annotations

import gzip
import io
import lzma
import os
import stat
import struct
import sys
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator, NamedTuple

import numpy as np

from dlcsniff.decoders.errors import CaptureError
from dlcsniff.decoders.inputs.background_digest import BackgroundDigest
from dlcsniff.decoders.inputs.record_walk import epb_offsets, pcap_offsets

CHUNK_BYTES = 4 << 20
# No capture tool writes a record near this size (libpcap's largest snaplen is 256 KiB); a larger length
# field means the file is corrupt from there on.
MAX_RECORD_BYTES = 1 << 26
NS_PER_S = 1_000_000_000

STDIN = "-"
# Compression formats by magic: gzip (RFC 1952), xz (.xz file format 1.0), zstd (RFC 8878 frame magic).
_COMPRESSION_MAGICS = {b"\x1f\x8b": "gzip", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
_MAGIC_BYTES = max(map(len, _COMPRESSION_MAGICS))
# pcap global header magic (as the first 4 file bytes) -> (struct byte order, ns per timestamp fraction unit)
_PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1": ("<", 1000),   # 0xa1b2c3d4 little-endian: microseconds
    b"\xa1\xb2\xc3\xd4": (">", 1000),
    b"\x4d\x3c\xb2\xa1": ("<", 1),      # 0xa1b23c4d: nanoseconds
    b"\xa1\xb2\x3c\x4d": (">", 1),
}
_PCAP_MODIFIED_MAGICS = (b"\x34\xcd\xb2\xa1", b"\xa1\xb2\xcd\x34")   # 0xa1b2cd34: "modified pcap"
_PCAP_HEADER_BYTES = 24
PCAP_RECORD_HEADER_BYTES = 16   # ts_sec, ts_frac, caplen, orig_len; the packet follows
EPB_HEADER_BYTES = 28           # block type, length, interface id, ts high, ts low, caplen, orig_len; packet

# pcapng block types (draft-ietf-opsawg-pcapng)
_SHB = 0x0A0D0D0A        # section header: palindromic, so it reads the same in both byte orders
_IDB = 0x00000001        # interface description
_PB = 0x00000002         # obsolete packet block
_SPB = 0x00000003        # simple packet block
_ISB = 0x00000005        # interface statistics
_EPB = 0x00000006        # enhanced packet block
_SHB_BYTES = b"\x0a\x0d\x0d\x0a"
# Shortest well-formed block of each type: header, fixed fields, trailing length.
_MIN_BLOCK_BYTES = {_SHB: 28, _IDB: 20, _PB: 32, _SPB: 16, _ISB: 24, _EPB: 32}
_BYTE_ORDER_MAGIC = {b"\x4d\x3c\x2b\x1a": "<", b"\x1a\x2b\x3c\x4d": ">"}
_OPT_END = 0
_OPT_IF_NAME = 2
_OPT_IF_TSRESOL = 9
_OPT_IF_TSOFFSET = 14
# ISB counters since the capture started: dropped by the interface for lack of resources (dumpcap: libpcap's
# ps_drop, the kernel buffer's) and by the operating system
_OPT_ISB_IFDROP = 5
_OPT_ISB_OSDROP = 7
_DEFAULT_TSRESOL = 6     # microseconds, when an interface has no if_tsresol option

_SPARE_BUFFERS = 6        # read buffers kept for reuse (the hash may hold a few)
# Room a new read buffer gets beyond CHUNK_BYTES: a refill carries the unread part of the last record over
# (up to libpcap's largest snaplen and its header), so a buffer of just the size asked would fit no later refill
# and every refill that carried bytes over made a new buffer (six of them, 25 MB, on a 1 GB capture).
_BUFFER_SLACK = (256 << 10) + 64

_PCAP_RECORD = {e: struct.Struct(e + "IIII") for e in "<>"}          # ts_sec ts_frac caplen orig_len
_PCAP_CAPLEN = {e: struct.Struct(e + "8xI") for e in "<>"}
_EPB_FIELDS = {e: struct.Struct(e + "8xIIIII") for e in "<>"}        # if_id ts_high ts_low caplen orig_len
_EPB_CHECKED = {e: struct.Struct(e + "III8xI") for e in "<>"}        # type length if_id caplen
# The same headers as numpy records, for reading a whole batch at once.
_PCAP_RECORD_ROWS = {e: np.dtype([("ts_s", e + "u4"), ("ts_frac", e + "u4"), ("caplen", e + "u4"),
                                  ("orig_len", e + "u4")]) for e in "<>"}
_EPB_ROWS = {e: np.dtype([("if_id", e + "u4"), ("ts_high", e + "u4"), ("ts_low", e + "u4"),
                          ("caplen", e + "u4"), ("orig_len", e + "u4")]) for e in "<>"}


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
class Timebase:
    """How one pcapng interface's 64-bit timestamp units become epoch ns: units * mul // div + offset_ns."""
    mul: int
    div: int
    offset_ns: int


@dataclass(frozen=True, slots=True)
class SectionInterface:
    """One interface of the current pcapng section, as its packet blocks refer to it (by position)."""
    linktype: int
    number: int                  # file-wide interface number
    timebase: Timebase
    snaplen: int


@dataclass(frozen=True, slots=True)
class PcapRecords:
    """Records of a pcap file: a PCAP_RECORD_HEADER_BYTES header in `endian` order, then the packet."""
    endian: str
    frac_ns: int                 # ns per unit of the header's second field
    linktype: int


@dataclass(frozen=True, slots=True)
class EnhancedPacketBlocks:
    """pcapng enhanced packet blocks of one section: EPB_HEADER_BYTES of header in `endian` order, then the
    packet. Their interface id indexes `interfaces`."""
    endian: str
    interfaces: tuple[SectionInterface, ...]


class RecordColumns(NamedTuple):
    """A batch's records as arrays, one entry per record."""
    data_start: np.ndarray       # where the packet starts in the batch's buffer
    caplen: np.ndarray
    orig_len: np.ndarray
    ts_ns: np.ndarray
    linktype: int | np.ndarray   # one for the whole batch, or one per record (pcapng, mixed interfaces)


def struct_rows(u8: np.ndarray, starts: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The `dtype`-sized structure at each start offset (starts past the end read the last bytes)."""
    width = dtype.itemsize
    if len(u8) < width:
        u8 = np.concatenate([u8, np.zeros(width - len(u8), dtype=np.uint8)])
    windows = np.lib.stride_tricks.sliding_window_view(u8, width)
    return windows[np.minimum(starts, len(u8) - width)].view(dtype)[:, 0]


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """Consecutive packet records lying whole in one read buffer, all laid out alike.

    Every record here is well-formed: its captured bytes lie inside it, and (pcapng) its interface exists.
    """
    buf: memoryview              # read-only view of the buffer
    offsets: array               # array("q"): where each record starts in buf
    layout: PcapRecords | EnhancedPacketBlocks

    def __len__(self) -> int:
        return len(self.offsets)

    def packets(self) -> Iterator[Packet]:
        buf, layout = self.buf, self.layout
        if layout.__class__ is PcapRecords:
            unpack = _PCAP_RECORD[layout.endian].unpack_from
            frac_ns, linktype = layout.frac_ns, layout.linktype
            for pos in self.offsets:
                ts_s, ts_frac, caplen, orig_len = unpack(buf, pos)
                data = pos + PCAP_RECORD_HEADER_BYTES
                yield Packet(ts_s * NS_PER_S + ts_frac * frac_ns, linktype, buf[data:data + caplen], orig_len, 0)
        else:
            for pos in self.offsets:
                yield self._epb(pos)

    def columns(self) -> RecordColumns | None:
        """Every record's fields as arrays (read with numpy over the whole batch), or None when its
        timestamps need more than int64 arithmetic."""
        u8 = np.frombuffer(self.buf, dtype=np.uint8)
        offsets = np.frombuffer(self.offsets, dtype=np.int64)
        layout = self.layout
        if layout.__class__ is PcapRecords:
            rec = struct_rows(u8, offsets, _PCAP_RECORD_ROWS[layout.endian])
            ts_ns = rec["ts_s"].astype(np.int64) * NS_PER_S + rec["ts_frac"].astype(np.int64) * layout.frac_ns
            return RecordColumns(offsets + PCAP_RECORD_HEADER_BYTES, rec["caplen"].astype(np.int64),
                                 rec["orig_len"].astype(np.int64), ts_ns, layout.linktype)
        interfaces = layout.interfaces
        muls = [i.timebase.mul for i in interfaces]
        offsets_ns = [i.timebase.offset_ns for i in interfaces]
        rec = struct_rows(u8, offsets + 8, _EPB_ROWS[layout.endian])
        units = (rec["ts_high"].astype(np.uint64) << np.uint64(32)) | rec["ts_low"].astype(np.uint64)
        if (any(i.timebase.div != 1 for i in interfaces) or max(map(abs, offsets_ns)) >= 1 << 62
                or int(units.max()) * max(muls) >= 1 << 62):
            return None
        if_id = rec["if_id"].astype(np.int64)
        ts_ns = (units.astype(np.int64) * np.array(muls, dtype=np.int64)[if_id]
                 + np.array(offsets_ns, dtype=np.int64)[if_id])
        linktypes = [i.linktype for i in interfaces]
        linktype = linktypes[0] if len(set(linktypes)) == 1 else np.array(linktypes, dtype=np.int64)[if_id]
        return RecordColumns(offsets + EPB_HEADER_BYTES, rec["caplen"].astype(np.int64),
                             rec["orig_len"].astype(np.int64), ts_ns, linktype)

    def subset(self, keep: np.ndarray) -> RecordBatch:
        """The records where `keep` (a boolean array, one per record) is true, as a batch of their own."""
        return RecordBatch(self.buf, array("q", np.frombuffer(self.offsets, dtype=np.int64)[keep].tobytes()),
                           self.layout)

    def first_ts_ns(self) -> int:
        return self._ts_ns(self.offsets[0])

    def last_ts_ns(self) -> int:
        return self._ts_ns(self.offsets[-1])

    def _ts_ns(self, pos: int) -> int:
        if self.layout.__class__ is PcapRecords:
            ts_s, ts_frac, _, _ = _PCAP_RECORD[self.layout.endian].unpack_from(self.buf, pos)
            return ts_s * NS_PER_S + ts_frac * self.layout.frac_ns
        return self._epb(pos).ts_ns

    def _epb(self, pos: int) -> Packet:
        if_id, ts_high, ts_low, caplen, orig_len = _EPB_FIELDS[self.layout.endian].unpack_from(self.buf, pos)
        iface = self.layout.interfaces[if_id]
        tb = iface.timebase
        data = pos + EPB_HEADER_BYTES
        return Packet(((ts_high << 32) | ts_low) * tb.mul // tb.div + tb.offset_ns, iface.linktype,
                      self.buf[data:data + caplen], orig_len, iface.number)


def _timebase(tsresol: int, tsoffset_s: int) -> Timebase:
    if tsresol & 0x80:                      # if_tsresol MSB set: 2^-n seconds per unit
        return Timebase(NS_PER_S, 1 << (tsresol & 0x7F), tsoffset_s * NS_PER_S)
    if tsresol <= 9:                        # 10^-n seconds per unit
        return Timebase(10 ** (9 - tsresol), 1, tsoffset_s * NS_PER_S)
    return Timebase(1, 10 ** (tsresol - 9), tsoffset_s * NS_PER_S)


def _describe_start(head: bytes) -> str:
    if not head:
        return "the file is empty"
    text = "".join(chr(b) if 32 <= b < 127 else "." for b in head)
    return f"its first bytes are {head.hex(' ')} ({text!r})"


def is_stream(path: str | os.PathLike) -> bool:
    """Whether the input is read as a stream (standard input, a fifo, a character device), not a file."""
    if str(path) == STDIN:
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


class _Input(io.RawIOBase):
    """The raw input, read front to back only: it counts the bytes taken from it (progress), hashes them (the
    manifest's sha256 of the input, from the bytes read for decoding: one pass over the file, hashed beside the
    decoding: decoders.inputs.background_digest) and can look at its first bytes (the magic) without a seek, so
    pipes read like files."""

    def __init__(self, source: BinaryIO, close_source: bool):
        self._source = source
        self._close_source = close_source
        self._head = b""
        self.consumed = 0
        self.digest = BackgroundDigest()

    def readable(self) -> bool:
        return True

    def peek_head(self, size: int) -> bytes:
        """Up to `size` first bytes (fewer only when the input is shorter), still to be read."""
        while len(self._head) < size:
            more = self._source.read(size - len(self._head))
            if not more:
                break
            self.consumed += len(more)
            self.digest.update(more)
            self._head += more
        return self._head

    def readinto(self, buf) -> int:
        if self._head:
            n = min(len(buf), len(self._head))
            buf[:n] = self._head[:n]
            self._head = self._head[n:]
            return n
        n = self._source.readinto(buf) or 0
        self.consumed += n
        if n:
            self.digest.update(memoryview(buf)[:n])     # held (and the buffer with it) until hashed
        return n

    def sha256(self) -> str:
        """The digest of the whole input: what decoding left unread (after a corrupt record, past the end of
        compressed data) is read into it first."""
        while more := self._source.read(1 << 20):
            self.digest.update(more)            # not counted in `consumed`: decoding did not take them
        return self.digest.hexdigest()

    def close(self) -> None:
        self.digest.close()
        if self._close_source and not self._source.closed:
            self._source.close()
        super().close()


def _decompressor(compression: str, raw: _Input) -> BinaryIO:
    if compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if compression == "xz":
        return lzma.LZMAFile(raw)
    import zstandard          # measured: 3.3 GB/s in-process, against 1 GB/s through a pipe from the zstd binary
    # read_across_frames: a file of several frames (zstd --rsyncable, concatenated files) is one capture
    return zstandard.ZstdDecompressor().stream_reader(raw, read_size=1 << 20, read_across_frames=True)


_DECOMPRESSION_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, lzma.LZMAError)


class CaptureReader:
    """One pass over a capture file: iterate it for `Packet`s, or take `batches()`. Use as a context manager.

    State readable at any time: `path`, `format` ("pcap" | "pcapng"), `compression` (None, "gzip", "xz",
    "zstd"; `compressed` says whether there is one), `interfaces`, `packets` (records read so far),
    `bytes_read` / `total_bytes` (input bytes read so far / the file's size on disk, None for a stream; for
    progress bars), `warnings`, `truncated_bytes` (bytes of an incomplete last record), `skipped_records`
    (malformed packet records passed over), `dropped_packets` (what the capture tool recorded as dropped
    before it got the packets: pcapng interface statistics; None when the file records none).
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.warnings: list[str] = []
        self.packets = 0
        self.truncated_bytes = 0
        self.skipped_records = 0
        self.interfaces: list[CaptureInterface] = []
        self._interface_drops: dict[int, int] = {}     # file-wide interface number -> its last ISB's drops
        if str(path) == STDIN:
            self._raw = _Input(sys.stdin.buffer, close_source=False)
            self.total_bytes = None
        else:
            try:
                source = open(self.path, "rb", buffering=0)
            except FileNotFoundError:
                raise CaptureError(f"{self.path}: no such file") from None
            except OSError as exc:
                raise CaptureError(f"{self.path}: cannot open: {exc.strerror}") from None
            mode = os.fstat(source.fileno()).st_mode
            self.total_bytes = os.fstat(source.fileno()).st_size if stat.S_ISREG(mode) else None
            self._raw = _Input(source, close_source=True)
        self._buf_offset = 0                 # offset of the buffer's first byte in the (decompressed) capture
        self._spares: list[bytearray] = []   # the last read buffers, for reuse once no view of them is left
        self._input_error: str | None = None  # why decompression stopped, if it did
        try:
            self._records = self._open_format()
        except BaseException:
            self._raw.close()
            raise

    @property
    def compressed(self) -> bool:
        return self.compression is not None

    # -- opening -------------------------------------------------------------------------------
    def _open_format(self) -> Iterator[RecordBatch | Packet]:
        magic = self._raw.peek_head(_MAGIC_BYTES)
        self.compression = next((name for m, name in _COMPRESSION_MAGICS.items() if magic.startswith(m)), None)
        if not magic:                   # tcpdump killed before it wrote anything: a capture of nothing
            self.format = "empty"
            self._input = self._raw
            what = "the file is empty" if self.total_bytes is not None else "the input is empty"
            self.warnings.append(f"{self.path}: {what} (not even a capture header): no packets")
            return self._no_records()
        self._input = self._raw if self.compression is None else _decompressor(self.compression, self._raw)
        head = self._refill(b"", 0, _PCAP_HEADER_BYTES)
        what = f"{self.compression}-compressed file" if self.compressed else "file"
        magic = bytes(head[:4])
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
            return self._pcap_records(head, PcapRecords(endian, frac_ns, network & 0xFFFF))
        if magic == _SHB_BYTES:
            if len(head) < 16:
                raise CaptureError(f"{self.path}: pcapng {what} ends inside its section header")
            order = _BYTE_ORDER_MAGIC.get(bytes(head[8:12]))
            if order is None:
                raise CaptureError(f"{self.path}: pcapng {what} without a valid byte-order magic: "
                                   f"{_describe_start(bytes(head[:16]))}")
            major, minor = struct.unpack_from(order + "HH", head, 12)
            if major != 1:
                raise CaptureError(f"{self.path}: unsupported pcapng version {major}.{minor} (only 1.x exists)")
            self.format = "pcapng"
            return self._pcapng_records(head)
        if magic in _PCAP_MODIFIED_MAGICS:
            raise CaptureError(f"{self.path}: unsupported pcap variant (the 'modified pcap' format of a "
                               f"patched libpcap); convert it with `editcap -F pcap`")
        if self._input_error is not None:
            raise CaptureError(f"{self.path}: not a readable {what} ({self._input_error})")
        raise CaptureError(f"{self.path}: not a pcap or pcapng {what}: {_describe_start(bytes(head[:16]))}")

    @staticmethod
    def _no_records() -> Iterator[RecordBatch | Packet]:
        yield from ()

    # -- input ---------------------------------------------------------------------------------
    def _read_into(self, buf: bytearray, start: int) -> int:
        """Fill buf from `start` on with input; the number of bytes read (fewer only at its end)."""
        done = start
        # Decompressed, a piece at a time: what precedes a corrupt or missing end still comes out.
        read = self._input.readinto1 if self.compressed else self._input.readinto
        with memoryview(buf) as view:
            while done < len(buf) and self._input_error is None:
                try:
                    n = read(view[done:])
                except self._decompression_errors() as exc:
                    self._input_error = str(exc)
                    self.warnings.append(f"{self.path}: compressed data ends early or is corrupt ({exc}); "
                                         f"decoded up to there")
                    break
                if not n:
                    break
                done += n
        return done - start

    def _refill(self, buf: memoryview | bytes, pos: int, need: int) -> memoryview:
        """The next buffer (read-only): `buf` from `pos` on, then fresh input, so that it holds `need` bytes
        (and at least CHUNK_BYTES more than before) when the input has them."""
        rest = len(buf) - pos
        self._buf_offset += pos
        new = self._free_buffer(rest + max(CHUNK_BYTES, need - rest))
        with memoryview(new) as view:
            view[:rest] = buf[pos:]
        filled = rest + self._read_into(new, rest)
        return memoryview(new).toreadonly()[:filled]

    def _free_buffer(self, size: int) -> bytearray:
        """A buffer of at least `size` bytes that nothing refers to any more (reused: its pages are
        already mapped), or a new one. The input's hash holds views of the buffers it has still to hash: when
        every spare is held, it is waited for before a buffer is added (the memory stays a few chunks)."""
        for attempt in range(2):
            for spare in self._spares:
                if len(spare) >= size:
                    try:
                        last = spare.pop()        # a buffer something still has a view of cannot resize
                    except BufferError:
                        continue
                    spare.append(last)            # (a shrink by one byte and back: no reallocation)
                    return spare
            if attempt or len(self._spares) < _SPARE_BUFFERS:
                break
            self._raw.digest.wait()
        new = bytearray(max(size, CHUNK_BYTES + _BUFFER_SLACK))
        self._spares.append(new)
        del self._spares[:-_SPARE_BUFFERS]
        return new

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
    def _pcap_records(self, buf: memoryview, layout: PcapRecords) -> Iterator[RecordBatch]:
        caplen_at = _PCAP_CAPLEN[layout.endian].unpack_from
        header_bytes = PCAP_RECORD_HEADER_BYTES
        big_endian = layout.endian == ">"
        pos = _PCAP_HEADER_BYTES
        while True:
            # The hot loop: find the records lying whole in this buffer (decoders.inputs.record_walk).
            end = len(buf)
            offsets, pos = pcap_offsets(buf, pos, big_endian)
            if offsets:
                self.packets += len(offsets)
                yield RecordBatch(buf, offsets, layout)
            # A record that does not fit (or the end of the buffer): read on.
            if end - pos < header_bytes:
                buf, pos = self._refill(buf, pos, header_bytes), 0
                if len(buf) < header_bytes:
                    self._stop_truncated(len(buf), "record header")
                    return
                continue
            caplen = caplen_at(buf, pos)[0]
            if caplen > MAX_RECORD_BYTES:
                self._stop_corrupt(pos, f"record claims {caplen} captured bytes")
                return
            buf, pos = self._refill(buf, pos, header_bytes + caplen), 0
            if len(buf) < header_bytes + caplen:
                self._stop_truncated(len(buf), "packet record")
                return

    # -- pcapng --------------------------------------------------------------------------------
    def _pcapng_records(self, buf: memoryview) -> Iterator[RecordBatch | Packet]:
        pos = 0
        endian = "<"
        block_header = struct.Struct("<II")
        section: list[SectionInterface] = []
        layout: EnhancedPacketBlocks | None = None
        last_ts_ns = 0
        while True:
            if layout is not None:
                # The hot loop: well-formed enhanced packet blocks lying whole in this buffer.
                offsets, pos = epb_offsets(buf, pos, endian == ">", len(section))
                if offsets:
                    self.packets += len(offsets)
                    batch = RecordBatch(buf, offsets, layout)
                    last_ts_ns = batch.last_ts_ns()
                    yield batch
            # Any other block, or one that does not fit in the buffer.
            end = len(buf)
            if end - pos < 12:
                buf, pos = self._refill(buf, pos, 12), 0
                end = len(buf)
                if end < 12:
                    self._stop_truncated(end, "block header")
                    return
            block_type = block_header.unpack_from(buf, pos)[0]
            if block_type == _SHB:
                order = _BYTE_ORDER_MAGIC.get(bytes(buf[pos + 8:pos + 12]))
                if order is None:
                    self._stop_corrupt(pos, "section header without a valid byte-order magic")
                    return
                if order != endian:
                    endian = order
                    block_header = struct.Struct(endian + "II")
                section = []
                layout = None
            block_len = block_header.unpack_from(buf, pos)[1]
            if block_len < 12 or block_len & 3 or block_len > MAX_RECORD_BYTES:
                self._stop_corrupt(pos, f"block of type {block_type:#x} claims a length of {block_len} bytes")
                return
            if end - pos < block_len:
                buf, pos = self._refill(buf, pos, block_len), 0
                end = len(buf)
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
            if block_type == _EPB:
                _, _, if_id, caplen = _EPB_CHECKED[endian].unpack_from(buf, pos)
                if if_id >= len(section):
                    self._skip(pos, f"packet block for undefined interface {if_id}")
                elif EPB_HEADER_BYTES + caplen > block_len - 4:
                    self._skip(pos, f"packet block of {block_len} bytes claims {caplen} captured bytes")
                else:
                    continue          # well-formed: the hot loop takes it
                pos += block_len
                continue
            if block_type == _SPB:
                if section:
                    orig_len = struct.unpack_from(endian + "I", buf, pos + 8)[0]
                    first = section[0]
                    caplen = min(orig_len, block_len - 16, first.snaplen or orig_len)
                    self.packets += 1
                    yield Packet(last_ts_ns, first.linktype, buf[pos + 12:pos + 12 + caplen], orig_len,
                                 first.number)
                else:
                    self._skip(pos, "simple packet block before any interface description")
            elif block_type == _PB:
                if_id, _drops, ts_high, ts_low, caplen, orig_len = struct.unpack_from(endian + "HHIIII", buf,
                                                                                      pos + 8)
                if if_id >= len(section):
                    self._skip(pos, f"packet block for undefined interface {if_id}")
                elif 28 + caplen > block_len - 4:
                    self._skip(pos, f"packet block of {block_len} bytes claims {caplen} captured bytes")
                else:
                    iface = section[if_id]
                    tb = iface.timebase
                    last_ts_ns = ((ts_high << 32) | ts_low) * tb.mul // tb.div + tb.offset_ns
                    self.packets += 1
                    yield Packet(last_ts_ns, iface.linktype, buf[pos + 28:pos + 28 + caplen], orig_len,
                                 iface.number)
            elif block_type == _IDB:
                section.append(self._interface(buf, pos, block_len, endian))
                layout = EnhancedPacketBlocks(endian, tuple(section))
            elif block_type == _ISB:
                self._statistics(buf, pos, block_len, endian, section)
            elif block_type == _SHB:
                major, minor = struct.unpack_from(endian + "HH", buf, pos + 12)
                if major != 1:
                    self._stop_corrupt(pos, f"a section of unsupported pcapng version {major}.{minor}")
                    return
            pos += block_len          # other blocks (name resolution, statistics, custom...) carry no packets

    def _interface(self, buf: memoryview, pos: int, block_len: int, endian: str) -> SectionInterface:
        linktype, _reserved, snaplen = struct.unpack_from(endian + "HHI", buf, pos + 8)
        name = None
        tsresol, tsoffset_s = _DEFAULT_TSRESOL, 0
        for code, value, length in _options(buf, pos + 16, pos + block_len - 4, endian):
            if code == _OPT_IF_TSRESOL and length >= 1:
                tsresol = buf[value]
            elif code == _OPT_IF_TSOFFSET and length >= 8:
                tsoffset_s = struct.unpack_from(endian + "q", buf, value)[0]
            elif code == _OPT_IF_NAME:
                name = bytes(buf[value:value + length]).decode("utf-8", "replace")
        number = len(self.interfaces)
        self.interfaces.append(CaptureInterface(linktype, snaplen, name))
        return SectionInterface(linktype, number, _timebase(tsresol, tsoffset_s), snaplen)

    def _statistics(self, buf: memoryview, pos: int, block_len: int, endian: str,
                    section: list[SectionInterface]) -> None:
        """An interface statistics block: its drop counters (cumulative: a later block replaces an earlier)."""
        if_id = struct.unpack_from(endian + "I", buf, pos + 8)[0]
        if if_id >= len(section):         # of no interface: its counts belong to nothing read
            return
        drops = None
        for code, value, length in _options(buf, pos + 20, pos + block_len - 4, endian):
            if code in (_OPT_ISB_IFDROP, _OPT_ISB_OSDROP) and length == 8:
                drops = (drops or 0) + struct.unpack_from(endian + "Q", buf, value)[0]
        if drops is not None:
            self._interface_drops[section[if_id].number] = drops

    @property
    def dropped_packets(self) -> int | None:
        """Packets the capture tool recorded as dropped before it got them, over every interface (pcapng
        interface statistics: isb_ifdrop + isb_osdrop of each interface's last statistics block); None when the
        file records no such counter (pcap files never do)."""
        return sum(self._interface_drops.values()) if self._interface_drops else None

    # -- iteration and lifetime ----------------------------------------------------------------
    def batches(self) -> Iterator[RecordBatch | Packet]:
        """The records in file order: runs of pcap records or enhanced packet blocks as RecordBatches, the
        rare other pcapng packet blocks (simple, obsolete) as single Packets."""
        return self._records

    def __iter__(self) -> Iterator[Packet]:
        for item in self._records:
            if item.__class__ is Packet:
                yield item
            else:
                yield from item.packets()

    @property
    def bytes_read(self) -> int:
        return self._raw.consumed

    def sha256(self) -> str | None:
        """sha256 of the file's bytes (as stored: compressed, if it is), once it has been read for decoding; None
        for a stream or a fifo (nothing to read twice, nor a file to name)."""
        return None if self.total_bytes is None else self._raw.sha256()

    def _decompression_errors(self) -> tuple[type[BaseException], ...]:
        if self.compression == "zstd":
            import zstandard
            return (*_DECOMPRESSION_ERRORS, zstandard.ZstdError)
        return _DECOMPRESSION_ERRORS

    def close(self) -> None:
        self._records.close()
        self._spares = []
        if self._input is not self._raw:
            self._input.close()
        self._raw.close()

    def __enter__(self) -> CaptureReader:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _options(buf: memoryview, opt: int, options_end: int, endian: str) -> Iterator[tuple[int, int, int]]:
    """(code, offset of the value, length) of each option of a pcapng block, from `opt` up to its end of
    options (or the first that does not fit)."""
    option_header = struct.Struct(endian + "HH")
    while opt + 4 <= options_end:
        code, length = option_header.unpack_from(buf, opt)
        value = opt + 4
        if code == _OPT_END or value + length > options_end:
            return
        yield code, value, length
        opt = value + ((length + 3) & ~3)


def first_last_ts_ns(item: RecordBatch | Packet) -> tuple[int, int]:
    """Timestamps of the first and last record of what `CaptureReader.batches()` gave."""
    if item.__class__ is Packet:
        return item.ts_ns, item.ts_ns
    return item.first_ts_ns(), item.last_ts_ns()


def open_capture(path: str | os.PathLike) -> CaptureReader:
    """Open a pcap / pcapng file or stream (`-`: standard input), compressed (gzip, xz, zstd) or not, for one
    pass of `Packet`s (or of batches)."""
    return CaptureReader(path)
