"""One progress bar, on rank 0 only, reused for the warm-up and the timed loop
(`gpucheck.distributed.progress`: stderr, a terminal, no --quiet)."""

from __future__ import annotations

from types import TracebackType

from gpucheck.context import Console
from gpucheck.distributed import progress


class Progress:
    """`bench: warm-up` then `bench: timed`, counting batches; nothing without a console."""

    def __init__(self, console: Console | None) -> None:
        self._console = console  # None: no bar
        self._bar: progress.Bar | None = None

    def __enter__(self) -> Progress:
        if self._console is not None:
            self._bar = progress.Bar("bench", 0, "batch", self._console)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.close()

    def start(self, phase: str, total: int) -> None:
        if self._bar is not None:
            self._bar.restart(phase, total)

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.advance()
