"""A capture as another clock would have stamped it: every packet's time t becomes
t + shift_ns + drift_ppm * 1e-6 * (t - the first packet's time), and, with a step, t + step_ns from step_at_ns
on (an NTP step). Written here from the pcap format (libpcap's savefile: a 24-byte file header, then a 16-byte
header per record), not with the decoder's reader; tests check it against tshark's times."""
from __future__ import annotations

import gzip
import struct
from pathlib import Path

# magic → (byte order, nanoseconds per unit of the second timestamp field)
_MAGIC = {b"\xd4\xc3\xb2\xa1": ("<", 1_000), b"\xa1\xb2\xc3\xd4": (">", 1_000),
          b"\x4d\x3c\xb2\xa1": ("<", 1), b"\xa1\xb2\x3c\x4d": (">", 1)}


def retime_pcap(source: Path, target: Path, *, shift_ns: int = 0, drift_ppm: float = 0.0, step_ns: int = 0,
                step_at_ns: int | None = None) -> None:
    """Copy the pcap `source` (gzipped or not, either byte order, micro- or nanosecond) to `target` (plain
    pcap, the same layout) with its packets' times moved (see the module doc); times round down to the
    file's resolution."""
    data = Path(source).read_bytes()
    data = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    if data[:4] not in _MAGIC:
        raise ValueError(f"{source}: not a pcap file")
    order, unit_ns = _MAGIC[data[:4]]
    record = struct.Struct(order + "IIII")
    out = bytearray(data[:24])
    offset, first = 24, None
    while offset + record.size <= len(data):
        seconds, fraction, caplen, length = record.unpack_from(data, offset)
        ts = seconds * 10**9 + fraction * unit_ns
        first = ts if first is None else first
        moved = ts + shift_ns + round(drift_ppm * 1e-6 * (ts - first))
        if step_at_ns is not None and ts >= step_at_ns:
            moved += step_ns
        units = moved // unit_ns
        per_second = 10**9 // unit_ns
        out += record.pack(units // per_second, units % per_second, caplen, length)
        out += data[offset + record.size:offset + record.size + caplen]
        offset += record.size + caplen
    Path(target).write_bytes(bytes(out))
