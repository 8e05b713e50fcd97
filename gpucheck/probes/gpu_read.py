"""NVML read into records: the driver (`DriverInfo`) and each GPU's `nvidia-smi -q` view
(`GpuRecord`, fields named after `nvidia-smi --query-gpu=...`, None is n/a) with its NVSwitch
fabric; no judging. A GPU failing mid-query keeps its error."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpucheck import subject as subjects
from gpucheck.devices import SYSFS, GpuIdentity
from gpucheck.numa import cpulist, read_local_cpus, read_numa_node
from gpucheck.probes.fabric import decode_health, read_fabric
from gpucheck.probes.nvml import Nvml, NvmlDoor, NvmlFailure, decode, field_value, read_fields
from gpucheck.probes.xid_table import RECOVERY_ACTIONS

# Clock-event (throttle) reason bits, as in nvml.h / pynvml nvmlClocksEventReason*.
CLOCK_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
BAD_CLOCK_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                     "hw_power_brake_slowdown")
MASK_FUNCTIONS = ("nvmlDeviceGetCurrentClocksEventReasons",
                  "nvmlDeviceGetCurrentClocksThrottleReasons")


@dataclass(frozen=True)
class DriverInfo:
    """NVML's view of the driver. `present` is False when no driver could be reached."""

    present: bool
    driver_version: str | None = None
    cuda_version: str | None = None
    gpu_count: int | None = None
    failure: NvmlFailure | None = None


