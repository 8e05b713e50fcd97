"""Command line: parse, run one command (imported only when chosen), render its report,
pick the exit code."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from types import ModuleType

from gpucheck import __version__
from gpucheck.commands import registry
from gpucheck.commands.registry import emit, file_formats, outputs_of, write_files
from gpucheck.context import Console, RunContext, RunOptions
from gpucheck.errors import Interrupted, UsageError, describe_stop, stop_signal
from gpucheck.escape import encodable
from gpucheck.escape import terminal as shown
from gpucheck.output import check_writable
from gpucheck.render import format_for
from gpucheck.report import Report, Section, fail

EXIT_USAGE = registry.EXIT_USAGE
# Signals that end a run like Ctrl-C does (SIGINT raises KeyboardInterrupt already).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# The user's run directory (partial results, roster: gpucheck.distributed.progress).
RUN_DIR_VAR = "GPUCHECK_RUN_DIR"


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """Every command's parser, or (given the command line) only its command's."""
    return registry.build_parser(__version__, argv)


def main(argv: list[str] | None = None) -> int:
    """Run one command line; the exit code."""
    try:
        args = build_parser(sys.argv[1:] if argv is None else argv).parse_args(argv)
    except registry.BadOption as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    ctx = context(args, RunOptions(), dict(os.environ))
    from gpucheck.distributed.deadline import exit_after_abort

    with signals_as_interrupts():
        # A failed NCCL group aborted in this process: its report written, the process
        # ends through os._exit with the command's code (gpucheck.distributed.deadline).
        return exit_after_abort(lambda: ctx.session.aborted, lambda: _run(args, ctx))


def context(args: argparse.Namespace, options: RunOptions,
            environ: Mapping[str, str]) -> RunContext:
    """What the run is given: progress on a terminal stderr unless --quiet, the run
    directory (GPUCHECK_RUN_DIR) unless `options` name one, the launcher's variables."""
    console = Console.of_process(environ)  # the one read of the terminal
    options = replace(options, run_dir=options.run_dir or environ.get(RUN_DIR_VAR) or None,
                      show_progress=not args.quiet and console.stderr_tty)
    return RunContext(options, launcher_env=environ, console=console)


def _run(args: argparse.Namespace, ctx: RunContext) -> int:
    module = registry.command_module(args.command)
    try:
        outputs = outputs_of(args)
        formats = file_formats(args.format, outputs)
        fmt = format_for(args.format, outputs[0] if outputs else None)
        for path in outputs:
            check_writable(path)
        if ctx.options.run_dir is not None:
            from gpucheck.distributed.progress import checked_run_dir

            checked_run_dir(ctx.options.run_dir, RUN_DIR_VAR)
        baseline = None
        if getattr(args, "load_baseline", None) is not None:  # the load commands only
            from gpucheck.commands.launch import read_baseline_option

            baseline = read_baseline_option(args)
        report = module.run(args, ctx)
        if report is None:
            return 0
        if baseline is not None:
            from gpucheck.commands.launch import baseline_section

            report.add(baseline_section(report, baseline))
        add_log(report, ctx)
        emit(report, fmt, outputs, args.quiet, ctx.console, formats)
    except UsageError as exc:
        # shown(): the message may quote a report file (its command, host, path).
        print(encodable(f"gpucheck {args.command}: error: {shown(exc)}",
                        getattr(sys.stderr, "encoding", None)), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt as exc:
        return _interrupted(module, args, ctx, stop_signal(exc))
    # A command with its own convention (health, preflight, show).
    decide: Callable[[Report, argparse.Namespace], int] | None = getattr(module, "exit_code", None)
    return decide(report, args) if decide is not None else report.exit_code(strict=args.strict)


@contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """For the block, SIGTERM and SIGHUP raise `Interrupted` as Ctrl-C raises
    KeyboardInterrupt (a SLURM time limit ends the run as Ctrl-C does, partial report
    kept); a SIGHUP ignored (`nohup`) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set on the main thread
        return
    from gpucheck.errors import hangup_ignored

    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS if not hangup_ignored(sig)}
    for sig in previous:
        signal.signal(sig, _raise_interrupted)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def _interrupted(module: ModuleType, args: argparse.Namespace, ctx: RunContext,
                 signum: signal.Signals) -> int:
    """The partial report in --output, with a FAIL saying how the run was stopped; one
    line on stderr; exit 128 + the signal (130 for Ctrl-C, 143 for SIGTERM)."""
    written = bool(outputs_of(args)) and _is_reporter(ctx) and _write_interrupted(
        module, args, ctx, signum)
    where = f"; partial report in {', '.join(outputs_of(args))}" if written else ""
    print(f"gpucheck {args.command}: {describe_stop(signum)}{shown(where)}", file=sys.stderr)
    return 128 + int(signum)


def _is_reporter(ctx: RunContext) -> bool:
    """Only the reporting rank writes --output (every rank runs the same command line)."""
    from gpucheck.distributed.world import world_of

    try:
        world = world_of(ctx)
    except UsageError:
        return True
    return world is None or world.is_reporter


def _write_interrupted(module: ModuleType, args: argparse.Namespace, ctx: RunContext,
                       signum: signal.Signals) -> bool:
    """The command's `partial_report(args, ctx)` plus the `<command>.interrupted`
    section; False when it cannot be written."""
    build = getattr(module, "partial_report", None)
    report = (build(args, ctx) if build is not None else None) or Report(command=args.command)
    add_log(report, ctx)
    report.add(interrupted_section(args.command, signum, partial=bool(report.sections)))
    try:
        formats = file_formats(args.format, outputs_of(args))
    except UsageError:
        return False
    return not write_files(report, formats)


def add_log(report: Report, ctx: RunContext) -> None:
    """Library warnings caught on the ranks (gpucheck.distributed.progress): a `log`
    section, data only (a FutureWarning is no verdict)."""
    if not ctx.warnings:
        return
    from gpucheck.distributed.progress import log_rows

    rows = log_rows(ctx.warnings)
    if rows:
        report.add(Section("log", "Warnings from libraries (caught, not printed)",
                           {"warnings": rows}))


def interrupted_section(command: str, signum: signal.Signals, partial: bool) -> Section:
    """The stop as a FAIL, in the shape of a failed run's section."""
    data = {"outcome": f"{describe_stop(signum)} before the run finished",
            "results_above": "partial: measured before the stop" if partial else "none"}
    hint = ("rerun to measure the rest" if signum == signal.SIGINT else
            "a time limit (SLURM --time, timeout) or an eviction stopped the run: allow "
            "more time or measure less, then rerun")
    return Section("interrupted", "Run stopped", data,
                   [fail(f"{command}.interrupted", data["outcome"], hint=hint)])
