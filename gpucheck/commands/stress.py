"""`gpucheck stress`: every GPU at once, one rank per GPU: GEMM throughput, memory
bandwidth, silent data corruption under load, host and peer copies."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpucheck.commands.launch import LaunchOptions, LaunchPlan, plan_launch, run_reported
from gpucheck.commands.launch import partial_report as job_partial_report
from gpucheck.commands.options import count, fraction, opt, positive_float
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


CUDA, CPU = DEFAULTS["cuda"], DEFAULTS["cpu"]


@dataclass(frozen=True)
class StressArgs(LaunchOptions):
    dtypes: str | None = opt("--dtypes", group="stress", metavar="LIST",
                             help="GEMM dtypes, comma-separated, the first also burns in: "
                             f"bf16, fp16, tf32, fp32 (default: {','.join(GPU_DTYPES)} as the "
                             f"GPU supports them; {','.join(CPU_DTYPES)} on CPU)")
    size: int | None = opt("--size", group="stress", type=count(least=16, most=65536),
                           metavar="N", help=f"n of the n x n x n products (default: "
                           f"{CUDA.size} on GPU, {CPU.size} on CPU)")
    duration: float | None = opt("--duration", group="stress", type=positive_float,
                                 metavar="SECONDS", help="length of the burn-in that looks for "
                                 f"silent data corruption (default: {CUDA.duration_s:g} on GPU, "
                                 f"{CPU.duration_s:g} on CPU)")
    peer_threshold: float | None = opt("--peer-threshold", group="stress", type=fraction,
                                       metavar="FRACTION", help="WARN for a rank below "
                                       "FRACTION x its node's median (default: "
                                       f"{DEFAULT_PEER_FRACTION:g} on GPU, "
                                       f"{DEFAULT_CPU_PEER_FRACTION:g} on CPU)")
    expected_threshold: float = opt("--expected-threshold", default=DEFAULT_EXPECTED_FRACTION,
                                    group="stress", type=fraction, metavar="FRACTION",
                                    help="WARN below FRACTION x the GPU model's typical figure "
                                    f"(default: {DEFAULT_EXPECTED_FRACTION:g})")
    copy_threshold: float = opt("--copy-threshold", default=DEFAULT_COPY_FRACTION,
                                group="stress", type=fraction, metavar="FRACTION",
                                help="WARN for host copies below FRACTION x the PCIe link's "
                                "rate, and for a peer pair below FRACTION x the median pair "
                                f"(default: {DEFAULT_COPY_FRACTION:g})")
    pin_numa: bool = opt("--no-numa-pin", default=True, group="stress", action="store_false",
                         help="leave each rank's CPU affinity as the launcher set it "
                         "(default: pin it to its GPU's NUMA node)")

    def verdicts(self, device: str) -> Verdicts:
        from gpucheck.stress.report import Verdicts

        peer = self.peer_threshold
        if peer is None:
            peer = DEFAULT_PEER_FRACTION if device == "cuda" else DEFAULT_CPU_PEER_FRACTION
        return Verdicts(peer, self.expected_threshold, self.copy_threshold)


add_arguments = StressArgs.add_to


def _dtypes(args: argparse.Namespace, device: str) -> tuple[str, ...]:
    allowed: tuple[str, ...] = CPU_DTYPES
    native: tuple[str, ...] = CPU_DTYPES
    if device == "cuda":
        import torch

        allowed = GPU_DTYPES  # bf16 and tf32 need compute capability 8.0 or newer
        native = GPU_DTYPES if torch.cuda.get_device_capability(0) >= (8, 0) else (
            "fp16", "fp32")
    if args.dtypes is None:
        return native
    chosen = tuple(dict.fromkeys(d.strip() for d in args.dtypes.split(",") if d.strip()))
    if not chosen or any(d not in allowed for d in chosen):
        where = "GPU" if device == "cuda" else "CPU"
        raise UsageError(f"--dtypes {args.dtypes!r}: on {where} ranks use "
                         f"{', '.join(allowed)}")
    missing = set(chosen) - set(native)
    if missing:
        raise UsageError(f"--dtypes: this GPU has no native {', '.join(sorted(missing))} "
                         "(needs compute capability 8.0 or newer); use fp16,fp32")
    return chosen


def check(args: argparse.Namespace, ctx: RunContext) -> tuple[LaunchPlan, StressSpec]:
    """Every option checked before any rank starts (`all` checks them all up front)."""
    from gpucheck.stress.worker import StressSpec

    plan = plan_launch(args, ctx)
    options = StressArgs.of(args)
    defaults = DEFAULTS[plan.device]
    verdicts = options.verdicts(plan.device)
    return plan, StressSpec(device=plan.device, backend=plan.backend, timeout_s=plan.timeout_s,
                      dtypes=_dtypes(args, plan.device), size=options.size or defaults.size,
                      duration_s=options.duration or defaults.duration_s,
                      warmup_s=defaults.warmup_s, gemm_window_s=defaults.gemm_window_s,
                      membw_window_s=defaults.membw_window_s, pin_numa=options.pin_numa,
                      fault_watch=options.fault_watch, peer_fraction=verdicts.peer_fraction,
                      expected_fraction=verdicts.expected_fraction,
                      copy_fraction=verdicts.copy_fraction)


def run(args: argparse.Namespace, ctx: RunContext) -> Report | None:
    plan, spec = check(args, ctx)
    from gpucheck.stress.worker import stress_worker

    return run_reported("stress", stress_worker, spec, plan, lambda r: _report(args, r),
                        quiet_stdout=args.quiet and args.output is None,
                        ctx=ctx)


def _report(args: argparse.Namespace, result: dict[str, Any]) -> Report:
    from gpucheck.stress.report import stress_sections

    verdicts = StressArgs.of(args).verdicts(str(result.get("device")))
    return Report(command="stress", sections=stress_sections(result, verdicts))


def partial_report(args: argparse.Namespace, ctx: RunContext) -> Report | None:
    """After Ctrl-C or SIGTERM: what was measured so far."""
    return job_partial_report(lambda partial: _report(args, partial), ctx)
