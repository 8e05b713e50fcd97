"""The hard budget: every check starts only when every rank agrees there is time left
for it, and no collective may wait past the budget's end.

The ranks' clocks start together (right after the process group is joined: start-up
is not counted) and each check begins with an all_reduce of the seconds left (MIN), so
every rank takes the same decision, run or SKIP, and the collectives stay in step.
The group's timeout is then set to what is left (`torch.distributed.set_timeout`):
a rank that stops answering mid-check ends the wait at the budget's end, and the
frame's roll call names it (`gpucheck.distributed.session`).
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable

# Seconds a collective may wait beyond the budget's end: ranks reach the end a little
# apart, and the final agreement (gather, decide, broadcast) needs its own moment.
GRACE_S = 5.0


class Budget:
    """Seconds left of the checks' budget, agreed by every rank."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._end = clock() + seconds

    def left_here(self) -> float:
        return max(0.0, self._end - self._clock())

    def agreed_left(self, device: str) -> float:
        """The least any rank has left (every rank calls it at the same point)."""
        import torch
        import torch.distributed as dist

        self.bound_waits(GRACE_S)
        where = "cuda" if device == "cuda" else "cpu"
        value = torch.tensor([self.left_here()], dtype=torch.float64, device=where)
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        return float(value.item())

    def bound_waits(self, extra_s: float = 0.0) -> None:
        """No collective from here on waits past the budget's end (plus `extra_s`)."""
        import torch.distributed as dist

        seconds = max(1.0, self.left_here() + extra_s)
        # The group's own method: `dist.set_timeout`, which calls it, is newer than torch 2.11;
        # on 2.11 the method alone held a gloo all_reduce to the new 2 s.
        group = dist.group.WORLD
        if group is None:
            raise RuntimeError("the budget bounds a process group's waits: none is open")
        group.set_timeout(_dt.timedelta(seconds=seconds))
