"""`gpucheck bench` end to end: real processes, gloo on loopback, every launch path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bench_workers
import pytest
from plant import Plant, planted

from gpucheck.bench.model import ITERS_PER_SEGMENT
from gpucheck.cli import main

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--model", "mobilenet_v3_small", "--batch-size", "2", "--warmup", "1", "--iters", "2"]
SUBPROCESS_TIMEOUT_S = 180
SEGMENTED_ITERS = 2 * ITERS_PER_SEGMENT  # the fewest iterations CPU ranks split


def bench(tmp_path: Path, *extra: str, plant: Plant | None = None) -> tuple[int, dict[str, Any]]:
    """Run `gpucheck bench` in this process, with `hooks` on every rank; (exit code,
    the JSON report)."""
    out = tmp_path / "report.json"
    with planted(plant or Plant()):
        code = main(["bench", "--quiet", "--output", str(out), *extra])
    return code, json.loads(out.read_text())


def section(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in report["sections"] if s["name"] == name)


def findings(report: dict[str, Any], check: str, status: str) -> list[dict[str, Any]]:
    return [f for s in report["sections"] for f in s["findings"]
            if f["check"] == check and f["status"] == status]


def assert_records_add_up(report: dict[str, Any], nproc: int, images_per_rank: int) -> None:
    timing = section(report, "timing")["data"]
    ranks = timing["ranks"]
    assert [r["rank"] for r in ranks] == list(range(nproc))
    assert all(r["images"] == images_per_rank for r in ranks)
    assert timing["total_images"] == sum(r["images"] for r in ranks)
    assert timing["summed_device_s"] == pytest.approx(sum(r["device_s"] for r in ranks))
    assert all(timing["job_wall_s"] >= r["wall_s"] for r in ranks)
    assert timing["aggregate_images_per_s"] == pytest.approx(
        timing["total_images"] / timing["job_wall_s"])


def no_children_left() -> bool:
    import psutil

    children = psutil.Process().children(recursive=True)
    return not [c for c in children if "resource_tracker" not in " ".join(c.cmdline())]


def test_one_rank_of_resnet50_runs_in_this_process(tmp_path: Path) -> None:
    code, report = bench(tmp_path, "--n-gpus", "1", "--batch-size", "2", "--warmup", "1",
                         "--iters", "1")
    assert code == 0, report
    setup = section(report, "bench")["data"]
    assert (setup["model"], setup["ranks"], setup["dtype"]) == ("resnet50", 1, "fp32")
    assert_records_add_up(report, 1, images_per_rank=2)


@pytest.fixture(scope="module")
def slow_and_wrong(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, dict]]:
    """Two ranks: rank 1 spends extra CPU time in every forward, rank 0 perturbs its
    logits; enough iterations for a straggler verdict (MIN_JUDGED_ITERS) in two segments,
    so the CPU ranks re-place their tensors once in the timed loop."""
    yield bench(tmp_path_factory.mktemp("slow"), "--n-gpus", "2", *SMALL, "--iters",
                str(SEGMENTED_ITERS),
                plant=Plant(model=bench_workers.slow_rank_one_wrong_rank_zero))


def test_job_wall_follows_the_slow_rank_that_rank_zero_would_hide(
        slow_and_wrong: tuple[int, dict]) -> None:
    _, report = slow_and_wrong
    assert_records_add_up(report, 2, images_per_rank=2 * SEGMENTED_ITERS)
    assert section(report, "bench")["data"]["timed_segments"] == 2
    assert findings(report, "bench.cpu_relayout", "OK")
    timing = section(report, "timing")["data"]
    walls = [r["wall_s"] for r in timing["ranks"]]
    assert walls[1] == max(walls) and walls[0] < walls[1]  # rank 0's own time misses it
    assert timing["job_wall_s"] >= walls[1]
    warned = findings(report, "bench.rank.straggler", "WARN")
    assert [f["subject"] for f in warned] == ["rank 1"]
    assert "CPU" in warned[0]["message"] and report["host"] in warned[0]["message"]


def test_two_ranks_one_computing_wrong_logits_fail_naming_that_rank_only(
        slow_and_wrong: tuple[int, dict]) -> None:
    # No majority with two ranks: the CPU reference tells which one is wrong.
    code, report = slow_and_wrong
    assert code == 1
    failed = findings(report, "bench.consistency", "FAIL")
    assert [f["subject"] for f in failed] == ["rank 0"]
    assert "CPU reference" in failed[0]["message"]
    data = section(report, "consistency")["data"]
    assert data["reference_deviation_per_rank"][0] > data["reference_tolerance"]
    assert no_children_left()


def torchrun(tmp_path: Path, nproc_per_node: int, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(var, None)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
               str(nproc_per_node), "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0",
               "-m", "gpucheck", "bench", "--output", str(tmp_path / "r.json"), *extra]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=SUBPROCESS_TIMEOUT_S, check=False)


# Two ranks under torchrun, and two launched by a lone torchrun process: the launch paths
# (one rank in this process: test_one_rank_of_resnet50_runs_in_this_process).
def test_torchrun_ranks_report_once_from_rank_zero(tmp_path: Path) -> None:
    done = torchrun(tmp_path, 2, *SMALL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("gpucheck bench on") == 1
    report = json.loads((tmp_path / "r.json").read_text())
    assert_records_add_up(report, 2, images_per_rank=4)


def test_torchrun_single_process_launches_n_gpus_itself(tmp_path: Path) -> None:
    done = torchrun(tmp_path, 1, "--n-gpus", "2", *SMALL)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    assert_records_add_up(report, 2, images_per_rank=4)
    two_healthy_ranks_agree(report)  # the healthy case of consistency


def two_healthy_ranks_agree(report: dict[str, Any]) -> None:
    consistency = section(report, "consistency")
    assert consistency["data"]["max_deviation"] <= 1e-3
    assert consistency["data"]["reference"] == "CPU float32"
    assert len(consistency["data"]["reference_deviation_per_rank"]) == 2
    assert [f["status"] for f in consistency["findings"]] == ["OK"]
    # No GPU: the fault watch is a SKIP that says why (shared with test_faults_wiring_runs,
    # whose other runs watch fake GPUs).
    faults = section(report, "faults")["findings"]
    assert [(f["check"], f["status"], f["subject"]) for f in faults] == [
        ("faults.watch", "SKIP", None)]
    assert faults[0]["message"] == ("hardware fault watching n/a on ranks 0, 1: no GPU: "
                                    "this rank runs on the CPU")
