"""Driver and per-GPU health through NVML (the `nvidia-smi -q` view): the env probe's
assembly (driver and GPU sections, `gpu.count`), and the driver's CUDA and the GPUs'
architectures against torch's build. Reading is `gpu_read`'s, judging `gpu_judge`'s."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucheck.devices import expected_gpus, nvidia_pci_devices, sysfs_root
from gpucheck.numa import cpulist, node_cpus, numa_nodes
from gpucheck.probes.clock_window import second_look
from gpucheck.probes.gpu_judge import (
    count_finding,
    driver_finding,
    gpu_findings,
    hang_finding,
    numa_findings,
)
from gpucheck.probes.gpu_read import read_driver, read_gpu
from gpucheck.probes.gpu_record import DriverInfo, GpuRecord
from gpucheck.probes.nvml import Nvml, NvmlFailure
from gpucheck.probes.topology import read_topology
from gpucheck.probes.torch_build import version_tuple
from gpucheck.report import Finding, Section, fail, ok, skip, warn

# The NVML failures gpu.topology acts on (gpucheck/checks/node.py).
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
    `nvidia-smi topo -m`."""
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
    """Driver and every GPU, and `gpu.count` against the GPUs expected here; `sysfs`
    holds the PCI bus and NUMA nodes (GPUCHECK_SYSFS, else /sys)."""
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
    hang = hang_finding(nvml)
    if hang is not None:
        sections[0].findings.append(hang)
    nvml.shutdown()
    return NvmlResult(info, gpus, sections, pci_gpus)


# ---- the driver's CUDA and the GPUs' architectures against torch's build ----

# Which GPUs torch's kernels run on (SASS within a major, 'a' exactly, 'f' like SASS, PTX
# by JIT for any newer GPU up to the driver's CUDA): the rules and sources in docs/env.md.
_ARCH = re.compile(r"(sm|compute)_(\d+)(\d)([af]?)")


def parse_arch(entry: str) -> tuple[str, int, int, str] | None:
    """'sm_90' -> ('sm', 9, 0, ''), 'sm_100a' -> ('sm', 10, 0, 'a'), 'compute_120' -> PTX."""
    match = _ARCH.fullmatch(entry.strip())
    if match is None:
        return None
    return match[1], int(match[2]), int(match[3]), match[4]


def parse_cc(cc: str | None) -> tuple[int, int] | None:
    """NVML's compute capability "9.0" -> (9, 0)."""
    try:
        major, minor = (cc or "").split(".")
        return int(major), int(minor)
    except ValueError:
        return None


def _runs_on(arch: tuple[str, int, int, str], cc: tuple[int, int]) -> bool:
    kind, major, minor, suffix = arch
    if suffix == "a":  # architecture-specific: that exact GPU only
        return cc == (major, minor)
    if kind == "sm" or suffix == "f":  # SASS or family PTX: same major, minor >= Y
        return cc[0] == major and cc[1] >= minor
    return cc >= (major, minor)  # PTX: JIT for any newer GPU


def arch_coverage(cc: str | None, arch_list: Sequence[str]) -> tuple[str, str | None]:
    """How torch's kernels reach a GPU of this compute capability: ("sass", 'sm_80'),
    ("ptx", 'compute_90') by the driver's JIT, ("none", None), or ("unknown", None)."""
    gpu = parse_cc(cc)
    if gpu is None:
        return "unknown", None
    parsed = [(entry, parse_arch(entry)) for entry in arch_list]
    for kind in ("sm", "compute"):
        for entry, arch in parsed:
            if arch is not None and arch[0] == kind and _runs_on(arch, gpu):
                return ("sass" if kind == "sm" else "ptx"), entry
    return "none", None


def sm_name(cc: str | None) -> str:
    """"9.0" -> "sm_90" (the name torch's arch list uses)."""
    parsed = parse_cc(cc)
    return f"sm_{parsed[0]}{parsed[1]}" if parsed else f"compute capability {cc}"


def arch_finding(gpu: GpuRecord, arch_list: Sequence[str], ptx_jit_ok: bool) -> Finding | None:
    """`gpu.arch_supported`: does this torch have kernels this GPU can run?"""
    how, entry = arch_coverage(gpu.compute_capability, arch_list)
    if how == "unknown":
        return None
    check, sm = "gpu.arch_supported", sm_name(gpu.compute_capability)
    listed = ", ".join(arch_list)
    upgrade = (f"install a torch build whose arch list has {sm} (torch.cuda.get_arch_list()), "
               f"or build torch with TORCH_CUDA_ARCH_LIST={gpu.compute_capability}")
    if how == "sass":
        return ok(check, f"{sm}: torch ships native kernels for it ({entry})", gpu.subject)
    if how == "none":
        return fail(check, f"{sm} is not in torch's arch list ({listed}): the first CUDA kernel "
                    "fails with \"no kernel image is available for execution on the device\"",
                    upgrade, gpu.subject)
    message = (f"{sm} has no native kernels in torch's arch list ({listed}): it runs only by "
               f"JIT-compiling torch's {entry} PTX")
    if not ptx_jit_ok:
        return fail(check, f"{message}, and this driver is older than torch's CUDA, so its "
                    "JIT cannot compile that PTX (cudaErrorUnsupportedPtxVersion)",
                    f"upgrade the NVIDIA driver, or {upgrade}", gpu.subject)
    return warn(check, f"{message}: the first start compiles every kernel (minutes) and they "
                "may run slower than native ones", upgrade, gpu.subject)


def cuda_compat_finding(driver: DriverInfo, torch_cuda: str | None) -> Finding:
    """The driver's newest CUDA against torch's: an older major FAILs; an older minor is
    OK by minor-version compatibility, with a note."""
    check = "driver.cuda_compat"
    if torch_cuda is None:
        return skip(check, "torch has no CUDA build to compare with the driver")
    if not driver.present or driver.cuda_version is None:
        return skip(check, f"torch needs CUDA {torch_cuda}; the driver's CUDA is unknown")
    have, need = version_tuple(driver.cuda_version), version_tuple(torch_cuda)
    versions = f"driver {driver.driver_version} supports CUDA {driver.cuda_version}, " \
               f"torch was built with CUDA {torch_cuda}"
    if have[0] < need[0]:
        return fail(check, f"{versions}: the driver is too old for this torch",
                    "upgrade the NVIDIA driver (then reboot), or install a torch built for "
                    f"CUDA {driver.cuda_version} or older")
    if have < need:
        return ok(check, f"{versions}: runs by CUDA minor-version compatibility (the "
                  "driver cannot JIT-compile torch's newer PTX; see gpu.arch_supported)")
    return ok(check, versions)


def cuda_compat_findings(driver: DriverInfo, torch_cuda: str | None,
                         gpus: Sequence[GpuRecord] = (),
                         arch_list: Sequence[str] = ()) -> list[Finding]:
    """`driver.cuda_compat` and, for a CUDA torch, `gpu.arch_supported` per GPU."""
    findings = [cuda_compat_finding(driver, torch_cuda)]
    queried = [g for g in gpus if not g.error and g.compute_capability]
    if torch_cuda is None or not queried:
        return findings
    if not arch_list:
        return [*findings, skip("gpu.arch_supported", "torch reports no CUDA arch list "
                                "(torch.cuda.get_arch_list()); GPU architectures not checked")]
    have = version_tuple(driver.cuda_version) if driver.cuda_version else None
    ptx_jit_ok = have is None or have >= version_tuple(torch_cuda)
    arch = [arch_finding(g, arch_list, ptx_jit_ok) for g in queried]
    return [*findings, *(f for f in arch if f is not None)]
