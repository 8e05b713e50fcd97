"""The host kind of straggler end to end: a CPU rank whose process is stopped from
outside part of the time (tests/throttle.py, as a CPU quota does) computes at the other
rank's pace and holds the job back; it is named as such. Real processes, gloo on loopback.

A healthy pair staying OK is judged on the records of real healthy runs on this VM
(tests/test_bench_stragglers_recorded.py, test_bench_stragglers.py): a live healthy
pair on a loaded 2-core machine can legitimately hold the job back by more than the
threshold, and a verdict on this machine's noise is no test."""

from __future__ import annotations

import time
from pathlib import Path

import bench_workers
import psutil
import pytest
from plant import Plant

from gpucheck.bench.model import ITERS_PER_SEGMENT
from tests.test_bench_runs import bench, findings, no_children_left, section

# ResNet50 at batch 1: an iteration (about 0.1 s of CPU on a core) spans two of the
# throttle's periods (run 50 ms, stopped 150 ms), so every iteration is stopped. Four
# segments of 3 iterations, as the default run has: a median over 12 iterations, not 6.
ARGS = ["--n-gpus", "2", "--batch-size", "1", "--warmup", "1", "--iters",
        str(4 * ITERS_PER_SEGMENT)]
THROTTLE_PERIOD_S = "0.2"
THROTTLE_SCRIPT = str(Path(__file__).with_name("throttle.py"))
HELPER_EXIT_S = 10  # the helper checks every 0.2 s or so whether its rank is gone


def leftover_throttles() -> list[psutil.Process]:
    """Throttle helpers whose rank has ended (one still running would be left behind)."""
    left = []
    for proc in psutil.process_iter(["cmdline"]):
        line = proc.info["cmdline"] or []
        if THROTTLE_SCRIPT in line and not psutil.pid_exists(int(line[line.index(
                THROTTLE_SCRIPT) + 1])):
            left.append(proc)
    return left


def test_a_rank_stopped_from_outside_is_named_as_held_back_by_its_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(bench_workers.THROTTLE_PERIOD_VAR, THROTTLE_PERIOD_S)
    code, report = bench(tmp_path, *ARGS,
                         plant=Plant(model=bench_workers.stop_rank_one_most_of_the_time))
    assert code == 0, report  # a WARN
    warned = findings(report, "bench.rank.straggler", "WARN")
    assert [f["subject"] for f in warned] == ["rank 1"]
    assert "held the job back" in warned[0]["message"]
    assert "its host did not run it" in warned[0]["message"]
    assert warned[0]["action"] == "fix-config" and "quota" in warned[0]["hint"]
    ranks = section(report, "timing")["data"]["ranks"]
    assert all(r["wall_vs_others"] is not None for r in ranks)  # both clocks, every rank
    assert ranks[1]["wall_vs_others"] > ranks[1]["vs_others"]
    assert no_children_left()
    deadline = time.monotonic() + HELPER_EXIT_S
    while leftover_throttles() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not leftover_throttles()


def test_a_stall_in_each_loop_is_seen_again_in_a_second_loop_and_named(
        tmp_path: Path) -> None:
    # Rank 1 sleeps 1 s once in its timed loop: its loop held the job back, so the ranks
    # run the loop again before naming it, and the stall recurs there.
    code, report = bench(tmp_path, "--n-gpus", "2", "--model", "resnet18", "--batch-size",
                         "2", "--warmup", "1", "--iters", str(bench_workers.STALLED_ITERS),
                         plant=Plant(model=bench_workers.stall_rank_one_once_in_each_loop))
    assert code == 0, report  # a WARN
    (warned,) = findings(report, "bench.rank.straggler", "WARN")
    assert (warned["subject"], warned["action"]) == ("rank 1", "fix-config")
    ranks = section(report, "timing")["data"]["ranks"]
    assert ranks[1]["whole_loop"] > 1.1  # a 1 s stall in a loop of 0.25 s (idle) to 1 s
    assert ranks[1]["loop_again"] > 1.1 and ranks[1]["both_loops"] > 1.1
    assert warned["look"]["state"] == "confirmed"
    assert warned["look"]["first"] == ranks[1]["whole_loop"]
    assert no_children_left()
