"""How a figure is shown to a person, in the terminal and in the report alike: one unit per quantity.

- durations (iteration phases, computation, communication, waits, server overheads, collective times, skews,
  gaps, simulated iterations): ms, to the µs (3 decimals);
- clock offsets between captures and their error bounds: µs, to 0.1 µs, digits grouped (decode's summary:
  a capture seconds off reads +3,999,659.3 µs);
- sizes: B, kB, MB (10³ B, 10⁶ B), 2 decimals;
- collective bandwidth: GB/s (10⁹ B/s, nccl-tests' unit); link rates: Mbit/s (10⁶ bit/s, tc's mbit);
- ratios and shares: %, 1 decimal.

Tables (Parquet, summary.json) keep the units SCHEMA.md gives their columns (_s, _us, _ns...); `scale_of` turns a
column's unit into its display unit.
"""
from __future__ import annotations

import math

DURATION_UNIT = "ms"
_TO_MS = {"s": 1e3, "ms": 1.0, "us": 1e-3, "ns": 1e-6}


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def scale_of(column: str) -> tuple[float, str]:
    """(factor, unit) that shows a column's values in their display unit: a duration (_s, _ms, _us, _ns) in ms,
    a ratio or a share in %; anything else as it is."""
    suffix = column.rsplit("_", 1)[-1]
    if suffix in _TO_MS:
        return _TO_MS[suffix], DURATION_UNIT
    if suffix in ("ratio", "fraction", "share"):
        return 100.0, "%"
    return 1.0, ""


def number(value: float | None, unit: str) -> str:
    """A value already in display unit `unit`, with that unit's precision (no unit written)."""
    if not _finite(value):
        return "n/a"
    return f"{value:,.1f}" if unit == "%" else f"{value:,.3f}"


def duration(value: float | None, unit: str = "s", *, with_unit: bool = True) -> str:
    """A duration given in `unit` (s, ms, us, ns), shown in ms ("4.786 ms"); "n/a" when unknown."""
    shown = number(None if not _finite(value) else value * _TO_MS[unit], DURATION_UNIT)
    return f"{shown} {DURATION_UNIT}" if with_unit and shown != "n/a" else shown


def percent(fraction: float | None, *, with_unit: bool = True) -> str:
    """A fraction (0.221) shown as a percentage ("22.1 %")."""
    shown = number(None if not _finite(fraction) else fraction * 100, "%")
    return f"{shown} %" if with_unit and shown != "n/a" else shown


def link_rate(bit_s: float | None) -> str:
    """A link's rate in Mbit/s ("378.3 Mbit/s")."""
    return "n/a" if not _finite(bit_s) else f"{bit_s / 1e6:,.1f} Mbit/s"


def human_bytes(size: float | None) -> str:
    """A size in B, kB or MB (decimal)."""
    if size is None:
        return "n/a"
    for unit, factor in (("MB", 1e6), ("kB", 1e3)):
        if size >= factor:
            return f"{size / factor:.2f} {unit}"
    return f"{size:.0f} B"
