"""The NVML doorway's budgets, slow versus hung, persistence mode, and a driver NVML
cannot use.

Budgets are scaled down: a "slow" first attach sleeps 0.5 s in the fake while the
steady budget is 0.25 s and the attach budget 10 s, so the outcome does not depend
on how fast this machine is. A "hang" sleeps a few seconds, longer than the steady
budget plus the second budget (0.5 s) and shorter than the attach budget, so a hang
given the wrong budget would come back and the test would fail. A "slow" call
sleeps past its budget and well inside the second one (10 s).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpucheck.probes.consistency import cuda_compat_findings
from gpucheck.probes.gpus import probe_nvml
from gpucheck.probes.nvml import (
    Nvml,
    NvmlFailure,
)
from gpucheck.report import Report, Status
from tests.fake_pynvml import FakeNvml
from tests.fake_pynvml import findings as _findings
from tests.fake_pynvml import gpus as _gpus
from tests.health_fakes import gpu_node_sysfs

STEADY_S, ATTACH_S, HANG_RETRY_S, SLOW_RETRY_S = 0.25, 10.0, 0.5, 10.0


def _probe(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml, steady_s: float = STEADY_S,
           attach_s: float = ATTACH_S, retry_s: float = HANG_RETRY_S,
           sysfs: Path = Path("/nonexistent/sysfs")):  # never this machine's /sys
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    return probe_nvml(Nvml(steady_s, attach_s, retry_s), sysfs, {})


def test_a_steady_budget_above_the_attach_budget_makes_the_first_attach_as_patient():
    # --nvml-timeout above 30 s must not make the first attach less patient than the rest.
    assert Nvml(45.0).attach_timeout_s == 45.0
    assert Nvml(3.0).longest_wait_s == 33.0  # a steady call: its budget and the second one


def test_a_slow_first_attach_per_gpu_is_not_a_hang_and_every_gpu_is_read(monkeypatch):
    # Persistence mode off on a GSP-based GPU: the first handle per GPU takes seconds.
    fake = FakeNvml(_gpus(3, first_attach_s=2 * STEADY_S, persistence=0))
    result = _probe(monkeypatch, fake)
    assert not _findings(result, "driver.nvml_hang")
    assert not [f for s in result.sections for f in s.findings if f.status is Status.FAIL]
    rows = result.sections[1].data["gpus"]
    assert [r["name"] for r in rows] == ["NVIDIA H200"] * 3
    assert all(r["error"] is None for r in rows)
    # The topology matrix attaches again: the GPUs are up by then, the steady budget holds.
    assert result.sections[1].data["topology"][0]["GPU2"] == "NV18"


def test_a_steady_state_call_that_hangs_through_both_budgets_closes_the_doorway(monkeypatch):
    # The call sleeps 3 s: under the attach budget (10 s) it would come back and not count.
    fake = FakeNvml(_gpus(3, hang={"nvmlDeviceGetTemperature"}), hang_s=3.0)
    result = _probe(monkeypatch, fake, steady_s=0.2)
    hang = _findings(result, "driver.nvml_hang", Status.FAIL)
    assert len(hang) == 1
    assert "nvmlDeviceGetTemperature" in hang[0].message
    assert "within 0.2 s, nor in 0.5 s more" in hang[0].message
    assert "first attach" not in hang[0].message
    assert not _findings(result, "driver.nvml_slow")
    # Closed: the other GPUs fail at once instead of each waiting out a budget.
    failed = _findings(result, "gpu.query", Status.FAIL)
    assert [f.subject.label.split(" (")[0] for f in failed] == ["GPU 0", "GPU 1", "GPU 2"]
    assert all("hung" in f.message for f in failed[1:])


def test_a_second_attach_of_the_same_gpu_gets_the_steady_budget(monkeypatch):
    fake = FakeNvml(_gpus(2), hang_s=3.0)
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    nvml = Nvml(0.2, ATTACH_S, HANG_RETRY_S)
    nvml.call("nvmlDeviceGetHandleByIndex", 0)
    fake.gpus[0].hang = {"nvmlDeviceGetHandleByIndex"}
    with pytest.raises(NvmlFailure) as raised:
        nvml.call("nvmlDeviceGetHandleByIndex", 0)
    assert raised.value.kind == "Timeout" and "within 0.2 s" in raised.value.detail


def test_a_first_attach_longer_than_its_budget_is_a_hang_named_as_such(monkeypatch):
    gpus = _gpus(3)
    gpus[1].first_attach_s = 3.0
    result = _probe(monkeypatch, FakeNvml(gpus), steady_s=0.1, attach_s=0.5)
    hang = _findings(result, "driver.nvml_hang", Status.FAIL)
    assert len(hang) == 1 and "nvmlDeviceGetHandleByIndex" in hang[0].message
    assert "within 0.5 s" in hang[0].message and "first attach" in hang[0].message
    rows = result.sections[1].data["gpus"]
    assert rows[0]["name"] == "NVIDIA H200" and rows[1]["error"] and rows[2]["error"]


def test_one_call_that_answers_after_its_budget_is_slow_not_hung_and_the_doorway_stays_open(
        monkeypatch):
    # Rank 0 creating contexts on every GPU: the call waits behind them, then answers.
    fake = FakeNvml(_gpus(2, hang={"nvmlDeviceGetTemperature"}), hang_s=2 * STEADY_S)
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    nvml = Nvml(STEADY_S, ATTACH_S, SLOW_RETRY_S)
    handle = nvml.call("nvmlDeviceGetHandleByIndex", 0)
    assert nvml.call("nvmlDeviceGetTemperature", handle, 0) == 34
    assert nvml.hung is None and nvml.call("nvmlDeviceGetName", handle) == "NVIDIA H200"
    [slow] = nvml.slow_calls
    assert slow.function == "nvmlDeviceGetTemperature" and slow.budget_s == STEADY_S
    assert slow.waited_s >= STEADY_S


def test_env_reports_a_slow_call_as_a_warn_with_no_action_and_reads_every_gpu(monkeypatch):
    gpus = _gpus(3)
    gpus[1].hang = {"nvmlDeviceGetTemperature"}
    result = _probe(monkeypatch, FakeNvml(gpus, hang_s=2 * STEADY_S), retry_s=SLOW_RETRY_S)
    [slow] = _findings(result, "driver.nvml_slow")
    assert slow.status is Status.WARN and slow.action == "none"
    assert slow.message.startswith("nvmlDeviceGetTemperature answered after ")
    assert f"(its budget: {STEADY_S:g} s)" in slow.message
    assert not [f for s in result.sections for f in s.findings if f.status is Status.FAIL]
    rows = result.sections[1].data["gpus"]
    assert all(r["error"] is None for r in rows) and rows[1]["temperature_c"] == 34


def test_persistence_mode_off_warns_per_gpu_with_the_way_to_turn_it_on(monkeypatch):
    gpus = _gpus(3)
    gpus[2].persistence = 0
    result = _probe(monkeypatch, FakeNvml(gpus))
    warned = _findings(result, "gpu.persistence_mode", Status.WARN)
    assert [f.subject.label.split(" (")[0] for f in warned] == ["GPU 2"]
    assert "off" in warned[0].message
    assert "nvidia-smi -pm 1" in warned[0].hint and "nvidia-persistenced" in warned[0].hint
    assert len(_findings(result, "gpu.persistence_mode", Status.OK)) == 2


def test_persistence_mode_a_gpu_cannot_report_is_skipped_not_warned(monkeypatch):
    result = _probe(monkeypatch, FakeNvml(_gpus(1, unsupported={
        "nvmlDeviceGetPersistenceMode"})))
    assert [f.status for f in _findings(result, "gpu.persistence_mode")] == [Status.SKIP]


@pytest.mark.parametrize("error, pci_gpus, meaning, todo", [
    ("NVMLError_LibRmVersionMismatch", 8, "driver/library version mismatch", "reboot"),
    ("NVMLError_DriverNotLoaded", 8, "kernel driver is not loaded", "modprobe nvidia"),
    ("NVMLError_LibraryNotFound", 8, "no NVIDIA driver", "install the NVIDIA driver")])
def test_a_driver_nvml_cannot_use_fails_the_report_with_its_meaning(
        monkeypatch, tmp_path, error, pci_gpus, meaning, todo):
    result = _probe(monkeypatch, FakeNvml(_gpus(8), init_error=error),
                    sysfs=gpu_node_sysfs(tmp_path, pci_gpus))
    report = Report("env")
    for section in result.sections:
        report.add(section)
    result.sections[0].findings.extend(cuda_compat_findings(result.driver, "13.0", result.gpus,
                                                            ("sm_90",)))
    assert report.verdict() is Status.FAIL and report.exit_code() == 1
    failed = [f for f in report.findings if f.status is Status.FAIL]
    # not a generic probe error; and the 8 GPUs the bus has are not usable
    assert [f.check for f in failed] == ["driver.nvml", "gpu.count"]
    assert meaning in failed[0].message and f"{pci_gpus} NVIDIA GPU(s)" in failed[0].message
    assert todo in failed[0].hint and "nvidia-smi to see" not in failed[0].hint
    assert failed[1].action == "drain-node"


def test_a_healthy_driver_passes_the_same_report_with_exit_code_0(monkeypatch, tmp_path):
    result = _probe(monkeypatch, FakeNvml(_gpus(8)), sysfs=gpu_node_sysfs(tmp_path))
    report = Report("env", sections=result.sections)
    assert report.verdict() is Status.OK and report.exit_code() == 0
