"""`gpucheck fleet REPORT... | DIR`: reports from many nodes judged together (one per
node, e.g. `srun --ntasks-per-node 1 ... gpucheck all -o reports/$SLURMD_NODENAME.json`);
reads files only, never torch (docs/fleet.md).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass

from gpucheck.analysis.baseline import (
    Baseline,
    BaselineError,
    baseline_json,
    build_baseline,
    load_baseline,
)
from gpucheck.analysis.fleet import DEFAULT_MAD_K, DEFAULT_THRESHOLD, FleetOptions, fleet_sections
from gpucheck.analysis.loading import fraction, load_reports, report_paths
from gpucheck.analysis.nodes import Fleet, Unused, group_reports, newest_created_at
from gpucheck.commands.options import Options, opt, positive_float, positive_int
from gpucheck.commands.registry import outputs_of
from gpucheck.context import RunContext
from gpucheck.distributed.world import expand_nodelist
from gpucheck.errors import UsageError
from gpucheck.measure import Metric
from gpucheck.output import WriteError, check_writable, same_file, write_atomic
from gpucheck.report import Report, Section, fail

HELP = ("judge reports from many nodes together: outlier nodes per metric and GPU, "
        "version drift, missing or failed nodes, a ranked list of nodes to act on")


@dataclass(frozen=True)
class FleetArgs(Options):
    inputs: Sequence[str] = opt("inputs", default=(), nargs="+", metavar="REPORT|DIR",
                                help="report files, or directories of them (*.json)")
    nodes: str | None = opt("--nodes", metavar="LIST",
                            help="the nodes that should have reported, as SLURM writes them "
                            "(gpu[01-16],cpu3): the missing ones are named")
    expect_nodes: int | None = opt("--expect-nodes", type=positive_int, metavar="N",
                                   help="how many nodes should have reported (without names)")
    threshold: str = opt("--threshold", default=f"{DEFAULT_THRESHOLD:.0%}", metavar="FRACTION",
                         help="a node worse than the fleet median by more than this is an "
                         "outlier; also the baseline's tolerance (0.1 or 10%%; default "
                         f"{DEFAULT_THRESHOLD:.0%}%)")
    mad_k: float = opt("--mad-k", default=DEFAULT_MAD_K, type=positive_float, metavar="K",
                       help="also an outlier: worse by more than K scaled MADs (and at least "
                       f"2%%) (default {DEFAULT_MAD_K:g})")
    baseline: str | None = opt("--baseline", metavar="FILE",
                               help="warn on figures beyond this baseline's limits")
    save_baseline: str | None = opt("--save-baseline", metavar="FILE",
                                    help="write the expected value of every metric, from the "
                                    "healthy reports, to FILE")


add_arguments = FleetArgs.add_to


def run(args: argparse.Namespace, ctx: RunContext) -> Report:
    options = _options(args)
    if args.save_baseline is not None:
        if any(same_file(args.save_baseline, path) for path in outputs_of(args)):
            raise UsageError(f"--save-baseline and --output both name {args.save_baseline}: "
                             "one would overwrite the other; give two files")
        check_writable(args.save_baseline, "--save-baseline")
    # The report files, less this run's own -o and --save-baseline files.
    own = {os.path.realpath(p) for p in (*outputs_of(args), args.save_baseline)
           if p is not None}
    fleet = _read([p for p in report_paths(args.inputs) if os.path.realpath(p) not in own])
    future = {r.path for r in fleet.future}  # a forged date must not date the fleet's report
    loaded = [r.report for r in fleet.reports if r.report.path not in future]
    # The report's time is when fleet ran (the inputs' span is in its inputs section);
    # a saved baseline is as of its newest input.
    count = len(fleet.nodes)
    argv = ["gpucheck", "fleet", *args.inputs]  # from the options: `python -m` too
    for flag, value in (("--nodes", args.nodes), ("--expect-nodes", args.expect_nodes),
                        ("--threshold", args.threshold), ("--mad-k", args.mad_k),
                        ("--baseline", args.baseline),
                        ("--save-baseline", args.save_baseline)):
        if value is not None:
            argv += [flag, str(value)]
    report = Report("fleet", fleet_sections(fleet, options), argv=argv,
                    host=f"{count} node{'' if count == 1 else 's'}")
    if args.save_baseline is not None:
        healthy = [r for r in fleet.reports if r.healthy]
        samples: dict[str, list[Metric]] = {}
        for node in healthy:
            for name, metric in node.metrics.items():
                samples.setdefault(name, []).append(metric)
        source = {"reports": len(healthy), "nodes": len({r.node for r in healthy}),
                  "commands": sorted({r.command for r in healthy})}
        baseline = build_baseline(samples, options.threshold, options.mad_k,
                                  newest_created_at(loaded), source)
        try:
            write_atomic(args.save_baseline, baseline_json(baseline), "--save-baseline")
        except WriteError as exc:  # a full disk: the fleet's judgement is not lost
            report.add(Section("save_baseline", "Baseline not saved", {"file": args.save_baseline},
                               [fail("fleet.save_baseline", str(exc), hint="free space or give "
                                     "another --save-baseline file, then rerun")]))
    return report


def _options(args: argparse.Namespace) -> FleetOptions:
    nodes: tuple[str, ...] = ()
    if args.nodes is not None:
        try:
            nodes = tuple(dict.fromkeys(expand_nodelist(args.nodes)))
        except ValueError as exc:
            raise UsageError(f"--nodes {args.nodes!r}: {exc}; write it as SLURM does, e.g. "
                             "gpu[01-16],cpu3") from None
    count = args.expect_nodes
    if count is not None and nodes and count != len(nodes):
        raise UsageError(f"--expect-nodes {count} disagrees with --nodes ({len(nodes)} "
                         "nodes): give one of them")
    baseline: Baseline | None = None
    if args.baseline is not None:
        try:
            baseline = load_baseline(args.baseline)
        except BaselineError as exc:
            raise UsageError(str(exc)) from None
    return FleetOptions(fraction(args.threshold, "--threshold"), args.mad_k, nodes, count,
                        baseline)


def _read(paths: list[str]) -> Fleet:
    """Every readable report; the others are listed. Exit 2 only when none is readable."""
    loaded, errors = load_reports(paths)
    unreadable = [Unused(e.path, e.problem) for e in errors]
    if not loaded and not unreadable:
        raise UsageError("no report to judge: the only input is this run's own output file")
    if not loaded:
        first = unreadable[0]
        more = f" (and {len(unreadable) - 1} more unreadable)" if len(unreadable) > 1 else ""
        raise UsageError(f"{first.path}: {first.why}{more}: no report to judge")
    return group_reports(loaded, unreadable)
