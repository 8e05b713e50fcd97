"""Each command's canned result gives today's metric keys and values (the keys baselines
were saved with), from the worker's result and records, never the display tables."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

from gpucheck.analysis.loading import metrics_of
from gpucheck.bench.findings import timing_section
from gpucheck.bench.pace import aggregate
from gpucheck.bench.records import RankRecord
from gpucheck.comm.report import Verdicts as CommBounds
from gpucheck.comm.report import comm_sections
from gpucheck.measure import Better
from gpucheck.probes.runner import with_env_metrics
from gpucheck.report import Report, Section
from gpucheck.stress.report import Verdicts as StressBounds
from gpucheck.stress.report import stress_sections
from gpucheck.subject import Kind

ROOT = Path(__file__).resolve().parents[1]


def _stress_rank(rank: int) -> dict[str, Any]:
    return {"rank": rank, "node_rank": 0, "host": "n0", "local_rank": rank,
            "device": f"cuda:{rank}", "gpu": f"GPU {rank} (bus 0000:1{rank}:00.0)",
            "gpu_name": "NVIDIA H100 80GB HBM3", "nvml_index": rank,
            "pci_bus_id": f"0000:1{rank}:00.0"}


def stress_result() -> dict[str, Any]:
    ranks = [_stress_rank(r) for r in (0, 1)]
    gemm = [{"rank": r, "dtype": d, "size": 512, "iters": 50, "tflops": t * 0.9,
             "tflops_p50": t, "p50_ms": 1.0, "p99_ms": 2.0}
            for d, base in (("bf16", 600.0), ("fp32", 50.0)) for r, t in ((0, base),
                                                                          (1, base - 10))]
    membw = [{"rank": r, "size_bytes": 1 << 26, "iters": 16, "gbps": g * 0.9, "gbps_p50": g,
              "p50_ms": 1.0, "p99_ms": 1.2} for r, g in ((0, 3000.0), (1, 2900.0))]
    sdc = {"dtype": "bf16", "size": 512, "duration_s": 2.0, "tolerance": 1.0,
           "rows_checked": 64, "reference_deviations": [0.0, 0.0],
           "records": [{"rank": r, "dtype": "bf16", "size": 512, "mode": "bitwise",
                        "iters": 100, "duration_s": 2.0, "bad_iters": 0,
                        "first_bad_iter": None, "worst_elements": 0, "p50_ms": p,
                        "p99_ms": p * 1.1, "digest": "aa", "group": "g"}
                       for r, p in ((0, 7.0), (1, 7.5))]}
    copies = {"rows": [{"rank": r, "size_bytes": 256 << 20,
                        "h2d_alone_gbps": 50.0 + r, "d2h_alone_gbps": 51.0 + r,
                        "h2d_together_gbps": 40.0 + r, "d2h_together_gbps": 41.0 + r,
                        "link": "Gen5 x16", "link_gbps": 63.0} for r in (0, 1)]}
    node = {"node_rank": 0, "host": "n0", "gpus": [{"nvml_index": 0}, {"nvml_index": 1}],
            "pairs": [{"src": 0, "dst": 1, "gbps": 300.0, "path": "NV18", "p2p_status": "OK",
                       "peer_access": True},
                      {"src": 1, "dst": 0, "gbps": 310.0, "path": "NV18",
                       "p2p_status": "OK", "peer_access": True}]}
    return {"world_size": 2, "device": "cuda", "backend": "nccl", "dtypes": ["bf16", "fp32"],
            "size": 512, "duration_s": 2.0, "ranks": ranks, "gemm": gemm, "membw": membw,
            "sdc": sdc, "copies": copies, "p2p": {"nodes": [node]},
            "phases_planned": ["gemm", "membw", "sdc", "copies", "p2p"],
            "phases_done": ["gemm", "membw", "sdc", "copies", "p2p"]}


def values(report: Report) -> dict[str, float]:
    return {key: m.value for key, m in metrics_of(report).items()}


def test_stress_gives_each_phases_figures_per_rank_and_pair_in_that_phases_section() -> None:
    sections = stress_sections(stress_result(), StressBounds(0.9, 0.8, 0.6))
    for section in sections:
        assert all(m.name.split(".")[1] == section.name for m in section.metrics)
    report = Report("stress", sections)
    assert metrics_of(Report.from_dict(json.loads(json.dumps(report.to_dict())))) == \
        metrics_of(report)  # and they travel through the report's JSON
    assert sum(len(s.metrics) for s in sections) == len(metrics_of(report))  # none twice
    assert values(report) == {
        "stress.gemm.bf16.tflops.rank0": 600.0, "stress.gemm.bf16.tflops.rank1": 590.0,
        "stress.gemm.fp32.tflops.rank0": 50.0, "stress.gemm.fp32.tflops.rank1": 40.0,
        "stress.membw.gbps.rank0": 3000.0, "stress.membw.gbps.rank1": 2900.0,
        "stress.sdc.p50_ms.rank0": 7.0, "stress.sdc.p50_ms.rank1": 7.5,
        "stress.copies.h2d_gbps.rank0": 50.0, "stress.copies.h2d_gbps.rank1": 51.0,
        "stress.copies.d2h_gbps.rank0": 51.0, "stress.copies.d2h_gbps.rank1": 52.0,
        "stress.copies.h2d_together_gbps.rank0": 40.0,
        "stress.copies.h2d_together_gbps.rank1": 41.0,
        "stress.copies.d2h_together_gbps.rank0": 41.0,
        "stress.copies.d2h_together_gbps.rank1": 42.0,
        "stress.p2p.gbps.cuda0_to_cuda1": 300.0, "stress.p2p.gbps.cuda1_to_cuda0": 310.0}
    metrics = metrics_of(report)
    gemm = metrics["stress.gemm.bf16.tflops.rank1"]
    assert (gemm.unit, gemm.better, gemm.subject and gemm.subject.gpu) == (
        "TFLOP/s", Better.HIGHER, 1)
    assert metrics["stress.sdc.p50_ms.rank0"].better is Better.LOWER
    pair = metrics["stress.p2p.gbps.cuda0_to_cuda1"].subject
    assert pair is not None and (pair.kind, pair.gpu, pair.peer, pair.node) == (
        Kind.PAIR, 0, 1, 0)


def test_a_phase_that_did_not_finish_gives_no_metrics() -> None:
    result = stress_result()
    result["phases_done"] = ["gemm", "membw", "sdc"]
    report = Report("stress", stress_sections(result, StressBounds(0.9, 0.8, 0.6)))
    assert not [k for k in metrics_of(report) if ".copies." in k or ".p2p." in k]


def comm_result() -> dict[str, Any]:
    ranks = [{"rank": r, "local_rank": r, "node_rank": 0, "host": "vm", "device": "cpu",
              "nvml_index": None, "pci_bus_id": None, "uuid": None} for r in (0, 1)]
    rows = [{"size_bytes": s, "count": s // 4, "time_us": t, "algbw_gbps": b,
             "busbw_gbps": b, "wrong": 0, "slowest_rank": 1, "fastest_time_us": t / 1.25,
             "rank_times_us": [t / 1.25, t]} for s, t, b in ((1024, 500.0, 0.002),
                                                              (65536, 900.0, 0.07))]
    pairs = [{"src": 0, "dst": 1, "node_rank": 0, "size_bytes": 1 << 20,
              "bandwidth_gbps": 0.027, "samples_gbps": [0.027]},
             {"src": 1, "dst": 0, "node_rank": 0, "size_bytes": 1 << 20,
              "bandwidth_gbps": 0.031, "samples_gbps": [0.031]}]
    return {"world_size": 2, "device": "cpu", "backend": "gloo", "sizes_bytes": [1024, 65536],
            "iters": 3, "warmup": 1, "complete": True, "ranks": ranks,
            "collectives": {"all_reduce": rows},
            "pairwise": {"size_bytes": 1 << 20, "iters": 3, "pairs": pairs}}


def test_comm_gives_busbw_per_size_with_its_spread_and_the_pairs() -> None:
    report = Report("comm", comm_sections(comm_result(), CommBounds(0.5, None, 0.9)))
    assert values(report) == {"comm.all_reduce.busbw_gbps@1024": 0.002,
                              "comm.all_reduce.busbw_gbps@65536": 0.07,
                              "comm.pairwise.gbps.rank0_to_rank1": 0.027,
                              "comm.pairwise.gbps.rank1_to_rank0": 0.031}
    metrics = metrics_of(report)
    spread = metrics["comm.all_reduce.busbw_gbps@1024"].spread
    assert spread is not None and abs(spread - 0.25) < 1e-9
    assert metrics["comm.all_reduce.busbw_gbps@1024"].subject is None


def _record(rank: int, wall_s: float, iter_ms: tuple[float, ...]) -> RankRecord:
    return RankRecord(rank=rank, host="n0", node_rank=0, local_rank=rank, device="cpu",
                      device_name="CPU", device_uuid=None, images=12, iters=3, wall_s=wall_s,
                      span_s=wall_s, device_s=wall_s, peak_memory_bytes=None, threads=1,
                      iter_ms=iter_ms)


def test_bench_gives_the_jobs_figures_and_each_ranks_rate_and_pace() -> None:
    records = (_record(0, 6.0, (2000.0, 2000.0, 2200.0)), _record(1, 4.0, (1300.0,) * 3))
    metrics = metrics_of(Report("bench", [timing_section(records, aggregate(records, 0.1))]))
    assert set(metrics) == {"bench.aggregate_images_per_s", "bench.job_wall_s",
                            "bench.parallel_efficiency", "bench.spread_slowest_vs_median",
                            "bench.images_per_s.rank0", "bench.images_per_s.rank1",
                            "bench.iteration_p50_ms.rank0", "bench.iteration_p50_ms.rank1"}
    assert metrics["bench.images_per_s.rank0"].value == 2.0
    assert metrics["bench.images_per_s.rank1"].value == 3.0
    assert metrics["bench.job_wall_s"].value == 6.0
    assert metrics["bench.job_wall_s"].better is Better.LOWER
    assert metrics["bench.iteration_p50_ms.rank0"].value == 2000.0
    # The job's figures vary as much as its most unsettled rank (p99 over p50).
    assert metrics["bench.job_wall_s"].spread == metrics["bench.images_per_s.rank0"].spread


def test_env_gives_each_gpus_figures_and_the_systems() -> None:
    gpus = [{"index": i, "name": "NVIDIA H200", "uuid": f"GPU-{i}", "pci_bus_id": f"0:1{i}:0",
             "memory_total_bytes": 150 << 30, "pcie_width_current": 16 - 8 * i,
             "temperature_c": 34, "persistence_mode": True} for i in (0, 1)]
    sections = [Section("system", "System", {"memory_total_bytes": 1 << 40,
                                             "cpu_logical_cores": 64, "os": "Linux"}),
                Section("gpus", "GPUs", {"gpus": gpus}),
                Section("gpu_test", "GPU test", {"results": [
                    {"nvml_index": 1, "gpu": "GPU 1", "h2d_gbps": 25.0, "d2h_gbps": 26.0}]}),
                Section("node1.gpus", "GPUs of node 1", {"gpus": gpus[:1]})]
    with_env_metrics(sections)
    metrics = metrics_of(Report("env", sections))
    assert values(Report("env", sections)) == {
        "env.system.memory_total_bytes": 1 << 40, "env.system.cpu_logical_cores": 64,
        "env.gpu.memory_total_bytes.gpu0": 150 << 30, "env.gpu.memory_total_bytes.gpu1":
        150 << 30, "env.gpu.pcie_width_current.gpu0": 16,
        "env.gpu.pcie_width_current.gpu1": 8, "env.gpu.temperature_c.gpu0": 34,
        "env.gpu.temperature_c.gpu1": 34, "env.gpu_test.h2d_gbps.gpu1": 25.0,
        "env.gpu_test.d2h_gbps.gpu1": 26.0}
    width = metrics["env.gpu.pcie_width_current.gpu1"]
    assert width.better is Better.HIGHER and width.subject is not None
    assert (width.subject.gpu, width.subject.bus_id, width.subject.uuid) == (
        1, "0:11:0", "GPU-1")
    assert metrics["env.gpu.temperature_c.gpu0"].better is Better.INFO
    assert len(sections[3].metrics) == 3  # a gathered node's GPUs carry theirs too


def _imports_re(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name == "re" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and node.module == "re":
            return True
    return False


def test_no_regex_in_the_report_readers() -> None:
    # compare, fleet, baselines and the chart rules read fields, never rendered words.
    readers = [*sorted((ROOT / "gpucheck" / "analysis").glob("*.py")),
               ROOT / "gpucheck" / "render" / "chart_find.py"]
    assert readers and [p.name for p in readers if _imports_re(p)] == []
