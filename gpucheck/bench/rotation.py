"""CPU ranks take turns on the node's cores during the timed loop, in lockstep off the
host's monotonic clock, so a core its host slows weighs on every rank alike
(docs/bench.md, "Stragglers"). GPU ranks never rotate."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

from gpucheck.numa import cpulist

# Short against an iteration (about 0.5 s for ResNet50 on a core) so that each one
# sees every block about equally; long against a migration (a few microseconds, and a
# refill of the core's caches).
PERIOD_S = 0.05


@dataclass(frozen=True)
class RotationPlan:
    """Which block of cores this rank runs on at any moment."""

    blocks: tuple[tuple[int, ...], ...]
    slot: int  # this rank's block in period 0: its local rank
    period_s: float = PERIOD_S

    def block_at(self, monotonic_s: float) -> tuple[int, ...]:
        period = int(monotonic_s // self.period_s)
        return self.blocks[(self.slot + period) % len(self.blocks)]

    def next_switch(self, monotonic_s: float) -> float:
        return (int(monotonic_s // self.period_s) + 1) * self.period_s

    def describe(self) -> str:
        """"cpus 0-1 in 2 blocks of 1, every 50 ms"."""
        every = sorted(c for block in self.blocks for c in block)
        return (f"cpus {cpulist(tuple(every))} in {len(self.blocks)} blocks of "
                f"{len(self.blocks[0])}, every {self.period_s * 1e3:.0f} ms")


def plan_rotation(allowed: Sequence[int], local_rank: int, local_world_size: int,
                  node_cpu_sets: Sequence[str | None]) -> RotationPlan | None:
    """The plan for a CPU rank; None with one rank on the node, fewer cores than ranks,
    or ranks bound to different CPUs by a launcher."""
    if local_world_size < 2 or len(set(node_cpu_sets)) != 1 or None in node_cpu_sets:
        return None
    size = len(allowed) // local_world_size
    if size < 1:
        return None
    cpus = sorted(allowed)
    blocks = tuple(tuple(cpus[i * size:(i + 1) * size]) for i in range(local_world_size))
    return RotationPlan(blocks, local_rank)


class CoreRotation:
    """While active, a thread moves every thread of this process to the plan's block at
    each switch; on exit they get their CPUs back. No plan: does nothing."""

    def __init__(self, plan: RotationPlan | None) -> None:
        self.plan = plan
        self.switches = 0
        self._allowed: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> CoreRotation:
        if self.plan is not None:
            self._allowed = os.sched_getaffinity(0)
            self._move_to(self.plan.block_at(time.monotonic()))
            self._thread = threading.Thread(target=self._run, name="gpucheck-core-rotation",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._move_to(tuple(self._allowed))

    def _run(self) -> None:
        assert self.plan is not None
        while not self._stop.wait(max(0.0, self.plan.next_switch(time.monotonic())
                                      - time.monotonic())):
            self._move_to(self.plan.block_at(time.monotonic()))

    def _move_to(self, cpus: Sequence[int]) -> None:
        for tid in _thread_ids():
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:  # the thread ended since it was listed
                continue
        self.switches += 1


def _thread_ids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: this thread alone (pid 0 is the calling thread)
        return [0]
