"""NVML's own verdicts in `env`, each judged per GPU on the fake pynvml: the recovery action
it asks for (XID 154's field), NVSwitch fabric registration and health (mask, summary),
MIG mode; and the fake kept faithful to pynvml."""

from __future__ import annotations

import ctypes
import inspect

import pytest

from gpucheck.report import Status
from tests import fake_pynvml
from tests.fake_pynvml import HEALTHY_FABRIC_MASK, FakeGpu, FakeNvml
from tests.fake_pynvml import findings as _findings
from tests.fake_pynvml import gpus as _gpus
from tests.fake_pynvml import probe as _probe

NOT_STARTED = 1
FABRIC_V2 = 0x02000024
# healthMask sub-fields (pynvml NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_*), and the healthy
# mask with one of them changed.
DEGRADED_BW, ROUTE_RECOVERY, ROUTE_UNHEALTHY, ACCESS_TIMEOUT, CONFIG = 0, 2, 4, 6, 8


def _with(shift: int, value: int, width: int = 0x3) -> int:
    return HEALTHY_FABRIC_MASK & ~(width << shift) | value << shift


def _problems(result):
    return [f for s in result.sections for f in s.findings
            if f.status in (Status.WARN, Status.FAIL)]


def _gpu(finding) -> str:
    return finding.subject.label.split(" (")[0]


def test_a_healthy_nvswitch_node_stays_ok_on_every_nvml_verdict(monkeypatch):
    result = _probe(monkeypatch, FakeNvml(_gpus(8)))
    assert not _problems(result)
    for check in ("gpu.recovery_action", "gpu.fabric.health", "gpu.fabric"):
        assert [f.status for f in _findings(result, check)] == [Status.OK] * 8, check
    assert "NVML_GPU_RECOVERY_ACTION_NONE" in _findings(result, "gpu.recovery_action")[0].message
    rows = result.sections[1].data["gpus"]
    assert {(r["fabric_state"], r["fabric_status"]) for r in rows} == {("completed", "success")}
    row = rows[0]
    assert row["recovery_action"] == "none"
    assert row["fabric_health"] == ("degraded_bandwidth=false, route_recovery=false, "
                                    "route_unhealthy=false, access_timeout_recovery=false, "
                                    "incorrect_configuration=none")
    assert row["fabric_health_summary"] == "healthy"


@pytest.mark.parametrize("value, status, action, cause, words", [
    (1, Status.FAIL, "reset-gpu", "gpu_reset", "GPU_RESET"),
    (2, Status.FAIL, "drain-node", None, "NODE_REBOOT"),
    (3, Status.FAIL, "drain-node", None, "DRAIN_P2P"),
    (4, Status.WARN, "drain-node", None, "DRAIN_AND_RESET"),
    (5, Status.FAIL, "drain-node", None, "RECOVER_IMEX_DOMAIN"),
    (6, Status.FAIL, "reset-gpu", "bus_reset", "BUS_RESET"),
    (7, Status.FAIL, "drain-node", None, "SYSTEM_REBOOT"),
])
def test_a_recovery_action_nvml_asks_for_is_caught_on_that_gpu_with_its_action(
        monkeypatch, value, status, action, cause, words):
    gpus = _gpus(4)
    gpus[2].recovery_action = value
    result = _probe(monkeypatch, FakeNvml(gpus))
    bad = _problems(result)
    # The action follows from the cause NVML's value gives, never from the message.
    assert [(f.check, f.status, f.action, f.cause, _gpu(f)) for f in bad] == [
        ("gpu.recovery_action", status, action, cause, "GPU 2")]
    assert f"NVML_GPU_RECOVERY_ACTION_{words}" in bad[0].message
    assert action != "reset-gpu" or "nvidia-smi -r -i 2" in bad[0].hint
    oks = [f for f in _findings(result, "gpu.recovery_action") if f.status is Status.OK]
    assert [_gpu(f) for f in oks] == ["GPU 0", "GPU 1", "GPU 3"]


def test_a_recovery_action_gpucheck_does_not_know_warns_and_is_never_ok(monkeypatch):
    gpus = _gpus(2)
    gpus[0].recovery_action = 9
    bad = _problems(_probe(monkeypatch, FakeNvml(gpus)))
    assert [(f.check, f.status, _gpu(f)) for f in bad] == [
        ("gpu.recovery_action", Status.WARN, "GPU 0")]
    assert "unknown (9)" in bad[0].message and bad[0].action != "none"
    assert "nvmlDeviceGpuRecoveryAction_t" in bad[0].hint


@pytest.mark.parametrize("too_old, words, not_words", [
    ("driver", "R565", "pip install"),
    # nvidia-ml-py before the R565 field ids: gpucheck cannot ask, whatever the driver.
    ("nvidia-ml-py", "pip install -U nvidia-ml-py", "drivers before")])
