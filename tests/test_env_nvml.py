"""NVML logic against the fake pynvml: 2 to 8 GPUs, each fault with its verdict."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gpucheck.probes import gpus as gpus_module
from gpucheck.probes.consistency import cuda_compat_finding, probe_consistency
from gpucheck.probes.gpu_judge import driver_finding, gpu_findings
from gpucheck.probes.gpu_read import DriverInfo, GpuRecord
from gpucheck.probes.gpus import gpus_section, probe_nvml
from gpucheck.probes.nvml import Nvml, NvmlFailure
from gpucheck.probes.torch_build import TorchInfo
from gpucheck.render import render
from gpucheck.report import Report, Status
from tests.fake_pynvml import FakeGpu, FakeNvml, probe
from tests.fake_pynvml import findings as _findings
from tests.health_fakes import gpu_node_sysfs

NO_SYSFS = Path("/nonexistent/sysfs")


def _gpus(n: int, **faults: dict) -> list[FakeGpu]:
    """n healthy GPUs; `faults` maps 'gpu<i>' to field overrides."""
    gpus = [FakeGpu(bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0") for i in range(n)]
    for key, changes in faults.items():
        for attr, value in changes.items():
            setattr(gpus[int(key[3:])], attr, value)
    return gpus


def _probe(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml, sysfs: Path = NO_SYSFS):
    # never this machine's /sys: a bus with no GPU unless the test gives one
    return probe(monkeypatch, fake, sysfs=sysfs, environ={})


def _statuses(result) -> set[Status]:
    return {f.status for s in result.sections for f in s.findings}


def test_eight_healthy_gpus_are_all_ok_with_an_nvlink_topology(monkeypatch):
    result = _probe(monkeypatch, FakeNvml(_gpus(8)))
    assert result.driver.gpu_count == 8 and result.driver.cuda_version == "12.4"
    assert _statuses(result) == {Status.OK}
    gpus = result.sections[1].data["gpus"]
    assert [g["index"] for g in gpus] == list(range(8))
    assert gpus[0]["memory_total_bytes"] == 150_754_820_096
    assert gpus[0]["uuid"].startswith("GPU-") and isinstance(gpus[0]["uuid"], str)
    assert gpus[0]["pci_bus_id"] == "00000000:18:00.0"
    assert gpus[0]["power_limit_w"] == 700.0 and gpus[0]["compute_capability"] == "9.0"
    topology = result.sections[1].data["topology"]
    assert len(topology) == 8
    assert topology[2]["GPU2"] == "X" and topology[2]["GPU5"] == "NV18"


def test_pcie_topology_levels_show_as_nvidia_smi_topo_does(monkeypatch):
    fake = FakeNvml(_gpus(2, gpu0={"nvlinks": 0}, gpu1={"nvlinks": 0}), topology=50)
    topology = _probe(monkeypatch, fake).sections[1].data["topology"]
    assert topology == [{"gpu": "GPU0", "GPU0": "X", "GPU1": "SYS"},
                        {"gpu": "GPU1", "GPU0": "SYS", "GPU1": "X"}]


def test_degraded_pcie_width_warns_for_that_gpu_only(monkeypatch):
    result = _probe(monkeypatch, FakeNvml(_gpus(4, gpu3={"pcie_width": (8, 16)})))
    warned = _findings(result, "gpu.pcie.width", Status.WARN)
    assert [f.subject.label for f in warned] == [
        "GPU 3 (NVIDIA H200, bus 00000000:48:00.0, GPU-00000003-0000-0000-0000-000000000000)"]
    assert "x8 of x16" in warned[0].message and warned[0].hint
    # The others run at a lower PCIe generation than their max: idle, noted, not warned.
    oks = _findings(result, "gpu.pcie.width", Status.OK)
    assert len(oks) == 3 and all("idle" in f.message for f in oks)


def test_volatile_uncorrected_ecc_error_fails(monkeypatch):
    result = _probe(monkeypatch, FakeNvml(_gpus(2, gpu1={"ecc_volatile_unc": 3,
                                                       "ecc_aggregate_unc": 3})))
    failed = _findings(result, "gpu.ecc.volatile_uncorrected", Status.FAIL)
    assert len(failed) == 1 and failed[0].subject.label.startswith("GPU 1 ")
    assert "3 uncorrected" in failed[0].message
    assert _findings(result, "gpu.ecc.aggregate_uncorrected", Status.WARN)


@pytest.mark.parametrize("fault, check, hint", [
    ({"remapped": (0, 1, 1, 0)}, "gpu.remapped_rows.pending", "reset the GPU"),
    ({"remapped": (0, 0, 0, 1)}, "gpu.remapped_rows.failed", "RMA"),
    ({"retired_pending": 1}, "gpu.retired_pages.pending", "reset the GPU")])
def test_pending_or_failed_memory_retirement_fails_that_gpu_with_its_hint(monkeypatch, fault,
                                                                          check, hint):
    result = _probe(monkeypatch, FakeNvml(_gpus(3, gpu2=fault)))
    (failed,) = [f for s in result.sections for f in s.findings if f.status is Status.FAIL]
    assert failed.check == check and hint in failed.hint
    assert failed.subject.label.startswith("GPU 2 ")


@pytest.fixture
def short_look(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 0.2 s second look (10 samples, MIN_SAMPLES is 5) instead of 1 s per test."""
    monkeypatch.setattr(gpus_module, "WINDOW_S", 0.2)
    monkeypatch.setattr(gpus_module, "TICK_S", 0.02)


