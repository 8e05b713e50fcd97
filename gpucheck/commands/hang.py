"""`gpucheck hang`: a distributed job is stuck or crawls: which rank, doing what.

No PIDs: every torch.distributed rank on this node. PIDs: those ranks (a torchrun
PID stands for its workers). `--traces DIR`: the job's Flight Recorder dumps.
Under srun --ntasks-per-node 1 or torchrun with one process per node, every node
looks at its own ranks and rank 0 judges them all (docs/hang.md).
"""

from __future__ import annotations

import argparse

from gpucheck.commands.option_types import finite_float, positive_float, positive_int
from gpucheck.context import RunContext
from gpucheck.errors import UsageError
from gpucheck.report import Report

HELP = ("a distributed job hangs or crawls: name the rank the others wait for and what it "
        "does (py-spy stacks, process state, GPU), or read its Flight Recorder dumps")
DEFAULT_WINDOW_S = 2.0
MAX_WINDOW_S = 60.0
# An NVML call that has not answered in 30 s is hung (the doorway's own retry budget
# comes on top); a larger budget would only push the run past its gather timeout,
# and 1e300 overflows the wait itself.
MAX_NVML_TIMEOUT_S = 30.0
MIN_NVML_TIMEOUT_S = 0.1  # below it every call "times out" on a healthy driver


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pids", nargs="*", type=positive_int, metavar="PID",
                        help="rank processes, or a launcher (torchrun) standing for its "
                             "workers (default: every rank process on this node)")
    parser.add_argument("--traces", metavar="DIR", default=None,
                        help="read the Flight Recorder dumps in DIR (TORCH_FR_DUMP_TEMP_FILE's "
                             "folder); alone, without looking at live processes")
    parser.add_argument("--prefix", metavar="NAME", default=None,
                        help="the dumps' file name prefix, before the rank (default: the "
                             "most common one in DIR)")
    parser.add_argument("--window", type=finite_float, default=DEFAULT_WINDOW_S, metavar="SECONDS",
                        help="watch the ranks this long: a rank that never leaves one "
                             "collective call in it is waiting (default: "
                             f"{DEFAULT_WINDOW_S:g}; longer than one training step)")
    parser.add_argument("--nvml-timeout", type=positive_float, default=3.0, metavar="SECONDS",
                        help="give up on an NVML call after this long (default: 3; at "
                             f"most {MAX_NVML_TIMEOUT_S:g})")


def _validate(args: argparse.Namespace) -> None:
    if not 1 <= args.window <= MAX_WINDOW_S:  # py-spy records whole seconds
        raise UsageError(f"--window {args.window:g}: give 1 to {MAX_WINDOW_S:g} seconds")
    if not MIN_NVML_TIMEOUT_S <= args.nvml_timeout <= MAX_NVML_TIMEOUT_S:
        raise UsageError(f"--nvml-timeout {args.nvml_timeout:g}: give "
                         f"{MIN_NVML_TIMEOUT_S:g} to {MAX_NVML_TIMEOUT_S:g} seconds")
    bad = [p for p in args.pids if p <= 0]
    if bad:
        raise UsageError(f"PID {bad[0]}: a process id is a positive number")


def run(args: argparse.Namespace, ctx: RunContext) -> Report | None:
    _validate(args)
    report = Report(command="hang")
    if args.traces is not None:
        from gpucheck.hang.trace_findings import traces_section

        report.add(traces_section(args.traces, args.prefix))
        if not args.pids:
            return report
    from gpucheck.hang.gather import gather_views
    from gpucheck.hang.live import live_sections

    nodes = gather_views(args.pids, args.window, args.nvml_timeout, ctx)
    if nodes is None:
        return None
    for section in live_sections(nodes, args.window):
        report.add(section)
    return report
