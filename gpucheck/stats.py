"""Numbers: plain statistics over measured figures (median and MAD, never mean and
standard deviation: docs/DESIGN.md), byte counts in words, a figure read defensively.
Floor 1: imports nothing from gpucheck."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# MAD x 1.4826 estimates the standard deviation of normally distributed values.
MAD_SCALE = 1.4826


def median(values: Iterable[float]) -> float:
    """The median of a non-empty collection, as a float (StatisticsError when empty)."""
    return float(statistics.median(values))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty sequence: always a value
    that was measured, so p50 of two iterations is the slower one, p99 of 50 the max."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n q / 100), at least 1
    return float(ordered[int(rank) - 1])


def best(samples: Sequence[float]) -> float:
    """The fastest of repeated rate readings (noise only slows)."""
    return float(max(samples))


def typical(samples: Sequence[float]) -> float:
    """The median of repeated readings: what the path usually does."""
    return median(samples)


@dataclass(frozen=True)
class Spread:
    """The distribution of one figure's values: count, median, median absolute
    deviation (unscaled), lowest and highest."""

    n: int
    median: float
    mad: float
    low: float
    high: float


def describe(values: Sequence[float]) -> Spread:
    """The spread of a non-empty sequence (StatisticsError when empty)."""
    center = median(values)
    mad = median(abs(v - center) for v in values)
    return Spread(len(values), center, mad, float(min(values)), float(max(values)))


def significant(value: float, digits: int = 6) -> float:
    """`value` rounded to `digits` significant digits (reports stay readable and stable)."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


_EXACT_UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
_BYTE_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def human_bytes(size: int) -> str:
    """An exact size in the largest unit that divides it: a buffer size ("64 MiB",
    "1536 B"); never rounded, so two sizes never read alike."""
    for unit, scale in _EXACT_UNITS:
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def fmt_bytes(count: int) -> str:
    """A count in the largest unit it reaches, one decimal ("1.5 GiB"): a measured
    amount, where the exact figure matters less than its size."""
    for unit, size in _BYTE_UNITS:
        if abs(count) >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def number(value: object) -> float | None:
    """A finite int or float (not a bool), else None: a record is read defensively."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
