"""The metric extractor and the facts compare and fleet share, on saved real reports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gpucheck.analysis.facts import HARDWARE, SETUP, VERSION, extract_facts
from gpucheck.analysis.metrics import FAMILIES, HIGHER, INFO, LOWER, extract_metrics

REPORTS = Path(__file__).resolve().parent / "data" / "reports"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "fleet.md"


def sample(name: str) -> dict[str, Any]:
    return json.loads((REPORTS / f"{name}.json").read_text())


def section(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(s for s in report["sections"] if s["name"] == name)


def test_bench_gives_images_per_s_per_rank_and_the_job_figures() -> None:
    report = sample("bench")
    metrics = extract_metrics(report)
    ranks = section(report, "timing")["data"]["ranks"]
    assert set(metrics) == {"bench.aggregate_images_per_s", "bench.job_wall_s",
                            "bench.parallel_efficiency", "bench.spread_slowest_vs_median",
                            "bench.images_per_s.rank0", "bench.images_per_s.rank1",
                            "bench.iteration_p50_ms.rank0", "bench.iteration_p50_ms.rank1"}
    assert metrics["bench.images_per_s.rank1"].value == ranks[1]["images_per_s"]
    assert metrics["bench.images_per_s.rank1"].position == "rank1"
    assert metrics["bench.images_per_s.rank1"].pool == "bench.images_per_s"


def test_times_are_better_lower_and_throughputs_higher() -> None:
    metrics = extract_metrics(sample("bench"))
    assert (metrics["bench.job_wall_s"].direction, metrics["bench.job_wall_s"].unit) == (
        LOWER, "s")
    assert (metrics["bench.images_per_s.rank0"].direction,
            metrics["bench.images_per_s.rank0"].unit) == (HIGHER, "images/s")


def test_comm_gives_busbw_per_collective_and_message_size_and_the_pair_matrix() -> None:
    report = sample("comm")
    metrics = extract_metrics(report)
    sizes = [r["size_bytes"] for r in section(report, "all_reduce")["data"]["results"]]
    for op in ("all_reduce", "all_gather"):
        for size in sizes:
            assert f"comm.{op}.busbw_gbps@{size}" in metrics
    one = metrics[f"comm.all_reduce.busbw_gbps@{sizes[-1]}"]
    assert one.value == section(report, "all_reduce")["data"]["results"][-1]["busbw_gbps"]
    assert (one.unit, one.direction, one.family) == ("GB/s", HIGHER,
                                                     "comm.all_reduce.busbw_gbps")
    assert {"comm.pairwise.gbps.rank0_to_rank1", "comm.pairwise.gbps.rank1_to_rank0"} <= set(
        metrics)


def test_stress_gemm_is_the_median_product_per_dtype_and_rank() -> None:
    report = sample("stress")
    metrics = extract_metrics(report)
    row = next(r for r in section(report, "gemm")["data"]["results"]
               if r["dtype"] == "bf16" and r["rank"] == 1)
    assert metrics["stress.gemm.bf16.tflops.rank1"].value == row["tflops_p50"]
    assert "stress.gemm.fp32.tflops.rank0" in metrics
    assert metrics["stress.membw.gbps.rank0"].unit == "GB/s"
    assert metrics["stress.sdc.p50_ms.rank0"].direction == LOWER


def test_env_gives_per_gpu_figures_by_nvml_index_named_like_the_rest_of_gpucheck() -> None:
    metrics = extract_metrics(sample("env_gpu"))
    width = metrics["env.gpu.pcie_width_current.gpu1"]
    assert (width.value, width.direction, width.position) == (16, HIGHER, "gpu1")
    assert width.gpu is not None and width.gpu.startswith("GPU 1 (NVIDIA H200, bus ")
    assert metrics["env.gpu.temperature_c.gpu0"].direction == INFO
    assert "env.system.memory_total_bytes" in metrics


def test_a_gpu_run_names_the_gpu_each_rank_used() -> None:
    report = sample("stress")
    label = "GPU 3 (NVIDIA H200, bus 00000000:9A:00.0, GPU-8c1e)"
    section(report, "stress")["data"]["ranks"][1]["gpu"] = label
    metrics = extract_metrics(report)
    assert metrics["stress.gemm.fp32.tflops.rank1"].gpu == label
    assert metrics["stress.gemm.fp32.tflops.rank0"].gpu is None


def test_host_copies_and_peer_matrices_become_per_gpu_and_per_pair_metrics() -> None:
    report = {"sections": [
        {"name": "copies", "data": {"results": [
            {"rank": 0, "h2d_alone_gbps": 25.0, "d2h_alone_gbps": 26.0,
             "h2d_together_gbps": 20.0, "d2h_together_gbps": 21.0}]}},
        {"name": "p2p", "data": {"node 0 (gpu01) matrix": [
            {"src": "cuda:0 (GPU 4)", "to cuda:0": None, "to cuda:1": 350.5},
            {"src": "cuda:1 (GPU 5)", "to cuda:0": "no P2P", "to cuda:1": None}]}}]}
    metrics = extract_metrics(report)
    assert {n: m.value for n, m in metrics.items()} == {
        "stress.copies.h2d_gbps.rank0": 25.0, "stress.copies.d2h_gbps.rank0": 26.0,
        "stress.copies.h2d_together_gbps.rank0": 20.0,
        "stress.copies.d2h_together_gbps.rank0": 21.0,
        "stress.p2p.gbps.cuda0_to_cuda1": 350.5}
    assert metrics["stress.p2p.gbps.cuda0_to_cuda1"].gpu == "GPU 4 -> GPU 5"


def test_sections_of_a_combined_report_are_found_by_their_last_name() -> None:
    bench = sample("bench")
    combined = {"command": "all", "sections": [
        dict(s, name=f"bench.{s['name']}") for s in bench["sections"]]}
    assert extract_metrics(combined).keys() == extract_metrics(bench).keys()


@pytest.mark.parametrize("value", [None, "fast", True, float("nan"), float("inf"), [1.0]])
def test_a_missing_or_non_numeric_value_is_no_metric(value: Any) -> None:
    report = {"sections": [{"name": "timing", "data": {
        "job_wall_s": value, "ranks": [{"rank": 0, "images_per_s": value}, "not a row",
                                       {"rank": "0", "images_per_s": 3.0}]}}]}
    assert extract_metrics(report) == {}


def test_a_damaged_section_is_skipped_not_fatal() -> None:
    report = {"sections": ["text", {"name": "timing", "data": ["not", "a", "dict"]},
                           {"name": "gemm", "data": {"results": "nope"}}]}
    assert extract_metrics(report) == {}


def test_facts_hold_versions_hardware_and_run_settings() -> None:
    env, bench = extract_facts(sample("env_gpu")), extract_facts(sample("bench"))
    assert env["NVIDIA driver version"].value == "550.54.15"
    assert env["NVIDIA driver version"].kind == VERSION
    assert (env["GPU model"].value, env["GPU model"].kind) == ("NVIDIA H200", HARDWARE)
    assert env["GPU count (driver)"].value == "2"
    assert (bench["bench.batch_size"].value, bench["bench.batch_size"].kind) == ("4", SETUP)
    assert "NVIDIA driver version" not in bench  # bench reports state no driver


def test_every_metric_family_is_in_the_docs() -> None:
    text = DOCS.read_text()
    documented = set(re.findall(r"`([a-z_0-9<>.]+)`", text))
    assert [f for f in FAMILIES if f not in documented] == []
