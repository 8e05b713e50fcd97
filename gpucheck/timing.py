"""The one timer: marks on a rank's timeline (CUDA events on the stream, read after one
synchronisation, so the host's launch overhead is not counted; on CPU, or `host=True`,
the wall and CPU clocks), and timed loops that keep every iteration's time."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck.distributed.deadline import settle, synchronize
from gpucheck.stats import percentile

Step = Callable[[int], None]  # runs iteration i (launches it, on a GPU)


class Marks:
    """`begin` where a segment starts, `mark` where an iteration ends; `points` events
    made before the loop, more as needed."""

    def __init__(self, device: str, points: int = 0, *, host: bool = False) -> None:
        self.device = device
        self.cuda = device == "cuda" and not host
        self.events: list[Any] = [_event() for _ in range(points)] if self.cuda else []
        self.ends_iteration: list[bool] = []  # per mark: False where a segment begins
        self.cpu_s: list[float] = []
        self.wall_s: list[float] = []
        self.done = 0  # marks known complete (`completed`)

    def begin(self) -> None:
        self._point(ends_iteration=False)

    def mark(self) -> None:
        self._point(ends_iteration=True)

    def _point(self, ends_iteration: bool) -> None:
        if self.cuda:
            if len(self.ends_iteration) == len(self.events):
                self.events.append(_event())
            self.events[len(self.ends_iteration)].record()
        elif ends_iteration:  # the wall clock innermost: no other clock read in a span
            self.wall_s.append(time.perf_counter())
            self.cpu_s.append(time.process_time())
        else:
            self.cpu_s.append(time.process_time())
            self.wall_s.append(time.perf_counter())
        self.ends_iteration.append(ends_iteration)

    def completed(self) -> int:
        """How many marks have happened (a stream completes its events in order)."""
        if not self.cuda:
            return len(self.ends_iteration)
        while self.done < len(self.ends_iteration) and self.events[self.done].query():
            self.done += 1
        return self.done

    def ended(self) -> bool:
        return self.completed() == len(self.ends_iteration)

    def wait(self, wait_s: float, what: str) -> None:
        """Until the last mark (host marks: the device's work) is reached, under
        gpucheck's deadline."""
        if self.cuda:
            settle([], wait_s, what, done=self.ended)
        else:
            synchronize(self.device, wait_s, what)

    def span_s(self) -> float:  # from the first mark to the last
        return self._elapsed_ms(0, len(self.ends_iteration) - 1, self.wall_s) / 1e3

    def intervals_s(self) -> list[float]:  # each iteration's, from the mark before it
        return [self._elapsed_ms(i - 1, i, self.wall_s) / 1e3
                for i in range(1, len(self.ends_iteration))]

    def read_ms(self, points: int | None = None) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(each iteration's device ms, its end in ms from the first mark) over the first
        `points` marks; on CPU the device time is the process's CPU time (docs/bench.md)."""
        took, ends = [], []
        for index in range(1, points if points is not None else len(self.ends_iteration)):
            if self.ends_iteration[index]:
                took.append(self._elapsed_ms(index - 1, index, self.cpu_s))
                ends.append(self._elapsed_ms(0, index, self.wall_s))
        return tuple(took), tuple(ends)

    def read_wall_ms(self) -> tuple[float, ...]:
        """CPU: each iteration's wall time (gpucheck.bench.pace); empty on a GPU, whose
        events already give its timeline."""
        if self.cuda:
            return ()
        return tuple((self.wall_s[i] - self.wall_s[i - 1]) * 1e3
                     for i in range(1, len(self.ends_iteration)) if self.ends_iteration[i])

    def _elapsed_ms(self, first: int, last: int, clock: list[float]) -> float:
        if last <= first:
            return 0.0
        if self.cuda:
            self.events[last].synchronize()  # at once when it is already complete
            return float(self.events[first].elapsed_time(self.events[last]))
        return (clock[last] - clock[first]) * 1e3


def _event() -> Any:
    import torch

    return torch.cuda.Event(enable_timing=True)


@dataclass(frozen=True)
class LoopStats:
    """A timed batch: its iterations' times summarised (seconds)."""

    iters: int
    total_s: float
    p50_s: float
    p99_s: float
    max_s: float


def summarise(times_s: Sequence[float]) -> LoopStats:
    return LoopStats(iters=len(times_s), total_s=float(sum(times_s)),
                     p50_s=percentile(times_s, 50), p99_s=percentile(times_s, 99),
                     max_s=float(max(times_s)))


def warm_up(step: Step, device: str, warmup_s: float) -> float:
    """Run `step` untimed for about `warmup_s` (at least twice); seconds per iteration
    of the last batch, once caches, clocks and library heuristics have settled."""
    batch, started, per_iter = 1, time.perf_counter(), 0.0
    step(0)  # the first call pays for set-up (cuBLAS handles, oneDNN kernels)
    synchronize(device)
    while True:
        begun = time.perf_counter()
        for i in range(batch):
            step(i)
        synchronize(device)
        per_iter = (time.perf_counter() - begun) / batch
        if time.perf_counter() - started >= warmup_s:
            return per_iter
        batch = min(batch * 2, 1024)


def timed_batch(step: Step, iters: int, device: str) -> list[float]:
    """Each iteration's seconds: back to back, a mark between iterations, one sync."""
    marks = Marks(device)
    marks.mark()
    for i in range(iters):
        step(i)
        marks.mark()
    return marks.intervals_s()


def timed_window(step: Step, device: str, warmup_s: float, window_s: float,
                 low: int = 5, high: int = 5000) -> list[float]:
    """Warm up, then time as many iterations as fill about `window_s` seconds."""
    per_iter = warm_up(step, device, warmup_s)
    iters = high if per_iter <= 0 else int(min(high, max(low, round(window_s / per_iter))))
    return timed_batch(step, iters, device)
