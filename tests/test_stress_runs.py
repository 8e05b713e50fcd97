"""`gpucheck stress` on real gloo CPU ranks over loopback, through the CLI, with short
measuring windows (`short_windows`) and small products.

CPU ranks on a shared 2-core machine are noisy, so these runs assert what planted faults
must cause (a FAIL naming the rank, a straggler WARN for a rank sleeping in every
iteration) and no FAIL when healthy, never the absence of noise-sensitive WARNs; the
verdicts are tested as pure functions in test_stress_units.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import stress_workers
from plant import Plant, planted

from gpucheck.cli import main
from gpucheck.commands import stress as stress_command
from gpucheck.context import RunContext
from gpucheck.distributed.faultwatch import OFF_REASON

# The shortest burn-in: it still repeats the product MIN_REPEATS (10) times, past the
# planted change after CHANGE_AFTER (5).
SHORT = ("--duration", "0.1", "--size", "256", "--timeout", "60", "-q")
# Runs with a planted fault measure only the dtype that also burns in (fp32 first on
# CPU): the fault is in the burn-in or in every loop, so one GEMM window shows it.
ONE_DTYPE = ("--dtypes", "fp32")


@pytest.fixture(scope="module", autouse=True)
def short_windows() -> Iterator[None]:
    """CPU ranks time each GEMM and copy for a fraction of the default windows: what these
    runs assert (every phase ran, a planted fault named) needs no precise figure."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(stress_command.DEFAULTS, "cpu", stress_command.Defaults(
            size=256, duration_s=0.1, warmup_s=0.05, gemm_window_s=0.3, membw_window_s=0.2))
        yield


def stress(tmp_path: Path, nproc: int, *extra: str, hook: str | None = None,
           ) -> tuple[int, dict[str, Any]]:
    """`hook`: the name of a tests/stress_workers.py function every rank calls."""
    out = tmp_path / "stress.json"
    with planted(Plant(stress=getattr(stress_workers, hook) if hook else None)):
        code = main(["stress", "--n-gpus", str(nproc), *SHORT, "--format", "json",
                        "-o", str(out), *extra])
    return code, json.loads(out.read_text())


def section(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in report["sections"] if s["name"] == name)


def findings(report: dict[str, Any], status: str, check: str | None = None,
             ) -> list[tuple[str, str | None]]:
    return [(f["check"], f["subject"]) for s in report["sections"] for f in s["findings"]
            if f["status"] == status and (check is None or f["check"] == check)]


def no_children_left() -> bool:
    """No rank left behind (multiprocessing's resource tracker stays by design)."""
    children = psutil.Process().children(recursive=True)
    return not [c for c in children if "resource_tracker" not in " ".join(c.cmdline())]


def assert_healthy(report: dict[str, Any], nproc: int) -> None:
    """Every phase ran on every rank, without a FAIL; what a CPU has not, a SKIP."""
    assert findings(report, "FAIL") == [], report
    setup = section(report, "stress")["data"]
    assert setup["complete"] and [r["rank"] for r in setup["ranks"]] == list(range(nproc))
    gemm = section(report, "gemm")["data"]["results"]
    assert sorted((r["rank"], r["dtype"]) for r in gemm) == sorted(
        (r, d) for r in range(nproc) for d in ("fp32", "bf16"))
    assert all(r["tflops"] > 0 and r["p99_ms"] >= r["p50_ms"] > 0 for r in gemm)
    assert all(r["gbps"] > 0 for r in section(report, "membw")["data"]["results"])
    burn = section(report, "sdc")["data"]["results"]
    assert all(r["iters"] >= 1 and r["bad_iters"] == 0 and r["mode"] == "bitwise"
               for r in burn)
    assert all(r["reference_deviation"] < 1 for r in burn)  # within every element's bound
    assert findings(report, "SKIP", "stress.copies") == [("stress.copies", None)]
    assert findings(report, "SKIP", "stress.p2p") == [("stress.p2p", None)]
    assert findings(report, "SKIP", "stress.power.reach") == [("stress.power.reach", None)]


def test_a_healthy_cpu_rank_runs_every_phase_in_this_process(tmp_path: Path) -> None:
    # Two healthy ranks under torchrun: tests/test_all_torchrun.py; two without a FAIL:
    # test_faults_wiring_runs.py's stress run. --no-fault-watch reaches the ranks.
    code, report = stress(tmp_path, 1, "--no-fault-watch")
    assert code == 0
    assert_healthy(report, 1)
    agreement = [f for f in section(report, "sdc")["findings"]
                 if f["check"] == "stress.sdc.agreement"]
    coverage = section(report, "sdc")["data"]["reference_coverage"]
    assert coverage == "all 256 rows (65536 elements)" and coverage in agreement[0]["message"]
    (off,) = section(report, "faults")["findings"]
    assert (off["status"], OFF_REASON in off["message"]) == ("SKIP", True)
    assert no_children_left()


