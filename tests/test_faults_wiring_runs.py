"""Fault watching in bench, comm and stress end to end: real gloo CPU ranks over
loopback, each watching a GPU of the fake pynvml (tests/fake_nvml_site) through the
test-only bus override, so the whole path runs without a GPU: the frame starts the
watch in every rank, the worker marks its window and gathers, rank 0 reports.

Runs are kept small (2 ranks, the smallest loads); the faults section is judged on
its own, since other sections of CPU runs may warn about scheduling noise.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import bench_workers
import pytest
from plant import Plant, planted

from gpucheck.cli import main
from gpucheck.commands import stress as stress_command

SITE = Path(__file__).resolve().parent / "fake_nvml_site"
BUS = ("00000000:18:00.0", "00000000:9A:00.0")
WATCH_FAKE = Plant(fault_bus=BUS)  # rank r watches fake GPU r (the bus override)
LABEL = ("GPU 0 (NVIDIA H200, bus 00000000:18:00.0, GPU-00000000-0000-0000-0000-000000000000)",
         "GPU 1 (NVIDIA H200, bus 00000000:9A:00.0, GPU-00000001-0000-0000-0000-000000000000)")
XID = 0x8  # nvmlEventTypeXidCriticalError
BENCH = ["--model", "mobilenet_v3_small", "--batch-size", "2", "--warmup", "1", "--iters", "2"]
COMM = ["--min-bytes", "1K", "--max-bytes", "4K", "--iters", "2", "--warmup", "1",
        "--no-pairwise"]


@pytest.fixture
def fake_gpus(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Two fake H200s in every rank; rank r watches GPU r. Call with the scenario."""
    monkeypatch.syspath_prepend(str(SITE))  # spawned ranks start from this sys.path
    kept = sys.modules.pop("pynvml", None)

    def scenario(gpus: list[dict[str, Any]] | None = None,
                 events: list[dict[str, Any]] | None = None) -> None:
        gpus = gpus or [{}, {}]
        for gpu, bus in zip(gpus, BUS, strict=True):
            gpu.setdefault("bus_id", bus)
        monkeypatch.setenv("GPUCHECK_FAKE_NVML", json.dumps({"gpus": gpus,
                                                             "events": events or []}))
    yield scenario
    sys.modules.pop("pynvml", None)
    if kept is not None:
        sys.modules["pynvml"] = kept


def run(tmp_path: Path, command: str, *extra: str,
        plant: Plant = WATCH_FAKE) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "report.json"
    with planted(plant):
        code = main([command, "--n-gpus", "2", "--timeout", "60", "-q", "-o", str(out),
                        *extra])
    return code, json.loads(out.read_text())


def faults(report: dict[str, Any]) -> dict[str, Any]:
    return next(s for s in report["sections"] if s["name"] == "faults")


