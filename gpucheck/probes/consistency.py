"""Consistency: do NVML, torch and CUDA_VISIBLE_DEVICES agree; are the GPUs alike?"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpucheck.probes.gpus import GpuRecord
from gpucheck.probes.torch_build import TorchInfo
from gpucheck.report import Finding, Section, fail, ok, skip, warn


def _valid_entry(entry: str) -> bool:
    if entry.startswith(("GPU-", "MIG-")):
        return True
    return entry.isdigit()


def parse_visible_devices(value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as CUDA reads it: None when unset; entries up to the first invalid.

    CUDA stops at the first entry it cannot parse ("-1" hides everything), so
    "0,1,-1,2" exposes two GPUs. Equivalent: `echo $CUDA_VISIBLE_DEVICES`.
    """
    if value is None:
        return None
    entries = []
    for raw in value.split(","):
        entry = raw.strip()
        if not _valid_entry(entry):
            break
        entries.append(entry)
    return entries


def expected_visible(nvml_count: int | None, cvd: str | None) -> int | None:
    """How many GPUs CUDA should expose given NVML's count and CUDA_VISIBLE_DEVICES."""
    entries = parse_visible_devices(cvd)
    if entries is None:
        return nvml_count
    count = 0
    for entry in entries:
        if entry.isdigit() and nvml_count is not None and int(entry) >= nvml_count:
            break
        count += 1
    return count


def count_finding(nvml_count: int | None, torch: TorchInfo, cvd: str | None) -> Finding:
    """NVML count vs `torch.cuda.device_count()` vs CUDA_VISIBLE_DEVICES, explained."""
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
    expected = expected_visible(nvml_count, cvd)
    if expected == 0:
        return warn(check, f"{facts}: CUDA_VISIBLE_DEVICES hides every GPU",
                    "unset CUDA_VISIBLE_DEVICES or list the GPUs to use (e.g. 0,1)")
    if torch.device_count != expected:
        why = ("torch cannot use CUDA (see torch.cuda_available)" if not torch.cuda_available
               else f"expected {expected} visible GPU(s)")
        return fail(check, f"{facts}: {why}",
                    "compare nvidia-smi -L with python -c 'import torch; "
                    "print(torch.cuda.device_count())'; check CUDA_VISIBLE_DEVICES")
    note = f" (CUDA_VISIBLE_DEVICES exposes {expected} of {nvml_count})" \
        if expected != nvml_count else ""
    return ok(check, f"{facts}{note}")


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
    findings = [count_finding(nvml_count, torch, cvd), *uniformity_findings(gpus)]
    return Section("consistency", "Consistency", data, findings)