def warns(report: dict[str, Any], check: str) -> list[dict[str, Any]]:
    return [f for s in report["sections"] for f in s["findings"]
            if f["status"] == "WARN" and f["check"] == check]


@pytest.fixture(scope="module")
def slow_and_changing(tmp_path_factory: pytest.TempPathFactory,
                      ) -> Iterator[tuple[int, dict[str, Any]]]:
    """Three ranks: rank 1 sleeps in every iteration and is always wrong the same way,
    rank 2's results change."""
    yield stress(tmp_path_factory.mktemp("slow"), 3, *ONE_DTYPE,
                 hook="slow_wrong_rank_one_changes_on_rank_two")


def test_a_gpu_whose_result_changes_under_load_fails_by_name(
        slow_and_changing: tuple[int, dict[str, Any]]) -> None:
    code, report = slow_and_changing
    assert code == 1
    assert findings(report, "FAIL") == [("stress.sdc.repeat", "rank 2"),
                                        ("stress.sdc.agreement", "rank 1")]
    changed = section(report, "sdc")["data"]["results"][2]
    assert changed["first_bad_iter"] == 5 and changed["bad_iters"] == changed["iters"] - 4


def test_a_rank_always_wrong_is_named_through_the_cpu_reference(
        slow_and_changing: tuple[int, dict[str, Any]]) -> None:
    # Two ranks, where only the reference can decide: test_preflight_runs.py's runs of
    # wrong_rank_one_always (and agreement.judge in test_peers.py).
    _, report = slow_and_changing
    burn = section(report, "sdc")["data"]["results"]
    assert [r["bad_iters"] for r in burn[:2]] == [0, 0]  # rank 1 agrees with itself
    assert burn[0]["digest"] == burn[2]["digest"] != burn[1]["digest"]
    assert burn[1]["reference_deviation"] > 0.1 > burn[0]["reference_deviation"]


def test_a_rank_slow_in_every_iteration_is_a_named_straggler(
        slow_and_changing: tuple[int, dict[str, Any]]) -> None:
    _, report = slow_and_changing
    (straggler,) = warns(report, "stress.sdc.straggler")
    assert straggler["subject"] == "rank 1" and straggler["look"]["state"] == "confirmed"
    assert {r["rank"] for r in section(report, "sdc")["data"]["measured again"]} == {0, 1, 2}
    # Which GEMM dtypes cross the bar on a loaded machine is noise: rank 1 and no other
    # is named; the count is judged on recorded figures (test_stress_recorded.py).
    assert {f["subject"] for f in warns(report, "stress.gemm.peers")} == {"rank 1"}
    assert {r["rank"] for r in section(report, "gemm")["data"]["measured again"]} == {0, 1, 2}
    assert no_children_left()


def test_a_crashed_rank_keeps_the_phases_measured_before_it(tmp_path: Path) -> None:
    code, report = stress(tmp_path, 2, *ONE_DTYPE, hook="crash_rank_one_in_burn")
    assert code == 1
    assert [s["name"] for s in report["sections"]] == ["stress", "gemm", "membw", "faults",
                                                       "failure"]
    assert section(report, "stress")["data"]["complete"] is False
    assert ("stress.rank_failed", "rank 1") in findings(report, "FAIL")
    assert no_children_left()


def test_an_interrupted_run_reports_the_phases_it_had() -> None:
    """After Ctrl-C the launcher holds rank 0's last published result: its report."""
    from argparse import ArgumentParser, Namespace

    from gpucheck.commands.stress import StressArgs, partial_report
    from gpucheck.distributed import progress

    ranks = [{"rank": r, "node_rank": 0, "host": "vm", "local_rank": r, "device": "cpu",
              "gpu_name": None} for r in range(2)]
    gemm = [{"rank": r, "dtype": "fp32", "size": 512, "iters": 50, "tflops": 0.03,
             "tflops_p50": 0.03, "p50_ms": 9.0, "p99_ms": 12.0} for r in range(2)]
    ctx = RunContext()
    progress.remember_partial(ctx, {
        "world_size": 2, "device": "cpu", "backend": "gloo", "dtypes": ["fp32"], "size": 512,
        "duration_s": 8.0, "ranks": ranks, "gemm": gemm, "membw": None, "sdc": None,
        "copies": None, "p2p": None, "phases_planned": ["gemm", "membw", "sdc"],
        "phases_done": ["gemm"], "complete": False})
    parser = ArgumentParser()
    StressArgs.add_to(parser)
    args = parser.parse_args(["--peer-threshold", "0.9", "--expected-threshold", "0.8",
                              "--copy-threshold", "0.6"])
    built = partial_report(args, ctx)
    assert built is not None and [s.name for s in built.sections] == ["stress", "gemm",
                                                                      "faults"]
    assert built.sections[0].data["phases_done"] == "1 of 3: gemm"
    assert partial_report(Namespace(), RunContext()) is None  # nothing published: nothing to keep

