"""`gpucheck stress`: every GPU at once, one rank per GPU: GEMM throughput, memory
bandwidth, silent data corruption under load, host and peer copies."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpucheck.commands.job_report import partial_report as job_partial_report
from gpucheck.commands.job_report import run_reported
from gpucheck.commands.launch_options import LaunchPlan, add_launch_arguments, plan_launch
from gpucheck.commands.option_types import finite_float, positive_float, positive_int
from gpucheck.context import RunContext
from gpucheck.errors import UsageError
from gpucheck.report import Report

if TYPE_CHECKING:  # imported where used: the workers bring torch in
    from gpucheck.stress.report import Verdicts
    from gpucheck.stress.worker import StressSpec

HELP = "every GPU at once: GEMM TFLOP/s, memory bandwidth, silent data corruption, copies"
GPU_DTYPES = ("bf16", "fp16", "tf32", "fp32")
CPU_DTYPES = ("fp32", "bf16")
DEFAULT_PEER_FRACTION = 0.9
# CPU ranks share cores with each other and everything else on the machine: their
# spread is scheduling noise, not a fault, so only a gross difference is flagged.
DEFAULT_CPU_PEER_FRACTION = 0.5
DEFAULT_EXPECTED_FRACTION = 0.8
DEFAULT_COPY_FRACTION = 0.6


@dataclass(frozen=True)
class Defaults:
    """Per-device defaults (docs/stress.md says why)."""

    size: int
    duration_s: float
    warmup_s: float
    gemm_window_s: float
    membw_window_s: float


DEFAULTS = {"cuda": Defaults(size=8192, duration_s=30.0, warmup_s=0.5, gemm_window_s=2.0,
                             membw_window_s=1.0),
            "cpu": Defaults(size=512, duration_s=8.0, warmup_s=0.2, gemm_window_s=1.0,
                            membw_window_s=0.5)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_launch_arguments(parser)
    cuda, cpu = DEFAULTS["cuda"], DEFAULTS["cpu"]
    group = parser.add_argument_group("stress")
    group.add_argument("--dtypes", default=None, metavar="LIST",
                       help="GEMM dtypes, comma-separated, the first also burns in: bf16, "
                       f"fp16, tf32, fp32 (default: {','.join(GPU_DTYPES)} as the GPU "
                       f"supports them; {','.join(CPU_DTYPES)} on CPU)")
    group.add_argument("--size", type=positive_int, default=None, metavar="N",
                       help=f"n of the n x n x n products (default: {cuda.size} on GPU, "
                       f"{cpu.size} on CPU)")
    group.add_argument("--duration", type=positive_float, default=None, metavar="SECONDS",
                       help="length of the burn-in that looks for silent data corruption "
                       f"(default: {cuda.duration_s:g} on GPU, {cpu.duration_s:g} on CPU)")
    group.add_argument("--peer-threshold", type=finite_float, default=None,
                       metavar="FRACTION", help="WARN for a rank below FRACTION x its node's "
                       f"median (default: {DEFAULT_PEER_FRACTION:g} on GPU, "
                       f"{DEFAULT_CPU_PEER_FRACTION:g} on CPU)")
    group.add_argument("--expected-threshold", type=finite_float,
                       default=DEFAULT_EXPECTED_FRACTION,
                       metavar="FRACTION", help="WARN below FRACTION x the GPU model's typical "
                       f"figure (default: {DEFAULT_EXPECTED_FRACTION:g})")
    group.add_argument("--copy-threshold", type=finite_float, default=DEFAULT_COPY_FRACTION,
                       metavar="FRACTION", help="WARN for host copies below FRACTION x the "
                       "PCIe link's rate, and for a peer pair below FRACTION x the median "
                       f"pair (default: {DEFAULT_COPY_FRACTION:g})")
    group.add_argument("--no-numa-pin", dest="pin_numa", action="store_false",
                       help="leave each rank's CPU affinity as the launcher set it (default: "
                       "pin it to its GPU's NUMA node)")


def _dtypes(args: argparse.Namespace, device: str) -> tuple[str, ...]:
    allowed = GPU_DTYPES if device == "cuda" else CPU_DTYPES
    if args.dtypes is None:
        return _gpu_default_dtypes() if device == "cuda" else CPU_DTYPES
    chosen = tuple(dict.fromkeys(d.strip() for d in args.dtypes.split(",") if d.strip()))
    bad = [d for d in chosen if d not in allowed]
    if bad or not chosen:
        where = "GPU" if device == "cuda" else "CPU"
        raise UsageError(f"--dtypes {args.dtypes!r}: on {where} ranks use "
                         f"{', '.join(allowed)}")
    if device == "cuda":
        missing = set(chosen) - set(_gpu_default_dtypes())
        if missing:
            raise UsageError(f"--dtypes: this GPU has no native {', '.join(sorted(missing))} "
                             "(needs compute capability 8.0 or newer); use fp16,fp32")
    return chosen


def _gpu_default_dtypes() -> tuple[str, ...]:
    """bf16 and tf32 need Ampere (compute capability 8.0) or newer."""
    import torch

    modern = torch.cuda.get_device_capability(0) >= (8, 0)
    return GPU_DTYPES if modern else ("fp16", "fp32")


def _fraction(flag: str, value: float) -> float:
    if not 0 < value <= 1:
        raise UsageError(f"{flag} {value:g}: give a fraction in (0, 1]")
    return value


def _check(args: argparse.Namespace, plan: LaunchPlan) -> StressSpec:
    """Every option checked before any rank starts; returns the StressSpec."""
    from gpucheck.stress.worker import StressSpec

    defaults = DEFAULTS[plan.device]
    duration = defaults.duration_s if args.duration is None else args.duration
    if not duration > 0:
        raise UsageError(f"--duration {args.duration:g}: give a positive number of seconds")
    size = defaults.size if args.size is None else args.size
    if not 16 <= size <= 65536:
        raise UsageError(f"--size {size}: give n between 16 and 65536")
    if args.peer_threshold is None:
        args.peer_threshold = DEFAULT_PEER_FRACTION if plan.device == "cuda" else \
            DEFAULT_CPU_PEER_FRACTION
    for flag, value in (("--peer-threshold", args.peer_threshold),
                        ("--expected-threshold", args.expected_threshold),
                        ("--copy-threshold", args.copy_threshold)):
        _fraction(flag, value)
    return StressSpec(device=plan.device, backend=plan.backend, timeout_s=plan.timeout_s,
                      dtypes=_dtypes(args, plan.device), size=size, duration_s=duration,
                      warmup_s=defaults.warmup_s, gemm_window_s=defaults.gemm_window_s,
                      membw_window_s=defaults.membw_window_s, pin_numa=args.pin_numa,
                      fault_watch=args.fault_watch, peer_fraction=args.peer_threshold,
                      expected_fraction=args.expected_threshold,
                      copy_fraction=args.copy_threshold)


def _verdicts(args: argparse.Namespace) -> Verdicts:
    from gpucheck.stress.report import Verdicts

    return Verdicts(args.peer_threshold, args.expected_threshold, args.copy_threshold)


def run(args: argparse.Namespace, ctx: RunContext) -> Report | None:
    plan = plan_launch(args, ctx)
    spec = _check(args, plan)
    from gpucheck.stress.worker import stress_worker

    return run_reported("stress", stress_worker, spec, plan, lambda r: _report(args, r),
                        quiet_stdout=args.quiet and args.output is None,
                        ctx=ctx)


def _report(args: argparse.Namespace, result: dict[str, Any]) -> Report:
    from gpucheck.stress.report import stress_sections

    return Report(command="stress", sections=stress_sections(result, _verdicts(args)))


def partial_report(args: argparse.Namespace, ctx: RunContext) -> Report | None:
    """After Ctrl-C or SIGTERM: what was measured so far (gpucheck.cli adds the stop)."""
    return job_partial_report(lambda partial: _report(args, partial), ctx)
