"""`gpucheck hang`: a distributed job is stuck or crawls: which rank, doing what
(live ranks on every node, or the job's Flight Recorder dumps: docs/hang.md).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from gpucheck.commands.options import Options, opt, positive_int, real
from gpucheck.context import RunContext
from gpucheck.report import Report

HELP = ("a distributed job hangs or crawls: name the rank the others wait for and what it "
        "does (py-spy stacks, process state, GPU), or read its Flight Recorder dumps")
DEFAULT_WINDOW_S = 2.0
# An NVML call unanswered in 30 s is hung; more would push the run past its gather.
MAX_NVML_TIMEOUT_S = 30.0
MIN_NVML_TIMEOUT_S = 0.1  # below it every call "times out" on a healthy driver


@dataclass(frozen=True)
class HangArgs(Options):
    pids: Sequence[int] | None = opt("pids", nargs="*", type=positive_int, metavar="PID",
                                 help="rank processes, or a launcher (torchrun) standing for "
                                 "its workers (default: every rank process on this node)")
    traces: str | None = opt("--traces", metavar="DIR",
                             help="read the Flight Recorder dumps in DIR "
                             "(TORCH_FR_DUMP_TEMP_FILE's folder); alone, without looking at "
                             "live processes")
    prefix: str | None = opt("--prefix", metavar="NAME", help="the dumps' file name prefix, "
                             "before the rank (default: the most common one in DIR)")
    # py-spy records whole seconds.
    window: float = opt("--window", default=DEFAULT_WINDOW_S, type=real(least=1, most=60),
                        metavar="SECONDS", help="watch the ranks this long: a rank that never "
                        "leaves one collective call in it is waiting (default: "
                        f"{DEFAULT_WINDOW_S:g}; longer than one training step)")
    nvml_timeout: float = opt("--nvml-timeout", default=3.0,
                              type=real(least=MIN_NVML_TIMEOUT_S, most=MAX_NVML_TIMEOUT_S),
                              metavar="SECONDS", help="give up on an NVML call after this "
                              f"long (default: 3; at most {MAX_NVML_TIMEOUT_S:g})")


add_arguments = HangArgs.add_to


def run(args: argparse.Namespace, ctx: RunContext) -> Report | None:
    options = HangArgs.of(args)
    report = Report(command="hang")
    if options.traces is not None:
        from gpucheck.hang.findings import traces_section

        report.add(traces_section(options.traces, options.prefix))
        if not options.pids:
            return report
    from gpucheck.hang.live import gather_views, live_sections

    nodes = gather_views(list(options.pids or ()), options.window, options.nvml_timeout, ctx)
    if nodes is None:
        return None
    for section in live_sections(nodes, options.window):
        report.add(section)
    return report
