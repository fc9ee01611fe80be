"""Rates, sizes and durations as people write them on a command line: the one parser of every option that takes
one (simulate's --bandwidth, --latency, --captured-bandwidth; capture's --snaplen, --rotate-size, --max-disk,
--buffer-size, --duration; decode's --start/--end +N after the start of the capture).

The units are tc(8)'s and iperf3's, with one rule over both: B is a byte, b a bit (tc ignores case, so its `MBps`
and `Mbps` are both megabytes a second, and a user's `10GB/s` must not become 10 Gbit/s). A number without a unit
is refused (tc reads a bare rate as bit/s and a bare time as µs, this command line used to read both as the SI
unit): the error lists the units. Zero needs no unit where zero is allowed (sizes, durations).

- rate, bit/s: bit, kbit, Mbit, Gbit, Tbit (any case, as tc), bit/s, Mbit/s, Mb/s; bps, kbps, Kbps, Mbps, Gbps,
  Tbps (as iperf prints them); Kibit, Mibit, Gibit (2^10...); a bare k, M, G, T as iperf3 -b (10G: 10 Gbit/s).
  Bytes a second: B/s, kB/s, MB/s, GB/s, TB/s, KiB/s, MiB/s, GiB/s; Bps, kBps, MBps, GBps, KiBps... (tc's).
  Refused as ambiguous: mbps, gbps, tbps (tc(8): megabytes a second; most people: megabits), and a size (10GB).
- size, bytes: B, kB, MB, GB, TB (10^3...), KiB, MiB, GiB, TiB (2^10...), a bare k, K, M, G, T as tc and iperf3
  -n spell them (binary: 64M is 64 MiB), kbit, Mbit, Gbit (tc's, whole bytes). Refused as ambiguous: kb, Mb, mb...
  (tc: kilobytes, most people: kilobits).
- duration, seconds: ns, us, µs, ms, s (and tc's nsec, usec, msec, sec), min, h.
"""
from __future__ import annotations

import re

_NUMBER = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(.*?)\s*")
_PREFIXES = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
             "Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40}
_LETTERS = {"k": 1, "K": 1, "m": 2, "M": 2, "g": 3, "G": 3, "t": 4, "T": 4}      # a bare multiplier (iperf, tc)


def _units(ends: dict[str, float]) -> dict[str, float]:
    """Every prefix + end -> its scale; the ends spelled `bit` in any case as well (tc ignores case)."""
    units = {prefix + end: scale * per for prefix, scale in _PREFIXES.items() for end, per in ends.items()}
    return units | {unit.lower(): scale for unit, scale in units.items() if "bit" in unit}


# bit/s in a unit of rate: bits (tc's, iperf's, SI's spellings), bytes (B: tc's Bps and the usual B/s), iperf3 -b's
# bare multipliers (decimal)
_RATE_SCALES = (_units({"bit": 1, "bits": 1, "bit/s": 1, "bits/s": 1, "b/s": 1, "bps": 1, "B/s": 8, "Bps": 8})
                | {letter: 1000.0 ** power for letter, power in _LETTERS.items()})
# bytes in a unit of size: bytes, tc's bits, tc's and iperf3 -n's bare multipliers (binary)
_SIZE_SCALES = (_units({"B": 1, "bit": 1 / 8})
                | {letter: 1024.0 ** power for letter, power in _LETTERS.items()})
_SECONDS = {"ns": 1e-9, "nsec": 1e-9, "us": 1e-6, "usec": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "msec": 1e-3,
            "s": 1.0, "sec": 1.0, "min": 60.0, "h": 3600.0}
# tc(8) reads these as bytes, most people as bits
_AMBIGUOUS_RATES = {"mbps", "gbps", "tbps"}
_AMBIGUOUS_SIZE = re.compile(r"[kKmMgGtT]i?b")

RATE_UNITS = ("bit/s: bit, kbit, Mbit, Gbit, bps, kbps, Mbps, Gbps, k, M, G (iperf -b); bytes/s: B/s, kB/s, MB/s, "
              "GB/s, KiB/s, MiB/s, GiB/s, Bps, MBps, GBps")
SIZE_UNITS = "B, kB, MB, GB, TB (10^3...), KiB, MiB, GiB, TiB (2^10...), k, M, G (as tc and iperf -n: KiB, MiB, GiB)"
DURATION_UNITS = "ns, us, µs, ms, s, min, h"


