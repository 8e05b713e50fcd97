"""`gpucheck show REPORT.json`: a saved report in another format (README, "The commands").

A JSON report from a node becomes Markdown for a ticket or HTML for a browser, with
no Python: `gpucheck show node.json -o ticket.md`. The file goes through the bounded
reader (gpucheck.inputs via gpucheck.analysis.loading), so a huge, hostile or damaged
file is one line and exit 2. `show` judges nothing: it exits 0 once the report is
rendered, whatever the report's own verdict (`--strict` is ignored).
"""

from __future__ import annotations

import argparse

from gpucheck.context import RunContext
from gpucheck.errors import UsageError
from gpucheck.report import Report

HELP = ("render a saved JSON report (of any command) as text, Markdown, HTML, one line "
        "or Prometheus text")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("report", metavar="REPORT.json",
                        help="a report written by gpucheck <command> -o FILE.json")


def run(args: argparse.Namespace, ctx: RunContext) -> Report:
    return load_shown(args.report)


def load_shown(path: str) -> Report:
    """The report at `path` as a Report, or UsageError naming the file and the problem."""
    from gpucheck.analysis.loading import ReportError, load_report

    try:
        return load_report(path).report
    except ReportError as exc:
        raise UsageError(f"{exc}; give a JSON report written with -o FILE.json") from None


def exit_code(report: Report, args: argparse.Namespace) -> int:
    """Rendering is the whole job: the shown report's verdict is not this run's."""
    return 0
