"""The budgeted check runner: every check on its own daemon thread, one deadline.

A health check that can hang is worse than none: SLURM kills a HealthCheckProgram
after 60 s and node-problem-detector a plugin after its `timeout`, and either way
nothing is reported. So each check runs on a daemon thread and the runner waits
only until the deadline: what has not finished by then is reported as not finished
(the caller makes it a SKIP that says so) and its thread is left behind; daemon
threads never hold up the exit.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Outcome:
    """A check's value, the error that ended it, or neither when it did not finish."""

    value: Any = None
    error: str | None = None
    finished: bool = True
    seconds: float = 0.0


class Deadline:
    """An instant on the monotonic clock, and how long until it."""

    def __init__(self, budget_s: float, start: float | None = None) -> None:
        self.budget_s = budget_s
        self.start = time.monotonic() if start is None else start
        self.at = self.start + budget_s

    def left(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def spent(self) -> float:
        return time.monotonic() - self.start


def run_until(checks: Mapping[str, Callable[[], Any]], deadline: Deadline) -> dict[str, Outcome]:
    """Run every check concurrently; return at the deadline or when all are done.

    A check that raised has `error`; one still running at the deadline has
    `finished=False` (it keeps running on its daemon thread, and whatever it
    shares with the caller must be read as a snapshot).
    """
    results: dict[str, Outcome] = {}
    lock = threading.Lock()

    def target(name: str, check: Callable[[], Any]) -> None:
        began = time.monotonic()
        try:
            outcome = Outcome(check(), None, True, time.monotonic() - began)
        except Exception as exc:  # a check must never take the command down
            outcome = Outcome(None, f"{type(exc).__name__}: {exc}", True,
                              time.monotonic() - began)
        with lock:
            results[name] = outcome

    threads = [threading.Thread(target=target, args=item, daemon=True,
                                name=f"gpucheck-health-{item[0]}") for item in checks.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(deadline.left())
    with lock:
        done = dict(results)
    return {name: done.get(name, Outcome(finished=False, seconds=deadline.spent()))
            for name in checks}


def process_age_s(proc: str = "/proc") -> float | None:
    """Seconds since this process started (`ps -o etimes= -p $$`), from /proc/self/stat's
    starttime (clock ticks after boot, field 22) and /proc/uptime; None where unreadable.

    So a budget can cover the interpreter's own start and gpucheck's imports, not only
    the checks: what SLURM or node-problem-detector time is the whole process.
    """
    try:
        with open(f"{proc}/self/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        with open(f"{proc}/uptime", encoding="ascii") as uptime:
            up_s = float(uptime.read().split()[0])
        ticks = os.sysconf("SC_CLK_TCK")
        age = up_s - int(fields[19]) / ticks  # field 22 counted from 1, after "pid (comm)"
    except (OSError, ValueError, IndexError):
        return None
    return age if age >= 0 else None


def start_of_run(budget_s: float, now: float | None = None) -> float:
    """When the budget starts: at the process's start when that is recent (a command
    line run), else now (an older process calling in, e.g. a test runner: counting
    from its start would leave no time)."""
    now = time.monotonic() if now is None else now
    age = process_age_s()
    return now - age if age is not None and age < budget_s / 2 else now
