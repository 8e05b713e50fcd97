"""compare knows noise: two healthy back-to-back runs are no regression, a real 30% drop
still is, and every metric says the threshold it was judged with."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from gpucheck.analysis.compare import HOST_BOUND_RUNS, NOISY, noise_levels
from gpucheck.cli import main
from gpucheck.measure import Better, Metric
from gpucheck.subject import rank as rank_subject

DATA = Path(__file__).resolve().parent / "data"


def load(name: str) -> dict[str, Any]:
    folder = "reports" if (DATA / "reports" / f"{name}.json").exists() else "noise_pairs"
    return json.loads((DATA / folder / f"{name}.json").read_text())


def compare(tmp_path: Path, a: dict[str, Any], b: dict[str, Any]) -> tuple[int, dict]:
    paths = []
    for name, raw in (("a", a), ("b", b)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(raw))
        paths.append(str(path))
    out = tmp_path / "compare.json"
    code = main(["compare", *paths, "-q", "-o", str(out)])
    return code, json.loads(out.read_text())


def metric_rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    section = next(s for s in report["sections"] if s["name"] == "metrics")
    return {r["metric"]: r for r in section["data"]["metrics"]}


def scaled(raw: dict[str, Any], section: str, name: str, factor: float,
           rank: int | None = None) -> dict[str, Any]:
    """`raw` with the metric `name` (every message size of it; of `rank`, or every
    one) times `factor`."""
    changed = copy.deepcopy(raw)
    for s in changed["sections"]:
        if s["name"] != section:
            continue
        for metric in s["metrics"]:
            mine = rank is None or (metric["subject"] or {}).get("rank") == rank
            if metric["name"].split("@")[0] == name and mine:
                metric["value"] = round(metric["value"] * factor, 6)
    return changed


def test_two_healthy_back_to_back_comm_runs_on_this_vm_are_not_a_regression(
        tmp_path: Path) -> None:
    # Real runs, one after the other, same machine: single sizes moved by -87% to +520%.
    code, report = compare(tmp_path, load("comm_noisy_a"), load("comm_noisy_b"))
    assert code == 0 and report["verdict"] != "FAIL"
    rows = metric_rows(report)
    assert rows["comm.all_reduce.busbw_gbps@65536"]["change_pct"] < -80
    assert rows["comm.all_reduce.busbw_gbps@65536"]["verdict"] in ("within noise", "too noisy")
    noise = [f for s in report["sections"] for f in s["findings"]
             if f["check"] == "compare.noise"]
    assert noise and any("too noisy to judge" in f["message"] for f in noise)
    for row in rows.values():  # each judged figure says its threshold and noise's source
        if row["verdict"] in ("only in A", "only in B", "info"):
            continue
        assert row["threshold_pct"] >= 5.0
        level, source = row["noise"].split("% ", 1)
        assert float(level) >= 0
        assert source in ("within the runs", "others better in B", "none measured",
                          "CPU ranks: runs")


def on_gpus(raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` as a GPU run's report (device cuda, NCCL): only its settings differ."""
    changed = copy.deepcopy(raw)
    for s in changed["sections"]:
        if s["name"] == "comm":
            s["data"].update(device="cuda", backend="nccl")
    return changed


def test_healthy_back_to_back_comm_runs_recorded_on_this_vm_compare_as_noise(
        tmp_path: Path) -> None:
    """Issue 36 item 9: two healthy `gpucheck comm` runs (tests/data/noise_pairs) exit 0;
    on CPU ranks every figure is judged against what two runs differ by, and the
    pairwise figures carry the spread of their repeats."""
    a, b = load("comm_healthy_a"), load("comm_healthy_b")
    code, report = compare(tmp_path, a, b)
    assert code == 0
    assert not [f for s in report["sections"] for f in s["findings"]
                if f["check"] == "compare.regression"]
    rows = metric_rows(report)
    assert {r["verdict"] for r in rows.values()} <= {"same", "better", "within noise",
                                                      "too noisy"}
    assert all(r["threshold_pct"] >= HOST_BOUND_RUNS * 100 for r in rows.values())
    (metrics,) = [f for s in report["sections"] for f in s["findings"]
                  if f["check"] == "compare.metrics"]
    assert metrics["status"] == "SKIP"  # nothing could be judged, and it says so
    pairs = [m for s in a["sections"] for m in s["metrics"] if m["name"] == "comm.pairwise.gbps"]
    assert pairs and all(m["spread"] is not None and m["spread"] >= 0 for m in pairs)


def test_a_3x_slower_collective_on_gpu_reports_is_still_a_regression(tmp_path: Path) -> None:
    a = on_gpus(load("comm_healthy_a"))
    code, report = compare(tmp_path, a, scaled(a, "broadcast", "comm.broadcast.busbw_gbps",
                                               1 / 3))
    assert code == 1
    (found,) = [f for s in report["sections"] for f in s["findings"]
                if f["check"] == "compare.regression"]
    assert found["status"] == "FAIL"
    worse = {n for n, r in metric_rows(report).items() if r["verdict"] == "worse"}
    assert worse and {n.split("@")[0] for n in worse} == {"comm.broadcast.busbw_gbps"}


