"""Timed loops that keep every iteration's time, on GPU and CPU alike.

On a GPU the host only launches work; a timestamp is a CUDA event recorded on the
stream between two iterations, and all of them are read after ONE synchronisation
at the end of the batch, so the GPU runs the iterations back to back and the
host's launch overhead is not counted. On CPU a timestamp is `time.perf_counter()`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck.stats import percentile

__all__ = ["LoopStats", "Marks", "Step", "iterations_for", "percentile", "summarise",
           "synchronize", "timed_batch", "timed_window", "warm_up"]

Step = Callable[[int], None]  # runs iteration i (launches it, on a GPU)


@dataclass(frozen=True)
class LoopStats:
    """A timed batch: its iterations' times summarised (seconds)."""

    iters: int
    total_s: float
    p50_s: float
    p99_s: float
    max_s: float

    @property
    def mean_s(self) -> float:
        return self.total_s / self.iters


def summarise(times_s: Sequence[float]) -> LoopStats:
    return LoopStats(iters=len(times_s), total_s=float(sum(times_s)),
                     p50_s=percentile(times_s, 50), p99_s=percentile(times_s, 99),
                     max_s=float(max(times_s)))


class Marks:
    """Timestamps between iterations; `intervals_s()` reads them (one sync on a GPU)."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"
        self.stamps: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.stamps.append(event)
        else:
            self.stamps.append(time.perf_counter())

    def intervals_s(self) -> list[float]:
        if not self.cuda:
            return [b - a for a, b in zip(self.stamps, self.stamps[1:], strict=False)]
        if self.stamps:
            self.stamps[-1].synchronize()
        return [a.elapsed_time(b) / 1000 for a, b in zip(self.stamps, self.stamps[1:],
                                                        strict=False)]


def synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


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


def iterations_for(window_s: float, per_iter_s: float, low: int, high: int) -> int:
    """How many iterations fill `window_s`, within [low, high]."""
    if per_iter_s <= 0:
        return high
    return int(min(high, max(low, round(window_s / per_iter_s))))


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
    return timed_batch(step, iterations_for(window_s, per_iter, low, high), device)
