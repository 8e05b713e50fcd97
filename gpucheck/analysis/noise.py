"""How far two runs' figures can differ by noise alone, per metric: what compare
judges a change against, so two healthy back-to-back runs are not a regression.

Two measures of the runs' own spread, the larger wins:
- within a run: how much the figure varied while it was measured (`Metric.spread`:
  a rank's p99 iteration against its median, the slowest rank of a collective against
  the fastest), in either run;
- between the runs, in the other direction: noise moves figures both ways, a real
  change moves them one way. A figure whose family (the other sizes of the same
  collective, the other ranks of the same figure) came out *better* in B by some
  amount shows that B and A differ by that much without anything being wrong, so a
  drop of that size is not told apart from noise. A real 30% drop of every size or
  of one rank has no such mirror and stays a regression.

The threshold a metric is judged with is the larger of the user's `--threshold` and
this noise; beyond NOISY a metric is reported as too noisy to judge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gpucheck.analysis.metrics import family, judged
from gpucheck.measure import Metric
from gpucheck.peers import shortfall

NOISY = 0.5  # a metric that can move by half by noise alone is not judged

@dataclass(frozen=True)
class Noise:
    """A metric's noise as a shortfall fraction, and where it came from."""

    level: float
    source: str  # "within the runs", "others better in B", or "none measured"


def noise_levels(a: Mapping[str, Metric], b: Mapping[str, Metric]) -> dict[str, Noise]:
    """Every metric both runs have, with its noise."""
    shared = sorted(a.keys() & b.keys())
    moves = {n: shortfall(b[n].value, a[n].value, a[n].better) for n in shared
             if judged(a[n])}
    levels: dict[str, Noise] = {}
    for name in moves:
        within = max(_as_shortfall(a[name].spread), _as_shortfall(b[name].spread))
        mirror = _mirror(name, a[name], moves, a)
        if max(within, mirror) <= 0:
            levels[name] = Noise(0.0, "none measured")
        elif within >= mirror:
            levels[name] = Noise(within, "within the runs")
        else:
            levels[name] = Noise(mirror, "others better in B")
    return levels


def judged_threshold(threshold: float, noise: Noise | None) -> float:
    return max(threshold, noise.level if noise else 0.0)


def _as_shortfall(spread: float | None) -> float:
    """A spread of +s (values up to 1+s apart) as the drop it can fake: 1 - 1/(1+s)."""
    if spread is None or not math.isfinite(spread) or spread <= 0:
        return 0.0
    return 1 - 1 / (1 + spread)


def _mirror(name: str, metric: Metric, moves: Mapping[str, float],
            a: Mapping[str, Metric]) -> float:
    """The largest improvement in B among the metric's family, as a drop it can fake."""
    better = [-moves[other] for other in _family_members(name, metric, moves, a)
              if moves[other] < 0]
    best = max(better, default=0.0)
    if math.isinf(best):
        return 1.0
    return 1 - 1 / (1 + best)


def _family_members(name: str, metric: Metric, moves: Mapping[str, float],
                a: Mapping[str, Metric]) -> list[str]:
    """The other figures of the metric's family (the other sizes of one collective, the
    other ranks of one figure), measured in the same two runs."""
    return [n for n in moves if n != name and family(a[n]) == family(metric)]
