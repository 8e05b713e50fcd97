"""The fleet's robust statistics, by metric direction ("higher", "lower", "info"): a
thin layer over `gpucheck.stats` (median, MAD, Spread) and `gpucheck.peers` (shortfall,
the outlier rule, trimming), kept for the report readers that still name directions
as strings (analysis/metrics.py). They move to `Better` and the peers module directly
as they read `Metric`s (issue 25, S4); then this module goes.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpucheck import peers
from gpucheck.measure import Better, Bound
from gpucheck.peers import MAD_FLOOR, MAD_MIN_VALUES, MIN_VALUES, TRIM_ROUNDS
from gpucheck.stats import MAD_SCALE, Spread, describe, significant

__all__ = ["MAD_FLOOR", "MAD_MIN_VALUES", "MAD_SCALE", "MIN_VALUES", "TRIM_ROUNDS", "Spread",
           "describe", "is_outlier", "shortfall", "significant", "trimmed"]


def shortfall(value: float, reference: float, direction: str) -> float:
    """How much worse `value` is than `reference`, as a fraction (negative: better; 0
    for an unknown or "info" direction). From a reference of zero any worse value is
    infinitely worse."""
    if direction not in (Better.HIGHER.value, Better.LOWER.value):
        return 0.0
    return peers.shortfall(value, reference, Better(direction))


def is_outlier(value: float, spread: Spread, direction: str, threshold: float,
               mad_k: float) -> bool:
    """`gpucheck.peers.outlier` with a bound `threshold` worse than the median (a
    fraction in [0, 1)); an "info" figure is never an outlier."""
    if direction not in (Better.HIGHER.value, Better.LOWER.value):
        return False
    return peers.outlier(value, spread, Bound.shortfall(threshold, Better(direction)), mad_k)


def trimmed(values: Sequence[float], threshold: float, mad_k: float) -> list[float]:
    """`values` without their outliers on either side, trimmed again against the new
    median until nothing more goes (`gpucheck.peers.trimmed`)."""
    return peers.trimmed(values, threshold, mad_k)
