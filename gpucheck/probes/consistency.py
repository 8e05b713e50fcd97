"""Do NVML, torch and CUDA_VISIBLE_DEVICES agree, are the GPUs alike, and can torch's
build run on this driver and these GPUs? Pure functions, the facts passed in; the rules
and their sources are in docs/env.md."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpucheck.probes.gpu_read import DriverInfo, GpuRecord
from gpucheck.probes.torch_build import TorchInfo, version_tuple, well_formed
from gpucheck.report import Finding, Section, fail, ok, skip, warn
from gpucheck.subject import text


@dataclass(frozen=True)
class VisibleDevices:
    """What CUDA will make of CUDA_VISIBLE_DEVICES on this machine."""

    value: str | None
    used: list[str] = field(default_factory=list)  # the entries CUDA will honour
    cut_at: str | None = None  # the first entry CUDA stops at (None: all honoured)
    cut_reason: str | None = None
    cuda_count: int | None = None  # devices CUDA will enumerate (None: unknown)

    @property
    def is_set(self) -> bool:
        return self.value is not None


def _entry_problem(entry: str, nvml_count: int | None, uuids: Sequence[str] | None,
                   seen: set[str]) -> tuple[str | None, str | None]:
    """(why CUDA stops at this entry or None, the GPU it names)."""
    if entry == "":
        return "an empty entry", None
    if not well_formed(entry):
        return "neither a GPU index nor a UUID", None
    name = entry
    if entry.isdigit() and nvml_count is not None and int(entry) >= nvml_count:
        return f"no GPU has index {entry} (this machine has {nvml_count})", None
    if entry.startswith("GPU-") and uuids:
        matches = [u for u in uuids if u.startswith(entry)]  # CUDA takes a unique prefix
        if len(matches) != 1:
            return ("no GPU has this UUID" if not matches
                    else f"the UUID prefix matches {len(matches)} GPUs"), None
        name = matches[0]
    if entry.isdigit() and uuids and int(entry) < len(uuids):
        name = uuids[int(entry)]
    if name in seen:
        return "a GPU listed twice", None
    return None, name


def read_visible(value: str | None, nvml_count: int | None,
                 uuids: Sequence[str] | None = None) -> VisibleDevices:
    """Walk the entries as CUDA does; `uuids` are NVML's GPU UUIDs in index order."""
    if value is None:
        return VisibleDevices(None, cuda_count=nvml_count)
    used: list[str] = []
    seen: set[str] = set()
    for raw in value.split(","):
        entry = raw.strip()
        reason, name = _entry_problem(entry, nvml_count, uuids, seen)
        if reason is not None:
            return VisibleDevices(value, used, entry, reason, _cuda_count(used))
        used.append(entry)
        seen.add(name or entry)
    return VisibleDevices(value, used, cuda_count=_cuda_count(used))


def _cuda_count(used: list[str]) -> int:
    """Devices CUDA enumerates from the honoured entries (one MIG instance at most)."""
    if any(e.startswith("MIG-") for e in used):
        return 1
    return len(used)


def count_finding(nvml_count: int | None, torch: TorchInfo, cvd: str | None,
                  gpus: list[GpuRecord] | None = None) -> Finding:
    """NVML's count vs CUDA's (`torch.device_count` is `cudaGetDeviceCount`'s, not torch's
    NVML-based guess, so MIG and a cut-short CUDA_VISIBLE_DEVICES show), explained."""
    check = "consistency.gpu_count"
    shown = "unset" if cvd is None else repr(cvd)
    facts = (f"NVML sees {nvml_count if nvml_count is not None else 'n/a'}, "
             f"CUDA_VISIBLE_DEVICES {shown}, torch sees {torch.device_count}")
    if not torch.imported:
        return skip(check, f"{facts.rsplit(',', 1)[0]}; torch did not import")
    if not nvml_count and not torch.device_count:
        return skip(check, f"no GPUs: {facts}")
    if nvml_count is None:
        return warn(check, f"{facts}: NVML is unavailable, so torch's count cannot be "
                    "cross-checked", "install nvidia-ml-py and check the driver (nvidia-smi)")
    expected = read_visible(cvd, nvml_count, _uuids(gpus)).cuda_count
    if expected == 0:
        return warn(check, f"{facts}: CUDA_VISIBLE_DEVICES hides every GPU",
                    "unset CUDA_VISIBLE_DEVICES or list the GPUs to use (e.g. 0,1)")
    mig = [g.index for g in gpus or [] if g.mig_mode]
    if mig and torch.cuda_available and 0 < torch.device_count <= (expected or 0):
        # CUDA enumerates one MIG instance per process: fewer devices is the design.
        return ok(check, f"{facts} (MIG is on for GPU {', '.join(map(str, mig))}: CUDA "
                  "shows a process one MIG instance, so fewer devices than GPUs is expected)")
    if torch.device_count != expected:
        why = ("torch cannot use CUDA (see torch.cuda_available)" if not torch.cuda_available
               else f"expected {expected} visible GPU(s)")
        return fail(check, f"{facts}: {why}",
                    "compare nvidia-smi -L with python -c 'import torch; "
                    "print(torch.cuda.device_count())'; check CUDA_VISIBLE_DEVICES")
    note = f" (CUDA_VISIBLE_DEVICES exposes {expected} of {nvml_count})" \
        if expected != nvml_count else ""
    return ok(check, f"{facts}{note}")


