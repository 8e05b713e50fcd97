"""`gpucheck bench`: DDP inference benchmark that times every rank honestly."""

from __future__ import annotations

import argparse
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
from gpucheck.commands.launch import LaunchOptions, LaunchPlan, plan_launch, run_reported
from gpucheck.commands.options import non_negative_int, opt, positive_float, positive_int
from gpucheck.context import RunContext
from gpucheck.errors import deferred_interrupts
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
    from gpucheck.bench.worker import bench_worker
    from gpucheck.distributed.deadline import armed

    plan, spec, images = check(args, ctx)
    with armed("bench"):  # a hang leaves Flight Recorder dumps (gpucheck hang --traces)
        return run_reported("bench", bench_worker, spec, plan,
                            lambda result: _report(args, ctx, spec, images, result),
                            quiet_stdout=args.quiet and args.output is None, ctx=ctx)


def _report(args: argparse.Namespace, ctx: RunContext, spec: BenchSpec, images: ImageSet,
            result: Any) -> Report:
    """The run's report; given rank 0's partial results instead (a failed job), what was
    measured before the failure."""
    from gpucheck.bench.worker import BenchOutcome

    if not isinstance(result, BenchOutcome):
        return _measured_so_far(result, ctx) or Report(command="bench")
    from gpucheck.bench.findings import bench_sections

    report = Report(command="bench")
    for section in bench_sections(spec, images, result, args.straggler_threshold):
        report.add(section)
    return report


def partial_report(args: argparse.Namespace, ctx: RunContext) -> Report | None:
    """After Ctrl-C or SIGTERM: what rank 0 had measured, every rank's timed iterations."""
    return _measured_so_far(ctx.progress.partial, ctx)


def _measured_so_far(partial: dict[str, Any] | None, ctx: RunContext) -> Report | None:
    """What rank 0 had published, every rank's timed iterations and rank 0's fault watch
    before a stop or a failure; None when nothing was."""
    from gpucheck.bench.records import timed_so_far_section
    from gpucheck.distributed import progress

    report = Report(command="bench")
    if partial is not None:
        shown = {k: v for k, v in partial.items() if k != "faults"}
        report.add(Section("partial", "Measured by rank 0 before the stop", shown))
    timed = timed_so_far_section(progress.local_ranks(ctx))
    if timed is not None:
        report.add(timed)
    if not report.sections:
        return None
    if partial and partial.get("faults"):
        from gpucheck.faults import run_faults_section

        report.add(run_faults_section(partial["faults"]))
    return report


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
