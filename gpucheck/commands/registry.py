"""The commands (their modules, imported only when chosen: never torch for --help or
health), the parser, and the output options honoured (`emit`). Shared by the CLI and
`all`, so no command reaches up into the CLI.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

from gpucheck.context import Console
from gpucheck.errors import UsageError
from gpucheck.escape import encodable, terminal
from gpucheck.output import WriteError, write_atomic
from gpucheck.render import EXTENSIONS, FORMATS, format_for, render
from gpucheck.report import Report

COMMANDS = ("env", "bench", "comm", "stress", "all", "compare", "fleet", "health", "hang",
            "show", "preflight")

EXIT_USAGE = 2


class BadOption(UsageError):
    """An option argparse refused: main() prints the one line and returns 2."""


class OneLineParser(argparse.ArgumentParser):
    """argparse with a one-line error, a "did you mean", and the --help to read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No prefixes (`--n-gpu` for `--n-gpus`): a script's prefix would change meaning,
        # or stop parsing, the day an option that shares it is added.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        # Filled by build_parser on the top parser: the parsers of the commands it built.
        self.command_parsers: dict[str, argparse.ArgumentParser] = {}

    def error(self, message: str) -> NoReturn:
        # "argument --n-gpus/--nproc: 0: give 1 or more" reads "--n-gpus 0: give 1 or more"
        message = re.sub(r"^argument ([^:/ ]+)(?:/[^: ]+)*: ", r"\1 ", message)
        # An unknown option reaches the top parser: point to the command's own --help.
        built = self.command_parsers
        own: argparse.ArgumentParser = next(iter(built.values())) if len(built) == 1 else self
        guess = did_you_mean(message, own)
        # A mistyped command: the help of the command it was probably meant to be.
        helped = f"{self.prog} {guess}" if guess in built else own.prog
        said = f"; did you mean {guess!r}?" if guess else ""
        raise BadOption(f"{self.prog}: error: {terminal(message)}{terminal(said)} "
                        f"(see {terminal(helped)} --help)")


def did_you_mean(message: str, parser: argparse.ArgumentParser) -> str:
    """What argparse's refused command or option was probably meant to be, or ""."""
    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice is not None:
        wrong, offered = choice[1], re.findall(r"'([^']*)'", choice[2])
    else:
        unknown = re.search(r"unrecognized arguments: (.*)$", message)
        words = unknown[1].split() if unknown else []
        wrong = next((w.split("=", 1)[0] for w in words if w.startswith("-")), "")
        offered = [o for a in parser._actions for o in a.option_strings]
    import difflib

    close = difflib.get_close_matches(wrong, offered, n=1, cutoff=0.6) if wrong else []
    return close[0] if close else ""


def command_module(name: str) -> ModuleType:
    """`gpucheck.commands.<name>`: `HELP`, `add_arguments(parser)`, `run(args)`."""
    if name not in COMMANDS:
        raise KeyError(f"no gpucheck command {name!r}")
    return importlib.import_module(f"gpucheck.commands.{name}")


def output_options() -> OneLineParser:
    """The options every command shares: format, output file, strictness, quiet."""
    common = OneLineParser(add_help=False)  # the subparsers' own class: their parents' too
    group = common.add_argument_group("report")
    group.add_argument("--format", metavar="FMT", default=None,
                       help=f"report format: {', '.join(FORMATS)} (default: from --output's "
                            "extension, else text)")
    group.add_argument("--output", "-o", metavar="FILE", default=None, action=OutputAction,
                       help="also write the report to FILE (atomically); .json, .md and .html "
                            "pick the format; give it again to write several files from one "
                            "run (-o node.json -o ticket.md)")
    group.add_argument("--strict", action="store_true",
                       help="exit 1 on WARN as well as on FAIL")
    group.add_argument("--quiet", "-q", action="store_true",
                       help="no progress output; with --output, nothing on stdout")
    return common


