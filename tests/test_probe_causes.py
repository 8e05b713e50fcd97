"""The causes the probe sites set (issue 25): the NVML doorway's error kind is data, and
the action follows from it, never from a word of the message (the fabric state, recovery
action and configuration flag: tests/test_nvml_health.py and test_nvml_fabric.py)."""

from __future__ import annotations

import pytest

from gpucheck.probes import gpus as gpus_module
from gpucheck.probes.gpu_judge import driver_finding, gpu_findings
from gpucheck.probes.gpu_read import DriverInfo, GpuRecord
from gpucheck.probes.gpus import gpus_section
from gpucheck.probes.nvml import NvmlFailure
from gpucheck.report import Status


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
