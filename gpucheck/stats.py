"""Plain statistics over measured figures: median, nearest-rank percentile, best and
typical of repeats, a robust spread. Median and MAD, not mean and standard deviation:
one dead GPU would drag a mean until nothing stood out. Floor 1: imports nothing."""

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
