"""Test-only model hooks for `gpucheck bench`, given as `Plant(model=...)`
(tests/plant.py; `tests/hooked.py --model bench_workers:<function>` in a subprocess).

Each hook is called on every rank as hook(model, rank) before DDP wraps the model,
so every rank wraps the same way (DDP checks that) and only the forward differs.
Nothing in gpucheck imports this module; only tests pass its functions.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

SLOW_RANK = 1
SLEEP_S = 0.1  # busy CPU time per forward: several times a small model's iteration


class _RankBehaviour(nn.Module):
    """The wrapped model, slowed down and/or made wrong on chosen ranks."""

    def __init__(self, inner: nn.Module, sleep_s: float, wrong: bool) -> None:
        super().__init__()
        self.inner = inner
        self.sleep_s = sleep_s
        self.wrong = wrong

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        if self.sleep_s:
            _spend(self.sleep_s, batch.is_cuda)  # a slow device: same work, more time
        out = self.inner(batch)
        return out * 1.5 + 1.0 if self.wrong else out  # a GPU computing wrong answers


def _spend(seconds: float, on_gpu: bool) -> None:
    """Time a slow device would take. CPU ranks are timed in CPU time (docs/bench.md,
    "Stragglers"), so on CPU the extra time is busy work, not a sleep."""
    if on_gpu:
        time.sleep(seconds)
        return
    until = time.process_time() + seconds
    while time.process_time() < until:
        pass


def slow_rank_one(model: nn.Module, rank: int) -> nn.Module:
    return _RankBehaviour(model, SLEEP_S if rank == SLOW_RANK else 0.0, wrong=False)


def slow_rank_one_wrong_rank_zero(model: nn.Module, rank: int) -> nn.Module:
    return _RankBehaviour(model, SLEEP_S if rank == SLOW_RANK else 0.0, wrong=rank == 0)


class _Broken(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("simulated device fault in forward")


def fail_rank_zero(model: nn.Module, rank: int) -> nn.Module:
    return _Broken(model) if rank == 0 else model


SLOWDOWN = 0.15


class _Slowed(nn.Module):
    """A rank slower by a fixed fraction in every iteration: after the real forward, as
    much extra work as `fraction` of it. On CPU the extra is busy work measured in the
    process's CPU time: a sleep would hand the core to the other processes, and the
    scheduler's wake-up credit then speeds up this rank's next forward, hiding most of
    the slowdown on a loaded machine. On a GPU the host waits for the kernels and then
    sleeps (the GPU stays idle, as a slower GPU would leave the next launch waiting)."""

    def __init__(self, inner: nn.Module, fraction: float) -> None:
        super().__init__()
        self.inner = inner
        self.fraction = fraction

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        if not self.fraction:
            return self.inner(batch)
        if batch.is_cuda:
            started = time.perf_counter()
            out = self.inner(batch)
            torch.cuda.synchronize(batch.device)
            time.sleep(self.fraction * (time.perf_counter() - started))
            return out
        started = time.process_time()
        out = self.inner(batch)
        until = time.process_time() + self.fraction * (time.process_time() - started)
        while time.process_time() < until:
            pass
        return out


def slow_rank_one_by_15_percent(model: nn.Module, rank: int) -> nn.Module:
    return _Slowed(model, SLOWDOWN if rank == SLOW_RANK else 0.0)


def slow_rank_zero_by_15_percent(model: nn.Module, rank: int) -> nn.Module:
    return _Slowed(model, SLOWDOWN if rank == 0 else 0.0)


def wrong_rank_zero(model: nn.Module, rank: int) -> nn.Module:
    return _RankBehaviour(model, 0.0, wrong=rank == 0)


THROTTLE_SCRIPT = str(Path(__file__).with_name("throttle.py"))


def _throttled(model: nn.Module, share: float) -> nn.Module:
    """A rank whose host does not run it part of the time: tests/throttle.py stops this
    process from outside for `share` of the time it lets it run (as a CPU quota would),
    so the rank computes as fast as the others, in CPU time, and its wall time is longer
    by up to `share` (less on a loaded machine, where the scheduler gives a stopped
    process back part of its turn). The helper ends when this process does."""
    if share:
        period = os.environ.get(THROTTLE_PERIOD_VAR)
        # Without the plant: planting imports gpucheck and torch, seconds in which the
        # helper would not yet throttle anything.
        env = {k: v for k, v in os.environ.items() if k != "GPUCHECK_TEST_PLANT"}
        subprocess.Popen([sys.executable, THROTTLE_SCRIPT, str(os.getpid()), str(share),
                          *([period] if period else [])],
                         stdin=subprocess.DEVNULL, close_fds=True, env=env)
    return model


# benchmarks/straggler_noise.py: the share for the two hooks below, and the stall's grain
# (the period of one run and one stop, seconds; default tests/throttle.py's RUN_S run).
THROTTLE_SHARE_VAR = "GPUCHECK_TEST_THROTTLE_SHARE"
THROTTLE_PERIOD_VAR = "GPUCHECK_TEST_THROTTLE_PERIOD"


def _throttle_share() -> float:
    return float(os.environ.get(THROTTLE_SHARE_VAR) or SLOWDOWN)


def throttle_rank_one_by_15_percent(model: nn.Module, rank: int) -> nn.Module:
    return _throttled(model, _throttle_share() if rank == SLOW_RANK else 0.0)


def throttle_rank_zero_by_15_percent(model: nn.Module, rank: int) -> nn.Module:
    return _throttled(model, _throttle_share() if rank == 0 else 0.0)


def stop_rank_one_most_of_the_time(model: nn.Module, rank: int) -> nn.Module:
    """Stopped three times as long as it is let run (300 ms every 100 ms): four times the
    wall time on a quiet machine, and still far behind on a loaded one, where a short
    stop costs a rank that gets a small share of a core little (the scheduler gives a
    task back some of the turn it missed). For tests that must name it whatever the
    load."""
    return _throttled(model, 3.0 if rank == SLOW_RANK else 0.0)


class _FailsLater(nn.Module):
    """Fails `after_s` seconds into the timed loop (clock from the second forward: the
    first is the warm-up of a --warmup 1 run), as a GPU that dies mid-run."""

    def __init__(self, inner: nn.Module, after_s: float) -> None:
        super().__init__()
        self.inner = inner
        self.after_s = after_s
        self.calls = 0
        self.started = 0.0

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 2:
            self.started = time.monotonic()
        if self.calls > 2 and time.monotonic() - self.started > self.after_s:
            raise RuntimeError("simulated device fault in the timed loop")
        return self.inner(batch)


def fail_rank_one_in_the_timed_loop(model: nn.Module, rank: int) -> nn.Module:
    return _FailsLater(model, 1.5) if rank == 1 else model


class _StallsAt(nn.Module):
    """Sleeps `stall_s` in chosen forward calls (1: the first call): a rank its host
    does not run for one long stretch, at known moments (no CPU time spent: the host
    kind). With --warmup 1 --iters N, call 1 is the warm-up, calls 2..N+1 the timed loop
    and N+2..2N+1 its second look when one is run."""

    def __init__(self, inner: nn.Module, calls: frozenset[int], stall_s: float) -> None:
        super().__init__()
        self.inner = inner
        self.stall_calls = calls
        self.stall_s = stall_s
        self.calls = 0

    def forward(self, batch: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls in self.stall_calls:
            time.sleep(self.stall_s)
        return self.inner(batch)


STALL_S = 1.0
STALLED_ITERS = 6  # the runs these hooks are for: --warmup 1 --iters 6


def stall_rank_one_once_in_each_loop(model: nn.Module, rank: int) -> nn.Module:
    """One 1 s stall in the middle of the timed loop and one in its second look: a
    stall that recurs (a neighbour or a loader on a long period)."""
    middle = 2 + STALLED_ITERS // 2
    calls = frozenset({middle, middle + STALLED_ITERS}) if rank == SLOW_RANK else frozenset()
    return _StallsAt(model, calls, STALL_S)
