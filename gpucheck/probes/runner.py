"""Run the env probes concurrently and assemble the report.

Phase 1 runs the independent probes on daemon threads (system, python env, torch
import, NVML, environment) while the torchvision ops check runs in a child
process. Phase 2 joins what needs two of them (driver vs torch CUDA, counts,
the GPU functional test). A probe that raises becomes a FAIL finding; one that
does not finish in time is reported and left behind (daemon threads never
block exit).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpucheck.probes.consistency import probe_consistency
from gpucheck.probes.envvars import probe_envvars
from gpucheck.probes.gpus import (
    DriverInfo,
    GpuRecord,
    NvmlResult,
    cuda_compat_findings,
    probe_nvml,
)
from gpucheck.probes.gputest import GpuTestRun, probe_gputest
from gpucheck.probes.kernel_log import read_kernel_log
from gpucheck.probes.nvml import DEFAULT_TIMEOUT_S, Nvml
from gpucheck.probes.pyenv import TorchvisionCheck, probe_pyenv
from gpucheck.probes.system import probe_system
from gpucheck.probes.torch_build import TorchInfo, cuda_available_finding, probe_torch
from gpucheck.probes.xid_section import kernel_log_section
from gpucheck.report import Report, Section, fail

# NVML may take 30 s to start and seconds per GPU to attach with persistence off (see
# probes/nvml.py): the phase waits long enough for a slow but healthy 8-GPU node.
PHASE1_TIMEOUT_S = 120.0
GPU_TEST_TIMEOUT_S = 10.0
GPU_TEST_PER_GPU_S = 3.0

TITLES = {"system": "System", "python": "Python environment", "torch": "PyTorch build",
          "nvml": "NVIDIA driver", "environment": "Environment variables (allowlisted)",
          "gpu_test": "GPU functional test"}


@dataclass(frozen=True)
class Outcome:
    """A probe's return value, or the error that ended it."""

    value: Any = None
    error: str | None = None
    seconds: float = 0.0


def run_concurrently(probes: Mapping[str, Callable[[], Any]],
                     timeout_s: float) -> dict[str, Outcome]:
    """Run each probe on its own daemon thread; wait at most `timeout_s` for all."""
    results: dict[str, Outcome] = {}

    def target(name: str, probe: Callable[[], Any]) -> None:
        start = time.monotonic()
        try:
            results[name] = Outcome(probe(), None, time.monotonic() - start)
        except BaseException as exc:  # a probe must never take the command down
            results[name] = Outcome(None, f"{type(exc).__name__}: {exc}",
                                    time.monotonic() - start)

    threads = [threading.Thread(target=target, args=(name, probe), daemon=True,
                                name=f"gpucheck-{name}") for name, probe in probes.items()]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    for name in probes:
        results.setdefault(name, Outcome(None, f"did not finish within {timeout_s:g} s"))
    return dict(results)


def crashed_section(name: str, error: str) -> Section:
    """What a probe that raised or hung leaves in the report."""
    return Section(name, TITLES.get(name, name), {"probe_error": error},
                   [fail(f"{name}.probe", f"the {name} probe failed: {error}",
                         "run it again with --format json and report a gpucheck bug "
                         "with the output")])


def _section(outcome: Outcome, name: str) -> Section:
    return outcome.value if outcome.error is None else crashed_section(name, outcome.error)


def _phase1(nvml_timeout_s: float, environ: Mapping[str, str],
            kernel_log: str | None = None) -> dict[str, Outcome]:
    return run_concurrently({
        "torch": probe_torch,
        "nvml": lambda: probe_nvml(Nvml(nvml_timeout_s), environ=environ),
        "system": probe_system,
        "python": probe_pyenv,
        "environment": lambda: probe_envvars(environ),
        "kernel_log": lambda: read_kernel_log(kernel_log),
    }, PHASE1_TIMEOUT_S)


