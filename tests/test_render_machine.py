"""`--format line` (one clean line) and `--format prometheus` (read back by prometheus_client:
one gauge per check and subject, every figure in base units)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from gpucheck import subject
from gpucheck.render import render
from gpucheck.render.headline import LABELS, MAX_CHARS
from gpucheck.report import Report, Section, fail, ok, skip, warn

parser = pytest.importorskip("prometheus_client.parser")
REPORTS = Path(__file__).resolve().parent / "data" / "reports"
GPU3 = subject.gpu(3, "GPU 3 (NVIDIA H200, bus 00000000:48:00.0, "
                   "GPU-00000003-0000-0000-0000-000000000000)", bus_id="00000000:48:00.0",
                   uuid="GPU-00000003-0000-0000-0000-000000000000")


def saved(name: str) -> Report:
    return Report.from_dict(json.loads((REPORTS / name).read_text()))


def _families(text: str) -> dict:
    return {f.name: f for f in parser.text_string_to_metric_families(text)}


def _health_like() -> Report:
    section = Section("gpus", "GPUs", {"valid_until": "2026-11-24T10:10:00+00:00"}, [
        ok("driver.nvml", "driver 550"),
        ok("gpu.pcie.width", "x16", GPU3),
        fail("kernel_log.xid", "XID 48 once", "reset it", GPU3, cause="table.reset-gpu"),
        warn("kernel_log.xid", "XID 94 once", "restart", GPU3, cause="table.restart-app"),
        warn("ib.port.rate", "runs at 200 Gb/sec", "reseat", subject.port("mlx5_1/1")),
        skip("ib.port.link_downed", "first check", subject.port("mlx5_0/1")),
    ])
    return Report(command="health", sections=[section], created_at="2026-11-24T10:00:00+00:00")


def test_prometheus_text_parses_with_prometheus_own_parser_into_labelled_gauges():
    families = _families(render(_health_like(), "prometheus"))
    assert {n: f.type for n, f in families.items()} == {
        "gpucheck_check_status": "gauge", "gpucheck_verdict": "gauge",
        "gpucheck_findings": "gauge", "gpucheck_report_timestamp_seconds": "gauge",
        "gpucheck_valid_until_timestamp_seconds": "gauge", "gpucheck_info": "gauge"}
    samples = families["gpucheck_check_status"].samples
    by_key = {(s.labels["check"], s.labels["subject"]): s for s in samples}
    assert len(by_key) == len(samples) == 5  # two XIDs on GPU 3 fold into one series
    xid = by_key[("kernel_log.xid", GPU3.label)]
    assert xid.value == 3 and xid.labels["gpu"] == "3" and xid.labels["action"] == "reset-gpu"
    assert set(xid.labels) == set(LABELS) and xid.labels["command"] == "health"
    rate = by_key[("ib.port.rate", "hca port mlx5_1/1")]
    assert (rate.value, rate.labels["hca"], rate.labels["port"]) == (2, "mlx5_1", "1")
    assert by_key[("driver.nvml", "")].value == 0
    assert families["gpucheck_verdict"].samples[0].value == 3
    findings = {s.labels["status"]: s.value for s in families["gpucheck_findings"].samples}
    assert findings == {"OK": 2, "SKIP": 1, "WARN": 2, "FAIL": 1}
    made = dt.datetime(2026, 11, 24, 10, 0, tzinfo=dt.timezone.utc).timestamp()
    assert families["gpucheck_report_timestamp_seconds"].samples[0].value == made
    assert families["gpucheck_valid_until_timestamp_seconds"].samples[0].value == made + 600
    assert all(s.timestamp is None for f in families.values() for s in f.samples)


def test_prometheus_label_values_are_escaped():
    odd = 'GPU 1 (a "quoted" \\ name\nwith a newline)'
    report = Report(command="health", sections=[Section("x", "X", {}, [
        fail("gpu.query", "lost", "reset", subject.gpu(1, odd))])])
    (sample,) = _families(render(report, "prometheus"))["gpucheck_check_status"].samples
    assert sample.labels["subject"] == odd and sample.labels["gpu"] == "1"


@pytest.mark.parametrize("name", ["env_gpu.json", "stress_fail.json", "bench.json"])
def test_every_saved_report_renders_as_valid_prometheus_text(name):
    families = _families(render(saved(name), "prometheus"))
    statuses = families["gpucheck_check_status"].samples
    assert len(statuses) == len({(s.labels["check"], s.labels["subject"]) for s in statuses})
    assert "gpucheck_valid_until_timestamp_seconds" not in families  # says no valid_until


def test_the_line_of_a_saved_failed_stress_run_names_the_rank_and_drains():
    line = render(saved("stress_fail.json"), "line")
    assert line.count("\n") == 1 and line.startswith("gpucheck stress FAIL drain-node")
    assert "stress.sdc.repeat" in line


def test_the_line_is_one_short_printable_line_whatever_the_message_holds():
    report = Report(command="health", sections=[Section("x", "X", {}, [
        fail("gpu.query", "lost\nfell off\x1b[31m the bus\t" + "x" * 400, "reset", GPU3)])])
    line = render(report, "line")
    assert line.endswith("\n") and line.count("\n") == 1 and len(line) <= MAX_CHARS + 1
    assert all(32 <= ord(c) < 127 for c in line[:-1]) and line[:-1].endswith("...")
    assert "GPU 3 (bus 00000000:48:00.0): gpu.query: lost fell off [31m the bus x" in line


def test_the_line_of_a_healthy_report_counts_its_checks():
    report = Report(command="health", sections=[Section("x", "X", {}, [
        ok("gpu.numa", "fine"), ok("system.shm", "fine"),
        skip("ib.ports", "no InfiniBand device")])])
    assert render(report, "line") == ("gpucheck health OK: 2 checks OK, 1 skipped: ib.ports: "
                                      "no InfiniBand device\n")


# --- figures: every metric as a gauge in base units, the subject as labels ------------

def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(s.labels, s.value) for s in _families(text)[name].samples]


def test_a_comm_report_exports_busbw_per_collective_and_size_in_bytes_per_second() -> None:
    text = render(saved("comm.json"), "prometheus")
    busbw = _samples(text, "gpucheck_comm_busbw_bytes_per_second")
    labels, value = next((lb, v) for lb, v in busbw
                         if lb["collective"] == "all_gather" and lb["size_bytes"] == "65536")
    assert labels == {"command": "comm", "collective": "all_gather", "size_bytes": "65536"}
    assert value == pytest.approx(0.0721e9)  # 0.0721 GB/s in the report
    pairs = {(lb["rank"], lb["peer"]) for lb, _ in
             _samples(text, "gpucheck_comm_pairwise_bytes_per_second")}
    assert pairs == {("0", "1"), ("1", "0")}


def test_bench_figures_are_in_base_units_with_the_rank_as_a_label() -> None:
    report = saved("bench.json")
    text = render(report, "prometheus")
    p50 = {lb["rank"]: v for lb, v in _samples(text, "gpucheck_bench_iteration_p50_seconds")}
    in_ms = {m.subject.rank: m.value for s in report.sections for m in s.metrics
             if m.name == "bench.iteration_p50_ms" and m.subject is not None}
    assert p50 == {str(rank): pytest.approx(ms / 1000) for rank, ms in in_ms.items()}
    (job,) = _samples(text, "gpucheck_bench_aggregate_images_per_second")
    assert job[0] == {"command": "bench"} and job[1] > 0


def test_gpu_figures_carry_dcgm_exporters_gpu_labels_and_every_family_one_label_set() -> None:
    text = render(saved("env_gpu.json"), "prometheus")
    power = _samples(text, "gpucheck_env_gpu_power_limit_watts")
    assert {lb["gpu"] for lb, _ in power} == {"0", "1"}
    assert all(set(lb) == {"command", "gpu", "UUID", "pci_bus_id"} for lb, _ in power)
    for family in _families(text).values():
        assert len({frozenset(s.labels) for s in family.samples}) == 1, family.name
    assert _samples(text, "gpucheck_env_gpu_sm_clock_max_hertz")[0][1] == 1980e6


def test_the_scope_is_exported_and_a_report_without_figures_has_no_figure_family() -> None:
    text = render(Report(command="health", sections=[], scope="no NVIDIA GPU"), "prometheus")
    assert _samples(text, "gpucheck_info") == [({"command": "health",
                                                 "scope": "no NVIDIA GPU"}, 1.0)]
    assert not [n for n in _families(text) if n.startswith("gpucheck_health_")]
