"""Command line: parse, run one command, render its report, pick the exit code.

Each command lives in `gpucheck.commands.<name>` (listed in
`gpucheck.commands.registry`) and provides `HELP`,
`add_arguments(parser)` and `run(args) -> Report | None` (None on a rank that
does not report, e.g. every rank but 0 under torchrun). Command modules are
imported only when chosen, so `gpucheck --help` never imports torch.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from gpucheck import __version__
from gpucheck.commands import registry
from gpucheck.commands.baseline_option import baseline_section, read_baseline_option
from gpucheck.distributed import terminal
from gpucheck.errors import Interrupted, UsageError, describe_stop, stop_signal
from gpucheck.escape import encodable
from gpucheck.escape import terminal as shown
from gpucheck.output import WriteError, check_writable, write_atomic
from gpucheck.render import format_for, render
from gpucheck.report import Report, Section, fail

EXIT_USAGE = registry.EXIT_USAGE
EXIT_INTERRUPTED = 130  # Ctrl-C; every stop signal N exits 128 + N (SIGTERM: 143)
# Signals that end a run like Ctrl-C does (SIGINT raises KeyboardInterrupt already).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """Every command's parser, or (given the command line) only its command's."""
    return registry.build_parser(__version__, argv)


def use_color(stream: TextIO) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set (no-color.org)."""
    return stream.isatty() and "NO_COLOR" not in os.environ


def terminal_width(stream: TextIO) -> int | None:
    """A terminal's own width, so text lines fit it; None off a terminal (the text
    renderer's fixed default keeps files and pipes stable)."""
    if not stream.isatty():
        return None
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError):
        return None


def emit(report: Report, fmt: str, output: str | None, quiet: bool,
         stream: TextIO | None = None) -> None:
    """Write the report file (if asked) and show the report on `stream`.

    A failed write (a full disk at the end of a long run) still shows the report on
    `stream` unless `quiet`, then raises WriteError saying where the report went."""
    stream = stream or sys.stdout
    width = terminal_width(stream)
    if output is None:
        stream.write(encodable(render(report, fmt, color=fmt == "text" and use_color(stream),
                                      width=width if fmt == "text" else None),
                               getattr(stream, "encoding", None)))
        stream.flush()
        return
    failed: WriteError | None = None
    try:
        write_atomic(output, render(report, fmt))
    except WriteError as exc:
        failed = exc
    if not quiet:
        stream.write(encodable(render(report, "text", color=use_color(stream), width=width),
                               getattr(stream, "encoding", None)))
        stream.flush()
    if failed is not None:
        kept = ("the report is on stdout only" if not quiet else
                "nothing was kept (-q): rerun without -q or with another --output")
        raise WriteError(f"{failed}; {kept}") from None


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser(sys.argv[1:] if argv is None else argv).parse_args(argv)
    except registry.BadOption as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    with signals_as_interrupts():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    module = registry.command_module(args.command)
    try:
        fmt = format_for(args.format, args.output)
        if args.output is not None:
            check_writable(args.output)
        baseline = read_baseline_option(args)
        terminal.configure(terminal.wanted(args.quiet))  # progress on stderr, rank 0 only
        report = module.run(args)
        if report is None:
            return 0
        if baseline is not None:
            report.add(baseline_section(report, baseline))
        emit(report, fmt, args.output, args.quiet)
    except UsageError as exc:
        # shown(): the message may quote a report file (its command, host, path).
        print(encodable(f"gpucheck {args.command}: error: {shown(exc)}",
                        getattr(sys.stderr, "encoding", None)), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        return _interrupted(module, args, stop_signal(exc))
    decide = getattr(module, "exit_code", None)  # a command with its own convention
    return decide(report, args) if decide is not None else report.exit_code(strict=args.strict)


@contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """For the block, SIGTERM and SIGHUP raise `Interrupted`, as Ctrl-C raises
    KeyboardInterrupt: a SLURM time limit, `timeout` or an eviction then ends the run
    the way Ctrl-C does (workers stopped, partial report kept, one line, exit 128+N)
    instead of killing the process on the spot."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set on the main thread
        return
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in STOP_SIGNALS:
        signal.signal(sig, _raise_interrupted)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def _interrupted(module: Any, args: argparse.Namespace, signum: signal.Signals) -> int:
    """Keep what was measured: the partial report in --output, with a FAIL saying how
    the run was stopped; one line on stderr; exit 128 + the signal (130, 143)."""
    how = describe_stop(signum)
    written = args.output is not None and _is_reporter() and _write_interrupted(
        module, args, signum)
    where = f"; partial report in {args.output}" if written else ""
    print(f"gpucheck {args.command}: {how}{shown(where)}", file=sys.stderr)
    return 128 + int(signum)


def _is_reporter() -> bool:
    """Only the reporting rank writes --output (under torchrun or srun every rank runs
    this command line with the same --output)."""
    from gpucheck.distributed.world import world_from_env

    try:
        world = world_from_env()
    except UsageError:
        return True
    return world is None or world.is_reporter


def _write_interrupted(module: Any, args: argparse.Namespace, signum: signal.Signals) -> bool:
    """The command's partial report (`partial_report(args)`, when it has one) plus the
    `<command>.interrupted` section; False when it cannot be written."""
    build = getattr(module, "partial_report", None)
    report = (build(args) if build is not None else None) or Report(command=args.command)
    report.add(interrupted_section(args.command, signum, partial=bool(report.sections)))
    try:
        write_atomic(args.output, render(report, format_for(args.format, args.output)))
    except UsageError:
        return False
    return True


def interrupted_section(command: str, signum: signal.Signals, partial: bool) -> Section:
    """The stop as a FAIL, in the shape of a failed run's section."""
    data = {"outcome": f"{describe_stop(signum)} before the run finished",
            "results_above": "partial: measured before the stop" if partial else "none"}
    hint = ("rerun to measure the rest" if signum == signal.SIGINT else
            "a time limit (SLURM --time, timeout) or an eviction stopped the run: allow "
            "more time or measure less, then rerun")
    return Section("interrupted", "Run stopped", data,
                   [fail(f"{command}.interrupted", data["outcome"], hint=hint)])
