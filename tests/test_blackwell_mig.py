"""Blackwell and MIG, without the hardware: the NVLink error counters NVML removed on
B200/GB200 are a SKIP that says so, never a silent n/a nor a false alarm; a MIG
instance is named "MIG-<uuid>", never "GPU-<uuid>"."""

from __future__ import annotations

import sys
import time
from types import SimpleNamespace

import pytest

from gpucheck.devices import GpuIdentity, uuid_of
from gpucheck.faults import FaultWatch, fault_findings
from gpucheck.probes import runner as gputest
from gpucheck.probes.gpu_read import GpuRecord
from gpucheck.probes.gpus import probe_nvml
from gpucheck.probes.nvml import Nvml, cuda_identity
from gpucheck.report import Status
from tests.fake_pynvml import FakeGpu, FakeNvml, blackwell_gpu

BUS = "00000000:9A:00.0"
BARE = "aaaaaaaa-0000-0000-0000-00000000009a"


def _install(monkeypatch: pytest.MonkeyPatch, fake: FakeNvml) -> FakeNvml:
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    return fake


def _watch(bus: str = BUS) -> dict:
    with FaultWatch(bus, nvml=Nvml(2.0), sample_s=0.005, rank=0) as watch:
        time.sleep(0.01)
        watch.mark_start()
        time.sleep(0.02)
        watch.mark_end()
    return watch.result()


def _summary(findings):
    found = [f for f in findings if f.check == "faults.summary"]
    assert len(found) == 1, [(f.check, f.status, f.message) for f in findings]
    return found[0]


def test_a_b200_whose_nvlink_counters_nvml_removed_says_so_and_raises_no_alarm(monkeypatch):
    _install(monkeypatch, FakeNvml([blackwell_gpu(bus_id="00000000:18:00.0"),
                                    blackwell_gpu(bus_id=BUS)]))
    result = _watch()
    assert result["counters"]["nvlink_active_links"]["after"] == 18
    assert result["counters"]["nvlink_crc_flit"]["delta"] is None
    findings = fault_findings([result])
    assert not [f for f in findings if f.status in (Status.WARN, Status.FAIL)]
    summary = _summary(findings)
    assert "NVIDIA B200" in summary.subject.label
    assert "removed them on Blackwell" in summary.message and "NotSupported" in summary.message


def test_an_h200_with_readable_nvlink_counters_is_judged_and_not_called_blackwell(monkeypatch):
    _install(monkeypatch, FakeNvml([FakeGpu(bus_id="00000000:18:00.0"), FakeGpu(bus_id=BUS)]))
    summary = _summary(fault_findings([_watch()]))
    assert summary.status is Status.OK and "NVLink CRC/replay +0" in summary.message
    assert "Blackwell" not in summary.message


def test_a_b200_link_that_goes_down_is_still_caught_without_the_error_counters(monkeypatch):
    fake = _install(monkeypatch, FakeNvml([blackwell_gpu(bus_id=BUS)]))
    with FaultWatch(BUS, nvml=Nvml(2.0), sample_s=0.005, rank=0) as watch:
        watch.mark_start()
        fake.gpus[0].nvlinks_down = {4, 5}
        watch.mark_end()
    down = [f for f in fault_findings([watch.result()]) if f.check == "faults.nvlink.down"]
    assert [(f.status, f.action) for f in down] == [(Status.FAIL, "reset-gpu")]
    assert "NVIDIA B200" in down[0].subject.label and "2 NVLink link(s)" in down[0].message


def test_env_on_a_healthy_b200_node_raises_no_alarm(monkeypatch):
    gpus = [blackwell_gpu(bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0") for i in range(8)]
    _install(monkeypatch, FakeNvml(gpus, driver="570.124.06", cuda_driver=12080))
    result = probe_nvml(Nvml(2.0))
    statuses = {(f.check, f.status) for s in result.sections for f in s.findings}
    assert not [c for c, st in statuses if st in (Status.WARN, Status.FAIL)]
    assert ("gpu.recovery_action", Status.OK) in statuses
    assert ("gpu.fabric.health", Status.OK) in statuses


def _props(uuid: str = BARE) -> SimpleNamespace:
    return SimpleNamespace(name="NVIDIA H100 80GB HBM3", uuid=uuid, pci_domain_id=0,
                           pci_bus_id=0x9A, pci_device_id=0)


def _torch() -> SimpleNamespace:
    return SimpleNamespace(cuda=SimpleNamespace(get_device_properties=lambda i: _props()))


def test_a_mig_instance_is_named_mig_and_a_whole_gpu_gpu():
    assert uuid_of(_props(), mig=True) == f"MIG-{BARE}"
    assert uuid_of(_props()) == f"GPU-{BARE}"
    assert uuid_of(_props(f"MIG-{BARE}")) == f"MIG-{BARE}"  # already prefixed: kept


@pytest.mark.parametrize("mig, prefix", [([1, 1], "MIG-"), ([0, 0], "GPU-")])
def test_a_rank_on_a_gpu_in_mig_mode_is_labelled_with_its_mig_uuid(monkeypatch, mig, prefix):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _install(monkeypatch, FakeNvml([FakeGpu(bus_id="00000000:18:00.0"),
                                    FakeGpu(bus_id=BUS, mig=mig)]))
    me = cuda_identity(_torch(), 0)
    assert me.nvml_index == 1 and me.uuid == f"{prefix}{BARE}"
    assert me.label().endswith(f"{prefix}{BARE})") and "GPU-MIG" not in me.label()


def test_without_nvml_a_mig_entry_in_cuda_visible_devices_still_names_a_mig(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"MIG-{BARE}")
    _install(monkeypatch, FakeNvml([], init_error="NVMLError_LibraryNotFound"))
    assert cuda_identity(_torch(), 0).uuid == f"MIG-{BARE}"


def test_the_gpu_test_names_a_mig_instance_by_its_mig_uuid():
    nvml_gpus = [GpuRecord(index=0, name="NVIDIA H100 80GB HBM3", pci_bus_id=BUS,
                           uuid="GPU-bbbbbbbb-0000-0000-0000-000000000000", mig_mode=True)]
    me = gputest.identify(_torch(), 0, nvml_gpus)
    assert me == GpuIdentity(0, 0, "NVIDIA H100 80GB HBM3", BUS, f"MIG-{BARE}")