@pytest.mark.usefixtures("short_look")
@pytest.mark.parametrize("mask, reason", [(0x40, "hw_thermal_slowdown"),
                                          (0x20, "sw_thermal_slowdown"),
                                          (0x80, "hw_power_brake_slowdown"),
                                          (0x8 | 0x40, "hw_thermal_slowdown")])
def test_thermal_power_brake_and_hw_slowdown_warn(monkeypatch, mask, reason):
    result = _probe(monkeypatch, FakeNvml(_gpus(2, gpu0={"clock_reasons": mask})))
    warned = _findings(result, "gpu.clocks.event_reasons", Status.WARN)
    assert len(warned) == 1 and reason in warned[0].message


def test_the_hw_slowdown_flag_alone_in_one_sample_is_noted_not_warned(monkeypatch):
    # NVML also sets 0x8 during P-state and clock changes: one sample cannot tell.
    result = _probe(monkeypatch, FakeNvml(_gpus(2, gpu0={"clock_reasons": 0x8})))
    assert not _findings(result, "gpu.clocks.event_reasons", Status.WARN)
    noted = [f for f in _findings(result, "gpu.clocks.event_reasons")
             if "hw_slowdown" in f.message]
    assert len(noted) == 1 and "P-state and clock changes" in noted[0].message
    assert noted[0].subject.label.startswith("GPU 0 (")


def test_sw_power_cap_alone_is_not_a_slowdown_warning(monkeypatch):
    result = _probe(monkeypatch, FakeNvml(_gpus(2, gpu0={"clock_reasons": 0x4})))
    assert not _findings(result, "gpu.clocks.event_reasons", Status.WARN)


def test_busy_gpu_warns_and_lists_its_processes(monkeypatch):
    result = _probe(monkeypatch, FakeNvml(_gpus(2, gpu1={"pids": [4242], "util": (97, 40)})))
    warned = _findings(result, "gpu.busy", Status.WARN)
    assert len(warned) == 1 and "4242" in warned[0].message
    assert result.sections[1].data["processes"] == [
        {"gpu": 1, "pid": 4242, "used_memory_bytes": 2 << 30}]


