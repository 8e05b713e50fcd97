"""env's torch side on GPU nodes, without a GPU: MIG counts, CUDA_VISIBLE_DEVICES that CUDA
cuts short, one name per GPU across sections, a GPU test that hangs, fabric error 802."""

from __future__ import annotations

import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from gpucheck.devices import cuda_device_count, local_device_index
from gpucheck.probes import runner
from gpucheck.probes import runner as gputest
from gpucheck.probes.consistency import count_finding, probe_consistency
from gpucheck.probes.gpu_read import GpuRecord
from gpucheck.probes.torch_build import TorchInfo, cuda_available_finding, read_torch
from gpucheck.report import Status


def _props(bus: int, name: str = "NVIDIA H200") -> SimpleNamespace:
    return SimpleNamespace(name=name, uuid=f"aaaaaaaa-0000-0000-0000-0000000000{bus:02x}",
                           pci_domain_id=0, pci_bus_id=bus, pci_device_id=0, major=9, minor=0)


def _fake_torch(runtime_count: int, nvml_guess: int, buses: list[int]) -> SimpleNamespace:
    """A torch whose NVML-based device_count() and CUDA's own count differ, as under MIG."""
    cuda = SimpleNamespace(is_available=lambda: True, device_count=lambda: nvml_guess,
                           get_device_properties=lambda i: _props(buses[i]),
                           get_arch_list=lambda: ["sm_90"])
    version = SimpleNamespace(cuda="13.0", hip=None)
    runtime = SimpleNamespace(_cuda_getDeviceCount=lambda: runtime_count)
    return SimpleNamespace(__version__="2.15.0", version=version, cuda=cuda, _C=runtime)


def _nvml_gpus(n: int, mig: bool = False) -> list[GpuRecord]:
    buses = [0x18 + 0x10 * i for i in range(n)]
    return [GpuRecord(index=i, name="NVIDIA H200", pci_bus_id=f"00000000:{bus:02X}:00.0",
                      uuid=f"GPU-aaaaaaaa-0000-0000-0000-0000000000{bus:02x}", mig_mode=mig)
            for i, bus in enumerate(buses)]


def _torch(count: int) -> TorchInfo:
    return TorchInfo(version="2.15.0", cuda="13.0", cuda_available=True, device_count=count)


def test_torch_count_is_the_count_cuda_enumerates_not_nvmls_guess():
    # CUDA_VISIBLE_DEVICES=MIG-a,MIG-b: torch's NVML path says 2, CUDA enumerates 1.
    fake = _fake_torch(runtime_count=1, nvml_guess=2, buses=[0x18, 0x28])
    assert cuda_device_count(fake) == 1
    assert read_torch(fake).device_count == 1


@pytest.mark.parametrize("cvd, sees, mig, status, words", [
    ("MIG-aaaa,MIG-bbbb", 1, True, Status.OK, "MIG is on"),  # two instances: one device
    (None, 1, True, Status.OK, "MIG is on"),  # MIG with nothing set: no false alarm
    (None, 6, False, Status.FAIL, "expected 8")])  # a real shortfall
def test_under_mig_one_device_is_ok_and_without_it_a_shortfall_fails(cvd, sees, mig, status,
                                                                     words):
    finding = count_finding(8, _torch(sees), cvd, _nvml_gpus(8, mig=mig))
    assert finding.status is status and words in finding.message


@pytest.mark.parametrize("cvd, entry, sees", [
    ("0,1,,2,3", "''", 2), ("0,1,9", "'9'", 2), ("0,1,0,2", "'0'", 2),
    ("2,GPU-ffff", "'GPU-ffff'", 1), ("0,-1,3", "'-1'", 1)])
def test_cuda_visible_devices_that_cuda_cuts_short_warns_naming_the_entry(cvd, entry, sees):
    section = probe_consistency(4, _nvml_gpus(4), _torch(sees), cvd)
    found = [f for f in section.findings if f.check == "consistency.cuda_visible_devices"]
    assert len(found) == 1 and found[0].status is Status.WARN
    assert f"entry {entry}" in found[0].message and f"only {sees} GPU(s)" in found[0].message
    counts = [f for f in section.findings if f.check == "consistency.gpu_count"]
    assert counts[0].status is Status.OK  # torch agrees with what CUDA will really do