def test_a_pairwise_figure_whose_repeats_spread_widely_is_judged_against_that_spread() -> None:
    pair = rank_subject(0)
    a = {"p": Metric("comm.pairwise.gbps", "GB/s", Better.HIGHER, 2.0, pair, 1.0)}
    b = {"p": Metric("comm.pairwise.gbps", "GB/s", Better.HIGHER, 1.2, pair, 0.1)}
    assert noise_levels(a, b)["p"].level == pytest.approx(0.5)  # 2x apart: half by noise


def test_a_planted_30_percent_drop_of_every_size_is_still_a_regression(
        tmp_path: Path) -> None:
    a = on_gpus(load("comm_noisy_a"))
    code, report = compare(tmp_path, a, scaled(a, "all_reduce", "comm.all_reduce.busbw_gbps", 0.7))
    assert code == 1
    rows = metric_rows(report)
    worse = [r for n, r in rows.items() if n.startswith("comm.all_reduce.")]
    assert worse and all(r["verdict"] == "worse" for r in worse)
    assert all(r["threshold_pct"] < 30 for r in worse)
    assert all(r["verdict"] == "same" for n, r in rows.items() if n.startswith("comm.all_g"))


def test_a_change_inside_the_runs_own_iteration_spread_is_within_noise() -> None:
    a = {"x.rank0": Metric("x", "images/s", Better.HIGHER, 100.0, rank_subject(0), 0.25)}
    b = {"x.rank0": Metric("x", "images/s", Better.HIGHER, 85.0, rank_subject(0), 0.02)}
    level = noise_levels(a, b)["x.rank0"]
    assert level.source == "within the runs" and level.level == pytest.approx(0.2)


def test_the_mirror_counts_only_the_family_improving_not_getting_worse() -> None:
    def m(name: str, value: float) -> Metric:
        return Metric(name, "GB/s", Better.HIGHER, value)

    a = {f"c.busbw@{s}": m(f"c.busbw@{s}", 1.0) for s in (1, 2, 4)}
    slower = {n: m(n, 0.6) for n in a}
    assert all(v.level == 0 for v in noise_levels(a, slower).values())
    mixed = {**slower, "c.busbw@4": m("c.busbw@4", 3.0)}
    assert noise_levels(a, mixed)["c.busbw@1"].level >= NOISY


def test_a_bench_slowed_by_load_on_its_host_is_a_host_bound_warn_not_a_regression(
        tmp_path: Path) -> None:
    # Real runs: B beside two busy loops, 6x slower on the wall clock, same CPU-time pace.
    code, report = compare(tmp_path, load("bench_loaded_a"), load("bench_loaded_b"))
    assert code == 0 and report["verdict"] == "WARN"
    found = [f for s in report["sections"] for f in s["findings"]
             if f["check"] == "compare.host_bound"]
    assert len(found) == 1 and found[0]["action"] == "rerun"
    assert "rank0" in found[0]["message"] and "rank1" in found[0]["message"]
    rows = metric_rows(report)
    assert rows["bench.images_per_s.rank0"]["verdict"] == "host-bound"
    assert rows["bench.aggregate_images_per_s"]["verdict"] == "host-bound"


def test_a_host_bound_stragglers_symptoms_are_reported_under_it_not_as_a_regression(
        tmp_path: Path) -> None:
    # Real runs (issue 21): B's rank 1 stopped from outside half the time. Its slower wall
    # clock makes the job's spread and wall figures worse: the same cause, already named.
    code, report = compare(tmp_path, load("bench_stall_a"), load("bench_stall_b"))
    checks = [(f["check"], f["status"]) for s in report["sections"] for f in s["findings"]]
    assert ("compare.regression", "FAIL") not in checks and code == 0
    [host] = [f for s in report["sections"] for f in s["findings"]
              if f["check"] == "compare.host_bound"]
    assert host["status"] == "WARN" and host["action"] == "rerun"
    assert "bench.spread_slowest_vs_median" in host["message"]
    rows = metric_rows(report)
    assert rows["bench.spread_slowest_vs_median"]["verdict"] == "host-bound"
    assert rows["bench.images_per_s.rank1"]["verdict"] == "host-bound"


def test_a_rank_whose_pace_slowed_with_its_wall_time_is_a_slower_device_and_fails(
        tmp_path: Path) -> None:
    a = load("bench")
    slow = scaled(scaled(a, "timing", "bench.images_per_s", 0.7, rank=1), "timing",
                  "bench.iteration_p50_ms",
                  1 / 0.7, rank=1)
    for section in slow["sections"]:  # a worse spread beside it is still a regression
        for metric in section["metrics"]:
            if metric["name"] == "bench.spread_slowest_vs_median":
                metric["value"] *= 1.4
    code, report = compare(tmp_path, a, slow)
    assert code == 1
    rows = metric_rows(report)
    assert rows["bench.images_per_s.rank1"]["verdict"] == "worse"
    assert rows["bench.spread_slowest_vs_median"]["verdict"] == "worse"
    assert not [f for s in report["sections"] for f in s["findings"]
                if f["check"] == "compare.host_bound"]
