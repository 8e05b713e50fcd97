"""bench's figures as metrics, from the ranks' records and rank 0's summary (not the
report's tables): the job's throughput, wall time, efficiency and spread; each rank's
images/s and its own pace (median iteration: device time, CPU time on CPU ranks)."""

from __future__ import annotations

from collections.abc import Sequence

from gpucheck.bench.aggregate import BenchSummary, RankRecord, aggregate
from gpucheck.measure import Better, Metric
from gpucheck.measured import HasMetrics, attach, rank_subjects, relative_spread

JOB_FIGURES = {"aggregate_images_per_s": ("images/s", Better.HIGHER),
               "job_wall_s": ("s", Better.LOWER),
               "parallel_efficiency": ("ratio", Better.HIGHER),
               "spread_slowest_vs_median": ("ratio", Better.LOWER)}


def bench_metrics(records: Sequence[RankRecord], summary: BenchSummary) -> list[Metric]:
    ordered = sorted(records, key=lambda r: r.rank)
    ranks = rank_subjects([{"rank": r.rank, "nvml_index": r.nvml_index, "host": r.host,
                            "pci_bus_id": r.pci_bus_id, "node_rank": r.node_rank}
                           for r in ordered])
    spreads = {r.rank: relative_spread(r.p99_ms, r.p50_ms) for r in ordered}
    # The job's figures vary as much as its most unsettled rank did.
    job_spread = max((s for s in spreads.values() if s is not None), default=None)
    values = {"aggregate_images_per_s": summary.aggregate_images_per_s,
              "job_wall_s": summary.job_wall_s,
              "parallel_efficiency": summary.parallel_efficiency,
              "spread_slowest_vs_median": summary.spread}
    found = [Metric(f"bench.{name}", unit, better, float(values[name]), spread=job_spread)
             for name, (unit, better) in JOB_FIGURES.items()]
    for r in ordered:
        found.append(Metric("bench.images_per_s", "images/s", Better.HIGHER,
                            float(r.images_per_s), ranks[r.rank], spreads[r.rank]))
        if r.p50_ms is not None:
            found.append(Metric("bench.iteration_p50_ms", "ms", Better.LOWER, r.p50_ms,
                                ranks[r.rank], spreads[r.rank]))
    return found


def with_bench_metrics(sections: Sequence[HasMetrics], records: Sequence[RankRecord],
                       threshold: float) -> None:
    """The one call commands/bench.py makes: every bench figure onto its timing section."""
    summary = aggregate(records, threshold)
    attach(sections, bench_metrics(records, summary), dict.fromkeys(
        ("images_per_s", "iteration_p50_ms", *JOB_FIGURES), "timing"))