def _torch_parts(outcome: Outcome) -> tuple[Section, TorchInfo]:
    if outcome.error is not None:
        return crashed_section("torch", outcome.error), TorchInfo(error=outcome.error)
    parts: tuple[Section, TorchInfo] = outcome.value  # probe_torch's return
    return parts


def _nvml_parts(outcome: Outcome) -> tuple[list[Section], NvmlResult | None]:
    if outcome.error is not None:
        return [crashed_section("nvml", outcome.error)], None
    return outcome.value.sections, outcome.value


def _gpu_test(info: TorchInfo, enabled: bool, nvml_gpus: list[GpuRecord],
              timeout_s: float | None = None) -> Section:
    """The GPU functional test, bounded; on a hang the GPUs that passed keep their rows
    and the finding names the GPU it hung on."""
    torch = sys.modules.get("torch") if info.imported and info.cuda_available else None
    timeout = timeout_s or GPU_TEST_TIMEOUT_S + GPU_TEST_PER_GPU_S * info.device_count
    run = GpuTestRun()
    outcome = run_concurrently({"gpu_test": lambda: probe_gputest(torch, enabled, nvml_gpus,
                                                                  run)}, timeout)["gpu_test"]
    if outcome.error is None:
        section: Section = outcome.value  # probe_gputest's return
        return section
    hung = run.current
    if hung is None:  # failed before or after any GPU: the probe itself broke
        return crashed_section("gpu_test", outcome.error)
    index = "<index>" if hung.nvml_index is None else hung.nvml_index
    # A copy: the hung thread may still append to its own section later.
    kept = Section(run.section.name, run.section.title,
                   {"results": list(run.section.data["results"])}, list(run.section.findings))
    kept.findings.append(fail(
        "gpu.functional", f"the test did not finish on this GPU: {outcome.error}",
        f"the GPU may be hung: check dmesg for Xid errors and nvidia-smi; reset it "
        f"(nvidia-smi -r -i {index}) or drain the node", hung.subject()))
    return kept


# An OK with no GPU must not read as "the GPUs are fine": the headline says what it covers.
NO_GPU_SCOPE = "no NVIDIA GPU or driver found: software checks only"


def collect_env_report(gpu_test: bool = True, nvml_timeout_s: float = DEFAULT_TIMEOUT_S,
                       environ: Mapping[str, str] | None = None,
                       kernel_log: str | None = None) -> Report:
    """Every env probe, as one Report (also the unit a multi-node gather collects)."""
    environ = dict(os.environ if environ is None else environ)
    phase1 = _phase1(nvml_timeout_s, environ, kernel_log)
    torch_section, info = _torch_parts(phase1["torch"])
    # Forked only now, with every phase-1 thread finished (no lock held mid-fork).
    torchvision = TorchvisionCheck(sys.modules.get("torch") if info.imported else None)
    nvml_sections, nvml = _nvml_parts(phase1["nvml"])
    driver = nvml.driver if nvml else DriverInfo(present=False)
    gpus = nvml.gpus if nvml else []
    gpus_present = bool((nvml and nvml.pci_gpus) or driver.gpu_count)
    torch_section.findings.append(cuda_available_finding(
        info, driver.present if nvml else None, driver.cuda_version, gpus_present, environ))
    nvml_sections[0].findings.extend(cuda_compat_findings(driver, info.cuda, gpus,
                                                          info.arch_list))
    python = _section(phase1["python"], "python")
    report = Report(command="env", scope=None if gpus_present or nvml is None else NO_GPU_SCOPE)
    for section in (_section(phase1["system"], "system"), python, torch_section,
                    *nvml_sections):
        report.add(section)
    report.add(probe_consistency(driver.gpu_count, gpus, info,
                                 environ.get("CUDA_VISIBLE_DEVICES")))
    report.add(_gpu_test(info, gpu_test, gpus))
    xids = phase1["kernel_log"]
    report.add(kernel_log_section(xids.value, gpus, xids.error))
    report.add(_section(phase1["environment"], "environment"))
    python.findings.append(torchvision.finding())
    return report
