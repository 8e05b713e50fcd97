"""Robust statistics across nodes: median, MAD, outliers and iterative trimming.

Median and MAD, not mean and standard deviation: in a fleet the bad nodes are the
point, and one dead GPU at a tenth of the speed would drag a mean and inflate a
standard deviation until nothing stood out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gpucheck.analysis.metrics import HIGHER, LOWER

# MAD x 1.4826 estimates the standard deviation of normally distributed values.
MAD_SCALE = 1.4826
# The MAD rule alone would call a node 0.3% off an outlier in a fleet that agrees to
# 0.05%: no one acts on that, so a node must also be this much worse.
MAD_FLOOR = 0.02
MIN_VALUES = 3  # with two values the median cannot tell which one is off
# A MAD from a handful of values is itself noise: eleven nodes with 2% noise can
# happen to agree to 0.3%, which makes an ordinary node "5 MADs off" (seen with
# benchmarks/fleet_scale.py --nodes 12). The MAD rule waits for this many values.
MAD_MIN_VALUES = 20
TRIM_ROUNDS = 20


@dataclass(frozen=True)
class Spread:
    """The distribution of one metric's values."""

    n: int
    median: float
    mad: float
    low: float
    high: float


def describe(values: Sequence[float]) -> Spread:
    center = statistics.median(values)
    mad = statistics.median(abs(v - center) for v in values)
    return Spread(len(values), center, mad, min(values), max(values))


def shortfall(value: float, reference: float, direction: str) -> float:
    """How much worse `value` is than `reference`, as a fraction (negative: better).

    From a reference of zero any worse value is infinitely worse.
    """
    if direction not in (HIGHER, LOWER):
        return 0.0
    worse = reference - value if direction == HIGHER else value - reference
    if reference == 0:
        return math.inf if worse > 0 else (-math.inf if worse < 0 else 0.0)
    return worse / abs(reference)


def is_outlier(value: float, spread: Spread, direction: str, threshold: float,
               mad_k: float) -> bool:
    """Worse than the median by more than `threshold`, or (from MAD_MIN_VALUES values
    on) by more than `mad_k` scaled MADs when that is also at least MAD_FLOOR. Better
    than the median is never an outlier: a fast node is not a problem."""
    if spread.n < MIN_VALUES:
        return False
    short = shortfall(value, spread.median, direction)
    if short > threshold:
        return True
    return (spread.n >= MAD_MIN_VALUES and short >= MAD_FLOOR
            and abs(value - spread.median) > mad_k * MAD_SCALE * spread.mad)


def trimmed(values: Sequence[float], threshold: float, mad_k: float) -> list[float]:
    """`values` without their outliers on either side, trimmed again against the new
    median until nothing more goes (a baseline from the healthy majority)."""
    kept = sorted(values)
    for _ in range(TRIM_ROUNDS):
        if len(kept) < MIN_VALUES:
            return kept
        spread = describe(kept)
        keep = [v for v in kept if not (is_outlier(v, spread, HIGHER, threshold, mad_k)
                                        or is_outlier(v, spread, LOWER, threshold, mad_k))]
        if len(keep) == len(kept) or not keep:
            return kept
        kept = keep
    return kept


def significant(value: float, digits: int = 6) -> float:
    """`value` rounded to `digits` significant digits (reports stay readable and stable)."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))
