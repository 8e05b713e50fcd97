"""Command line: parse, run one command, render its report, pick the exit code.

Each command lives in `gpucheck.commands.<name>` and provides `HELP`,
`add_arguments(parser)` and `run(args) -> Report | None` (None on a rank that
does not report, e.g. every rank but 0 under torchrun). Command modules are
imported only when chosen, so `gpucheck --help` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn, TextIO

from gpucheck import __version__
from gpucheck.errors import UsageError
from gpucheck.output import check_writable, write_atomic
from gpucheck.render import FORMATS, format_for, render
from gpucheck.report import Report

COMMANDS = ("env", "bench", "comm", "stress")

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error (argparse prints the usage block too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _output_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("report")
    group.add_argument("--format", metavar="FMT", default=None,
                       help=f"report format: {', '.join(FORMATS)} (default: from --output's "
                            "extension, else text)")
    group.add_argument("--output", "-o", metavar="FILE", default=None,
                       help="also write the report to FILE (atomically); .json and .md pick "
                            "the format")
    group.add_argument("--strict", action="store_true",
                       help="exit 1 on WARN as well as on FAIL")
    group.add_argument("--quiet", "-q", action="store_true",
                       help="no progress output; with --output, nothing on stdout")
    return common


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="gpucheck",
        description="Is this GPU server fit for distributed work? Exit codes: 0 no FAIL, "
                    "1 any FAIL (--strict: WARN too), 2 usage or input error.",
    )
    parser.add_argument("--version", action="version", version=f"gpucheck {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = _output_options()
    for name in COMMANDS:
        module = _command_module(name)
        command_parser = sub.add_parser(name, help=module.HELP, description=module.HELP,
                                        parents=[common])
        module.add_arguments(command_parser)
    return parser


def _command_module(name: str):  # type: ignore[no-untyped-def]
    return importlib.import_module(f"gpucheck.commands.{name}")


def use_color(stream: TextIO) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (no-color.org)."""
    return stream.isatty() and "NO_COLOR" not in os.environ


def emit(report: Report, fmt: str, output: str | None, quiet: bool,
         stream: TextIO | None = None) -> None:
    """Write the report file (if asked) and show the report on `stream`."""
    stream = stream or sys.stdout
    if output is not None:
        write_atomic(output, render(report, fmt))
        if not quiet:
            stream.write(render(report, "text", color=use_color(stream)))
        return
    stream.write(render(report, fmt, color=fmt == "text" and use_color(stream)))
    stream.flush()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        fmt = format_for(args.format, args.output)
        if args.output is not None:
            check_writable(args.output)
        report = _command_module(args.command).run(args)
        if report is None:
            return 0
        emit(report, fmt, args.output, args.quiet)
    except UsageError as exc:
        print(f"gpucheck {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"gpucheck {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return report.exit_code(strict=args.strict)
