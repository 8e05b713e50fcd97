"""NVSwitch fabric registration, MIG mode, and the fake kept faithful to pynvml."""

from __future__ import annotations

import ctypes
import inspect

import pytest

from gpucheck.report import Status
from tests import fake_pynvml
from tests.fake_pynvml import FakeGpu, FakeNvml
from tests.fake_pynvml import findings as _findings
from tests.fake_pynvml import gpus as _gpus
from tests.fake_pynvml import probe as _probe

NOT_STARTED, IN_PROGRESS, COMPLETED, NOT_SUPPORTED = 1, 2, 3, 0
NVML_ERROR_NOT_READY = 27


@pytest.mark.parametrize("state, words, cause, action", [
    (NOT_STARTED, "not started", None, "fix-config"),
    (IN_PROGRESS, "in progress", "registering", "rerun")])
def test_an_unfinished_fabric_registration_fails_naming_the_fabric_manager(
        monkeypatch, state, words, cause, action):
    gpus = _gpus(4)
    gpus[3].fabric = (state, 0)
    result = _probe(monkeypatch, FakeNvml(gpus))
    failed = _findings(result, "gpu.fabric", Status.FAIL)
    assert [f.subject.label.split(" (")[0] for f in failed] == ["GPU 3"]
    assert words in failed[0].message and "error 802" in failed[0].message
    assert (failed[0].cause, failed[0].action) == (cause, action)
    assert "systemctl start nvidia-fabricmanager" in failed[0].hint
    assert len(_findings(result, "gpu.fabric", Status.OK)) == 3


def test_a_completed_but_failed_registration_fails_with_the_nvml_error(monkeypatch):
    result = _probe(monkeypatch, FakeNvml(_gpus(2, fabric=(COMPLETED, NVML_ERROR_NOT_READY))))
    failed = _findings(result, "gpu.fabric", Status.FAIL)
    assert len(failed) == 2 and "NVML_ERROR_NOT_READY (27)" in failed[0].message
    assert "nvidia-fabricmanager" in failed[0].hint


@pytest.mark.parametrize("fabric", [(NOT_SUPPORTED, 0), None])
def test_a_gpu_without_an_nvswitch_fabric_gets_no_fabric_verdict(monkeypatch, fabric):
    # (NOT_SUPPORTED, 0): a PCIe H100 answers; None: pre-Hopper raises NotSupported.
    result = _probe(monkeypatch, FakeNvml(_gpus(2, fabric=fabric, nvlinks=0)))
    assert not _findings(result, "gpu.fabric") and not _findings(result, "gpu.fabric.health")
    assert {f.status for s in result.sections for f in s.findings} == {Status.OK}


def test_a_driver_without_the_versioned_call_is_read_through_the_old_one(monkeypatch):
    fake = FakeNvml(_gpus(2, fabric=(NOT_STARTED, 0)),
                    absent=frozenset({"nvmlDeviceGetGpuFabricInfoV"}))
    failed = _findings(_probe(monkeypatch, fake), "gpu.fabric", Status.FAIL)
    assert len(failed) == 2


def test_a_driver_without_any_fabric_call_reads_the_rest_of_the_gpu(monkeypatch):
    fake = FakeNvml(_gpus(2), absent=frozenset({"nvmlDeviceGetGpuFabricInfoV",
                                                "nvmlDeviceGetGpuFabricInfo"}))
    result = _probe(monkeypatch, fake)
    assert not _findings(result, "gpu.fabric")
    assert all(r["fabric_state"] is None and r["error"] is None
               for r in result.sections[1].data["gpus"])


def test_mig_mode_on_is_reported_per_gpu_with_what_it_means(monkeypatch):
    gpus = _gpus(3)
    gpus[1].mig = [1, 1]
    result = _probe(monkeypatch, FakeNvml(gpus))
    mig = _findings(result, "gpu.mig_mode")
    assert [(f.status, f.subject.label.split(" (")[0]) for f in mig] == [(Status.OK, "GPU 1")]
    assert "one MIG instance" in mig[0].message and "NCCL" in mig[0].message


def test_a_pending_mig_change_warns_that_the_gpu_needs_a_reset(monkeypatch):
    result = _probe(monkeypatch, FakeNvml(_gpus(2, mig=[0, 1])))
    warned = _findings(result, "gpu.mig_mode", Status.WARN)
    assert len(warned) == 2 and "pending" in warned[0].message
    assert "nvidia-smi -r -i 0" in warned[0].hint


def test_the_fake_has_pynvmls_names_signatures_constants_structs_and_errors():
    pynvml = pytest.importorskip("pynvml")
    module = FakeNvml([FakeGpu()]).module
    for name in (n for n in dir(module) if n.startswith("nvmlDevice") or
                 n.startswith("nvmlSystem") or n in ("nvmlInit", "nvmlShutdown")):
        real = getattr(pynvml, name)
        assert list(inspect.signature(getattr(module, name)).parameters) == list(
            inspect.signature(real).parameters), name
    for name, value in fake_pynvml.CONSTANTS.items():
        assert getattr(pynvml, name) == value, name
    for name, struct in fake_pynvml.STRUCTS.items():
        real = getattr(pynvml, name)
        assert struct._fields_ == real._fields_ and ctypes.sizeof(struct) == ctypes.sizeof(real)
    assert module.c_nvmlGpuFabricInfoV_t().version == pynvml.c_nvmlGpuFabricInfoV_t().version
    for name in (n for n in dir(pynvml) if n.startswith("NVMLError_")):
        fake_error, real_error = getattr(module, name)(), getattr(pynvml, name)()
        assert fake_error.value == real_error.value, name
        assert isinstance(module.NVMLError(real_error.value), getattr(module, name))
        if real_error.value in pynvml.NVMLError._errcode_to_string:
            assert str(fake_error) == str(real_error), name