@pytest.mark.parametrize("cvd, sees", [
    ("0,1", 2), ("3,GPU-aaaaaaaa-0000-0000-0000-000000000018", 2), ("0,1,", 2), (None, 4)])
def test_a_well_formed_cuda_visible_devices_stays_ok(cvd, sees):
    section = probe_consistency(4, _nvml_gpus(4), _torch(sees), cvd)
    assert {f.status for f in section.findings} == {Status.OK}


def test_minus_one_hides_every_gpu_without_a_cut_short_warning():
    section = probe_consistency(4, _nvml_gpus(4), TorchInfo(version="2.15.0", cuda="13.0"), "-1")
    assert not [f for f in section.findings if f.check == "consistency.cuda_visible_devices"]


def test_gpu_test_names_each_gpu_by_nvml_index_bus_id_and_uuid(monkeypatch):
    # CUDA_VISIBLE_DEVICES=4,5,6,7: cuda:0 is NVML's GPU 4. A FAIL must not say "GPU 0".
    buses = [0x18 + 0x10 * i for i in (4, 5, 6, 7)]
    fake = _fake_torch(runtime_count=4, nvml_guess=4, buses=buses)
    errors = {0: 0.0, 1: 5.0, 2: 0.0, 3: 0.0}
    monkeypatch.setattr(gputest, "check_one_gpu", lambda torch, i: {
        "matmul_max_abs_error": errors[i], "h2d_gbps": 50.0, "d2h_gbps": 50.0, "seconds": 0.1})
    section = gputest.probe_gputest(fake, True, _nvml_gpus(8))
    rows = section.data["results"]
    assert [r["nvml_index"] for r in rows] == [4, 5, 6, 7]
    assert [r["cuda_ordinal"] for r in rows] == [0, 1, 2, 3]
    bad = [f for f in section.findings if f.status is Status.FAIL]
    assert len(bad) == 1
    assert bad[0].subject.label.startswith("GPU 5 (NVIDIA H200, bus 00000000:68:00.0")
    assert "GPU-aaaaaaaa-0000-0000-0000-000000000068" in bad[0].subject.label


def test_a_gpu_test_that_hangs_keeps_the_rows_measured_and_names_the_hung_gpu(monkeypatch):
    fake = _fake_torch(runtime_count=3, nvml_guess=3, buses=[0x18, 0x28, 0x38])
    release = threading.Event()

    def check(torch, ordinal):
        if ordinal == 1:
            release.wait(10)
        return {"matmul_max_abs_error": 0.0, "h2d_gbps": 50.0, "d2h_gbps": 50.0,
                "seconds": 0.1}

    monkeypatch.setattr(gputest, "check_one_gpu", check)
    monkeypatch.setattr(runner.sys, "modules", {**sys.modules, "torch": fake})
    try:
        section = runner._gpu_test(_torch(3), True, _nvml_gpus(3), timeout_s=0.5)
    finally:
        release.set()
    assert [r["nvml_index"] for r in section.data["results"]] == [0]
    hung = [f for f in section.findings if f.status is Status.FAIL]
    assert len(hung) == 1 and hung[0].subject.label.startswith("GPU 1 (")
    assert "nvidia-smi -r -i 1" in hung[0].hint


def test_cuda_error_802_points_at_the_fabric_manager():
    info = TorchInfo(version="2.15.0", cuda="13.0", init_error="RuntimeError: CUDA error: "
                     "system not yet initialized (error 802)")
    finding = cuda_available_finding(info, True, "13.0", True, {})
    assert finding.status is Status.FAIL and "nvidia-fabricmanager" in finding.hint


@pytest.mark.parametrize("local_rank, visible, ordinal", [
    (0, 8, 0), (5, 8, 5), (3, 1, 0), (3, 2, 1)])
def test_a_rank_uses_a_gpu_its_process_can_see(local_rank, visible, ordinal):
    assert local_device_index(local_rank, visible) == ordinal


def test_torch_build_and_consistency_import_without_a_circle():
    code = ("import sys, gpucheck.probes.torch_build; "
            "assert 'gpucheck.probes.consistency' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
