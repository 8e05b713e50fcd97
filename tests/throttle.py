"""Test-only: stop a process from outside for a share of the time, as a CPU quota does.

    python tests/throttle.py PID SHARE [PERIOD_S]

Runs beside the target process (its child: started by a test hook in tests/bench_workers.py)
and, over and over, lets it run for PERIOD_S / (1 + SHARE) (RUN_S without a period),
stops it (SIGSTOP) and continues it (SIGCONT) once its stopped time adds up to SHARE of
the time it was let run. The share is kept on the running totals, so a late wake-up of
this helper on a loaded machine makes the next stop shorter or the next run longer, not
the slowdown larger: the target's wall time is (1 + SHARE) times what it would have been,
and its CPU time is unchanged.

A cgroup CPU quota (cpu.cfs_quota_us, cpu.max) throttles the same way on a 100 ms
period; a cgroup needs privileges a test cannot count on, a signal needs none. A longer
period is a coarser stall (300 ms stopped of every 600: a data loader or a neighbour that
blocks for long stretches), which slows only some iterations and the whole loop as much.

Ends, continuing the target, when the target ends (this helper's parent changes) or
when told to (SIGTERM).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

RUN_S = 0.1  # a cgroup's default CPU period is 100 ms


def throttle(pid: int, share: float, run_s: float = RUN_S) -> None:
    parent = os.getppid()
    allowed_s = stopped_s = 0.0
    while os.getppid() == parent:
        started = time.perf_counter()
        time.sleep(run_s)
        os.kill(pid, signal.SIGSTOP)
        stopped = time.perf_counter()
        allowed_s += stopped - started
        try:
            time.sleep(max(0.0, share * allowed_s - stopped_s))
        finally:
            os.kill(pid, signal.SIGCONT)
        stopped_s += time.perf_counter() - stopped


def _on_time() -> None:
    """Wake up on time on a loaded machine, as the kernel enforces a quota: a real-time
    priority where this process may take one (it only sleeps and signals), else as is."""
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))


def _stop(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


def main(argv: list[str]) -> None:
    pid, share = int(argv[0]), float(argv[1])
    run_s = float(argv[2]) / (1 + share) if len(argv) > 2 else RUN_S
    signal.signal(signal.SIGTERM, _stop)
    _on_time()
    try:
        throttle(pid, share, run_s)
    except (ProcessLookupError, SystemExit):
        pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)  # never leave the target stopped


if __name__ == "__main__":
    main(sys.argv[1:])
