"""`gpucheck comm`: collective sweep (all_reduce, all_gather, reduce_scatter, all_to_all,
broadcast) and pairwise send/recv, hang-safe."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from gpucheck.comm.aggregate import COLLECTIVES
from gpucheck.commands.job_report import partial_report as job_partial_report
from gpucheck.commands.job_report import run_reported
from gpucheck.commands.launch_options import LaunchPlan, add_launch_arguments, plan_launch
from gpucheck.commands.option_types import (
    MAX_COUNT,
    finite_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from gpucheck.context import RunContext
from gpucheck.errors import UsageError

if TYPE_CHECKING:  # imported where used: the workers bring torch in
    from gpucheck.comm.report import Verdicts
    from gpucheck.comm.worker import CommSpec
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_launch_arguments(parser)
    group = parser.add_argument_group("sweep")
    group.add_argument("--min-bytes", type=_size, default=1024, metavar="SIZE",
                       help="smallest per-rank buffer (default: 1K)")
    group.add_argument("--max-bytes", type=_size, default=None, metavar="SIZE",
                       help="largest per-rank buffer (default: from free device memory, at "
                       "most 1G on GPU and 16M on CPU)")
    group.add_argument("--iters", type=positive_int, default=20, metavar="N",
                       help="timed operations per size (default: 20)")
    group.add_argument("--warmup", type=non_negative_int, default=5, metavar="N",
                       help="untimed operations per size first (default: 5)")
    group.add_argument("--collectives", default=",".join(COLLECTIVES), metavar="LIST",
                       help=f"comma-separated, of: {', '.join(COLLECTIVES)} (default: all)")
    group.add_argument("--no-pairwise", dest="pairwise", action="store_false",
                       help="skip the pairwise send/recv matrix")
    group.add_argument("--pair-bytes", type=_size, default=None, metavar="SIZE",
                       help="buffer for each send/recv pair (default: the largest size)")
    group.add_argument("--pair-threshold", type=finite_float, default=DEFAULT_PAIR_THRESHOLD,
                       metavar="FRACTION", help="WARN for a pair below this fraction of its "
                       f"node's median pair bandwidth (default: {DEFAULT_PAIR_THRESHOLD:g})")
    group.add_argument("--baseline-busbw", type=positive_float, default=None, metavar="GBPS",
                       help="FAIL when the largest all_reduce's bus bandwidth is below GBPS")


def _check(args: argparse.Namespace) -> tuple[str, ...]:
    if args.iters < 1 or args.warmup < 0:
        raise UsageError("--iters must be 1 or more and --warmup 0 or more")
    if args.min_bytes < 4 or (args.max_bytes is not None and args.max_bytes < args.min_bytes):
        raise UsageError("--min-bytes must be at least 4 and --max-bytes at least --min-bytes")
    if not 0 < args.pair_threshold <= 1:
        raise UsageError(f"--pair-threshold {args.pair_threshold:g}: give a fraction in (0, 1]")
    if args.baseline_busbw is not None and not args.baseline_busbw > 0:
        raise UsageError(f"--baseline-busbw {args.baseline_busbw:g}: give the expected bus "
                         "bandwidth in GB/s, a positive number")
    collectives = tuple(c.strip() for c in args.collectives.split(",") if c.strip())
    unknown = set(collectives) - set(COLLECTIVES)
    if unknown or not collectives:
        raise UsageError(f"--collectives {args.collectives!r}: use one or more of "
                         f"{', '.join(COLLECTIVES)}, comma-separated")
    return collectives


def _spec(args: argparse.Namespace, plan: LaunchPlan, collectives: tuple[str, ...]) -> CommSpec:
    from gpucheck.comm.worker import CommSpec

    return CommSpec(device=plan.device, backend=plan.backend, timeout_s=plan.timeout_s,
                    collectives=collectives, min_bytes=args.min_bytes,
                    max_bytes=args.max_bytes, iters=args.iters, warmup=args.warmup,
                    pairwise=args.pairwise, pair_bytes=args.pair_bytes,
                    pair_threshold=args.pair_threshold, fault_watch=args.fault_watch)


def _verdicts(args: argparse.Namespace) -> Verdicts:
    from gpucheck.comm.report import Verdicts

    return Verdicts(args.pair_threshold, args.baseline_busbw, SLOW_NODE_FRACTION)


def run(args: argparse.Namespace, ctx: RunContext) -> Report | None:
    collectives = _check(args)
    plan = plan_launch(args, ctx)
    from gpucheck.comm.worker import comm_worker
    from gpucheck.distributed.flight import armed

    with armed("comm"):  # a hang leaves Flight Recorder dumps (gpucheck hang --traces)
        return run_reported("comm", comm_worker, _spec(args, plan, collectives), plan,
                            lambda r: _report(args, r),
                            quiet_stdout=args.quiet and args.output is None,
                            ctx=ctx)


def _report(args: argparse.Namespace, result: dict[str, Any]) -> Report:
    from gpucheck.comm.report import comm_sections

    return Report(command="comm", sections=comm_sections(result, _verdicts(args)))


def partial_report(args: argparse.Namespace, ctx: RunContext) -> Report | None:
    """After Ctrl-C or SIGTERM: what was measured so far (gpucheck.cli adds the stop)."""
    return job_partial_report(lambda partial: _report(args, partial), ctx)
