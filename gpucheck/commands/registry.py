"""The command registry: which subcommands exist, their modules, and the parser.

Both the CLI (`gpucheck.cli`) and commands that run other commands
(`gpucheck.commands.all`) use it, so no command reaches up into the CLI.
Command modules are imported only when chosen or when the parser is built, so
`import gpucheck.commands.registry` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import re
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from gpucheck.errors import UsageError
from gpucheck.escape import terminal
from gpucheck.render import FORMATS

COMMANDS = ("env", "bench", "comm", "stress", "all", "compare", "fleet", "health", "hang",
            "preflight")

EXIT_USAGE = 2


class BadOption(UsageError):
    """An option argparse refused: `gpucheck.cli.main` prints the one line and returns
    2, as for every other usage error (a caller of main() gets the code, not an exit)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse with a one-line error (argparse prints the usage block too)."""

    def error(self, message: str) -> NoReturn:
        # "argument --n-gpus/--nproc: 0: give 1 or more" reads "--n-gpus 0: give 1 or more"
        message = re.sub(r"^argument ([^:/ ]+)(?:/[^: ]+)*: ", r"\1 ", message)
        raise BadOption(f"{self.prog}: error: {terminal(message)} (see {self.prog} --help)")


def command_module(name: str) -> ModuleType:
    """`gpucheck.commands.<name>`: `HELP`, `add_arguments(parser)`, `run(args)`."""
    if name not in COMMANDS:
        raise KeyError(f"no gpucheck command {name!r}")
    return importlib.import_module(f"gpucheck.commands.{name}")


def output_options() -> argparse.ArgumentParser:
    """The options every command shares: format, output file, strictness, quiet."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("report")
    group.add_argument("--format", metavar="FMT", default=None,
                       help=f"report format: {', '.join(FORMATS)} (default: from --output's "
                            "extension, else text)")
    group.add_argument("--output", "-o", metavar="FILE", default=None,
                       help="also write the report to FILE (atomically); .json, .md and .html "
                            "pick the format")
    group.add_argument("--strict", action="store_true",
                       help="exit 1 on WARN as well as on FAIL")
    group.add_argument("--quiet", "-q", action="store_true",
                       help="no progress output; with --output, nothing on stdout")
    return common


def parsed_commands(argv: Sequence[str] | None) -> tuple[str, ...]:
    """The commands whose parsers are built: only the one `argv` names when it names one
    (nothing else can parse, and the other modules, some heavy, stay unimported, so
    `gpucheck health` starts fast); every one for `gpucheck --help` and usage errors."""
    if argv and argv[0] in COMMANDS:
        return (argv[0],)
    return COMMANDS


def build_parser(version: str, argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line: the shared options and every registered command, or only the
    one `argv` names (`parsed_commands`)."""
    parser = OneLineParser(
        prog="gpucheck",
        description="Is this GPU server fit for distributed work? Exit codes: 0 no FAIL, "
                    "1 any FAIL (--strict: WARN too), 2 usage or input error, 130 "
                    "interrupted (Ctrl-C), 143 terminated (SIGTERM).",
    )
    parser.add_argument("--version", action="version", version=f"gpucheck {version}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = output_options()
    for name in parsed_commands(argv):
        module = command_module(name)
        command_parser = sub.add_parser(name, help=module.HELP, description=module.HELP,
                                        parents=[common])
        module.add_arguments(command_parser)
    return parser