@dataclass(frozen=True)
class GpuRecord:
    """One GPU, fields named after `nvidia-smi --query-gpu=...`; None is n/a."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    compute_capability: str | None = None
    persistence_mode: bool | None = None
    mig_mode: bool | None = None
    mig_mode_pending: bool | None = None
    temperature_c: int | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    utilization_gpu_pct: int | None = None
    utilization_memory_pct: int | None = None
    process_count: int | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    ecc_mode: bool | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failed: bool | None = None
    bank_remaps_active: int | None = None  # NVML_FI_DEV_ACTIVE_BANK_REMAPPINGS
    bank_remaps_inactive: int | None = None  # NVML_FI_DEV_INACTIVE_BANK_REMAPPINGS
    bank_remap_pending: bool | None = None  # NVML_FI_DEV_PENDING_BANK_REMAPPING
    clock_event_reasons: list[str] | None = None
    # The second look (clock_window.second_look) when the sample showed a thermal or
    # power-brake slowdown: window_s, samples, fractions, counter_share, held.
    clock_window: dict[str, Any] | None = None
    nvlink_active_links: int | None = None
    fabric_state: str | None = None  # FABRIC_STATES; None: no fabric API (n/a)
    fabric_status: str | None = None  # "success" or the NVML_ERROR_* name, once completed
    fabric_health_mask: int | None = None  # healthMask (decode_health); None: n/a
    fabric_health_summary: str | None = None  # HEALTH_SUMMARIES; None: n/a (v2 struct)
    recovery_action: str | None = None  # xid_table.RECOVERY_ACTIONS' name; None: n/a (pre-R565)
    # Why the recovery action is n/a: "nvidia-ml-py" (the package is too old to ask) or
    # "driver" (the driver does not report it); None when it was read.
    recovery_action_na: str | None = None
    numa_node: int | None = None  # sysfs; None where it reads -1 (VMs, single socket)
    cpu_affinity: str | None = None  # CPUs near the GPU, "0-27,56-83" (nvidia-smi topo -m)
    processes: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    error_kind: str | None = None
    error_hint: str | None = None

    @property
    def subject(self) -> subjects.Subject:
        """"GPU 3 (NVIDIA H200, bus 00000000:9A:00.0, GPU-...)", as every section names it."""
        return GpuIdentity(None, self.index, self.name, self.pci_bus_id, self.uuid).subject()

    def row(self) -> dict[str, Any]:
        row = asdict(self)
        for key in ("processes", "error_kind", "error_hint", "fabric_health_mask",
                    "clock_window"):
            row.pop(key)
        look = self.clock_window
        row["clock_held"] = ", ".join(look["held"]) or None if look else None
        row["clock_look"] = (f"{look['samples']} samples over {look['window_s']} s"
                             if look else None)
        health = decode_health(self.fabric_health_mask)
        row["fabric_health"] = ", ".join(f"{k}={v}" for k, v in health.items()) or None
        return row


# nvmlDeviceGetFieldValues' scopeId for a value summed over all NVLinks (NVLink5, as DCGM).
ALL_LINKS = 0xFFFFFFFF
# Bank remapper (nvmlEccBankRemapperStatus_v1_t as field values).
BANK_FIELDS: dict[str, tuple[str, int]] = {
    "bank_remaps_active": ("NVML_FI_DEV_ACTIVE_BANK_REMAPPINGS", 0),
    "bank_remaps_inactive": ("NVML_FI_DEV_INACTIVE_BANK_REMAPPINGS", 0),
    "bank_remap_pending": ("NVML_FI_DEV_PENDING_BANK_REMAPPING", 0),
}
def read_driver(nvml: Nvml) -> DriverInfo:
    """`nvidia-smi --query-gpu=driver_version` and the CUDA the driver supports."""
    try:
        version = nvml.call("nvmlSystemGetDriverVersion")
        cuda = nvml.get("nvmlSystemGetCudaDriverVersion_v2")
        if cuda is None:
            cuda = nvml.get("nvmlSystemGetCudaDriverVersion")
        count = nvml.call("nvmlDeviceGetCount")
    except NvmlFailure as exc:
        return DriverInfo(present=False, failure=exc)
    # NVML's 12040 is nvidia-smi's "CUDA Version: 12.4".
    cuda_text = f"{cuda // 1000}.{(cuda % 1000) // 10}" if cuda else None
    return DriverInfo(True, str(version), cuda_text, int(count))


def _enabled(value: Any) -> bool | None:
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return None if value is None else bool(value)


def _watts(milliwatts: Any) -> float | None:
    return None if milliwatts is None else round(milliwatts / 1000.0, 1)


def _flag(value: Any) -> bool | None:
    return None if value is None else bool(value)


def read_mask(nvml: NvmlDoor, handle: Any, functions: list[str]) -> int | None:
    """The clock-event reasons mask now (`nvidia-smi --query-gpu=clocks_event_reasons.active`);
    a function this driver lacks is dropped from `functions`, never asked again."""
    while functions:
        mask = nvml.get(functions[0], handle)
        if mask is not None:
            return int(mask)
        functions.pop(0)
    return None


def _processes(nvml: Nvml, handle: Any) -> list[dict[str, Any]] | None:
    """`nvidia-smi --query-compute-apps=pid,used_memory`, graphics ones too; None when
    the compute list is n/a (an empty graphics list says nothing of CUDA). A list that
    grew while read (InsufficientSize) is asked once more, then n/a, never a failed GPU."""
    seen: dict[int, dict[str, Any]] = {}
    answered = False
    for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        procs: list[Any] | None = None
        for _ in range(2):
            try:
                procs = nvml.get(fn, handle)
                break
            except NvmlFailure as exc:
                if exc.kind != "NVMLError_InsufficientSize":
                    raise
        if procs is None:
            if fn == "nvmlDeviceGetComputeRunningProcesses":
                return None
            continue
        answered = True
        for proc in procs:
            used = getattr(proc, "usedGpuMemory", None)
            seen.setdefault(int(proc.pid), {"pid": int(proc.pid), "used_memory_bytes": used})
    return list(seen.values()) if answered else None


def nvlink_active(nvml: Nvml, handle: Any) -> int | None:
    """Active NVLink links (`nvidia-smi nvlink --status`); None when NVLink is absent."""
    max_links = getattr(nvml.module, "NVML_NVLINK_MAX_LINKS", 18)
    active = 0
    for link in range(max_links):
        state = nvml.get("nvmlDeviceGetNvLinkState", handle, link)
        if state is None:
            return None if link == 0 else active
        active += int(bool(state))
    return active


def _recovery_action(nvml: Nvml, handle: Any) -> tuple[str | None, str | None]:
    """NVML's recovery action (`nvidia-smi -q` "Recovery Action", R565+) and, when n/a,
    which side is too old: "nvidia-ml-py" (cannot ask) or "driver"."""
    m = nvml.module
    if getattr(m, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None) is None \
            or getattr(m, "nvmlDeviceGetFieldValues", None) is None:
        return None, "nvidia-ml-py"
    value = field_value(nvml, handle, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
    if value is None:
        return None, "driver"
    known = RECOVERY_ACTIONS.get(int(value))
    word = "none" if int(value) == 0 else known.name if known else f"unknown ({int(value)})"
    return word, None


def _near_cpus(nvml: Nvml, handle: Any, bus_id: str, sysfs: Path) -> str | None:
    """`nvidia-smi topo -m`'s "CPU Affinity" (64-bit words), else sysfs' local CPUs."""
    # Room for every CPU id, 1024 at least: ids can pass the count of configured CPUs.
    words = max(os.cpu_count() or 0, 1024) // 64 + 1
    mask = nvml.get("nvmlDeviceGetCpuAffinity", handle, words) or ()
    cpus = tuple(64 * i + bit for i, word in enumerate(mask) for bit in range(64)
                 if int(word) >> bit & 1)
    return cpulist(cpus or read_local_cpus(bus_id, sysfs)) or None


def read_gpu(nvml: Nvml, index: int, sysfs: Path = SYSFS) -> GpuRecord:
    """Everything `nvidia-smi -q -i <index>` shows that matters here."""
    f: dict[str, Any] = {}
    try:
        h = nvml.call("nvmlDeviceGetHandleByIndex", index)
        m = nvml.module
        pci = nvml.get("nvmlDeviceGetPciInfo", h)
        cc = nvml.get("nvmlDeviceGetCudaComputeCapability", h)
        f.update(name=nvml.get("nvmlDeviceGetName", h), uuid=nvml.get("nvmlDeviceGetUUID", h),
                 pci_bus_id=None if pci is None else str(decode(pci.busId)),
                 compute_capability=None if cc is None else f"{cc[0]}.{cc[1]}")
        version = getattr(m, "nvmlMemory_v2", None)  # the v2 call where it exists
        mem = nvml.get("nvmlDeviceGetMemoryInfo", h, version=version) if version else None
        mem = mem or nvml.get("nvmlDeviceGetMemoryInfo", h)
        f.update(memory_total_bytes=None if mem is None else int(mem.total),
                 memory_used_bytes=None if mem is None else int(mem.used))
        util = nvml.get("nvmlDeviceGetUtilizationRates", h)
        sm = getattr(m, "NVML_CLOCK_SM", 1)
        f["persistence_mode"] = _enabled(nvml.get("nvmlDeviceGetPersistenceMode", h))
        modes = nvml.get("nvmlDeviceGetMigMode", h)  # `mig.mode.current,mig.mode.pending`
        pending = modes[1] if isinstance(modes, (list, tuple)) and len(modes) > 1 else None
        f.update(mig_mode=_enabled(modes), mig_mode_pending=_flag(pending))
        f.update(temperature_c=nvml.get("nvmlDeviceGetTemperature", h,
                                        getattr(m, "NVML_TEMPERATURE_GPU", 0)),
                 power_draw_w=_watts(nvml.get("nvmlDeviceGetPowerUsage", h)),
                 power_limit_w=_watts(nvml.get("nvmlDeviceGetEnforcedPowerLimit", h)),
                 sm_clock_mhz=nvml.get("nvmlDeviceGetClockInfo", h, sm),
                 sm_clock_max_mhz=nvml.get("nvmlDeviceGetMaxClockInfo", h, sm),
                 utilization_gpu_pct=None if util is None else int(util.gpu),
                 utilization_memory_pct=None if util is None else int(util.memory))
        for key, fn in (("pcie_gen_current", "nvmlDeviceGetCurrPcieLinkGeneration"),
                        ("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration"),
                        ("pcie_width_current", "nvmlDeviceGetCurrPcieLinkWidth"),
                        ("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth")):
            f[key] = nvml.get(fn, h)
        unc = getattr(m, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        f.update(ecc_volatile_uncorrected=nvml.get("nvmlDeviceGetTotalEccErrors", h, unc,
                                                   getattr(m, "NVML_VOLATILE_ECC", 0)),
                 ecc_aggregate_uncorrected=nvml.get("nvmlDeviceGetTotalEccErrors", h, unc,
                                                    getattr(m, "NVML_AGGREGATE_ECC", 1)),
                 ecc_mode=_enabled(nvml.get("nvmlDeviceGetEccMode", h)))
        # Retired pages, remapped rows (`nvidia-smi -q -d ROW_REMAPPER`) and bank remaps.
        f["retired_pages_pending"] = _flag(nvml.get("nvmlDeviceGetRetiredPagesPendingStatus", h))
        rows = nvml.get("nvmlDeviceGetRemappedRows", h)
        banks = read_fields(nvml, h, BANK_FIELDS)
        f.update(remapped_rows_pending=None if rows is None else bool(rows[2]),
                 remapped_rows_failed=None if rows is None else bool(rows[3]),
                 bank_remaps_active=_count(banks["bank_remaps_active"]),
                 bank_remaps_inactive=_count(banks["bank_remaps_inactive"]),
                 bank_remap_pending=_flag(banks["bank_remap_pending"]))
        mask = read_mask(nvml, h, list(MASK_FUNCTIONS))
        f["clock_event_reasons"] = None if mask is None else [
            name for bit, name in CLOCK_REASONS.items() if mask & bit]
        procs = _processes(nvml, h)
        f.update(process_count=None if procs is None else len(procs), processes=procs or [])
        f["nvlink_active_links"] = nvlink_active(nvml, h)
        f.update(read_fabric(nvml, h))
        f["recovery_action"], f["recovery_action_na"] = _recovery_action(nvml, h)
        # The NUMA node from sysfs, not nvmlDeviceGetNumaNodeId: on Grace Hopper that is
        # the node of the GPU's own memory.
        bus = f["pci_bus_id"]
        f.update(numa_node=None if bus is None else read_numa_node(bus, sysfs),
                 cpu_affinity=None if bus is None else _near_cpus(nvml, h, bus, sysfs))
    except NvmlFailure as exc:
        f.update(error=str(exc), error_kind=exc.kind, error_hint=exc.hint)
    return GpuRecord(index=index, **f)


def _count(value: float | int | None) -> int | None:
    return None if value is None else int(value)
