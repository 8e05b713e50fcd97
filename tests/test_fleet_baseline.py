"""Baselines: saved from a fleet's healthy reports, read back as limits, judged by
`baseline_findings` (the function bench, comm and stress can call)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from gpucheck import subject
from gpucheck.analysis.baseline import (
    BASELINE_SCHEMA_VERSION,
    Baseline,
    BaselineError,
    Expected,
    baseline_findings,
    baseline_from_dict,
    expected_from,
    load_baseline,
)
from gpucheck.analysis.loading import metrics_of
from gpucheck.cli import main
from gpucheck.measure import Better, Metric
from gpucheck.report import Report, Status
from tests.test_fleet import REPORTS, healthy_fleet, rows_where, section, write_node

HIGHER, LOWER = Better.HIGHER, Better.LOWER


def save(tmp_path: Path, folder: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    baseline = tmp_path / "baseline.json"
    code = main(["fleet", str(folder), "--save-baseline", str(baseline), "-q", "-o",
                 str(tmp_path / "fleet.json"), *extra])
    return code, json.loads(baseline.read_text())


def values(folder: Path, name: str) -> list[float]:
    return sorted(metrics_of(Report.from_dict(json.loads(p.read_text())))[name].value
                  for p in sorted(folder.glob("*.json")))


def test_a_saved_baseline_has_the_healthy_median_and_a_floor_under_it(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    healthy_fleet(folder, "bench", 5)
    code, saved = save(tmp_path, folder, "--threshold", "10%")
    assert code == 0
    assert (saved["kind"], saved["schema_version"]) == ("gpucheck-baseline",
                                                        BASELINE_SCHEMA_VERSION)
    assert saved["source"] == {"reports": 5, "nodes": 5, "commands": ["bench"]}
    entry = saved["metrics"]["bench.images_per_s.rank0"]
    median = values(folder, "bench.images_per_s.rank0")[2]
    assert entry["expected"] == pytest.approx(median, rel=1e-5)
    assert entry["limit"] == pytest.approx(median * 0.9, rel=1e-5)
    assert (entry["direction"], entry["unit"], entry["nodes"]) == (HIGHER, "images/s", 5)
    wall = saved["metrics"]["bench.job_wall_s"]
    assert wall["direction"] == LOWER and wall["limit"] == pytest.approx(
        wall["expected"] * 1.1, rel=1e-5)


def test_slow_and_failed_nodes_do_not_drag_the_baseline(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    healthy_fleet(folder, "stress", 5)
    healthy_only = values(folder, "stress.gemm.fp32.tflops.rank1")
    write_node(folder, "stress", "gpu08", 8, rows_where(1, "tflops_p50", 0.5))  # trimmed
    shutil.copy(REPORTS / "stress_fail.json", folder)  # FAIL: not healthy, left out
    _, saved = save(tmp_path, folder)
    entry = saved["metrics"]["stress.gemm.fp32.tflops.rank1"]
    assert entry["expected"] == pytest.approx(healthy_only[2], rel=1e-5)
    assert entry["nodes"] == 5
    assert saved["source"]["reports"] == 6


def healthy(raw: dict[str, Any]) -> None:
    """env_gpu without its FAILs (the fake driver is older than this torch's CUDA)."""
    for s in raw["sections"]:
        for f in s["findings"]:
            if f["status"] == "FAIL":
                f.update(status="OK", hint=None, action=None)


def test_info_metrics_get_no_baseline(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    for i in range(1, 4):
        write_node(folder, "env_gpu", f"gpu{i:02d}", i, healthy)
    _, saved = save(tmp_path, folder)
    assert "env.gpu.pcie_width_current.gpu0" in saved["metrics"]
    assert not any(name.startswith("env.gpu.temperature_c") for name in saved["metrics"])


def test_a_fleet_warns_below_the_baseline_floor_naming_node_and_metric(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.mkdir()
    healthy_fleet(good, "bench", 5)
    save(tmp_path, good)
    later = tmp_path / "later"
    later.mkdir()
    healthy_fleet(later, "bench", 2)
    write_node(later, "bench", "gpu03", 3, rows_where(0, "images_per_s", 0.8))
    code = main(["fleet", str(later), "--baseline", str(tmp_path / "baseline.json"), "-q",
                 "-o", str(tmp_path / "later.json")])
    report = json.loads((tmp_path / "later.json").read_text())
    assert code == 0
    beyond = section(report, "baseline")["data"]["beyond"]
    assert [(r["node"], r["metric"]) for r in beyond if "images_per_s.rank" in r["metric"]] == [
        ("gpu03", "bench.images_per_s.rank0")]
    reasons = section(report, "actions")["data"]["reasons"]
    assert any(r["node"] == "gpu03" and r["check"] == "baseline.metric" for r in reasons)


def test_a_baseline_of_another_command_is_skipped(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    healthy_fleet(folder, "comm", 3)
    save(tmp_path, folder)
    code = main(["fleet", str(REPORTS / "bench.json"), "--baseline",
                 str(tmp_path / "baseline.json"), "-q", "-o", str(tmp_path / "b.json")])
    report = json.loads((tmp_path / "b.json").read_text())
    assert code == 0
    assert [f["status"] for f in section(report, "baseline")["findings"]] == ["SKIP"]


def metric(key: str, value: float, better: Better = HIGHER, rank: int | None = None
           ) -> Metric:
    """The metric of `key`: for a rank, its name and `.rank<N>`."""
    name = key.removesuffix(f".rank{rank}") if rank is not None else key
    return Metric(name, "GB/s", better, value, subject.rank(rank) if rank is not None
                  else None)


BASE = Baseline(0.1, {
    "stress.membw.gbps.rank0": Expected(100.0, 90.0, HIGHER, "GB/s", 8, 1.0),
    "stress.sdc.p50_ms.rank0": Expected(2.0, 2.2, LOWER, "ms", 8, 0.01),
    "comm.all_reduce.busbw_gbps@1024": Expected(10.0, 9.0, HIGHER, "GB/s", 8, 0.1),
    "comm.all_reduce.busbw_gbps@2048": Expected(20.0, 18.0, HIGHER, "GB/s", 8, 0.1),
})


def test_baseline_findings_warn_beyond_a_limit_once_per_collective_else_ok_or_skip() -> None:
    found = baseline_findings({
        "stress.membw.gbps.rank0": metric("stress.membw.gbps.rank0", 80.0, rank=0),
        "stress.sdc.p50_ms.rank0": metric("stress.sdc.p50_ms.rank0", 3.0, LOWER, 0)},
        BASE)
    assert [(f.check, f.status, f.subject.label, f.action) for f in found] == [
        ("baseline.metric", Status.WARN, "rank0", "rerun"),
        ("baseline.metric", Status.WARN, "rank0", "rerun")]
    assert "floor 90" in found[0].message and "ceiling 2.2" in found[1].message
    found = baseline_findings({n: metric(n, v) for n, v in (
        ("comm.all_reduce.busbw_gbps@1024", 5.0), ("comm.all_reduce.busbw_gbps@2048", 10.0))},
        BASE)
    assert len(found) == 1 and "2 figures beyond the baseline" in found[0].message
    within = baseline_findings({"stress.membw.gbps.rank0": metric(
        "stress.membw.gbps.rank0", 91.0, rank=0)}, BASE)
    assert [f.status for f in within] == [Status.OK]
    other = baseline_findings({"bench.job_wall_s": metric("bench.job_wall_s", 1.0)}, BASE)
    assert [f.status for f in other] == [Status.SKIP]


def test_expected_values_come_from_iteratively_trimmed_values() -> None:
    # Four dead nodes pull the median to 0.945, so 0.89 looks close; once they are
    # trimmed the median is 1.0 and 0.89 is 11% off: it goes in the second round.
    entry = expected_from([0.2] * 4 + [0.89] + [1.0] * 5, HIGHER, "x", 0.1, 5)
    assert (entry.expected, entry.nodes) == (1.0, 5)
    assert entry.limit == pytest.approx(0.9)


@pytest.mark.parametrize(("raw", "says"), [
    ({"kind": "something"}, "not a gpucheck baseline"),
    ({"kind": "gpucheck-baseline", "schema_version": 7, "tolerance": 0.1, "metrics": {}},
     "unknown baseline schema_version 7"),
    ({"kind": "gpucheck-baseline", "schema_version": 1, "tolerance": 0.1,
      "metrics": {"x": {"expected": 1.0}}}, "metric 'x' needs"),
    ({"kind": "gpucheck-baseline", "schema_version": 1}, "damaged"),
])
def test_a_bad_baseline_names_its_problem(raw: dict[str, Any], says: str) -> None:
    with pytest.raises(BaselineError, match=says):
        baseline_from_dict(raw, "b.json")


def test_a_bad_baseline_file_is_a_usage_error_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "b.json"
    bad.write_text("{")
    out = tmp_path / "f.json"
    assert main(["fleet", str(REPORTS / "bench.json"), "--baseline", str(bad), "-o",
                 str(out)]) == 2
    assert "b.json: is not valid JSON" in capsys.readouterr().err and not out.exists()
    with pytest.raises(BaselineError, match="cannot be read"):
        load_baseline(str(tmp_path / "absent.json"))


def test_a_baseline_file_given_as_a_report_is_named_as_such(tmp_path: Path) -> None:
    folder = tmp_path / "reports"
    folder.mkdir()
    healthy_fleet(folder, "bench", 3)
    save(tmp_path, folder)
    shutil.copy(tmp_path / "baseline.json", folder)
    main(["fleet", str(folder), "-q", "-o", str(tmp_path / "f.json")])
    report = json.loads((tmp_path / "f.json").read_text())
    [bad] = section(report, "inputs")["data"]["unreadable"]
    assert "is a gpucheck baseline, not a report" in bad["problem"]


def test_save_baseline_into_a_missing_directory_is_a_usage_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fleet", str(REPORTS / "bench.json"), "--save-baseline",
                 str(tmp_path / "nope" / "b.json")]) == 2
    assert "--save-baseline" in capsys.readouterr().err
