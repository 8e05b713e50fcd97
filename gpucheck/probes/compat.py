"""Driver CUDA against torch's CUDA, and torch's arch list against each GPU.

The driver/arch rules: which GPUs torch's kernels can run on (SASS, PTX by JIT,
nothing) and whether the driver is new enough for torch's CUDA. Pure functions of
`DriverInfo`/`GpuRecord` and torch's build facts; no NVML call here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpucheck.probes.gpu_record import DriverInfo, GpuRecord
from gpucheck.report import Finding, fail, ok, skip, warn


def _version_tuple(version: str) -> tuple[int, int]:
    parts = ([*version.split("."), "0"])[:2]
    try:
        return int(parts[0]), int(parts[1])
    except ValueError:
        return 0, 0


# Which GPUs torch's kernels run on. From the CUDA C++ Programming Guide ("Binary
# Compatibility", "PTX Compatibility", and "Feature Availability" for the a/f suffixes;
# and NVIDIA's "Blackwell and CUDA 12.9 introduce family-specific architecture
# features" post):
# - SASS (a cubin, 'sm_XY') built for X.Y runs on X.Z with Z >= Y, never across majors
#   (sm_80 runs on sm_86 and sm_89, not on sm_90; sm_120 not on sm_100);
# - 'sm_90a'/'sm_100a' (architecture-specific) run only on exactly 9.0/10.0;
# - 'sm_100f' (family-specific, CUDA 12.9+) runs on 10.Z with Z >= 0, like plain SASS;
# - PTX ('compute_XY') is JIT-compiled by the driver for any GPU of X.Y or newer,
#   across majors (compute_120 PTX runs on a future sm_130), but the driver's JIT
#   understands PTX only up to its own CUDA version (cudaErrorUnsupportedPtxVersion;
#   the "Minor Version Compatibility" limits in NVIDIA's CUDA Compatibility guide).
# Tegra parts (sm_72, sm_87, ...) have no binary compatibility; not modelled here.
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
    """How torch's kernels reach a GPU of this compute capability.

    ("sass", 'sm_80') when a cubin runs on it natively, ("ptx", 'compute_90') when
    only the driver's JIT can make its kernels, ("none", None) when nothing runs
    ("no kernel image is available for execution on the device"), ("unknown", None)
    without a compute capability.
    """
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
    """The driver's newest CUDA against the CUDA torch was built with.

    FAIL when the driver's CUDA major is older than torch's (CUDA cannot start);
    OK when the major matches, with a note when the driver's minor is older:
    CUDA 11+ runs it by minor-version compatibility (what the GPUs need from torch's
    kernels is `gpu.arch_supported`'s part); OK otherwise.
    """
    check = "driver.cuda_compat"
    if torch_cuda is None:
        return skip(check, "torch has no CUDA build to compare with the driver")
    if not driver.present or driver.cuda_version is None:
        return skip(check, f"torch needs CUDA {torch_cuda}; the driver's CUDA is unknown")
    have, need = _version_tuple(driver.cuda_version), _version_tuple(torch_cuda)
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
    have = _version_tuple(driver.cuda_version) if driver.cuda_version else None
    ptx_jit_ok = have is None or have >= _version_tuple(torch_cuda)
    arch = [arch_finding(g, arch_list, ptx_jit_ok) for g in queried]
    return [*findings, *(f for f in arch if f is not None)]
