"""Robust statistics behind fleet's outliers and baselines: median, MAD, the two rules
(gpucheck.stats and gpucheck.peers, as fleet calls them with a metric's `better`)."""

from __future__ import annotations

import math

import pytest

from gpucheck.measure import Better, Bound
from gpucheck.peers import MAD_MIN_VALUES, outlier, shortfall, trimmed
from gpucheck.stats import Spread, describe, significant

HIGHER, LOWER, INFO = Better.HIGHER, Better.LOWER, Better.INFO


def is_outlier(value: float, spread: Spread, better: Better, threshold: float,
               mad_k: float) -> bool:
    """As analysis/outliers.py asks: `threshold` worse than the median, or the MAD rule."""
    return outlier(value, spread, Bound.shortfall(threshold, better), mad_k)


def test_describe_gives_median_mad_and_range() -> None:
    spread = describe([1.0, 2.0, 3.0, 4.0, 100.0])
    assert (spread.n, spread.median, spread.mad, spread.low, spread.high) == (
        5, 3.0, 1.0, 1.0, 100.0)


@pytest.mark.parametrize(("value", "reference", "direction", "expected"), [
    (90.0, 100.0, HIGHER, 0.1), (110.0, 100.0, HIGHER, -0.1),
    (110.0, 100.0, LOWER, 0.1), (90.0, 100.0, LOWER, -0.1),
    (3.0, 0.0, LOWER, math.inf), (0.0, 0.0, HIGHER, 0.0), (50.0, 100.0, INFO, 0.0)])
def test_shortfall_is_how_much_worse_in_the_metrics_direction(
        value: float, reference: float, direction: Better, expected: float) -> None:
    assert shortfall(value, reference, direction) == pytest.approx(expected)


_TIGHT = [100.0 + d for d in (-0.2, -0.1, 0.0, 0.0, 0.1, 0.2, 0.1, -0.1, 0.0)] * 3
_FEW = [100.0, 100.1, 99.9, 100.0, 100.1, 99.9, 100.0, 100.1, 99.9, 96.0]


@pytest.mark.parametrize(("values", "value", "better", "expected"), [
    ([100.0, 100.0, 100.0, 85.0], 85.0, HIGHER, True),  # more than 10% below the median
    ([100.0, 100.0, 100.0, 85.0], 91.0, HIGHER, False),
    ([100.0, 101.0, 99.0, 100.0], 300.0, HIGHER, False),  # better is never an outlier
    ([100.0, 101.0, 99.0, 100.0], 1.0, LOWER, False),
    ([100.0, 101.0, 99.0, 100.0], 300.0, LOWER, True),
    ([*_TIGHT, 96.0], 96.0, HIGHER, True),  # a tight fleet: 4% off, far beyond 5 MADs
    ([*_TIGHT, 99.0], 99.0, HIGHER, False),  # beyond 5 MADs but under 2%
    (_FEW, 96.0, HIGHER, False),  # under MAD_MIN_VALUES values: the threshold rule only
    ([10.0, 100.0], 10.0, HIGHER, False),  # two values cannot name an outlier
])
def test_the_outlier_rules(values: list[float], value: float, better: Better,
                           expected: bool) -> None:
    assert len(_TIGHT) + 1 >= MAD_MIN_VALUES > len(_FEW)
    assert is_outlier(value, describe(values), better, 0.10, 5) is expected


def test_trimming_removes_both_sides_until_stable() -> None:
    assert trimmed([1.0, 1.0, 1.02, 0.98, 5.0, 0.1], 0.1, 5) == [0.98, 1.0, 1.0, 1.02]


def test_significant_keeps_six_digits() -> None:
    assert significant(123456789.0) == 123457000.0
    assert significant(0.000123456789) == 0.000123457
    assert significant(0.0) == 0.0