def test_lost_gpu_fails_and_the_others_are_still_reported(monkeypatch):
    result = _probe(monkeypatch, FakeNvml(_gpus(4, gpu2={"lost": True})))
    lost = _findings(result, "gpu.lost", Status.FAIL)
    assert [f.subject.label for f in lost] == ["GPU 2"]
    assert "lost" in lost[0].message and "reset" in lost[0].hint
    rows = result.sections[1].data["gpus"]
    assert rows[3]["name"] == "NVIDIA H200" and rows[2]["name"] is None
    assert [r["gpu"] for r in result.sections[1].data["topology"]] == ["GPU0", "GPU1", "GPU3"]


def test_not_supported_fields_show_as_na(monkeypatch):
    unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetEnforcedPowerLimit",
                   "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows",
                   "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetCurrPcieLinkWidth",
                   "nvmlDeviceGetCurrentClocksEventReasons",
                   "nvmlDeviceGetCurrentClocksThrottleReasons"}
    fake = FakeNvml(_gpus(2, gpu1={"unsupported": unsupported, "mig": None, "nvlinks": 0}))
    result = _probe(monkeypatch, fake)
    row = result.sections[1].data["gpus"][1]
    for key in ("power_draw_w", "power_limit_w", "ecc_volatile_uncorrected", "mig_mode",
                "remapped_rows_pending", "pcie_width_current", "clock_event_reasons",
                "nvlink_active_links"):
        assert row[key] is None, key
    subject_one = [f for f in result.sections[1].findings if f.subject.label.startswith("GPU 1 ")]
    assert {f.status for f in subject_one} <= {Status.OK, Status.SKIP}
    assert any(f.status is Status.SKIP for f in subject_one)
    assert "n/a" in render(Report("env", sections=result.sections), "text")


@pytest.mark.parametrize("driver_cuda, torch_cuda, status", [
    (11080, "12.4", Status.FAIL), (12020, "12.4", Status.OK), (13000, "13.2", Status.OK),
    (12040, "12.4", Status.OK), (13000, "12.4", Status.OK)])
def test_driver_cuda_against_torch_cuda(monkeypatch, driver_cuda, torch_cuda, status):
    result = _probe(monkeypatch, FakeNvml(_gpus(2), cuda_driver=driver_cuda))
    finding = cuda_compat_finding(result.driver, torch_cuda)
    assert finding.status is status
    if status is Status.FAIL:
        assert "too old" in finding.message and "upgrade" in finding.hint
    older_minor = driver_cuda // 1000 == int(torch_cuda.split(".")[0]) and \
        driver_cuda % 1000 // 10 < int(torch_cuda.split(".")[1])
    assert ("minor-version compatibility" in finding.message) is older_minor


def test_cuda_compat_skips_without_a_cuda_torch_or_a_driver():
    driver = DriverInfo(True, "550.54.15", "12.4", 2)
    assert cuda_compat_finding(driver, None).status is Status.SKIP
    assert cuda_compat_finding(DriverInfo(False), "12.4").status is Status.SKIP


def test_no_nvml_library_without_nvidia_hardware_is_skip(monkeypatch, tmp_path):
    result = _probe(monkeypatch, FakeNvml([], init_error="NVMLError_LibraryNotFound"),
                    sysfs=gpu_node_sysfs(tmp_path, gpus=0))
    finding = _findings(result, "driver.nvml")[0]
    assert finding.status is Status.SKIP and not result.driver.present
    assert [f.status for f in _findings(result, "gpu.count")] == [Status.SKIP]


