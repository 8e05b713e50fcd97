"""Driver CUDA vs torch CUDA, and torch's arch list vs each GPU (SASS, PTX, nothing)."""

from __future__ import annotations

import sys

import pytest

from gpucheck.probes.consistency import arch_coverage, cuda_compat_findings, parse_arch
from gpucheck.probes.gpu_read import DriverInfo, GpuRecord
from gpucheck.probes.gpus import probe_nvml
from gpucheck.probes.nvml import Nvml
from gpucheck.report import Report, Status
from tests.fake_pynvml import FakeGpu, FakeNvml
from tests.health_fakes import gpu_node_sysfs

# What a cu12.8/cu13.x torch wheel ships: SASS for Turing..Blackwell, PTX for the newest.
WHEEL_ARCHS = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120")
R580 = DriverInfo(True, "580.65.06", "13.0", 8)
H100 = "NVIDIA H100 80GB HBM3"


@pytest.mark.parametrize("entry, parsed", [
    ("sm_90", ("sm", 9, 0, "")), ("sm_120", ("sm", 12, 0, "")),
    ("sm_100a", ("sm", 10, 0, "a")), ("sm_100f", ("sm", 10, 0, "f")),
    ("compute_120", ("compute", 12, 0, "")), ("sm_", None), ("gfx90a", None)])
def test_arch_list_entries_parse_into_kind_major_minor_and_suffix(entry, parsed):
    assert parse_arch(entry) == parsed


@pytest.mark.parametrize("cc, archs, how", [
    ("9.0", ["sm_90"], "sass"),
    ("8.6", ["sm_80"], "sass"),  # SASS runs on a later minor of the same major
    ("8.9", ["sm_80", "compute_89"], "sass"),  # native code wins over JIT
    ("8.0", ["sm_86"], "none"),  # ...but never on an earlier minor
    ("9.0", ["sm_80", "sm_86"], "none"),  # ...nor across majors
    ("12.0", ["sm_100"], "none"),  # consumer Blackwell is not sm_100
    ("12.1", ["sm_120"], "sass"),
    ("9.0", ["sm_90a"], "sass"),
    ("10.3", ["sm_100a"], "none"),  # arch-specific: exactly 10.0 only
    ("10.3", ["sm_100f"], "sass"),  # family-specific: 10.x with x >= 0
    ("10.3", ["sm_100"], "sass"),
    ("9.0", ["sm_80", "compute_80"], "ptx"),  # PTX JIT-compiles for any newer GPU
    ("13.0", list(WHEEL_ARCHS), "ptx"),  # across majors too
    ("8.0", ["compute_90"], "none"),  # but not for an older one
    ("10.0", ["compute_90a"], "none"),
    ("7.0", list(WHEEL_ARCHS), "none"),
    (None, ["sm_90"], "unknown")])
def test_which_gpus_torchs_kernels_run_on(cc, archs, how):
    assert arch_coverage(cc, archs)[0] == how


