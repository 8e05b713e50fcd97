"""Test-only: stop a process from outside for a share of the time, as a CPU quota does.

    python tests/throttle.py PID SHARE [PERIOD_S]

Beside the target (started by tests/bench_workers.py), over and over: let it run, SIGSTOP
it, SIGCONT it once its stopped time adds up to SHARE of its running time (on running
totals, so a late wake-up never makes the slowdown larger). Ends, continuing the target,
when the target ends (this helper's parent changes) or on SIGTERM.
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
