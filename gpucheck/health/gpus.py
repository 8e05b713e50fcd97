"""NVML health per GPU for `gpucheck health`: read and judged as `env` does, less
`gpu.busy` (a GPU at work is healthy) and the topology; the read reports its progress
(`GpuProgress`) so a budget ending mid-read keeps the GPUs read so far.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gpucheck.devices import ExpectedGpus, nvidia_pci_devices
from gpucheck.probes.gpu_judge import count_finding, driver_finding, gpu_findings
from gpucheck.probes.gpu_read import DriverInfo, GpuRecord, read_driver, read_gpu
from gpucheck.probes.gpus import second_look
from gpucheck.probes.nvml import Nvml
from gpucheck.report import Finding, Section, skip
from gpucheck.subject import gpu

NOT_IN_HEALTH = ("gpu.busy",)


@dataclass
class GpuProgress:
    """What the NVML read has got so far (written by its thread, read at the deadline)."""

    pci_gpus: int | None = None
    expected: ExpectedGpus | None = None
    driver: DriverInfo | None = None
    records: list[GpuRecord] = field(default_factory=list)
    reading: int | None = None  # the GPU index being read now
    done: bool = False


def read_gpus(progress: GpuProgress, nvml: Nvml, sysfs: Path,
              expected: ExpectedGpus) -> GpuProgress:
    """The driver, then every GPU in turn (`nvidia-smi -q`), recording progress."""
    progress.pci_gpus = nvidia_pci_devices(str(sysfs / "bus/pci/devices"))
    progress.expected = expected
    progress.driver = read_driver(nvml)
    for index in range(progress.driver.gpu_count or 0):
        progress.reading = index
        progress.records.append(read_gpu(nvml, index, sysfs))
    progress.reading = None
    # A slowdown in one sample: watched a moment to see whether it is held (a GPU at
    # work touches its limits; only a held slowdown is judged).
    progress.records[:] = second_look(nvml, progress.records)
    progress.done = True
    nvml.shutdown()
    return progress


def _unfinished(progress: GpuProgress, budget_s: float) -> list[Finding]:
    """SKIPs for what NVML did not answer within the budget, naming where it stopped."""
    why = f"did not finish within the {budget_s:g} s budget"
    if progress.driver is None:
        return [skip("driver.nvml", f"NVML {why} (starting NVML or reading the driver): "
                     "nothing judged; run nvidia-smi to see whether it answers")]
    count = progress.driver.gpu_count or 0
    done = {r.index for r in progress.records}
    return [skip("gpu.query", f"NVML {why} while reading this GPU" if i == progress.reading
                 else f"not read: NVML {why}", gpu(i))
            for i in range(count) if i not in done]


def gpus_section(progress: GpuProgress, budget_s: float, hang: Finding | None = None,
                 most_seen: int | None = None) -> Section:
    """Driver, count and per-GPU findings from what was read, finished or not."""
    driver, expected = progress.driver, progress.expected
    findings: list[Finding] = []
    if driver is not None:
        findings.append(driver_finding(driver, progress.pci_gpus or 0))
    if hang is not None:
        findings.append(hang)
    if driver is not None and expected is not None and (driver.present or expected.count):
        findings.append(count_finding(driver.gpu_count if driver.present else None,
                                      expected, most_seen))
    for record in list(progress.records):
        findings += [f for f in gpu_findings(record) if f.check not in NOT_IN_HEALTH]
    if not progress.done:
        findings += _unfinished(progress, budget_s)
    data = {"driver_version": driver.driver_version if driver else None,
            "gpu_count": driver.gpu_count if driver else None,
            "nvidia_pci_devices": progress.pci_gpus,
            "gpus": [r.row() for r in list(progress.records)]}
    return Section("gpus", "NVIDIA driver and GPUs", data, findings)


def most_seen(progress: GpuProgress, before: int | None) -> int | None:
    """The most GPUs NVML has shown here, this run included when NVML answered it."""
    driver = progress.driver
    if not progress.done or driver is None or not driver.present:
        return before
    return max(before or 0, driver.gpu_count or 0)