def test_a_recovery_action_nobody_reports_is_a_skip_blaming_the_side_too_old(
        monkeypatch, too_old, words, not_words):
    fake = FakeNvml(_gpus(2, recovery_action=None if too_old == "driver" else 0))
    if too_old == "nvidia-ml-py":
        del fake.module.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    result = _probe(monkeypatch, fake)
    assert not _problems(result)
    skipped = _findings(result, "gpu.recovery_action")
    assert [f.status for f in skipped] == [Status.SKIP] * 2
    assert [g["recovery_action_na"] for g in result.sections[1].data["gpus"]] == [too_old] * 2
    assert words in skipped[0].message and not_words not in skipped[0].message


def test_a_gpu_without_field_values_at_all_is_a_skip_not_a_failure(monkeypatch):
    # A driver whose libnvidia-ml lacks the function (pynvml: FunctionNotFound); NVML
    # itself answers NotSupported per field, never for the whole call.
    result = _probe(monkeypatch, FakeNvml(_gpus(2), absent=frozenset({
        "nvmlDeviceGetFieldValues"})))
    assert not _problems(result)
    assert {f.status for f in _findings(result, "gpu.recovery_action")} == {Status.SKIP}


@pytest.mark.parametrize("mask, check, status, action, words", [
    (_with(DEGRADED_BW, 1), "gpu.fabric.degraded_bandwidth", Status.WARN, "drain-node",
     "DEGRADED_BW_TRUE"),
    (_with(ROUTE_UNHEALTHY, 1), "gpu.fabric.route_unhealthy", Status.FAIL, "drain-node",
     "ROUTE_UNHEALTHY_TRUE"),
    (_with(ROUTE_RECOVERY, 1), "gpu.fabric.recovering", Status.WARN, "rerun", "route_recovery"),
    (_with(ACCESS_TIMEOUT, 1), "gpu.fabric.recovering", Status.WARN, "rerun",
     "access_timeout_recovery"),
    # Too few NVLinks drains (cause insufficient_nvlinks); another configuration is a fix.
    (_with(CONFIG, 5, 0xF), "gpu.fabric.configuration", Status.FAIL, "drain-node",
     "INCORRECT_CONFIGURATION_INSUFFICIENT_NVLINKS"),
    (_with(CONFIG, 2, 0xF), "gpu.fabric.configuration", Status.FAIL, "fix-config",
     "INCORRECT_CONFIGURATION_"),
])
def test_a_fabric_health_problem_is_caught_on_that_gpu_with_its_action(
        monkeypatch, mask, check, status, action, words):
    gpus = _gpus(4)
    gpus[3].fabric_health = mask
    gpus[3].fabric_summary = 2  # NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY
    result = _probe(monkeypatch, FakeNvml(gpus))
    bad = _problems(result)
    # The field names the problem; the summary adds no second finding.
    assert [(f.check, f.status, f.action, _gpu(f)) for f in bad] == [
        (check, status, action, "GPU 3")]
    assert words in bad[0].message
    assert bad[0].cause == ("insufficient_nvlinks" if "NVLINKS" in words else None)
    assert [_gpu(f) for f in _findings(result, "gpu.fabric.health")] == ["GPU 0", "GPU 1",
                                                                         "GPU 2"]


@pytest.mark.parametrize("summary, status", [(2, Status.FAIL), (3, Status.WARN)])
def test_nvmls_fabric_summary_alone_is_judged_when_no_field_explains_it(monkeypatch, summary,
                                                                        status):
    gpus = _gpus(3)
    gpus[1].fabric_summary = summary
    bad = _problems(_probe(monkeypatch, FakeNvml(gpus)))
    assert [(f.check, f.status, f.action, _gpu(f)) for f in bad] == [
        ("gpu.fabric.health", status, "drain-node", "GPU 1")]


def test_a_driver_with_only_the_v2_fabric_struct_still_judges_the_mask(monkeypatch):
    gpus = _gpus(2)
    gpus[1].fabric_health = _with(DEGRADED_BW, 1)
    result = _probe(monkeypatch, FakeNvml(gpus, fabric_versions=frozenset({FABRIC_V2})))
    bad = _problems(result)
    assert [(f.check, _gpu(f)) for f in bad] == [("gpu.fabric.degraded_bandwidth", "GPU 1")]
    healthy = _findings(result, "gpu.fabric.health")
    assert healthy[0].status is Status.OK and "summary n/a" in healthy[0].message


def test_a_driver_without_the_versioned_call_has_no_health_and_says_so(monkeypatch):
    fake = FakeNvml(_gpus(2), absent=frozenset({"nvmlDeviceGetGpuFabricInfoV"}))
    result = _probe(monkeypatch, fake)
    assert not _problems(result)
    skipped = _findings(result, "gpu.fabric.health")
    assert [f.status for f in skipped] == [Status.SKIP] * 2 and "R550" in skipped[0].message


def test_an_unregistered_fabric_is_judged_by_registration_only(monkeypatch):
    # Before registration completes the mask means nothing: gpu.fabric's FAIL says it all.
    gpus = _gpus(2, fabric=(NOT_STARTED, 0), fabric_health=_with(DEGRADED_BW, 1))
    bad = _problems(_probe(monkeypatch, FakeNvml(gpus)))
    assert {f.check for f in bad} == {"gpu.fabric"}


# ---- fabric registration, MIG mode, the fake against pynvml ----

IN_PROGRESS, COMPLETED, NOT_SUPPORTED = 2, 3, 0
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
