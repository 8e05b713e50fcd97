"""`gpucheck show REPORT.json`: a saved report in another format (`-o ticket.md`),
read through the bounded reader; it judges nothing and exits 0 once rendered.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from gpucheck.commands.options import Options, opt
from gpucheck.context import RunContext
from gpucheck.errors import UsageError
from gpucheck.report import Report

HELP = ("render a saved JSON report (of any command) as text, Markdown, HTML, one line "
        "or Prometheus text")


@dataclass(frozen=True)
class ShowArgs(Options):
    report: str = opt("report", metavar="REPORT.json",
                      help="a report written by gpucheck <command> -o FILE.json")


add_arguments = ShowArgs.add_to


def run(args: argparse.Namespace, ctx: RunContext) -> Report:
    return load_shown(ShowArgs.of(args).report)


def load_shown(path: str) -> Report:
    """The report at `path`, or UsageError naming the file and the problem."""
    from gpucheck.analysis.loading import ReportError, load_report

    try:
        return load_report(path).report
    except ReportError as exc:
        raise UsageError(f"{exc}; give a JSON report written with -o FILE.json") from None


def exit_code(report: Report, args: argparse.Namespace) -> int:
    """The shown report's verdict is not this run's."""
    return 0
