"""`gpucheck bench`: DDP inference benchmark that times every rank honestly."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpucheck.bench.model import (
    DTYPES,
    ImageSet,
    check_model,
    default_images_dir,
    resolve_dtype,
    resolve_weights,
    scan_images,
)
from gpucheck.bench.pace import DEFAULT_STRAGGLER_THRESHOLD
from gpucheck.commands.options import (
    LaunchOptions,
    LaunchPlan,
    add_launch_finding,
    launch_scope,
    non_negative_int,
    opt,
    plan_launch,
    positive_float,
    positive_int,
)
from gpucheck.context import RunContext
from gpucheck.escape import terminal
from gpucheck.interrupts import deferred_interrupts
from gpucheck.report import Report, Section

if TYPE_CHECKING:  # imported where used: the worker brings torch in
    from gpucheck.bench.worker import BenchSpec

HELP = "DDP ResNet50 inference benchmark that times every rank"


@dataclass(frozen=True)
class Defaults:
    """Per-device defaults, chosen by measurement (docs/bench.md)."""

    batch_size: int
    warmup: int
    iters: int


DEFAULTS = {"cuda": Defaults(batch_size=128, warmup=20, iters=100),
            "cpu": Defaults(batch_size=4, warmup=2, iters=12)}


CUDA, CPU = DEFAULTS["cuda"], DEFAULTS["cpu"]


@dataclass(frozen=True)
class BenchArgs(LaunchOptions):
    images: str | None = opt("--images", group="benchmark", metavar="DIR",
                             help="folder of images (default: the shipped sample_images)")
    model: str = opt("--model", default="resnet50", group="benchmark",
                     help="any torchvision classification model (default: resnet50)")
    weights: str = opt("--weights", default="random", group="benchmark",
                       metavar="random|imagenet|PATH", help="random (seeded, default), imagenet "
                       "(torchvision's, from the local cache) or a saved state_dict file")
    download: bool = opt("--download", default=False, group="benchmark", action="store_true",
                         help="with --weights imagenet, download the weights when not cached")
    # choices: fp64 and the like are refused by the parser, before torch is imported.
    dtype: str = opt("--dtype", default="auto", group="benchmark", metavar="|".join(DTYPES),
                     choices=DTYPES, help="auto (default): bf16 on GPUs that support it, else "
                     "fp16; fp32 on CPU")
    channels_last: bool = opt("--channels-last", default=True, group="benchmark",
                              action=argparse.BooleanOptionalAction,
                              help="channels_last memory format (default: on; faster on GPU "
                              "and CPU)")
    batch_size: int | None = opt("--batch-size", group="benchmark", type=positive_int,
                                 metavar="N", help="images per batch and rank (default: "
                                 f"{CUDA.batch_size} on GPU, {CPU.batch_size} on CPU)")
    warmup: int | None = opt("--warmup", group="benchmark", type=non_negative_int,
                             metavar="N", help=f"untimed iterations first (default: "
                             f"{CUDA.warmup} on GPU, {CPU.warmup} on CPU)")
    iters: int | None = opt("--iters", group="benchmark", exclusive="loop", type=positive_int,
                            metavar="N", help=f"timed iterations (default: {CUDA.iters} on "
                            f"GPU, {CPU.iters} on CPU)")
    duration: float | None = opt("--duration", group="benchmark", exclusive="loop",
                                 type=positive_float, metavar="SECONDS", help="instead of "
                                 "--iters: as many iterations as fit in SECONDS at the slowest "
                                 "rank's warm-up speed")
    straggler_threshold: float = opt("--straggler-threshold",
                                     default=DEFAULT_STRAGGLER_THRESHOLD, group="benchmark",
                                     type=positive_float, metavar="FRACTION",
                                     help="warn about a rank this much slower than the median "
                                     f"(default: {DEFAULT_STRAGGLER_THRESHOLD:g})")


add_arguments = BenchArgs.add_to


def run(args: argparse.Namespace, ctx: RunContext) -> Report | None:
    from gpucheck.bench.worker import BenchOutcome, bench_worker
    from gpucheck.distributed.flight import armed
    from gpucheck.distributed.job import run_job
    from gpucheck.distributed.launch import WorkersFailed

    plan, spec, images = check(args, ctx)
    report = Report(command="bench", scope=launch_scope(plan))
    try:
        with armed("bench"):  # a hang leaves Flight Recorder dumps (gpucheck hang --traces)
            outcome = run_job(bench_worker, spec, plan.nproc, plan.master_port, ctx)
    except WorkersFailed as exc:
        if not getattr(exc, "reporter", True):
            # A rank > 0 under torchrun: rank 0 reports; exit non-zero so the launcher knows.
            print(f"gpucheck bench: this rank failed: {terminal(exc)}", file=sys.stderr)
            raise SystemExit(1) from None
        report.add(_failed_section(exc))
        _add_timed_so_far(report, ctx)
        _add_partial_faults(report, getattr(exc, "partial", None))
        return report
    if not isinstance(outcome, BenchOutcome):
        return None  # a rank other than 0 under torchrun: rank 0 reports
    from gpucheck.bench.findings import bench_sections, with_bench_metrics

    for section in bench_sections(spec, images, outcome, args.straggler_threshold):
        report.add(section)
    with_bench_metrics(report.sections, outcome.records, args.straggler_threshold)
    return add_launch_finding(report, plan)


def partial_report(args: argparse.Namespace, ctx: RunContext) -> Report | None:
    """After Ctrl-C or SIGTERM: what rank 0 had measured, and every rank's timed
    iterations so far (`gpucheck.bench.findings`; gpucheck.cli adds the stop)."""
    from gpucheck.distributed import progress

    partial = progress.local_partial(ctx)
    report = Report(command="bench")
    if partial is not None:
        shown = {k: v for k, v in partial.items() if k != "faults"}
        report.add(Section("partial", "Measured by rank 0 before the stop", shown))
    _add_timed_so_far(report, ctx)
    if not report.sections:
        return None
    _add_partial_faults(report, partial)
    return report


def _add_timed_so_far(report: Report, ctx: RunContext) -> None:
    """Every rank's timed iterations published before a stop or a failure."""
    from gpucheck.bench.partial import timed_so_far_section
    from gpucheck.distributed import progress

    timed = timed_so_far_section(progress.local_ranks(ctx))
    if timed is not None:
        report.add(timed)


