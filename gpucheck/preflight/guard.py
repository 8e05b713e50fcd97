"""The last resort against a hang no timeout can end: rank 0 stopped while it hosts
the job's store (an `env://` launch: srun, a hand-made RANK/WORLD_SIZE start).

Every collective is bounded by the budget (`gpucheck.preflight.budget`), and the roll
call after a failed one by its window; but a store client waiting on a server whose
process is stopped (SIGSTOP, a hung host) may not return at all (seen: the roll call's
`store.check` on rank 1 with rank 0 stopped, past 120 s). So each rank arms a timer
when the checks start: still inside preflight at the budget + the agreement's grace +
the roll call + `MARGIN_S`, it says so on stderr, writes what it knows, and ends
itself with exit 1: the command is never started. What it knows: with the store on
rank 0 and this rank not rank 0, rank 0's store does not answer (rank 0 unresponsive):
each node's lowest rank still answering writes the exclude file with rank 0's host.
Anywhere else it cannot tell who hung, and writes nothing.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

# Beyond every bound the checks have: a check may run over its estimated cost (a slow
# GEMM on a loaded machine) without anything being wrong; the guard must never end a
# healthy run, only one that cannot end by itself.
MARGIN_S = 30.0


def guard_seconds(budget_s: float, grace_s: float, backend: str,
                  margin_s: float | None = None) -> float:
    """`margin_s`: None for MARGIN_S (a test hook gives a shorter one). The roll call
    counts twice (the store's host stays another window for late readers), at its
    length on `backend` (`checkin.roll_call_window_s`, from the settings in effect):
    the guard must not end a rank still holding a roll call."""
    from gpucheck.distributed.checkin import roll_call_window_s

    roll_call_s = 2 * roll_call_window_s(budget_s, backend)
    return budget_s + grace_s + roll_call_s + (MARGIN_S if margin_s is None else margin_s)


def on_hang_hosts(rank: int, store_on_rank0: bool,
                  roster: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """What this rank writes to the exclude file when the guard fires: rank 0's node
    when rank 0's store is what does not answer and this rank speaks for its node;
    None (write nothing) when it cannot tell."""
    from gpucheck.preflight.actions import speaks_for_failed_job

    if rank == 0 or not store_on_rank0 or not speaks_for_failed_job([0], roster, rank, False):
        return None
    return [{"host": r.get("host"), "node_rank": r.get("node_rank")}
            for r in roster if int(r.get("rank", -1)) == 0]


class HangGuard:
    """A daemon timer that ends this process (exit 1) unless cancelled in time."""

    def __init__(self, seconds: float, rank: int, on_fire: Callable[[], None],
                 exit_now: Callable[[int], None] = os._exit) -> None:
        self._rank = rank
        self._on_fire = on_fire
        self._exit = exit_now
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self.seconds = seconds

    def __enter__(self) -> HangGuard:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def _fire(self) -> None:
        """Say it, write what is known, end: nothing of preflight may outlive this."""
        try:
            print(f"gpucheck preflight: rank {self._rank}: the checks and the agreement did "
                  f"not end within {self.seconds:g} s (the budget and every bound past it): "
                  "a rank or the job's store stopped answering; the command is not started",
                  file=sys.stderr, flush=True)
            self._on_fire()
        finally:
            self._exit(1)


def exclude_on_hang(path: str | None, hosts: list[dict[str, Any]] | None) -> Callable[[], None]:
    def write() -> None:
        if path is None or hosts is None:
            return
        from gpucheck.preflight.actions import write_exclude_file

        written = write_exclude_file(path, hosts)
        print(f"gpucheck preflight: rank 0 unresponsive (its store does not answer): "
              f"{path} names {', '.join(written) or 'no host'}", file=sys.stderr, flush=True)
    return write