def _records(n: int, cc: str = "9.0", name: str = H100) -> list[GpuRecord]:
    return [GpuRecord(index=i, name=name, compute_capability=cc,
                      pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
                      uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000") for i in range(n)]


def _bad(findings):
    return [f for f in findings if f.status in (Status.WARN, Status.FAIL)]


@pytest.mark.parametrize("torch_cuda", ["13.0", "12.8", "13.2"])
def test_eight_h100_on_r580_with_a_wheels_arch_list_have_no_warning(torch_cuda):
    findings = cuda_compat_findings(R580, torch_cuda, _records(8), WHEEL_ARCHS)
    assert not _bad(findings)
    compat = [f for f in findings if f.check == "driver.cuda_compat"]
    assert len(compat) == 1
    # cu13.2 on R580 (CUDA 13.0) is supported minor-version compatibility, said as a note.
    assert ("minor-version compatibility" in compat[0].message) is (torch_cuda == "13.2")
    arch = [f for f in findings if f.check == "gpu.arch_supported"]
    assert len(arch) == 8 and all("sm_90" in f.message for f in arch)


def test_this_torchs_own_arch_list_covers_an_h100_on_r580():
    torch = pytest.importorskip("torch")
    archs = tuple(torch.cuda.get_arch_list())
    if not archs or torch.version.cuda is None:
        pytest.skip("this torch reports no CUDA arch list")
    findings = cuda_compat_findings(R580, torch.version.cuda, _records(8), archs)
    assert not _bad(findings)
    assert [f.status for f in findings if f.check == "gpu.arch_supported"] == [Status.OK] * 8


def test_a_v100_under_a_torch_without_sm_70_fails_naming_the_gpu_and_the_list():
    gpus = [*_records(1), *_records(2, cc="7.0", name="Tesla V100-SXM2-32GB")[1:]]
    findings = cuda_compat_findings(R580, "13.0", gpus, WHEEL_ARCHS)
    failed = [f for f in findings if f.status is Status.FAIL]
    assert [f.check for f in failed] == ["gpu.arch_supported"]
    assert failed[0].subject.label.startswith("GPU 1 (Tesla V100-SXM2-32GB, bus 00000000:28:00.0")
    assert "sm_70" in failed[0].message and "no kernel image is available" in failed[0].message
    assert ", ".join(WHEEL_ARCHS) in failed[0].message and "sm_70" in failed[0].hint


def test_a_new_blackwell_under_an_old_torch_without_ptx_fails():
    old = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")
    findings = cuda_compat_findings(DriverInfo(True, "575.51", "12.9", 1), "12.4",
                                    _records(1, cc="12.0", name="NVIDIA RTX PRO 6000"), old)
    assert [(f.check, f.status) for f in _bad(findings)] == [("gpu.arch_supported",
                                                               Status.FAIL)]
    assert "sm_120" in findings[1].message


def test_a_gpu_reached_only_through_ptx_warns_and_fails_when_the_driver_cannot_jit_it():
    archs = ("sm_80", "compute_80")
    newer_driver = cuda_compat_findings(R580, "12.8", _records(1), archs)
    assert newer_driver[1].status is Status.WARN and "compute_80 PTX" in newer_driver[1].message
    # The driver's JIT understands PTX only up to its own CUDA (13.0 < torch's 13.2).
    older_driver = cuda_compat_findings(R580, "13.2", _records(1), archs)
    assert older_driver[0].status is Status.OK
    assert older_driver[1].status is Status.FAIL and "upgrade the NVIDIA driver" in \
        older_driver[1].hint


def test_without_an_arch_list_or_a_cuda_torch_the_architectures_are_not_judged():
    no_list = cuda_compat_findings(R580, "13.0", _records(2), ())
    assert [(f.check, f.status) for f in no_list] == [
        ("driver.cuda_compat", Status.OK), ("gpu.arch_supported", Status.SKIP)]
    cpu_torch = cuda_compat_findings(R580, None, _records(2), WHEEL_ARCHS)
    assert [f.check for f in cpu_torch] == ["driver.cuda_compat"]
    failed_gpu = [GpuRecord(index=0, error="lost", error_kind="NVMLError_GpuIsLost")]
    assert len(cuda_compat_findings(R580, "13.0", failed_gpu, WHEEL_ARCHS)) == 1


def _h100_node() -> FakeNvml:
    gpus = [FakeGpu(name=H100, bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0", cc=(9, 0),
                    nvlinks=18, persistence=1) for i in range(8)]
    return FakeNvml(gpus, driver="580.65.06", cuda_driver=13000)


@pytest.mark.parametrize("torch_cuda", ["13.0", "12.8"])
def test_gpucheck_env_on_an_8x_h100_sxm_node_on_r580_is_all_ok(monkeypatch, tmp_path,
                                                                torch_cuda):
    monkeypatch.setitem(sys.modules, "pynvml", _h100_node().module)
    result = probe_nvml(Nvml(), gpu_node_sysfs(tmp_path), {})
    result.sections[0].findings.extend(
        cuda_compat_findings(result.driver, torch_cuda, result.gpus, WHEEL_ARCHS))
    report = Report("env", sections=result.sections)
    assert report.verdict() is Status.OK, _bad(report.findings)
    checks = {f.check for f in report.findings}
    assert {"driver.cuda_compat", "gpu.arch_supported", "gpu.fabric",
            "gpu.persistence_mode"} <= checks
    # Every per-GPU finding names its GPU one way: NVML index, bus id, UUID.
    per_gpu = [f for f in report.findings if f.check.startswith("gpu.")
               and f.check != "gpu.count"]  # the node's count names no one GPU
    assert len(per_gpu) >= 8 * 5
    for finding in per_gpu:
        index = int(finding.subject.label.split()[1])
        assert finding.subject.label == (
            f"GPU {index} ({H100}, bus 00000000:{0x18 + 0x10 * index:02X}"
            f":00.0, GPU-{index:08d}-0000-0000-0000-000000000000)")
