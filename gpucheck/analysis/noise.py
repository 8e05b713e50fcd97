"""How far two runs' figures can differ by noise alone, per metric (the largest of the
spread within a run, the mirror between runs and HOST_BOUND_RUNS), and the host-bound
rule: what compare judges a change against (docs/fleet.md, "Noise").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck.analysis.loading import Fact, family, judged, position
from gpucheck.measure import Metric
from gpucheck.peers import shortfall
from gpucheck.report import Finding, warn

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


HOST_BOUND = "host-bound"
_WALL = "bench.images_per_s"
_PACE = "bench.iteration_p50_ms"
# The job's figures that follow the slowest rank: host-bound when every worse rank is.
_JOB = ("bench.aggregate_images_per_s", "bench.job_wall_s", "bench.parallel_efficiency",
        "bench.spread_slowest_vs_median")


def host_bound_ranks(table: list[dict[str, Any]], a: Mapping[str, Metric],
                     b: Mapping[str, Metric]) -> dict[str, tuple[float, float]]:
    """Rank position -> (wall, pace) slowdown factors of B against A, for every rank
    whose wall figure is worse and whose pace explains less than half of it (in log
    terms: 6x slower on the wall clock at a 1.1x slower pace is a busy host; 1.4x at
    1.4x is a slower device). Load also costs some pace (shared caches), hence half."""
    found = {}
    for row in table:
        name = row["metric"]
        rank = _rank_of(a.get(name), _WALL)
        if rank is None or row["verdict"] != "worse":
            continue
        pace = f"{_PACE}.{rank}"
        if pace not in a or pace not in b or min(a[pace].value, b[pace].value) <= 0 \
                or b[name].value <= 0:
            continue
        wall_factor = a[name].value / b[name].value  # images/s: higher is better
        pace_factor = b[pace].value / a[pace].value  # ms per iteration: lower is better
        if math.log(max(pace_factor, 1.0)) < 0.5 * math.log(wall_factor):
            found[rank] = (wall_factor, pace_factor)
    return found


def _rank_of(metric: Metric | None, name: str) -> str | None:
    """The rank position ("rank1") of a per-rank `name` figure, else None."""
    if metric is None or metric.name != name:
        return None
    return position(metric)


def relabel(table: list[dict[str, Any]], ranks: Mapping[str, Any],
            metrics: Mapping[str, Metric]) -> list[dict[str, Any]]:
    """Mark the host-bound ranks' wall and pace rows, and the job's figures when every
    worse rank is host-bound; return the job's rows so marked (the symptoms the host-bound
    WARN explains)."""
    worse_ranks = {rank for r in table if r["verdict"] == "worse"
                   and (rank := _rank_of(metrics.get(r["metric"]), _WALL)) is not None}
    explained = []
    for row in table:
        name = row["metric"]
        if row["verdict"] != "worse":
            continue
        rank = _rank_of(metrics.get(name), _WALL) or _rank_of(metrics.get(name), _PACE)
        if rank is not None and rank in ranks:
            row["verdict"] = HOST_BOUND
        elif name in _JOB and worse_ranks and worse_ranks <= ranks.keys():
            row["verdict"] = HOST_BOUND
            explained.append(row)
    return explained


def host_bound_finding(ranks: Mapping[str, tuple[float, float]],
                       explained: Sequence[Mapping[str, Any]] = ()) -> Finding:
    """The WARN naming the cause, and the job's figures it explains (`relabel`)."""
    said = ", ".join(f"{rank}: {wall:.2f}x slower on the wall clock, pace {pace:.2f}x"
                     for rank, (wall, pace) in sorted(ranks.items()))
    also = "; ".join(f"{r['metric']} {r['A']:.4g} -> {r['B']:.4g}" for r in explained)
    return warn("compare.host_bound",
                f"B's ranks ran slower but computed at about A's pace ({said}): B's host did not "
                "run them for part of the time (other load, a CPU quota, a stopped "
                "process), so this is not a slower device"
                + (f"; the job's figures fell with them ({also})" if also else ""),
                hint="rerun B on an idle node (check top, the job's cgroup CPU quota, other "
                "jobs on the node); if it stays slow, find what shares the node's CPUs")
