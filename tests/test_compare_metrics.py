"""The metrics compare and fleet read (`Section.metrics`, keyed by `Metric.key()`) and
the facts they share, on saved real reports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpucheck.analysis.loading import (
    HARDWARE,
    SETUP,
    VERSION,
    extract_facts,
    family,
    metrics_of,
    position,
    slot_words,
)
from gpucheck.measure import Better
from gpucheck.report import Report, ReportShapeError

REPORTS = Path(__file__).resolve().parent / "data" / "reports"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "fleet.md"


def sample(name: str) -> dict[str, Any]:
    return json.loads((REPORTS / f"{name}.json").read_text())


def section(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in report["sections"] if s["name"] == name)


def test_bench_gives_images_per_s_per_rank_and_the_job_figures() -> None:
    report = sample("bench")
    metrics = metrics_of(Report.from_dict(report))
    ranks = section(report, "timing")["data"]["ranks"]
    assert set(metrics) == {"bench.aggregate_images_per_s", "bench.job_wall_s",
                            "bench.parallel_efficiency", "bench.spread_slowest_vs_median",
                            "bench.images_per_s.rank0", "bench.images_per_s.rank1",
                            "bench.iteration_p50_ms.rank0", "bench.iteration_p50_ms.rank1"}
    assert metrics["bench.images_per_s.rank1"].value == ranks[1]["images_per_s"]
    assert position(metrics["bench.images_per_s.rank1"]) == "rank1"
    assert metrics["bench.images_per_s.rank1"].name == "bench.images_per_s"
    # times are better lower, throughputs higher
    assert (metrics["bench.job_wall_s"].better, metrics["bench.job_wall_s"].unit) == (
        Better.LOWER, "s")
    assert (metrics["bench.images_per_s.rank0"].better,
            metrics["bench.images_per_s.rank0"].unit) == (Better.HIGHER, "images/s")


def test_comm_gives_busbw_per_collective_and_message_size_and_the_pair_matrix() -> None:
    report = sample("comm")
    metrics = metrics_of(Report.from_dict(report))
    sizes = [r["size_bytes"] for r in section(report, "all_reduce")["data"]["results"]]
    for op in ("all_reduce", "all_gather"):
        for size in sizes:
            assert f"comm.{op}.busbw_gbps@{size}" in metrics
    one = metrics[f"comm.all_reduce.busbw_gbps@{sizes[-1]}"]
    assert one.value == section(report, "all_reduce")["data"]["results"][-1]["busbw_gbps"]
    assert (one.unit, one.better, family(one)) == ("GB/s", Better.HIGHER,
                                                   "comm.all_reduce.busbw_gbps")
    assert {"comm.pairwise.gbps.rank0_to_rank1", "comm.pairwise.gbps.rank1_to_rank0"} <= set(
        metrics)


def test_stress_gemm_is_the_median_product_per_dtype_and_rank() -> None:
    report = sample("stress")
    metrics = metrics_of(Report.from_dict(report))
    row = next(r for r in section(report, "gemm")["data"]["results"]
               if r["dtype"] == "bf16" and r["rank"] == 1)
    assert metrics["stress.gemm.bf16.tflops.rank1"].value == row["tflops_p50"]
    assert "stress.gemm.fp32.tflops.rank0" in metrics
    assert metrics["stress.membw.gbps.rank0"].unit == "GB/s"
    assert metrics["stress.sdc.p50_ms.rank0"].better is Better.LOWER


def test_env_gives_per_gpu_figures_by_nvml_index_named_like_the_rest_of_gpucheck() -> None:
    metrics = metrics_of(Report.from_dict(sample("env_gpu")))
    width = metrics["env.gpu.pcie_width_current.gpu1"]
    assert (width.value, width.better, position(width)) == (16, Better.HIGHER, "gpu1")
    assert (slot_words(width) or "").startswith("GPU 1 (NVIDIA H200, bus ")
    assert metrics["env.gpu.temperature_c.gpu0"].better is Better.INFO
    assert "env.system.memory_total_bytes" in metrics


def test_the_metrics_are_read_from_the_sections_not_their_tables() -> None:
    """Renaming or emptying a display table changes no metric (issue 25)."""
    report = sample("comm")
    before = metrics_of(Report.from_dict(report))
    for s in report["sections"]:
        s["data"] = {"renamed": s["data"]}
    assert metrics_of(Report.from_dict(report)) == before


def test_sections_of_a_combined_report_are_found_too() -> None:
    bench = sample("bench")
    combined = dict(bench, command="all", sections=[
        dict(s, name=f"bench.{s['name']}") for s in bench["sections"]])
    assert metrics_of(Report.from_dict(combined)).keys() == metrics_of(
        Report.from_dict(bench)).keys()


@pytest.mark.parametrize("value", ["fast", True, None, [1.0]])
def test_a_damaged_metric_is_an_error_the_reader_names(value: Any) -> None:
    report = dict(sample("bench"), sections=[{"name": "timing", "title": "t", "metrics": [
        {"name": "bench.job_wall_s", "unit": "s", "better": "lower", "value": value}]}])
    with pytest.raises(ReportShapeError, match=r"sections\[0\]: metrics\[0\]"):
        Report.from_dict(report)


def test_facts_hold_versions_hardware_and_run_settings() -> None:
    env, bench = (extract_facts(Report.from_dict(sample(n))) for n in ("env_gpu", "bench"))
    assert env["NVIDIA driver version"].value == "550.54.15"
    assert env["NVIDIA driver version"].kind == VERSION
    assert (env["GPU model"].value, env["GPU model"].kind) == ("NVIDIA H200", HARDWARE)
    assert env["GPU count (driver)"].value == "2"
    assert (bench["bench.batch_size"].value, bench["bench.batch_size"].kind) == ("4", SETUP)
    assert "NVIDIA driver version" not in bench  # bench reports state no driver


def test_every_metric_name_of_the_saved_reports_is_in_the_docs() -> None:
    text = DOCS.read_text()
    documented = set(re.findall(r"`([a-z_0-9<>.]+)`", text))
    names = {re.sub(r"\.(bf16|fp32|fp16)\.", ".<dtype>.", family(m))
             for name in ("bench", "comm", "stress", "env_gpu")
             for m in metrics_of(Report.from_dict(sample(name))).values()}
    names = {re.sub(r"^comm\.(all_reduce|all_gather)\.", "comm.<collective>.", n)
             for n in names}
    assert sorted(n for n in names if n not in documented) == []