class OutputAction(argparse.Action):
    """`-o` given more than once: `outputs` holds every file, `output` the first."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        outputs = [*(getattr(namespace, "outputs", None) or []), str(values)]
        namespace.outputs = outputs
        namespace.output = outputs[0]


def build_parser(version: str, argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command line: the shared options and the commands: only the one `argv` names
    (the others stay unimported: `gpucheck health` starts fast), else every one."""
    parser = OneLineParser(
        prog="gpucheck",
        description="Is this GPU server fit for distributed work? Exit codes: 0 no FAIL, "
                    "1 any FAIL (--strict: WARN too), 2 usage or input error, 130 "
                    "interrupted (Ctrl-C), 143 terminated (SIGTERM). Options are spelled "
                    "out in full: a prefix such as --n-gpu is refused, naming the option it "
                    "was probably meant to be.",
    )
    parser.add_argument("--version", action="version", version=f"gpucheck {version}")
    parser.set_defaults(outputs=[])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    common = output_options()
    for name in (argv[0],) if argv and argv[0] in COMMANDS else COMMANDS:
        module = command_module(name)
        command_parser = sub.add_parser(name, help=module.HELP, description=module.HELP,
                                        parents=[common])
        module.add_arguments(command_parser)
        parser.command_parsers[name] = command_parser
    return parser


# --- the output options honoured: files written, the report shown -----------------

def outputs_of(args: argparse.Namespace) -> list[str]:
    """Every `-o` file, in order (`-o` may be given more than once)."""
    given = getattr(args, "outputs", None) or []
    single = getattr(args, "output", None)
    return list(given) if given else ([single] if single is not None else [])


def file_formats(requested: str | None, outputs: list[str]) -> dict[str, str]:
    """Each output file's format: one file, --format else its extension; several, each
    file's extension (--format for the others). UsageError when two -o name one file."""
    seen: dict[str, str] = {}
    for path in outputs:
        real = os.path.realpath(path)
        if real in seen:
            raise UsageError(f"-o {path} names the same file as -o {seen[real]}; give "
                             "each file once")
        seen[real] = path
    if len(outputs) <= 1:
        return {path: format_for(requested, path) for path in outputs}
    format_for(requested, None)  # an unknown --format is refused all the same
    return {path: (format_for(None, path) if Path(path).suffix.lower() in EXTENSIONS
                   else format_for(requested, path)) for path in outputs}


def emit(report: Report, fmt: str, output: str | list[str] | None, quiet: bool,
         console: Console, formats: dict[str, str] | None = None) -> None:
    """Write the report files (each in `formats`' format, else `fmt`) and show the report;
    a failed write still writes the others and shows it, then says where it went."""
    stream, color = console.stdout, console.color
    width = console.columns(stream)  # None off a terminal: files and pipes stay stable
    outputs = [output] if isinstance(output, str) else list(output or [])
    if not outputs:
        stream.write(encodable(render(report, fmt, color=fmt == "text" and color,
                                      width=width if fmt == "text" else None),
                               getattr(stream, "encoding", None)))
        stream.flush()
        return
    failed = write_files(report, {p: (formats or {}).get(p, fmt) for p in outputs})
    if not quiet:
        stream.write(encodable(render(report, "text", color=color, width=width),
                               getattr(stream, "encoding", None)))
        stream.flush()
    if failed:
        written = [p for p in outputs if p not in {f[0] for f in failed}]
        kept = ("the report is on stdout" if not quiet else
                "nothing was kept on stdout (-q)") + (
            f" and in {', '.join(written)}" if written else
            ("" if not quiet else ": rerun without -q or with another --output"))
        raise WriteError(f"{'; '.join(str(f[1]) for f in failed)}; {kept}") from None


def write_files(report: Report, formats: dict[str, str]) -> list[tuple[str, UsageError]]:
    """Each file atomically, in its format; the ones that failed, with why."""
    failed: list[tuple[str, UsageError]] = []
    rendered: dict[str, str] = {}  # one rendering per format
    for path, fmt in formats.items():
        if fmt not in rendered:
            rendered[fmt] = render(report, fmt)
        try:
            write_atomic(path, rendered[fmt])
        except UsageError as exc:  # WriteError, or the target turned into a FIFO
            failed.append((path, exc))
    return failed