def _uuids(gpus: list[GpuRecord] | None) -> list[str] | None:
    """NVML's UUIDs in index order, when every GPU answered (else None: unknown)."""
    if not gpus or any(g.uuid is None for g in gpus):
        return None
    return [str(g.uuid) for g in sorted(gpus, key=lambda g: g.index)]


def _deliberately_hidden(visible: VisibleDevices) -> bool:
    """"-1" (or an empty value) is the usual way to hide every GPU, not a mistake."""
    value = (visible.value or "").strip()
    return value in ("", "-1") or (value.startswith("-1,") and not visible.used)


def visible_devices_finding(cvd: str | None, nvml_count: int | None,
                            gpus: list[GpuRecord] | None = None) -> Finding | None:
    """WARN when CUDA will stop early in CUDA_VISIBLE_DEVICES and drop GPUs silently."""
    check = "consistency.cuda_visible_devices"
    if cvd is None:
        return None
    visible = read_visible(cvd, nvml_count, _uuids(gpus))
    if visible.cut_at is None or _deliberately_hidden(visible):
        return ok(check, f"CUDA_VISIBLE_DEVICES={cvd!r}: CUDA uses every entry "
                  f"({visible.cuda_count} device(s))") if visible.cut_at is None else None
    dropped = [e for e in cvd.split(",")[len(visible.used):] if e.strip()]
    if not dropped and visible.cut_at == "":
        return ok(check, f"CUDA_VISIBLE_DEVICES={cvd!r}: CUDA uses "
                  f"{visible.cuda_count} device(s) (a trailing comma drops nothing)")
    entry = repr(visible.cut_at)
    return warn(check, f"CUDA_VISIBLE_DEVICES={cvd!r}: CUDA stops at entry {entry} "
                f"({visible.cut_reason}) and will see only {visible.cuda_count} GPU(s); "
                f"ignored: {', '.join(repr(e.strip()) for e in dropped) or entry}",
                "list each GPU once, by index (nvidia-smi -L) or full UUID, with no empty "
                "or unknown entries", subject=text("CUDA_VISIBLE_DEVICES"))


_UNIFORM: dict[str, tuple[str, Callable[[GpuRecord], Any], str]] = {
    "gpu_model": ("model", lambda g: g.name,
                  "mixed GPU models make every rank wait for the slowest"),
    "power_limit": ("power limit (W)", lambda g: g.power_limit_w,
                    "align the limits (nvidia-smi -pl) or find out why one differs"),
    "ecc_mode": ("ECC mode", lambda g: g.ecc_mode,
                 "enable ECC on every GPU (nvidia-smi -e 1, then reboot)"),
    "mig_mode": ("MIG mode", lambda g: g.mig_mode,
                 "set the same MIG mode on every GPU (nvidia-smi -mig 0|1)"),
}


def uniformity_findings(gpus: list[GpuRecord]) -> list[Finding]:
    """GPUs of one node should match in model, power limit, ECC and MIG mode."""
    healthy = [g for g in gpus if not g.error]
    if len(healthy) < 2:
        return []
    findings = []
    for key, (label, read, hint) in _UNIFORM.items():
        values = {g.index: read(g) for g in healthy if read(g) is not None}
        if len(set(values.values())) > 1:
            shown = ", ".join(f"GPU {i}: {v}" for i, v in values.items())
            findings.append(warn(f"consistency.{key}", f"GPUs differ in {label}: {shown}",
                                 hint))
        elif values:
            findings.append(ok(f"consistency.{key}", f"all {len(values)} GPUs share {label} "
                               f"{next(iter(values.values()))}"))
    return findings


def probe_consistency(nvml_count: int | None, gpus: list[GpuRecord], torch: TorchInfo,
                      cvd: str | None) -> Section:
    data = {"nvml_gpu_count": nvml_count,
            "torch_device_count": torch.device_count if torch.imported else None,
            "cuda_visible_devices": cvd}
    findings = [count_finding(nvml_count, torch, cvd, gpus)]
    visible = visible_devices_finding(cvd, nvml_count, gpus)
    if visible is not None:
        findings.append(visible)
    findings += uniformity_findings(gpus)
    return Section("consistency", "Consistency", data, findings)


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
