"""Real `gpucheck env` runs on this machine: the report says what torch and the platform say."""

from __future__ import annotations

import os
import platform
import sys
import threading

import pytest

from gpucheck.probes import runner
from gpucheck.probes.consistency import read_visible
from gpucheck.probes.pyenv import torchvision_finding
from gpucheck.probes.runner import collect_env_report, run_concurrently
from gpucheck.probes.system import REDACTED, allowed_env, shm_finding
from gpucheck.probes.torch_build import TorchInfo, cuda_unavailable_reason
from gpucheck.report import Status


@pytest.fixture(scope="module")
def report():
    return collect_env_report(gpu_test=True)


def _finding(report, check):
    return next(f for f in report.findings if f.check == check)


def test_system_section_matches_the_platform(report):
    data = report.section("system").data
    assert data["kernel"] == platform.release()
    assert data["architecture"] == platform.machine()
    assert data["cpu_logical_cores"] == os.cpu_count()
    stat = os.statvfs("/dev/shm")
    assert data["shm_total_bytes"] == stat.f_blocks * stat.f_frsize


def test_python_section_matches_the_interpreter(report):
    data = report.section("python").data
    assert data["python_version"] == platform.python_version()
    assert data["executable"] == sys.executable
    import torch

    assert data["packages"]["torch"] == torch.__version__.split("+")[0]


def test_torch_section_matches_what_torch_says(report):
    import torch

    data = report.section("torch").data
    assert data["version"] == torch.__version__
    assert data["cuda_build_version"] == torch.version.cuda
    assert data["cudnn_version"] == torch.backends.cudnn.version()
    assert data["cuda_available"] == torch.cuda.is_available()
    assert data["cuda_device_count"] == (torch.cuda.device_count()
                                         if torch.cuda.is_available() else 0)
    assert ("gloo" in data["distributed_backends"]) == torch.distributed.is_gloo_available()


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia"), reason="this machine has a driver")
def test_without_a_gpu_the_gpu_checks_skip_with_a_reason(report):
    assert _finding(report, "gpu.functional").status is Status.SKIP
    available = _finding(report, "torch.cuda_available")
    assert available.status is Status.SKIP and "driver" in available.message
    assert report.section("driver").data["nvml_error"]
    assert report.exit_code() == 0


def test_torchvision_ops_load_against_this_torch(report):
    assert _finding(report, "python.torchvision_ops").status is Status.OK


def test_no_gpu_test_flag_skips_the_functional_test():
    report = collect_env_report(gpu_test=False)
    finding = _finding(report, "gpu.functional")
    assert finding.status is Status.SKIP and "--no-gpu-test" in finding.message


def test_a_probe_that_raises_becomes_a_fail_finding(monkeypatch):
    def broken():
        raise RuntimeError("probe exploded")

    monkeypatch.setattr(runner, "probe_system", broken)
    report = collect_env_report(gpu_test=False)
    finding = _finding(report, "system.probe")
    assert finding.status is Status.FAIL and "probe exploded" in finding.message


def test_a_probe_that_hangs_is_reported_not_waited_for():
    release = threading.Event()
    outcomes = run_concurrently({"fast": lambda: 1, "stuck": release.wait}, timeout_s=0.2)
    release.set()
    assert outcomes["fast"].value == 1
    assert "did not finish" in outcomes["stuck"].error


def test_allowed_env_keeps_the_allowlist_and_redacts_secrets():
    env = {"NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "0,1", "HOME": "/root",
           "AWS_SECRET_ACCESS_KEY": "x", "NCCL_IB_PASSWORD": "hunter2",
           "SLURM_JOB_TOKEN": "t0k", "MASTER_PORT": "29500", "WANDB_API_KEY": "k"}
    assert allowed_env(env) == {"CUDA_VISIBLE_DEVICES": "0,1", "MASTER_PORT": "29500",
                                "NCCL_DEBUG": "INFO", "NCCL_IB_PASSWORD": REDACTED,
                                "SLURM_JOB_TOKEN": REDACTED}


def test_small_shm_warns_and_a_missing_one_fails():
    assert shm_finding(64 * 1024 * 1024).status is Status.WARN
    assert shm_finding(None).status is Status.FAIL
    assert shm_finding(8 * 1024**3).status is Status.OK


@pytest.mark.parametrize("value, parsed, visible", [
    (None, [], 4), ("", [], 0), ("-1", [], 0), ("0,1", ["0", "1"], 2),
    ("1,-1,2", ["1"], 1), ("0,7", ["0", "7"], 1), ("GPU-abc,1", ["GPU-abc", "1"], 2)])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(value, parsed, visible):
    assert read_visible(value, None).used == parsed
    assert read_visible(value, 4).cuda_count == visible


def test_cuda_unavailable_reasons_in_plain_words():
    cpu = TorchInfo(version="2.5.0+cpu")
    cuda = TorchInfo(version="2.5.0", cuda="12.4", init_error="RuntimeError: boom")
    assert "CPU-only" in cuda_unavailable_reason(cpu, True, "12.4", {})
    assert "hides every GPU" in cuda_unavailable_reason(
        cuda, True, "12.4", {"CUDA_VISIBLE_DEVICES": "-1"})
    assert "no NVIDIA driver" in cuda_unavailable_reason(cuda, False, None, {})
    assert "older than the build needs" in cuda_unavailable_reason(cuda, True, "11.8", {})
    assert cuda_unavailable_reason(cuda, True, "12.4", {}) == "RuntimeError: boom"


@pytest.mark.parametrize("out, status, words", [
    ('{"error": "OSError: undefined symbol: _ZN3c10", "library": "x"}', Status.FAIL,
     "do not load"),
    ('{"cuda_version": 12040, "torch_cuda": null, "nms": [0, 2]}', Status.FAIL, "CPU-only"),
    ('{"cuda_version": 11080, "torch_cuda": "12.4", "nms": [0, 2]}', Status.FAIL,
     "built with CUDA"),
    ('{"cuda_version": -1, "torch_cuda": null, "nms": [1]}', Status.FAIL, "wrong result"),
    ("", Status.FAIL, "crashed"),
    ('{"cuda_version": 12040, "torch_cuda": "12.4", "nms": [0, 2]}', Status.OK, "load")])
def test_torchvision_ops_verdicts(out, status, words):
    finding = torchvision_finding(0 if out else -6, out, "Aborted")
    assert finding.status is status and words in finding.message