def _split(text: str, kind: str, units: str) -> tuple[float, str]:
    found = _NUMBER.fullmatch(text)
    if not found:
        raise ValueError(f"{text!r} is not a {kind}: a positive number and a unit ({units})")
    return float(found.group(1)), found.group(2)


def _ambiguous_rate(unit: str) -> str | None:
    return f"{unit[0].upper()}bit or {unit[0].upper()}B/s" if unit in _AMBIGUOUS_RATES else None


def _ambiguous_size(unit: str) -> str | None:
    if not _AMBIGUOUS_SIZE.fullmatch(unit):
        return None
    prefix = unit[:-1] if unit[0] in "kK" else unit[0].upper() + unit[1:-1]
    return f"{prefix}B or {prefix}bit"


def _quantity(text: str, kind: str, units: str, scales: dict[str, float], others: dict[str, dict[str, float]],
              ambiguous=lambda unit: None) -> float:
    """text's value times its unit's scale; ValueError, naming the units, for a bare number (but 0), an ambiguous
    unit (`ambiguous`: what to write instead) or a unit of another kind (`others`: kind -> its scales)."""
    value, unit = _split(text, kind, units)
    if not unit and value == 0:
        return 0.0
    instead = ambiguous(unit)
    if instead:
        raise ValueError(f"{text!r} is ambiguous: tc reads {unit} as bytes, most people as bits; write {instead}")
    if not unit:
        raise ValueError(f"{text!r} has no unit: a {kind} needs one ({units})")
    if unit not in scales:
        hint = next((f" ({unit} is a {other})" for other, found in others.items() if unit in found), "")
        raise ValueError(f"{text!r} is not a {kind}{hint}: units {units}")
    return value * scales[unit]


def parse_rate(text: str) -> float:
    """A rate ("100Mbit", "10GB/s", "1.6G") -> bit/s; ValueError with the units when it is not one."""
    rate = _quantity(text, "rate", RATE_UNITS, _RATE_SCALES, {"size": _SIZE_SCALES, "duration": _SECONDS},
                     _ambiguous_rate)
    if rate <= 0:
        raise ValueError(f"{text!r} is not a rate: it must be more than 0")
    return rate


def parse_size(text: str) -> int:
    """A size ("64MiB", "100MB", "96B", "64M", "0") -> bytes; ValueError with the units when it is not one."""
    size = _quantity(text, "size", SIZE_UNITS, _SIZE_SCALES, {"rate": _RATE_SCALES, "duration": _SECONDS},
                     _ambiguous_size)
    if abs(size - round(size)) > 1e-9 * max(1.0, size):
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(round(size))


def parse_duration(text: str) -> float:
    """A duration ("50us", "0.2ms", "30s", "0") -> seconds; ValueError with the units when it is not one."""
    return _quantity(text, "duration", DURATION_UNITS, _SECONDS, {"rate": _RATE_SCALES, "size": _SIZE_SCALES})


def _shown(value: float, steps: tuple[tuple[float, str], ...]) -> str:
    for scale, unit in steps:
        if abs(value) >= scale:
            return f"{value / scale:.6g}{unit}"
    scale, unit = steps[-1]
    return f"{value / scale:.6g}{unit}"


def format_rate(bit_s: float) -> str:
    """bit/s as this module reads it back ("200Mbit")."""
    return _shown(bit_s, ((1e12, "Tbit"), (1e9, "Gbit"), (1e6, "Mbit"), (1e3, "kbit"), (1.0, "bit")))


def format_size(size_bytes: int) -> str:
    """Bytes as this module reads them back ("64MiB", "100MB", "96B"), exact."""
    for scale, unit in ((2 ** 40, "TiB"), (10 ** 12, "TB"), (2 ** 30, "GiB"), (10 ** 9, "GB"), (2 ** 20, "MiB"),
                        (10 ** 6, "MB"), (2 ** 10, "KiB"), (10 ** 3, "kB")):
        if size_bytes >= scale and size_bytes % scale == 0:
            return f"{size_bytes // scale}{unit}"
    return f"{size_bytes}B"


def format_duration(seconds: float) -> str:
    """Seconds as this module reads them back ("50us", "1.5s")."""
    return "0s" if seconds == 0 else _shown(seconds, ((1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")))
