"""The budgeted runner: checks run concurrently and the run returns at the deadline,
whatever a check is doing; the budget counts from the process's start."""

from __future__ import annotations

import os
import threading
import time

from gpucheck.health.run import Deadline, process_age_s, run_until, start_of_run


def test_finished_raised_and_unfinished_checks_each_say_what_happened():
    release = threading.Event()

    def stuck() -> str:
        release.wait(30)
        return "late"

    def broken() -> None:
        raise OSError("sysfs went away")

    outcomes = run_until({"fast": lambda: 42, "broken": broken, "stuck": stuck},
                         Deadline(0.3))
    release.set()
    assert (outcomes["fast"].value, outcomes["fast"].finished) == (42, True)
    assert outcomes["broken"].error == "OSError: sysfs went away"
    assert outcomes["stuck"].finished is False and outcomes["stuck"].value is None


def test_checks_run_concurrently_so_one_slow_check_does_not_delay_the_others():
    started: list[str] = []
    gate = threading.Barrier(3, timeout=10)

    def meet(name: str) -> str:
        started.append(name)
        gate.wait()  # only passes when all three run at the same time
        return name

    outcomes = run_until({n: (lambda n=n: meet(n)) for n in "abc"}, Deadline(20))
    assert {o.value for o in outcomes.values()} == {"a", "b", "c"}


def _fake_proc(tmp_path, uptime_s: float, start_ticks: int):
    (tmp_path / "self").mkdir()
    fields = ["S", "1"] + ["0"] * 17 + [str(start_ticks), "0"]  # field 22 is starttime
    (tmp_path / "self" / "stat").write_text(f"4242 (odd (name) here) {' '.join(fields)}\n")
    (tmp_path / "uptime").write_text(f"{uptime_s} 99999.0\n")
    return str(tmp_path)


def test_process_age_is_read_from_proc_even_with_parentheses_in_the_name(tmp_path):
    ticks = os.sysconf("SC_CLK_TCK")
    assert process_age_s(_fake_proc(tmp_path, 1000.5, 999 * ticks)) == 1.5


def test_an_unreadable_proc_gives_no_age(tmp_path):
    assert process_age_s(str(tmp_path)) is None


def test_this_process_age_is_read_from_the_real_proc():
    age = process_age_s()
    assert age is not None and age >= 0


def test_an_old_process_calling_in_starts_the_budget_now():
    now = time.monotonic()
    assert start_of_run(0.001, now) == now  # pytest is older than half of 1 ms
