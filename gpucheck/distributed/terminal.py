"""What the person at the terminal sees while a command runs: one line per step and a
tqdm bar where there is a count, on stderr, from the reporting rank only, and only on a
terminal without --quiet (decided once by the CLI; docs/DESIGN.md)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gpucheck.context import Console, RunContext
from gpucheck.escape import terminal as shown


def wanted(quiet: bool, console: Console) -> bool:
    """Whether a command run with `quiet` on this console should show progress."""
    return not quiet and console.stderr_tty


def enabled(ctx: RunContext) -> bool:
    """Progress is on and this process reports: the launcher, one rank alone, or rank 0
    of a job launched by torchrun or srun (the other ranks would repeat it)."""
    if not ctx.options.show_progress:
        return False
    from gpucheck.distributed.world import world_of
    from gpucheck.errors import UsageError

    try:
        world = world_of(ctx)
    except UsageError:
        return False  # the command itself says what is wrong with the environment
    return world is None or world.is_reporter


def say(ctx: RunContext, text: str) -> None:
    """One line of progress (above any open bar)."""
    if not enabled(ctx):
        return
    text = shown(text)  # a step can name a host or a file: shown, never obeyed
    if not (ctx.bars and ctx.bars[-1].write_above(text)):
        print(text, file=ctx.console.stderr, flush=True)


def step(ctx: RunContext, text: str) -> None:
    """Name what the innermost open bar is doing now (`gemm bf16 8192^3`)."""
    if ctx.bars:
        ctx.bars[-1].describe(text)


class Bar:
    """A tqdm bar `label: what it does now`, counting `unit`s; inert when progress is off
    (`show` False: tqdm is not even imported then)."""

    def __init__(self, label: str, total: int | None, unit: str,
                 console: Console | None) -> None:
        self.label = label
        self.tqdm: Any = None
        self.stderr = console.stderr if console else None
        if console is not None:
            from tqdm import tqdm

            # A terminal that reports no size (a bare pseudo-terminal: 0 columns) would
            # get an empty bar; it gets 80 columns instead.
            fixed = None if console.columns(console.stderr) else 80
            self.tqdm = tqdm(total=total, unit=unit, leave=False, file=console.stderr,
                             desc=label, ncols=fixed, dynamic_ncols=fixed is None)

    def write_above(self, text: str) -> bool:
        """A line above the bar; False when the bar is inert."""
        if self.tqdm is not None:
            self.tqdm.write(text, file=self.stderr)
        return self.tqdm is not None

    def describe(self, text: str) -> None:
        if self.tqdm is not None:
            self.tqdm.set_description(f"{self.label}: {text}")

    def restart(self, text: str, total: int | None) -> None:
        """Count again from zero, for a new phase (bench's warm-up, then timed loop)."""
        if self.tqdm is not None:
            self.tqdm.reset(total=total)
            self.describe(text)

    def advance(self, count: int = 1) -> None:
        if self.tqdm is not None:
            self.tqdm.update(count)

    def close(self) -> None:
        if self.tqdm is not None:
            self.tqdm.close()
            self.tqdm = None


@contextmanager
def bar(ctx: RunContext, label: str, total: int | None = None,
        unit: str = "it") -> Iterator[Bar]:
    """An open bar for the block; `step` names its current step."""
    opened = Bar(label, total, unit, ctx.console if enabled(ctx) else None)
    ctx.bars.append(opened)
    try:
        yield opened
    finally:
        ctx.bars.remove(opened)
        opened.close()


@contextmanager
def timed(ctx: RunContext, label: str, seconds: float, tick_s: float = 1.0) -> Iterator[Bar]:
    """A bar of `seconds` that counts the block's own seconds while it runs (a burn-in
    is one long call: without it the outer bar, ETA included, stands still)."""
    with bar(ctx, label, max(1, round(seconds)), "s") as opened:
        if opened.tqdm is None:
            yield opened
            return
        done = threading.Event()
        ticker = threading.Thread(target=_tick, args=(opened, done, tick_s), daemon=True)
        ticker.start()
        try:
            yield opened
        finally:
            done.set()
            ticker.join(timeout=5 * tick_s)


def _tick(opened: Bar, done: threading.Event, tick_s: float) -> None:
    """One unit per tick until the block ends or the bar is full (a burn-in ends at the
    first chunk boundary after its deadline: it may run a little over)."""
    total = opened.tqdm.total if opened.tqdm is not None else 0
    while not done.wait(tick_s):
        bar_now = opened.tqdm
        if bar_now is None or bar_now.n >= total:
            return
        bar_now.update(1)
