"""`gpucheck compare A.json B.json`: two reports of one command side by side; exit 1
when B is worse than A beyond --threshold (a CI gate). Never imports torch.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from gpucheck.analysis.compare import compare_sections
from gpucheck.analysis.loading import LoadedReport, ReportError, fraction, load_report
from gpucheck.analysis.nodes import newest_created_at
from gpucheck.commands.options import Options, opt
from gpucheck.context import RunContext
from gpucheck.errors import UsageError
from gpucheck.report import Report

HELP = ("compare two reports of the same command (two nodes, or before and after a "
        "change): versions, GPUs, every metric's change, new findings; exit 1 when B is "
        "worse than A")
DEFAULT_THRESHOLD = "5%"


@dataclass(frozen=True)
class CompareArgs(Options):
    a: str = opt("a", metavar="A.json", help="the reference report")
    b: str = opt("b", metavar="B.json", help="the report judged against A")
    threshold: str = opt("--threshold", default=DEFAULT_THRESHOLD, metavar="FRACTION",
                         help="a metric worse than A by more than this fails (0.05 or 5%%; "
                         f"default {DEFAULT_THRESHOLD}%)")  # %% in help: one %


add_arguments = CompareArgs.add_to


def run(args: argparse.Namespace, ctx: RunContext) -> Report:
    threshold = fraction(args.threshold, "--threshold")
    a, b = _shared(_load(args.a), _load(args.b))
    hosts = a.host if a.host == b.host else f"{a.host} vs {b.host}"
    # created_at and host come from the inputs: the same two files give the same report.
    return Report("compare", compare_sections(a, b, threshold),
                  argv=["gpucheck", "compare", args.a, args.b, "--threshold", args.threshold],
                  host=hosts, created_at=newest_created_at([a, b]))


def _shared(a: LoadedReport, b: LoadedReport) -> tuple[LoadedReport, LoadedReport]:
    """Two reports of one command (an `all` report read as the other's command's part)."""
    if a.command == b.command:
        return a, b
    single = b.command if a.command == "all" else a.command if b.command == "all" else None
    if single is not None:
        whole = a if a.command == "all" else b  # its sections of that command, read again
        part = LoadedReport.of(whole.path, dataclasses.replace(whole.report, sections=[
            s for s in whole.sections if s.name.split(".", 1)[0] == single]))
        if part.sections:  # the `all` ran that command
            return (part, b) if a.command == "all" else (a, part)
    raise UsageError(f"{b.path}: is a report of gpucheck {b.command}, {a.path} one of "
                     f"gpucheck {a.command}: compare needs two reports of the same command "
                     "(or an `all` report that ran it)")


def _load(path: str) -> LoadedReport:
    try:
        return load_report(path)
    except ReportError as exc:
        raise UsageError(str(exc)) from None
