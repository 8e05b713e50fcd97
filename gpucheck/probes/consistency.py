"""Consistency: do NVML, torch and CUDA_VISIBLE_DEVICES agree; are the GPUs alike?
CUDA_VISIBLE_DEVICES is read the way CUDA reads it: up to the first entry it cannot use
(docs/env.md); pure functions on strings, the NVML facts passed in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpucheck.probes.gpu_record import GpuRecord
from gpucheck.probes.torch_build import TorchInfo, well_formed
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
