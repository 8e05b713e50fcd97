"""How far two runs' figures can differ by noise alone, per metric: what compare
judges a change against, so two healthy back-to-back runs are not a regression.

Three measures of noise, the largest wins:
- within a run: how much the figure varied while it was measured (`Metric.spread`:
  a rank's p99 iteration against its median, the slowest rank of a collective against
  the fastest), in either run;
- between the runs, in the other direction: noise moves figures both ways, a real
  change moves them one way. A figure whose family (the other sizes of the same
  collective, the other ranks of the same figure) came out *better* in B by some
  amount shows that B and A differ by that much without anything being wrong, so a
  drop of that size is not told apart from noise. A real 30% drop of every size or
  of one rank has no such mirror and stays a regression;
- between any two runs of the same setup, where one run's spread says little: comm
  on CPU ranks (gloo through the host's memory and scheduler) moves by far more from
  run to run than within one (`HOST_BOUND_RUNS`).

The threshold a metric is judged with is the larger of the user's `--threshold` and
this noise; beyond NOISY a metric is reported as too noisy to judge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gpucheck.analysis.facts import Fact
from gpucheck.analysis.metrics import family, judged
from gpucheck.measure import Metric
from gpucheck.peers import shortfall

NOISY = 0.5  # a metric that can move by half by noise alone is not judged
# Four healthy `gpucheck comm` runs back to back on CPU ranks (2-core VM, issue 36 item
# 9; tests/data/noise_pairs/README.md): a figure moved by a median 1.5-1.9x between two
# runs, 4-6x at the 90th percentile, up to 17x, while one run's own spread was 1-4%.
# Noise of 4x (a 75% drop) is beyond NOISY: compare says "too noisy", never a regression.
HOST_BOUND_RUNS = 0.75
_HOST_BOUND = (("comm.device", "cpu", "comm."),)  # (fact, value, metric prefix)


@dataclass(frozen=True)
class Noise:
    """A metric's noise as a shortfall fraction, and where it came from."""

    level: float
    source: str  # "within the runs", "others better in B", or "none measured"


def host_prefixes(*facts: Mapping[str, Fact]) -> tuple[str, ...]:
    """The metric prefixes whose figures measure the host in either run (CPU ranks)."""
    return tuple(prefix for key, value, prefix in _HOST_BOUND
                 if any(f.get(key) is not None and f[key].value == value for f in facts))


def noise_levels(a: Mapping[str, Metric], b: Mapping[str, Metric],
                 host: tuple[str, ...] = ()) -> dict[str, Noise]:
    """Every metric both runs have, with its noise; `host`: the prefixes of figures that
    measure the host (`host_prefixes`), at least HOST_BOUND_RUNS."""
    shared = sorted(a.keys() & b.keys())
    moves = {n: shortfall(b[n].value, a[n].value, a[n].better) for n in shared
             if judged(a[n])}
    levels: dict[str, Noise] = {}
    for name in moves:
        within = max(_as_shortfall(a[name].spread), _as_shortfall(b[name].spread))
        mirror = _mirror(name, a[name], moves, a)
        if host and name.startswith(host):
            levels[name] = Noise(max(within, mirror, HOST_BOUND_RUNS), "CPU ranks: runs")
        elif max(within, mirror) <= 0:
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