def statuses(section: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    return [(f["check"], f["status"], f["subject"]) for f in section["findings"]]


def test_a_healthy_comm_run_shows_every_rank_and_its_gpu_ok(tmp_path: Path, fake_gpus) -> None:
    fake_gpus()
    code, report = run(tmp_path, "comm", *COMM)
    assert code == 0, report
    section = faults(report)
    assert statuses(section) == [("faults.summary", "OK", f"rank 0 on {LABEL[0]}"),
                                 ("faults.summary", "OK", f"rank 1 on {LABEL[1]}")]
    assert [(g["ranks"], g["verdict"]) for g in section["data"]["gpus"]] == [("0", "OK"),
                                                                           ("1", "OK")]
    assert all(g["ecc_uncorrected"] == 0 and g["xid_events"] == 0
               for g in section["data"]["gpus"])


def test_counters_the_fake_gpus_lack_are_na_in_a_stress_run_never_a_fail(
        tmp_path: Path, fake_gpus, monkeypatch: pytest.MonkeyPatch) -> None:
    # Short measuring windows: the faults section is what is judged here.
    monkeypatch.setitem(stress_command.DEFAULTS, "cpu", stress_command.Defaults(
        size=64, duration_s=0.1, warmup_s=0.05, gemm_window_s=0.3, membw_window_s=0.2))
    # No field value supported: NVML answers NotSupported per field, not for the call.
    lacking = {"nvlinks": 0, "unsupported": ["nvmlDeviceGetPcieReplayCounter"],
               "field_values": {}}
    fake_gpus(gpus=[dict(lacking), dict(lacking)])
    code, report = run(tmp_path, "stress", "--dtypes", "fp32")
    assert code == 0, [f for s in report["sections"] for f in s["findings"]
                       if f["status"] == "FAIL"]
    section = faults(report)
    assert [s for _, s, _ in statuses(section)] == ["OK", "OK"]
    for finding in section["findings"]:
        assert "n/a: PCIe replay counter, NVLink (none on this GPU)" in finding["message"]
    assert [g["pcie_replays"] for g in section["data"]["gpus"]] == [None, None]


# The default CPU bench (no fake GPUs): the watch is a SKIP that says why; asserted on
# test_bench_runs.py's two-rank run of the same settings (one run fewer). --no-fault-watch
# reaching the ranks: test_stress_runs.py's one-rank run.


def test_a_failed_bench_run_still_reports_rank_zeros_own_faults(tmp_path: Path,
                                                                fake_gpus) -> None:
    fake_gpus(events=[{"gpu": 0, "type": XID, "data": 79, "on_poll": 1}])
    code, report = run(tmp_path, "bench", *BENCH,
                       plant=replace(WATCH_FAKE, model=bench_workers.fail_rank_zero))
    assert code == 1
    section = faults(report)
    assert ("faults.xid", "FAIL", f"rank 0 on {LABEL[0]}") in statuses(section)
    skipped = [f["message"] for f in section["findings"] if f["status"] == "SKIP"]
    assert skipped == [], skipped  # bench's partial has no roll of ranks: rank 0 alone


def test_a_bench_straggler_in_thermal_slowdown_is_told_why_and_an_xid_79_fails_its_gpu(
        tmp_path: Path, fake_gpus) -> None:
    # Rank 1 sleeps in every forward (a slow GPU), its GPU's HW thermal slowdown counter
    # (field 270) grows at half of real time (slowed down 50% of any window), and an
    # XID 79 reaches that GPU mid-bench. One run for both (each its own finding).
    fake_gpus(gpus=[{}, {"slowdown_share": {"270": 0.5}}],
              events=[{"gpu": 1, "type": XID, "data": 79, "on_poll": 1}])
    code, report = run(tmp_path, "bench", *BENCH[:-1], "5",
                       plant=replace(WATCH_FAKE, model=bench_workers.slow_rank_one))
    assert code == 1
    section = faults(report)
    failed = [f for f in section["findings"] if f["status"] == "FAIL"]
    assert [(f["check"], f["subject"]) for f in failed] == [("faults.xid",
                                                             f"rank 1 on {LABEL[1]}")]
    assert "XID 79 (GPU has fallen off the bus)" in failed[0]["message"]
    assert ("faults.summary", "OK", f"rank 0 on {LABEL[0]}") in statuses(section)
    assert [(e["rank"], e["xid"]) for e in section["data"]["events"]] == [(1, 79)]
    warned = [f for s in report["sections"] for f in s["findings"]
              if f["check"] == "bench.rank.straggler" and f["status"] == "WARN"]
    assert [f["subject"] for f in warned] == ["rank 1"]
    # The share is the counter's growth over the loop's own clock: 50% give or take the
    # moment each was read (51% seen in a loaded CI run).
    cause = re.search(r"; was in HW thermal slowdown (\d+)% of the timed loop$",
                      warned[0]["message"])
    assert cause and 45 <= int(cause[1]) <= 55, warned[0]["message"]
    slowed = [f for f in faults(report)["findings"] if f["check"] == "faults.clocks.slowdown"]
    assert [(f["status"], f["subject"]) for f in slowed] == [("WARN", f"rank 1 on {LABEL[1]}")]
