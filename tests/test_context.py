"""The run context (gpucheck.context): test hooks travel as data, never through the
environment, and mean what the old environment hooks meant."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import bench_workers
import hooked
import pytest

from gpucheck.context import NO_HOOKS, RunOptions, SlowNode, SlowPair, TestHooks

PACKAGE = Path(__file__).resolve().parent.parent / "gpucheck"


def _sources() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for p in sorted(PACKAGE.rglob("*.py"))]


def test_no_production_module_reads_a_test_hook_from_the_environment() -> None:
    named = [f"{p.relative_to(PACKAGE)}:{n.lineno}" for p, tree in _sources()
             for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
             and ("GPUCHECK_TEST" in n.value or "GPUCHECK_STRESS_TEST" in n.value)]
    assert named == []


def test_options_with_hooks_cross_into_a_rank_by_pickle() -> None:
    options = RunOptions(hooks=TestHooks(model=bench_workers.wrong_rank_zero,
                                         fault_bus=("A", None),
                                         slow_pairs=(SlowPair(1, 0, 0.5),),
                                         slow_sends=SlowNode(2, 0.1, rail=1)))
    assert pickle.loads(pickle.dumps(options)) == options


def test_production_options_plant_nothing() -> None:
    assert RunOptions().hooks == NO_HOOKS
    assert NO_HOOKS.bus_id(0) is None
    assert NO_HOOKS.pair_delay(0, 1, again=False, repeat=0) == 0.0
    assert NO_HOOKS.node_delays(0, 0) == (0.0, 0.0)


@pytest.mark.parametrize(("when", "again", "repeat", "slept"), [
    ("always", False, 0, 0.5), ("always", True, 2, 0.5),
    ("first", False, 2, 0.5), ("first", True, 0, 0.0),
    ("once", False, 0, 0.5), ("once", False, 1, 0.0), ("once", True, 0, 0.0)])
def test_a_slow_pair_sleeps_when_its_mode_says(when: str, again: bool, repeat: int,
                                               slept: float) -> None:
    hooks = TestHooks(slow_pairs=(SlowPair(1, 0, 0.5, when),))
    assert hooks.pair_delay(1, 0, again, repeat) == slept
    assert hooks.pair_delay(0, 1, again, repeat) == 0.0  # the other direction


def test_a_slow_node_sleeps_on_its_node_and_rail_only() -> None:
    hooks = TestHooks(slow_sends=SlowNode(1, 0.2, rail=1),
                      slow_recvs=SlowNode(2, 0.3, first_only=True))
    assert hooks.node_delays(1, rail=1) == (0.2, 0.0)
    assert hooks.node_delays(1, rail=0) == (0.0, 0.0)
    assert hooks.node_delays(2, rail=0) == (0.0, 0.3)
    assert hooks.node_delays(2, rail=0, again=True) == (0.0, 0.0)


def test_hooked_reads_the_old_hook_forms_into_data() -> None:
    hooks, command = hooked.parse([
        "--model", "bench_workers:slow_rank_one", "--fault-bus", "A,,B",
        "--slow-pair", "2:3:0.02,3:2:0.05:first", "--slow-sends", "1/1:0.02",
        "--slow-recvs", "2:0.5:first", "gpucheck", "comm", "--n-gpus", "2"])
    assert command == ["comm", "--n-gpus", "2"]
    assert hooks == TestHooks(model=bench_workers.slow_rank_one, fault_bus=("A", None, "B"),
                              slow_pairs=(SlowPair(2, 3, 0.02), SlowPair(3, 2, 0.05, "first")),
                              slow_sends=SlowNode(1, 0.02, rail=1),
                              slow_recvs=SlowNode(2, 0.5, first_only=True))
