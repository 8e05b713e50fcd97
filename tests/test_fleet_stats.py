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


def test_below_the_median_by_more_than_the_threshold_is_an_outlier() -> None:
    spread = describe([100.0, 100.0, 100.0, 85.0])
    assert is_outlier(85.0, spread, HIGHER, 0.10, 5)
    assert not is_outlier(91.0, spread, HIGHER, 0.10, 5)


def test_better_than_the_median_is_never_an_outlier() -> None:
    spread = describe([100.0, 101.0, 99.0, 100.0])
    assert not is_outlier(300.0, spread, HIGHER, 0.10, 5)
    assert not is_outlier(1.0, spread, LOWER, 0.10, 5)
    assert is_outlier(300.0, spread, LOWER, 0.10, 5)


def test_a_tight_fleet_flags_a_node_several_mads_off_but_not_noise() -> None:
    fleet = [100.0 + d for d in (-0.2, -0.1, 0.0, 0.0, 0.1, 0.2, 0.1, -0.1, 0.0)] * 3
    spread = describe([*fleet, 96.0])
    assert spread.n >= MAD_MIN_VALUES
    assert is_outlier(96.0, spread, HIGHER, 0.10, 5)  # 4% off, far beyond 5 MADs
    assert not is_outlier(99.0, describe([*fleet, 99.0]), HIGHER, 0.10, 5)  # under 2%


def test_a_few_values_use_only_the_threshold_rule() -> None:
    few = [100.0, 100.1, 99.9, 100.0, 100.1, 99.9, 100.0, 100.1, 99.9, 96.0]
    assert len(few) < MAD_MIN_VALUES
    assert not is_outlier(96.0, describe(few), HIGHER, 0.10, 5)


def test_two_values_cannot_name_an_outlier() -> None:
    assert not is_outlier(10.0, describe([10.0, 100.0]), HIGHER, 0.10, 5)


def test_trimming_removes_both_sides_until_stable() -> None:
    assert trimmed([1.0, 1.0, 1.02, 0.98, 5.0, 0.1], 0.1, 5) == [0.98, 1.0, 1.0, 1.02]


def test_significant_keeps_six_digits() -> None:
    assert significant(123456789.0) == 123457000.0
    assert significant(0.000123456789) == 0.000123457
    assert significant(0.0) == 0.0
