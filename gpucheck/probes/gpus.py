"""Driver and per-GPU health through NVML (the `nvidia-smi -q` view): the env probe.

This module assembles; the parts live apart so each reads at once:
- `gpu_record`: the records (`DriverInfo`, `GpuRecord`) and NVML's vocabularies;
- `gpu_read`: reading NVML into records (one doorway, `probes.nvml`), and `fabric`
  for the NVSwitch fabric's registration and health;
- `gpu_judge`: how each GPU is judged (one function per check id);
- `topology`: the `nvidia-smi topo -m` matrix;
- `compat`: the driver's CUDA and the GPUs' architectures against torch's build.
The names callers used from here are re-exported below.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucheck.numa import cpulist, node_cpus, numa_nodes
from gpucheck.probes.clock_window import second_look
from gpucheck.probes.compat import (
    arch_coverage,
    cuda_compat_finding,
    cuda_compat_findings,
    parse_arch,
)
from gpucheck.probes.gpu_judge import count_finding, driver_finding, gpu_findings, numa_findings
from gpucheck.probes.gpu_read import (
    expected_gpus,
    nvidia_pci_devices,
    read_driver,
    read_gpu,
    sysfs_root,
)
from gpucheck.probes.gpu_record import BAD_CLOCK_REASONS, CLOCK_REASONS, DriverInfo, GpuRecord
from gpucheck.probes.nvml import SLOW_ADVICE, Nvml, NvmlFailure, slow_words
from gpucheck.probes.topology import read_topology
from gpucheck.report import Section, fail, skip, warn

# What callers import from here (gpucheck.probes.gpus), as before the split.
__all__ = ["BAD_CLOCK_REASONS", "CLOCK_REASONS", "DriverInfo", "GpuRecord", "NvmlResult",
           "arch_coverage", "cuda_compat_finding", "cuda_compat_findings", "driver_finding",
           "parse_arch",
           "probe_nvml"]


# The NVML failures gpu.topology acts on (gpucheck/checks/gpu.py).
_TOPOLOGY_CAUSES = ("timed_out", "no_answer")


def driver_section(info: DriverInfo, pci_gpus: int) -> Section:
    data = {
        "driver_version": info.driver_version,
        "cuda_driver_version": info.cuda_version,
        "gpu_count": info.gpu_count,
        "nvidia_pci_devices": pci_gpus,
        "nvml_error": None if info.failure is None else str(info.failure),
    }
    return Section("driver", "NVIDIA driver", data, [driver_finding(info, pci_gpus)])


def gpus_section(nvml: Nvml, gpus: list[GpuRecord],
                 nodes: Mapping[int, str] | None = None) -> Section:
    """The GPU table, per-GPU findings, `gpu.numa` (`nodes`: NUMA node -> its CPUs) and
    the topology matrix."""
    findings = [f for gpu in gpus for f in gpu_findings(gpu)]
    findings += numa_findings(gpus, nodes or {})
    data: dict[str, Any] = {"gpus": [g.row() for g in gpus]}
    data["processes"] = [{"gpu": g.index, **p} for g in gpus for p in g.processes]
    try:
        data["topology"] = read_topology(nvml, gpus) if len(gpus) > 1 else []
    except NvmlFailure as exc:
        data["topology"] = []
        cause = exc.cause if exc.cause in _TOPOLOGY_CAUSES else None
        findings.append(fail("gpu.topology", f"topology query failed: {exc}", exc.hint,
                             cause=cause))
    return Section("gpus", "GPUs", data, findings)


@dataclass(frozen=True)
class NvmlResult:
    driver: DriverInfo
    gpus: list[GpuRecord]
    sections: list[Section]
    pci_gpus: int


def probe_nvml(nvml: Nvml | None = None, sysfs: Path | None = None,
               environ: Mapping[str, str] | None = None) -> NvmlResult:
    """Driver and every GPU (`nvidia-smi -q` and `nvidia-smi topo -m`), and `gpu.count`
    against the GPUs this process should have (`expected_gpus`: SLURM's GRES, the
    container's, the PCI bus); `sysfs` is where the PCI bus and the GPUs' NUMA nodes
    are read (GPUCHECK_SYSFS, else /sys; a fake tree in tests)."""
    nvml = nvml or Nvml()
    environ = os.environ if environ is None else environ
    sysfs = sysfs or sysfs_root(environ)
    pci_gpus = nvidia_pci_devices(str(sysfs / "bus/pci/devices"))
    expected = expected_gpus(environ, sysfs)
    info = read_driver(nvml)
    sections = [driver_section(info, pci_gpus)]
    gpus: list[GpuRecord] = []
    if info.present:
        gpus = [read_gpu(nvml, i, sysfs) for i in range(info.gpu_count or 0)]
        gpus = second_look(nvml, gpus)  # a slowdown in one sample: is it held?
        nodes = {n: cpulist(node_cpus(n, sysfs)) for n in numa_nodes(sysfs)}
        sections.append(gpus_section(nvml, gpus, nodes))
    if info.present or expected.count:  # a node that should have GPUs: NVML must show them
        sections[0].findings.append(count_finding(info.gpu_count if info.present else None,
                                                  expected))
    else:
        sections.append(Section("gpus", "GPUs", {"gpus": []},
                                [skip("gpu.count", "no GPU can be queried without NVML")]))
    if nvml.hung is not None:
        sections[0].findings.append(fail("driver.nvml_hang", str(nvml.hung),
                                         "check dmesg for Xid errors; the driver may need a "
                                         "reset or the node a reboot"))
    elif nvml.slow_calls:  # late but answered: not a hang (gpucheck/probes/nvml.py)
        sections[0].findings.append(warn("driver.nvml_slow", slow_words(nvml.slow_calls),
                                         SLOW_ADVICE))
    nvml.shutdown()
    return NvmlResult(info, gpus, sections, pci_gpus)
