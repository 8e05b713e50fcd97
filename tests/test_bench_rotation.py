"""CPU ranks taking turns on the cores (`gpucheck.bench.model`): the plan, and the
real thread moving this process's threads."""

from __future__ import annotations

import os
import threading
import time

import pytest

from gpucheck.bench import model as bench_model
from gpucheck.bench.model import CoreRotation, RotationPlan, plan_rotation

ALLOWED = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
needs_two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs 2 CPUs to rotate over")


def test_two_ranks_on_four_cpus_get_two_blocks_of_two() -> None:
    plan = plan_rotation([3, 2, 1, 0], 1, 2, ["0-3", "0-3"])
    assert plan == RotationPlan(blocks=((0, 1), (2, 3)), slot=1)
    assert plan.describe() == "cpus 0-3 in 2 blocks of 2, every 50 ms"


def test_blocks_follow_the_allowed_cpus_and_leave_the_remainder_out() -> None:
    plan = plan_rotation([0, 2, 4, 6, 8], 0, 2, ["0,2,4,6,8"] * 2)
    assert plan is not None and plan.blocks == ((0, 2), (4, 6))


@pytest.mark.parametrize(("allowed", "local_world_size", "cpu_sets"), [
    ([0, 1], 1, ["0-1"]),  # one rank: nobody to be fair to
    ([0], 2, ["0", "0"]),  # fewer cores than ranks: they share anyway
    ([0, 1], 2, ["0", "1"]),  # a launcher bound each rank to its own CPUs
    ([0, 1], 2, ["0-1", None]),  # a rank that could not tell its CPUs
])
def test_no_rotation_where_it_would_not_be_fair_or_possible(
        allowed: list[int], local_world_size: int, cpu_sets: list[str | None]) -> None:
    assert plan_rotation(allowed, 0, local_world_size, cpu_sets) is None


def test_ranks_never_share_a_block_and_each_visits_every_block() -> None:
    plans = [plan_rotation(range(8), rank, 4, ["0-7"] * 4) for rank in range(4)]
    assert all(plans)
    visited: list[set[tuple[int, ...]]] = [set() for _ in plans]
    for step in range(40):
        now = 1000.0 + step * 0.0125  # four moments per period, across ten periods
        blocks = [plan.block_at(now) for plan in plans if plan]
        assert len(set(blocks)) == 4
        for seen, block in zip(visited, blocks, strict=True):
            seen.add(block)
    assert all(len(seen) == 4 for seen in visited)


def test_the_next_switch_is_the_next_period_boundary() -> None:
    plan = RotationPlan(blocks=((0,), (1,)), slot=0, period_s=0.05)
    assert plan.next_switch(10.01) == pytest.approx(10.05)
    assert plan.block_at(10.01) != plan.block_at(plan.next_switch(10.01) + 1e-9)


def test_without_a_plan_nothing_moves() -> None:
    before = os.sched_getaffinity(0) if ALLOWED else None
    with CoreRotation(None) as turns:
        time.sleep(0.06)
    assert turns.switches == 0
    if ALLOWED:
        assert os.sched_getaffinity(0) == before


@needs_two_cpus
def test_every_thread_visits_both_blocks_and_gets_its_cpus_back() -> None:
    plan = RotationPlan(blocks=((ALLOWED[0],), (ALLOWED[1],)), slot=0, period_s=0.02)
    stop = threading.Event()
    helper_seen: set[frozenset[int]] = set()

    def helper() -> None:  # a thread of the rank other than the one computing
        while not stop.is_set():
            helper_seen.add(frozenset(os.sched_getaffinity(0)))
            time.sleep(0.002)

    other = threading.Thread(target=helper)
    other.start()
    main_seen: set[frozenset[int]] = set()
    try:
        with CoreRotation(plan) as turns:
            deadline = time.monotonic() + 0.3
            while time.monotonic() < deadline:
                main_seen.add(frozenset(os.sched_getaffinity(0)))
                time.sleep(0.002)
    finally:
        stop.set()
        other.join()
    blocks = {frozenset(block) for block in plan.blocks}
    assert blocks <= main_seen and blocks <= helper_seen
    assert turns.switches >= 3
    assert os.sched_getaffinity(0) == set(ALLOWED)


@needs_two_cpus
def test_a_thread_that_ended_while_listed_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = 2**22 + 12345  # above the kernel's largest pid: no such thread
    monkeypatch.setattr(bench_model, "_thread_ids", lambda: [gone, threading.get_native_id()])
    turns = CoreRotation(RotationPlan(blocks=((ALLOWED[0],), (ALLOWED[1],)), slot=1))
    turns._move_to((ALLOWED[1],))
    try:
        assert os.sched_getaffinity(0) == {ALLOWED[1]}
    finally:
        os.sched_setaffinity(0, ALLOWED)
