"""Test faults are planted from outside the package (tests/plant.py): gpucheck reads
none, and a plant means what the old hooks meant in every process of a run."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import bench_workers
import hooked
import pytest
from plant import Plant, SlowNode, SlowPair, install

PACKAGE = Path(__file__).resolve().parent.parent / "gpucheck"


def test_no_production_module_knows_a_test_fault() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        words = [n.value for n in ast.walk(tree)
                 if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        found += [f"{path.relative_to(PACKAGE)}: {w}" for w in words if "GPUCHECK_TEST" in w]
        found += [f"{path.relative_to(PACKAGE)}: hook" for w in re.findall(r"\w+", path.read_text())
                  if w.lower() in ("hook", "hooks", "testhooks")]
    assert found == []


def test_a_plant_crosses_into_a_rank_through_the_environment() -> None:
    plant = Plant(model=bench_workers.wrong_rank_zero, fault_bus=("A", None),
                  slow_pairs=(SlowPair(1, 0, 0.5),), slow_sends=SlowNode(2, 0.1, rail=1),
                  hang_margin_s=2.0)
    assert Plant.from_json(plant.to_json()) == plant


def test_an_empty_plant_patches_nothing() -> None:
    def patch(*args: object) -> None:
        raise AssertionError(f"patched {args}")

    install(Plant(), patch)
    assert Plant().bus_id(0) is None
    assert Plant().pair_delay(0, 1, again=False, repeat=0) == 0.0
    assert Plant().node_delays(0, 0) == (0.0, 0.0)


@pytest.mark.parametrize(("when", "again", "repeat", "slept"), [
    ("always", False, 0, 0.5), ("always", True, 2, 0.5),
    ("first", False, 2, 0.5), ("first", True, 0, 0.0),
    ("once", False, 0, 0.5), ("once", False, 1, 0.0), ("once", True, 0, 0.0)])
def test_a_slow_pair_sleeps_when_its_mode_says(when: str, again: bool, repeat: int,
                                               slept: float) -> None:
    plant = Plant(slow_pairs=(SlowPair(1, 0, 0.5, when),))
    assert plant.pair_delay(1, 0, again, repeat) == slept
    assert plant.pair_delay(0, 1, again, repeat) == 0.0  # the other direction


def test_a_slow_node_sleeps_on_its_node_and_rail_only() -> None:
    plant = Plant(slow_sends=SlowNode(1, 0.2, rail=1),
                  slow_recvs=SlowNode(2, 0.3, first_only=True))
    assert plant.node_delays(1, rail=1) == (0.2, 0.0)
    assert plant.node_delays(1, rail=0) == (0.0, 0.0)
    assert plant.node_delays(2, rail=0) == (0.0, 0.3)
    assert plant.node_delays(2, rail=0, again=True) == (0.0, 0.0)


def test_hooked_reads_its_options_into_a_plant() -> None:
    plant, command = hooked.parse([
        "--model", "bench_workers:slow_rank_one", "--fault-bus", "A,,B",
        "--slow-pair", "2:3:0.02,3:2:0.05:first", "--slow-sends", "1/1:0.02",
        "--slow-recvs", "2:0.5:first", "gpucheck", "comm", "--n-gpus", "2"])
    assert command == ["comm", "--n-gpus", "2"]
    assert plant == Plant(model=bench_workers.slow_rank_one, fault_bus=("A", None, "B"),
                          slow_pairs=(SlowPair(2, 3, 0.02), SlowPair(3, 2, 0.05, "first")),
                          slow_sends=SlowNode(1, 0.02, rail=1),
                          slow_recvs=SlowNode(2, 0.5, first_only=True))
