"""The gathered records as report sections and verdicts, and bench's figures as metrics
(no rendering here); the figures ride on the timing section."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck.bench.consistency import (
    Consistency,
    compare_outputs,
    cpu_reference,
    reference_tolerance,
)
from gpucheck.bench.model import ImageSet
from gpucheck.bench.pace import BenchSummary, NodeSummary, aggregate
from gpucheck.bench.records import RankRecord
from gpucheck.bench.stragglers import rank_subject, straggler_findings
from gpucheck.bench.worker import CONSISTENCY_IMAGES, BenchOutcome, BenchSpec
from gpucheck.distributed.nodes import numa_findings
from gpucheck.faults import run_faults_section, slowdown_causes
from gpucheck.measure import Better, Metric, rank_subjects, relative_spread
from gpucheck.report import Finding, Section, fail, ok, warn
from gpucheck.subject import file, node, ranks


def bench_sections(spec: BenchSpec, images: ImageSet, outcome: BenchOutcome,
                   threshold: float) -> list[Section]:
    summary = aggregate(outcome.records, threshold)
    stacks = tuple(r.stack for r in sorted(outcome.records, key=lambda r: r.rank))
    consistency, reference = check_consistency(spec, outcome.outputs, stacks)
    sections = [
        setup_section(spec, images, outcome),
        timing_section(outcome.records, summary, slowdown_causes(outcome.faults)),
    ]
    if len(summary.nodes) > 1:
        sections.append(nodes_section(summary.nodes, threshold))
    sections.append(consistency_section(outcome.records, consistency, spec.dtype, reference))
    sections.append(faults_of(outcome.records, outcome.faults))
    return sections


def faults_of(records: tuple[RankRecord, ...], faults: Sequence[Mapping[str, Any]]) -> Section:
    """Hardware faults during the run, each GPU named as the timing section names it."""
    names = {r.rank: r.gpu_label() for r in records if r.pci_bus_id}
    return run_faults_section(faults, [r.rank for r in records], names)


def check_consistency(spec: BenchSpec, outputs: tuple[Any, ...],
                      stacks: tuple[str | None, ...] = ()) -> tuple[Consistency, str]:
    """The ranks' logits against each other and against a float32 CPU reference the
    reporting process computes now, after the job."""
    try:
        reference = cpu_reference(spec.model, spec.weights, spec.dtype, spec.images_dir,
                                  spec.files[:CONSISTENCY_IMAGES])
    except (RuntimeError, OSError, MemoryError) as exc:  # the ranks' own comparison stands
        return compare_outputs(outputs, spec.dtype, stacks=stacks), f"not computed ({exc})"
    return (compare_outputs(outputs, spec.dtype, reference,
                            reference_tolerance(spec.dtype, spec.device), stacks),
            "CPU float32")


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
                     subject=file(name)) for name, why in images.skipped]
    share = (f"{len(images.files)} image(s) split over {n_ranks} rank(s), "
             f"{outcome.per_rank_images} each")
    if outcome.padding:
        share += (f"; {outcome.padding} repeated to even out the split, as DistributedSampler "
                  "does")
    findings.append(ok("bench.images.share", share))
    if outcome.rotation:
        data["cpu_rotation"] = outcome.rotation
        findings.append(ok("bench.cpu_rotation", f"CPU ranks took turns on the cores in the "
                           f"timed loop ({outcome.rotation}), so a core the host slows "
                           "slows every rank alike and is not read as a straggler"))
    if first.segments > 1:
        data["timed_segments"] = first.segments
        findings.append(ok("bench.cpu_relayout", f"CPU ranks copied their weights and batch to "
                           f"fresh memory between {first.segments} segments of the timed loop "
                           "(untimed), so where a process's memory happens to land is not "
                           "read as a straggler"))
    if outcome.ranks:  # each rank's CPUs against its GPU's NUMA node (check-in records)
        data["rank_placement"] = [{k: r.get(k) for k in ("rank", "host", "device", "cpus",
                                                         "numa_node", "on_gpu_numa")}
                                  for r in outcome.ranks]
        findings += numa_findings(list(outcome.ranks))
    return Section("bench", "Benchmark setup", data, findings)


def timing_section(records: tuple[RankRecord, ...], summary: BenchSummary,
                   causes: Mapping[int, str] | None = None) -> Section:
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
    return Section("timing", "Timing (every rank)", data,
                   straggler_findings(records, summary, causes), bench_metrics(records, summary))


def rank_rows(records: tuple[RankRecord, ...], summary: BenchSummary) -> list[dict[str, Any]]:
    ordered = sorted(records, key=lambda r: r.rank)
    paces = {p.rank: p for p in summary.paces}
    columns = {"vs_others": "vs_others", "slower_share": "slower_share",
               "wall_vs_others": "wall_vs_others", "hold_back": "hold_back",
               "whole_loop": "whole", "loop_again": "again", "both_loops": "both"}
    return [{
        "rank": r.rank, "host": r.host, "device": r.device_name, "images": r.images,
        "wall_s": r.wall_s, "device_s": r.device_s, "images_per_s": r.images_per_s,
        "vs_median": v, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms,
        **{key: getattr(pace, field, None) for key, field in columns.items()},
        "waited_s": pace.waited_ms / 1e3 if pace else None,
        "others_spread": pace.others_spread if pace else None,
    } for r, v in zip(ordered, summary.vs_median, strict=True) for pace in [paces.get(r.rank)]]


def detail_rows(records: tuple[RankRecord, ...]) -> list[dict[str, Any]]:
    return [{
        "rank": r.rank, "node_rank": r.node_rank, "local_rank": r.local_rank,
        "device": r.device, "nvml_index": r.nvml_index, "pci_bus_id": r.pci_bus_id,
        "uuid": r.device_uuid, "peak_memory_bytes": r.peak_memory_bytes,
        "threads": r.threads, "span_s": r.span_s,
    } for r in sorted(records, key=lambda r: r.rank)]


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
                     subject=node(n.node_rank, n.host, host=n.host)) for n in nodes if n.slow]
    if not findings:
        findings.append(ok("bench.node.slow",
                           f"all {len(nodes)} nodes within {threshold:.0%} of the median node"))
    return Section("nodes", "Nodes", {"nodes": rows}, findings)


def consistency_section(records: tuple[RankRecord, ...], result: Consistency,
                        dtype: str, reference: str = "not computed") -> Section:
    data: dict[str, Any] = {
        "images": result.images, "dtype": dtype, "tolerance": result.tolerance,
        "max_deviation": result.max_deviation,
        "deviation_per_rank": list(result.deviations),
        "reference": reference,
    }
    if result.reference_deviations is not None:
        data["reference_tolerance"] = result.reference_tolerance
        data["reference_deviation_per_rank"] = list(result.reference_deviations)
    if result.bitwise_groups:
        data["bitwise_groups"] = [{"stack": stack, "ranks": list(ranks)}
                                  for stack, ranks in result.bitwise_groups.items()]
    by_rank = {r.rank: r for r in records}
    alike = len(result.wrong) == len(records) > 1 and not result.undecided and max(
        result.deviations) <= result.tolerance
    findings = [_wrong_rank(by_rank[rank], why, alike) for rank, why in result.wrong.items()]
    if result.undecided:
        findings.append(_undecided(result))
    if result.bitwise_split:
        findings.append(_bitwise_split(result))
    if not findings:
        findings.append(ok("bench.consistency", _agreement(len(records), result, dtype)))
    return Section("consistency", "Consistency across ranks", data, findings)


def _agreement(n_ranks: int, result: Consistency, dtype: str) -> str:
    text = (f"all {n_ranks} rank(s) agree on the check batch (largest relative deviation "
            f"{result.max_deviation:.2g}, tolerance {result.tolerance:g} for {dtype})")
    if result.bitwise_groups:
        text += (f"; bit for bit within each GPU model and software stack "
                 f"({len(result.bitwise_groups)} stack(s))")
    if result.reference_deviations is None:
        return text + "; no CPU reference to compare with"
    return (text + f" and with the CPU reference (largest {max(result.reference_deviations):.2g}"
            f", tolerance {result.reference_tolerance:g})")


def _wrong_rank(record: RankRecord, why: str, alike: bool) -> Finding:
    return fail(
        "bench.consistency",
        f"rank {record.rank} on {record.host} ({record.gpu_label()}) {why}",
        hint="every rank differs from the CPU reference alike: suspect the software (torch, "
             "cuDNN, driver) or the reference's tolerance, not one GPU" if alike else
             "a GPU that computes wrong answers: rerun, then run the vendor's diagnostics "
             "(dcgmi diag -r 3) and take it out of service if it repeats",
        subject=rank_subject(record), cause="all_alike" if alike else None,
    )


def _bitwise_split(result: Consistency) -> Finding:
    """Ranks of one stack whose logits differ bitwise, with no majority to name one."""
    listed = ", ".join(f"rank {r}" for r in result.bitwise_split)
    return warn(
        "bench.consistency",
        f"{listed} ran on one GPU model and software stack yet computed logits that differ "
        f"bitwise (largest {max(result.deviations[r] for r in result.bitwise_split):.3g} "
        "relative to the largest logit); each is within the CPU reference's tolerance and "
        "no majority of that stack tells which is wrong",
        hint="rerun with more GPUs of this model (a majority then names the odd one); "
             "repeated disagreement points at one of these GPUs (dcgmi diag -r 3)",
        subject=ranks(result.bitwise_split, listed),
    )


def _undecided(result: Consistency) -> Finding:
    listed = ", ".join(f"rank {r}" for r in result.undecided)
    why = ("there is no CPU reference" if result.reference_deviations is None else
           f"each is within the CPU reference's tolerance ({result.reference_tolerance:g})")
    return warn(
        "bench.consistency",
        f"{listed} computed logits up to {result.max_deviation:.3g} from the ranks' median "
        f"(tolerance {result.tolerance:g}); {why} and no majority tells which is wrong",
        hint="rerun with more GPUs (a majority then names the odd one); repeated "
             "disagreement points at one of these GPUs",
        subject=ranks(result.undecided, listed),
    )



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