def _add_partial_faults(report: Report, partial: dict[str, Any] | None) -> None:
    """Rank 0's fault watch, when it published one before the failure or the stop."""
    if partial and partial.get("faults"):
        from gpucheck.faults import run_faults_section

        report.add(run_faults_section(partial["faults"]))


def check(args: argparse.Namespace, ctx: RunContext) -> tuple[LaunchPlan, BenchSpec, ImageSet]:
    """Every option checked before any rank starts (`all` checks them all up front)."""
    from gpucheck.bench.worker import BenchSpec

    plan = plan_launch(args, ctx)
    defaults = DEFAULTS[plan.device]
    batch_size = args.batch_size or defaults.batch_size
    warmup = args.warmup if args.warmup is not None else defaults.warmup
    iters = None if args.duration is not None else args.iters or defaults.iters
    dtype = resolve_dtype(args.dtype, plan.device)
    with deferred_interrupts():  # imports torchvision: Ctrl-C is raised after it
        check_model(args.model)
    weights = resolve_weights(args.weights, args.model, args.download)
    images: ImageSet = scan_images(args.images or default_images_dir())
    spec = BenchSpec(
        model=args.model, weights=weights, dtype=dtype, channels_last=args.channels_last,
        batch_size=batch_size, warmup=max(warmup, 2) if args.duration is not None else warmup,
        iters=iters, duration_s=args.duration, device=plan.device, backend=plan.backend,
        timeout_s=plan.timeout_s, images_dir=images.folder, files=images.files,
        progress=ctx.options.show_progress, fault_watch=args.fault_watch,
        straggler_threshold=args.straggler_threshold,
    )
    return plan, spec, images


def _failed_section(exc: Exception) -> Section:
    """The failed ranks, the silent ones, and whatever rank 0 had measured before."""
    from gpucheck.distributed.failures import rank_failure_findings

    failures = getattr(exc, "failures", [])
    data: dict[str, Any] = {"failed_ranks": [f.rank for f in failures]}
    unresponsive = getattr(exc, "unresponsive", [])
    if unresponsive:
        data["unresponsive_ranks"] = unresponsive
    partial = getattr(exc, "partial", None)
    if partial:
        data["partial"] = {k: v for k, v in partial.items() if k != "faults"}
    return Section("ranks", "Failed ranks", data, rank_failure_findings(failures, "bench"))
