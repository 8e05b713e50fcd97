"""Marks on a rank's timeline during the timed loop: each iteration's device time, where
it ended, and (CPU ranks) its wall time (docs/bench.md, "Stragglers")."""

from __future__ import annotations

import time
from typing import Any


class IterationMarks:
    """Marks on the rank's timeline: `begin` where a segment starts, `mark` where an
    iteration ends. On a GPU a CUDA event recorded on the stream (all created before
    the loop, read after it): the device's time per iteration and its timeline. On CPU
    the process's CPU time gives the device time (a core shared with another process
    does not make the rank's computation slower; docs/bench.md, "Stragglers") and
    perf_counter the timeline."""

    def __init__(self, device: str, points: int) -> None:
        self.events: list[Any] = []
        if device == "cuda":
            import torch

            self.events = [torch.cuda.Event(enable_timing=True) for _ in range(points)]
        self.ends_iteration: list[bool] = []  # per mark: False where a segment begins
        self.cpu_s: list[float] = []
        self.wall_s: list[float] = []
        self.done = 0  # marks known complete (`completed`)

    def begin(self) -> None:
        self._point(ends_iteration=False)

    def mark(self) -> None:
        self._point(ends_iteration=True)

    def _point(self, ends_iteration: bool) -> None:
        if self.events:
            self.events[len(self.ends_iteration)].record()
        else:
            self.cpu_s.append(time.process_time())
            self.wall_s.append(time.perf_counter())
        self.ends_iteration.append(ends_iteration)

    def completed(self) -> int:
        """How many marks have happened: on a GPU the leading events already complete
        (a stream completes them in order; `query` never waits)."""
        if not self.events:
            return len(self.ends_iteration)
        while self.done < len(self.ends_iteration) and self.events[self.done].query():
            self.done += 1
        return self.done

    def read_ms(self, points: int | None = None) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(each iteration's device ms, each one's end in ms from the first mark), over
        the first `points` marks (default all); on a GPU those must be complete
        (`completed`, or after the device is synchronised)."""
        took, ends = [], []
        for index in range(1, points if points is not None else len(self.ends_iteration)):
            if self.ends_iteration[index]:
                took.append(self._elapsed_ms(index - 1, index, self.cpu_s))
                ends.append(self._elapsed_ms(0, index, self.wall_s))
        return tuple(took), tuple(ends)

    def read_wall_ms(self) -> tuple[float, ...]:
        """CPU: each iteration's wall time, from the mark before it (its segment's start
        or the previous iteration's end) to its end: with the CPU time, it tells a rank
        that computed slower from one its host did not run (gpucheck.bench.pace). Empty
        on a GPU: the host runs ahead of the device, and the events already give the
        device's own timeline."""
        if self.events:
            return ()
        return tuple((self.wall_s[i] - self.wall_s[i - 1]) * 1e3
                     for i in range(1, len(self.ends_iteration)) if self.ends_iteration[i])

    def _elapsed_ms(self, first: int, last: int, clock: list[float]) -> float:
        """Between two marks: the events' time on a GPU, else `clock`'s."""
        if self.events:
            return float(self.events[first].elapsed_time(self.events[last]))
        return (clock[last] - clock[first]) * 1e3