def test_missing_pynvml_module_warns_to_install_nvidia_ml_py(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    finding = _findings(probe_nvml(Nvml(1.0)), "driver.nvml")[0]
    assert finding.status is Status.WARN and "nvidia-ml-py" in finding.hint


def _torch(count: int, available: bool = True) -> TorchInfo:
    return TorchInfo(version="2.5.0", cuda="12.4", cuda_available=available,
                     device_count=count)


def test_cuda_visible_devices_explains_a_smaller_torch_count(monkeypatch):
    result = _probe(monkeypatch, FakeNvml(_gpus(4)))
    finding = probe_consistency(4, result.gpus, _torch(2), "0,1").findings[0]
    assert finding.status is Status.OK and "exposes 2 of 4" in finding.message
    hidden = probe_consistency(4, result.gpus, _torch(0, False), "").findings[0]
    assert hidden.status is Status.WARN and "hides every GPU" in hidden.message


@pytest.mark.parametrize("field_name, value, check", [
    ("name", "NVIDIA H100 80GB HBM3", "consistency.gpu_model"),
    ("power_limit_mw", 500_000, "consistency.power_limit"),
    ("ecc_mode", [0, 0], "consistency.ecc_mode"),
    ("mig", [1, 1], "consistency.mig_mode")])
def test_gpus_that_differ_within_a_node_are_flagged(monkeypatch, field_name, value, check):
    result = _probe(monkeypatch, FakeNvml(_gpus(4, gpu2={field_name: value})))
    section = probe_consistency(4, result.gpus, _torch(4), None)
    flagged = [f for f in section.findings if f.check == check]
    assert len(flagged) == 1 and flagged[0].status is Status.WARN
    assert "GPU 2" in flagged[0].message


# ---- causes (issue 25): the NVML doorway's error kind is data, and the action follows
# from it, never from a word of the message ----

@pytest.mark.parametrize(("kind", "cause", "action"), [
    ("NVMLError_GpuIsLost", "gpu_lost", "drain-node"),
    ("NVMLError_ResetRequired", "needs_reset", "reset-gpu"),
    ("NVMLError_Timeout", "timed_out", "reset-gpu"),
    ("Timeout", "no_answer", "reset-gpu"),
    ("NVMLError_LibRmVersionMismatch", None, "fix-config"),
    ("NVMLError_DriverNotLoaded", None, "fix-config"),
])
def test_driver_nvml_takes_its_cause_from_the_error_kind(kind: str, cause: str | None,
                                                         action: str) -> None:
    info = DriverInfo(present=False, failure=NvmlFailure(kind, "detail", "nvmlInit"))
    found = driver_finding(info, pci_gpus=2)
    assert (found.status, found.cause, found.action) == (Status.FAIL, cause, action)


def test_a_driver_message_with_the_old_words_decides_nothing() -> None:
    """An unknown error kind whose detail says "is lost" stays a configuration fix."""
    info = DriverInfo(present=False, failure=NvmlFailure("NVMLError_Other", "the GPU is "
                                                         "lost, needs a reset", "nvmlInit"))
    found = driver_finding(info, pci_gpus=1)
    assert found.cause is None and found.action == "fix-config"


def test_a_gpu_query_not_permitted_is_a_configuration_fix() -> None:
    denied = GpuRecord(0, error="not permitted", error_kind="NVMLError_NoPermission")
    wedged = GpuRecord(0, error="not permitted to query (detail)",
                       error_kind="NVMLError_ResetRequired")
    assert (gpu_findings(denied)[0].cause, gpu_findings(denied)[0].action) == \
        ("no_permission", "fix-config")
    assert (gpu_findings(wedged)[0].cause, gpu_findings(wedged)[0].action) == (None, "reset-gpu")


@pytest.mark.parametrize(("kind", "cause", "action"), [
    ("Timeout", "no_answer", "reset-gpu"), ("NVMLError_Timeout", "timed_out", "reset-gpu"),
    ("NVMLError_Unknown", None, "rerun")])
def test_a_topology_failure_takes_its_cause_from_the_error_kind(
        monkeypatch: pytest.MonkeyPatch, kind: str, cause: str | None, action: str) -> None:
    def broken(_nvml: object, _gpus: object) -> list[object]:
        raise NvmlFailure(kind, "no answer, timed out", "nvmlDeviceGetTopologyCommonAncestor")
    monkeypatch.setattr(gpus_module, "read_topology", broken)
    section = gpus_section(object(), [GpuRecord(0), GpuRecord(1)])  # type: ignore[arg-type]
    [found] = [f for f in section.findings if f.check == "gpu.topology"]
    assert (found.cause, found.action) == (cause, action)
