"""Turn the gathered records into report sections and verdicts (no rendering here)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck.bench.aggregate import BenchSummary, NodeSummary, RankRecord, aggregate
from gpucheck.bench.consistency import Consistency, compare_outputs
from gpucheck.bench.data import ImageSet
from gpucheck.bench.worker import BenchOutcome, BenchSpec
from gpucheck.faults import run_faults_section
from gpucheck.report import Finding, Section, fail, ok, warn


def bench_sections(spec: BenchSpec, images: ImageSet, outcome: BenchOutcome,
                   threshold: float) -> list[Section]:
    summary = aggregate(outcome.records, threshold)
    consistency = compare_outputs(outcome.outputs, spec.dtype)
    sections = [
        setup_section(spec, images, outcome),
        timing_section(outcome.records, summary),
    ]
    if len(summary.nodes) > 1:
        sections.append(nodes_section(summary.nodes, threshold))
    sections.append(consistency_section(outcome.records, consistency, spec.dtype))
    sections.append(faults_of(outcome.records, outcome.faults))
    return sections


def faults_of(records: tuple[RankRecord, ...], faults: Sequence[Mapping[str, Any]]) -> Section:
    """Hardware faults during the run, each GPU named as the timing section names it."""
    names = {r.rank: r.gpu_label() for r in records if r.pci_bus_id}
    return run_faults_section(faults, [r.rank for r in records], names)


def setup_section(spec: BenchSpec, images: ImageSet, outcome: BenchOutcome) -> Section:
    n_ranks = len(outcome.records)
    first = min(outcome.records, key=lambda r: r.rank)
    data: dict[str, Any] = {
        "model": spec.model, "weights": spec.weights.kind, "dtype": spec.dtype,
        "channels_last": spec.channels_last, "device": spec.device, "backend": spec.backend,
        "ranks": n_ranks, "threads_per_rank": first.threads, "batch_size": spec.batch_size,
        "warmup_iters": spec.warmup, "timed_iters": first.iters,
        "images_dir": images.folder, "images_found": len(images.files),
        "images_per_rank": outcome.per_rank_images, "images_padded": outcome.padding,
    }
    findings = [warn("bench.images.skipped", f"skipped {name}: {why}",
                     hint="remove or fix the file; only readable images are used",
                     subject=name) for name, why in images.skipped]
    share = (f"{len(images.files)} image(s) split over {n_ranks} rank(s), "
             f"{outcome.per_rank_images} each")
    if outcome.padding:
        share += (f"; {outcome.padding} repeated to even out the split, as DistributedSampler "
                  "does")
    findings.append(ok("bench.images.share", share))
    return Section("bench", "Benchmark setup", data, findings)


def timing_section(records: tuple[RankRecord, ...], summary: BenchSummary) -> Section:
    data: dict[str, Any] = {
        "job_wall_s": summary.job_wall_s,
        "summed_device_s": summary.summed_device_s,
        "total_images": summary.total_images,
        "aggregate_images_per_s": summary.aggregate_images_per_s,
        "median_rank_wall_s": summary.median_wall_s,
        "parallel_efficiency": summary.parallel_efficiency,
        "spread_slowest_vs_median": summary.spread,
        "ranks": rank_rows(records, summary),
        "rank_details": detail_rows(records),
    }
    return Section("timing", "Timing (every rank)", data, straggler_findings(records, summary))


def rank_rows(records: tuple[RankRecord, ...], summary: BenchSummary) -> list[dict[str, Any]]:
    ordered = sorted(records, key=lambda r: r.rank)
    return [{
        "rank": r.rank, "host": r.host, "device": r.device_name, "images": r.images,
        "wall_s": r.wall_s, "device_s": r.device_s, "images_per_s": r.images_per_s,
        "vs_median": v,
    } for r, v in zip(ordered, summary.vs_median, strict=True)]


def detail_rows(records: tuple[RankRecord, ...]) -> list[dict[str, Any]]:
    return [{
        "rank": r.rank, "node_rank": r.node_rank, "local_rank": r.local_rank,
        "device": r.device, "nvml_index": r.nvml_index, "pci_bus_id": r.pci_bus_id,
        "uuid": r.device_uuid, "peak_memory_bytes": r.peak_memory_bytes,
        "threads": r.threads, "span_s": r.span_s,
    } for r in sorted(records, key=lambda r: r.rank)]


def straggler_findings(records: tuple[RankRecord, ...], summary: BenchSummary) -> list[Finding]:
    by_rank = {r.rank: r for r in records}
    pct = f"{summary.threshold:.0%}"
    findings = [warn(
        "bench.rank.straggler",
        f"rank {rank} on {by_rank[rank].host} ({by_rank[rank].gpu_label()}) took "
        f"{summary.vs_median[rank]:.2f}x the median rank time "
        f"({by_rank[rank].wall_s:.3g} s vs {summary.median_wall_s:.3g} s)",
        hint=_straggler_hint(by_rank[rank]),
        subject=f"rank {rank}",
    ) for rank in summary.stragglers]
    if not findings:
        findings.append(ok("bench.rank.straggler",
                           f"all {summary.n_ranks} rank(s) within {pct} of the median "
                           f"(spread {summary.spread:.3f})"))
    return findings


def _straggler_hint(record: RankRecord) -> str:
    if record.device.startswith("cuda"):
        return ("check that GPU's clocks, temperature, power limit and PCIe link (gpucheck "
                "env, nvidia-smi -q -d PERFORMANCE); the job runs at the slowest rank's pace")
    return ("check what else runs on that host's cores (top); the job runs at the slowest "
            "rank's pace")


def nodes_section(nodes: tuple[NodeSummary, ...], threshold: float) -> Section:
    rows = [{"node_rank": n.node_rank, "host": n.host, "ranks": len(n.ranks),
             "images": n.images, "median_wall_s": n.median_wall_s,
             "slowest_wall_s": n.slowest_wall_s, "images_per_s": n.images_per_s,
             "vs_median": n.vs_median} for n in nodes]
    findings = [warn("bench.node.slow",
                     f"node {n.node_rank} ({n.host}) ran {n.vs_median:.2f}x the median node "
                     f"time (ranks {', '.join(map(str, n.ranks))})",
                     hint="compare that node's GPUs, clocks and drivers with the others "
                          "(gpucheck env on each node)",
                     subject=n.host) for n in nodes if n.slow]
    if not findings:
        findings.append(ok("bench.node.slow",
                           f"all {len(nodes)} nodes within {threshold:.0%} of the median node"))
    return Section("nodes", "Nodes", {"nodes": rows}, findings)


def consistency_section(records: tuple[RankRecord, ...], result: Consistency,
                        dtype: str) -> Section:
    data: dict[str, Any] = {
        "images": result.images, "dtype": dtype, "tolerance": result.tolerance,
        "max_deviation": result.max_deviation,
        "deviation_per_rank": list(result.deviations),
    }
    by_rank = {r.rank: r for r in records}
    findings = [_wrong_rank(by_rank[rank], result, len(records)) for rank in result.bad_ranks]
    if not findings:
        findings.append(ok("bench.consistency",
                           f"all {len(records)} rank(s) agree on the check batch (largest "
                           f"relative deviation {result.max_deviation:.2g}, tolerance "
                           f"{result.tolerance:g} for {dtype})"))
    return Section("consistency", "Consistency across ranks", data, findings)


def _wrong_rank(record: RankRecord, result: Consistency, n_ranks: int) -> Finding:
    deviation = result.deviations[record.rank]
    what = ("non-finite logits" if record.rank in result.nonfinite_ranks
            else f"logits {deviation:.3g} away from the other ranks' consensus "
                 f"(tolerance {result.tolerance:g})")
    tie = " (with 2 ranks the check cannot tell which one is wrong)" if n_ranks == 2 else ""
    return fail(
        "bench.consistency",
        f"rank {record.rank} on {record.host} ({record.gpu_label()}) computed {what}{tie}",
        hint="a GPU that computes wrong answers: rerun, then run the vendor's diagnostics "
             "(dcgmi diag -r 3) and take it out of service if it repeats",
        subject=f"rank {record.rank}",
    )
