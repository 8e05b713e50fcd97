"""Command line: parse, run one command, render its report, pick the exit code.

Each command lives in `gpucheck.commands.<name>` (listed in
`gpucheck.commands.registry`) and provides `HELP`,
`add_arguments(parser)` and `run(args, ctx) -> Report | None` (None on a rank that
does not report, e.g. every rank but 0 under torchrun). `ctx` (gpucheck.context) holds
what the run is given; `main` gives the defaults, tests call `program` with theirs.
Command modules are imported only when chosen, so `gpucheck --help` never imports torch.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from gpucheck import __version__
from gpucheck.commands import registry
from gpucheck.commands.baseline_option import baseline_section, read_baseline_option
from gpucheck.context import RunContext, RunOptions
from gpucheck.distributed import caught, progress, terminal
from gpucheck.distributed.deadline import exit_after_abort
from gpucheck.errors import Interrupted, UsageError, describe_stop, stop_signal
from gpucheck.escape import encodable
from gpucheck.escape import terminal as shown
from gpucheck.interrupts import hangup_ignored
from gpucheck.output import WriteError, check_writable, write_atomic
from gpucheck.render import EXTENSIONS, format_for, render
from gpucheck.report import Report, Section, fail

EXIT_USAGE = registry.EXIT_USAGE
EXIT_INTERRUPTED = 130  # Ctrl-C; every stop signal N exits 128 + N (SIGTERM: 143)
# Signals that end a run like Ctrl-C does (SIGINT raises KeyboardInterrupt already).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# The user's setting to keep the job's run directory (partial results, roster,
# diagnoses: gpucheck.distributed.progress), read here once into RunOptions.run_dir.
RUN_DIR_VAR = "GPUCHECK_RUN_DIR"


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
        columns = os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError):
        return None
    return columns or None  # a pty that reports 0 columns does not know its width


def outputs_of(args: argparse.Namespace) -> list[str]:
    """Every `-o` file, in order (`-o` may be given more than once)."""
    given = getattr(args, "outputs", None) or []
    single = getattr(args, "output", None)
    return list(given) if given else ([single] if single is not None else [])


def file_formats(requested: str | None, outputs: list[str]) -> dict[str, str]:
    """Each output file's format. One file: --format, else its extension (as ever).
    Several: each file's extension, --format only for a file whose extension names no
    format. UsageError when two -o name one file."""
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
         stream: TextIO | None = None, formats: dict[str, str] | None = None) -> None:
    """Write the report files (if asked) and show the report on `stream`.

    `formats`: each file's format (`file_formats`), else `fmt` for all. A failed write
    (a full disk at the end of a long run) still writes the other files and shows the
    report on `stream` unless `quiet`, then raises WriteError saying where it went."""
    stream = stream or sys.stdout
    width = terminal_width(stream)
    outputs = [output] if isinstance(output, str) else list(output or [])
    if not outputs:
        stream.write(encodable(render(report, fmt, color=fmt == "text" and use_color(stream),
                                      width=width if fmt == "text" else None),
                               getattr(stream, "encoding", None)))
        stream.flush()
        return
    failed = _write_files(report, {p: (formats or {}).get(p, fmt) for p in outputs})
    if not quiet:
        stream.write(encodable(render(report, "text", color=use_color(stream), width=width),
                               getattr(stream, "encoding", None)))
        stream.flush()
    if failed:
        written = [p for p in outputs if p not in {f[0] for f in failed}]
        kept = ("the report is on stdout" if not quiet else
                "nothing was kept on stdout (-q)") + (
            f" and in {', '.join(written)}" if written else
            ("" if not quiet else ": rerun without -q or with another --output"))
        raise WriteError(f"{'; '.join(str(f[1]) for f in failed)}; {kept}") from None


def _write_files(report: Report, formats: dict[str, str]) -> list[tuple[str, UsageError]]:
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


def main(argv: list[str] | None = None) -> int:
    return program(argv, RunOptions())


def program(argv: list[str] | None, options: RunOptions) -> int:
    """Run one command line with `options` (tests pass their hooks here); the exit code."""
    try:
        args = build_parser(sys.argv[1:] if argv is None else argv).parse_args(argv)
    except registry.BadOption as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    ctx = context(args, options, dict(os.environ))
    with signals_as_interrupts():
        # A failed NCCL group aborted in this process: its report written, the process
        # ends through os._exit with the command's code (gpucheck.distributed.deadline).
        return exit_after_abort(lambda: ctx.session.aborted, lambda: _run(args, ctx))


def context(args: argparse.Namespace, options: RunOptions,
            environ: Mapping[str, str]) -> RunContext:
    """What the run is given, read once here: progress on stderr when it is a terminal
    and no --quiet (shown by the ranks gpucheck starts too), the user's run directory
    (GPUCHECK_RUN_DIR) unless `options` name one, and the environment whose launcher
    variables place this process in a job."""
    options = replace(options, run_dir=options.run_dir or environ.get(RUN_DIR_VAR) or None,
                      show_progress=terminal.wanted(args.quiet))
    return RunContext(options, launcher_env=environ)


def _run(args: argparse.Namespace, ctx: RunContext) -> int:
    module = registry.command_module(args.command)
    try:
        outputs = outputs_of(args)
        formats = file_formats(args.format, outputs)
        fmt = format_for(args.format, outputs[0] if outputs else None)
        for path in outputs:
            check_writable(path)
        progress.checked_run_dir(ctx.options.run_dir, RUN_DIR_VAR)
        baseline = read_baseline_option(args)
        report = module.run(args, ctx)
        if report is None:
            return 0
        if baseline is not None:
            report.add(baseline_section(report, baseline))
        add_log(report, ctx)
        emit(report, fmt, outputs, args.quiet, formats=formats)
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
    """For the block, SIGTERM and SIGHUP raise `Interrupted`, as Ctrl-C raises
    KeyboardInterrupt: a SLURM time limit, `timeout` or an eviction then ends the run
    the way Ctrl-C does (workers stopped, partial report kept, one line, exit 128+N)
    instead of killing the process on the spot; a SIGHUP ignored (`nohup`) stays so."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set on the main thread
        return
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


