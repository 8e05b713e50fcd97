"""`gpucheck comm`: collective sweep (all_reduce, all_gather, reduce_scatter, all_to_all,
broadcast) and pairwise send/recv, hang-safe."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from gpucheck.comm.verdicts import COLLECTIVES
from gpucheck.commands.launch import LaunchOptions, LaunchPlan, plan_launch, run_reported
from gpucheck.commands.launch import partial_report as job_partial_report
from gpucheck.commands.options import (
    MAX_COUNT,
    fraction,
    non_negative_int,
    opt,
    positive_float,
    positive_int,
)
from gpucheck.context import RunContext
from gpucheck.errors import UsageError
from gpucheck.peers import SLOW_NODE_FRACTION
from gpucheck.report import Report

HELP = "collective and pairwise bandwidth, hang-safe"
DEFAULT_PAIR_THRESHOLD = 0.5


def _size(text: str) -> int:
    """Bytes, with an optional K/M/G suffix (binary: 1K = 1024)."""
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    raw = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        if raw and raw[-1] in scale:
            size = int(positive_float(raw[:-1]) * scale[raw[-1]])
        else:
            size = positive_int(raw)
    except argparse.ArgumentTypeError:  # nan, inf, -1, 0: never a buffer size
        size = 0
    if not 0 < size <= MAX_COUNT:
        raise argparse.ArgumentTypeError(
            f"{text}: not a size of 1 byte or more (e.g. 4096, 64K, 16M)") from None
    return size


@dataclass(frozen=True)
class CommArgs(LaunchOptions):
    min_bytes: int = opt("--min-bytes", default=1024, group="sweep", type=_size,
                         metavar="SIZE", help="smallest per-rank buffer (default: 1K)")
    max_bytes: int | None = opt("--max-bytes", group="sweep", type=_size, metavar="SIZE",
                                help="largest per-rank buffer (default: from free device "
                                "memory, at most 1G on GPU and 16M on CPU)")
    iters: int = opt("--iters", default=20, group="sweep", type=positive_int, metavar="N",
                     help="timed operations per size (default: 20)")
    warmup: int = opt("--warmup", default=5, group="sweep", type=non_negative_int,
                      metavar="N", help="untimed operations per size first (default: 5)")
    collectives: str = opt("--collectives", default=",".join(COLLECTIVES), group="sweep",
                           metavar="LIST", help=f"comma-separated, of: {', '.join(COLLECTIVES)} "
                           "(default: all)")
    pairwise: bool = opt("--no-pairwise", default=True, group="sweep", action="store_false",
                         help="skip the pairwise send/recv matrix")
    pair_bytes: int | None = opt("--pair-bytes", group="sweep", type=_size, metavar="SIZE",
                                 help="buffer for each send/recv pair (default: the largest "
                                 "size)")
    pair_threshold: float = opt("--pair-threshold", default=DEFAULT_PAIR_THRESHOLD,
                                group="sweep", type=fraction, metavar="FRACTION",
                                help="WARN for a pair below this fraction of its node's median "
                                f"pair bandwidth (default: {DEFAULT_PAIR_THRESHOLD:g})")
    baseline_busbw: float | None = opt("--baseline-busbw", group="sweep", type=positive_float,
                                       metavar="GBPS", help="FAIL when the largest all_reduce's "
                                       "bus bandwidth is below GBPS")

    def __post_init__(self) -> None:
        if self.min_bytes < 4 or (self.max_bytes is not None and
                                  self.max_bytes < self.min_bytes):
            raise UsageError("--min-bytes must be at least 4 and --max-bytes at least "
                             "--min-bytes")
        if not self.chosen():
            raise UsageError(f"--collectives {self.collectives!r}: use one or more of "
                             f"{', '.join(COLLECTIVES)}, comma-separated")

    def chosen(self) -> tuple[str, ...]:
        """The collectives asked for; () when any is unknown."""
        names = tuple(c.strip() for c in self.collectives.split(",") if c.strip())
        return () if set(names) - set(COLLECTIVES) else names


add_arguments = CommArgs.add_to


def check(args: argparse.Namespace, ctx: RunContext) -> tuple[LaunchPlan, tuple[str, ...]]:
    """Every option checked before any rank starts (`all` checks them all up front)."""
    collectives = CommArgs.of(args).chosen()
    return plan_launch(args, ctx), collectives


def run(args: argparse.Namespace, ctx: RunContext) -> Report | None:
    plan, collectives = check(args, ctx)
    from gpucheck.comm.worker import CommSpec, comm_worker
    from gpucheck.distributed.deadline import armed

    spec = CommSpec(device=plan.device, backend=plan.backend, timeout_s=plan.timeout_s,
                    collectives=collectives, min_bytes=args.min_bytes,
                    max_bytes=args.max_bytes, iters=args.iters, warmup=args.warmup,
                    pairwise=args.pairwise, pair_bytes=args.pair_bytes,
                    pair_threshold=args.pair_threshold, fault_watch=args.fault_watch)
    with armed("comm"):  # a hang leaves Flight Recorder dumps (gpucheck hang --traces)
        return run_reported("comm", comm_worker, spec, plan,
                            lambda r: _report(args, r),
                            quiet_stdout=args.quiet and args.output is None,
                            ctx=ctx)


def _report(args: argparse.Namespace, result: dict[str, Any]) -> Report:
    from gpucheck.comm.report import Verdicts, comm_sections

    verdicts = Verdicts(args.pair_threshold, args.baseline_busbw, SLOW_NODE_FRACTION)
    return Report(command="comm", sections=comm_sections(result, verdicts))


def partial_report(args: argparse.Namespace, ctx: RunContext) -> Report | None:
    """After Ctrl-C or SIGTERM: what was measured so far."""
    return job_partial_report(lambda partial: _report(args, partial), ctx)
