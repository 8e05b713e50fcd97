"""A bench that got slower on the wall clock while its ranks computed at the same
pace: B's host did not run the ranks (other load on the machine, a CPU quota, a
stopped process), not a slower device. compare says so as a WARN instead of a
regression FAIL: the hardware did not get worse, the node was busy.

A rank's pace is its median iteration in device time (CPU time on CPU ranks,
`bench.iteration_p50_ms`); its wall figure is `bench.images_per_s`.

The job's figures that follow its slowest rank (job wall time, aggregate images/s,
parallel efficiency, the slowest rank against the median) fall with a host-bound rank:
when every worse rank is host-bound, they are its symptoms, reported under the host-bound
WARN that names the cause, never as a second, stronger regression FAIL (issue 21).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck.analysis.metrics import position
from gpucheck.measure import Metric
from gpucheck.report import Finding, warn

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