def _interrupted(module: Any, args: argparse.Namespace, ctx: RunContext,
                 signum: signal.Signals) -> int:
    """Keep what was measured: the partial report in --output, with a FAIL saying how
    the run was stopped; one line on stderr; exit 128 + the signal (130, 143)."""
    how = describe_stop(signum)
    written = bool(outputs_of(args)) and _is_reporter(ctx) and _write_interrupted(
        module, args, ctx, signum)
    where = f"; partial report in {', '.join(outputs_of(args))}" if written else ""
    print(f"gpucheck {args.command}: {how}{shown(where)}", file=sys.stderr)
    return 128 + int(signum)


def _is_reporter(ctx: RunContext) -> bool:
    """Only the reporting rank writes --output (under torchrun or srun every rank runs
    this command line with the same --output)."""
    from gpucheck.distributed.world import world_of

    try:
        world = world_of(ctx)
    except UsageError:
        return True
    return world is None or world.is_reporter


def _write_interrupted(module: Any, args: argparse.Namespace, ctx: RunContext,
                       signum: signal.Signals) -> bool:
    """The command's partial report (`partial_report(args, ctx)`, when it has one) plus the
    `<command>.interrupted` section; False when it cannot be written."""
    build = getattr(module, "partial_report", None)
    report = (build(args, ctx) if build is not None else None) or Report(command=args.command)
    add_log(report, ctx)
    report.add(interrupted_section(args.command, signum, partial=bool(report.sections)))
    try:
        formats = file_formats(args.format, outputs_of(args))
    except UsageError:
        return False
    return not _write_files(report, formats)


def add_log(report: Report, ctx: RunContext) -> None:
    """The warnings libraries raised on the ranks (gpucheck.distributed.caught), caught
    instead of printed: a `log` section, data only (a FutureWarning is no verdict)."""
    rows = caught.log_rows(ctx.warnings)
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
