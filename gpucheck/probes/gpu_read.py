"""Reading NVML into records: the driver, each GPU's `nvidia-smi -q` view and its NVSwitch
fabric (no judging); a field the GPU lacks is None, a GPU failing mid-query keeps its error."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from gpucheck.devices import SYSFS
from gpucheck.numa import cpulist, read_local_cpus, read_numa_node
from gpucheck.probes.gpu_record import (
    CLOCK_REASONS,
    FABRIC_STATES,
    HEALTH_SUMMARIES,
    DriverInfo,
    GpuRecord,
)
from gpucheck.probes.nvml import Nvml, NvmlFailure, decode

K = TypeVar("K")  # read_fields' names for the fields it reads


class NvmlDoor(Protocol):
    """`Nvml`, or `Nvml` with its calls metered (the fault watcher's)."""

    @property
    def module(self) -> Any: ...

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any: ...

    def get(self, name: str, *args: Any, default: Any = None, **kwargs: Any) -> Any: ...


# NVML_GPU_RECOVERY_ACTION_* (pynvml; nvmlDeviceGpuRecoveryAction_t) -> our words.
RECOVERY_ACTIONS = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p",
                    4: "drain_and_reset", 5: "recover_imex_domain", 6: "bus_reset",
                    7: "system_reboot"}
# nvmlDeviceGetFieldValues' scopeId for a value summed over all NVLinks (NVLink5, as DCGM).
ALL_LINKS = 0xFFFFFFFF
# Bank remapper (nvmlEccBankRemapperStatus_v1_t as field values).
BANK_FIELDS: dict[str, tuple[str, int]] = {
    "bank_remaps_active": ("NVML_FI_DEV_ACTIVE_BANK_REMAPPINGS", 0),
    "bank_remaps_inactive": ("NVML_FI_DEV_INACTIVE_BANK_REMAPPINGS", 0),
    "bank_remap_pending": ("NVML_FI_DEV_PENDING_BANK_REMAPPING", 0),
}
# nvmlValueType_t -> the member of c_nvmlValue_t that holds a field value.
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
                  6: "usVal"}


def cuda_version_str(value: int | None) -> str | None:
    """NVML's 12040 -> '12.4' (as in the `CUDA Version` of nvidia-smi's header)."""
    if not value:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"


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
    return DriverInfo(True, str(version), cuda_version_str(cuda), int(count))


def _memory(nvml: Nvml, handle: Any) -> tuple[int | None, int | None]:
    """`nvidia-smi --query-gpu=memory.total,memory.used`, by the v2 call where it exists."""
    version = getattr(nvml.module, "nvmlMemory_v2", None)
    mem = nvml.get("nvmlDeviceGetMemoryInfo", handle, version=version) if version else None
    if mem is None:
        mem = nvml.get("nvmlDeviceGetMemoryInfo", handle)
    return (None, None) if mem is None else (int(mem.total), int(mem.used))


def _enabled(value: Any) -> bool | None:
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return None if value is None else bool(value)


def _watts(milliwatts: Any) -> float | None:
    return None if milliwatts is None else round(milliwatts / 1000.0, 1)


def _clock_reasons(nvml: Nvml, handle: Any) -> list[str] | None:
    """`nvidia-smi --query-gpu=clocks_event_reasons.active`, as names."""
    mask = nvml.get("nvmlDeviceGetCurrentClocksEventReasons", handle)
    if mask is None:
        mask = nvml.get("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    if mask is None:
        return None
    return [name for bit, name in CLOCK_REASONS.items() if int(mask) & bit]


def _process_list(nvml: Nvml, fn: str, handle: Any) -> list[Any] | None:
    """One process list; None when n/a. InsufficientSize (the list grew while read) is
    asked once more, then n/a, never a failed GPU."""
    for _ in range(2):
        try:
            processes: list[Any] | None = nvml.get(fn, handle)
            return processes
        except NvmlFailure as exc:
            if exc.kind != "NVMLError_InsufficientSize":
                raise
    return None


def _processes(nvml: Nvml, handle: Any) -> list[dict[str, Any]] | None:
    """`nvidia-smi --query-compute-apps=pid,used_memory`, graphics ones too; None when
    the compute list is n/a (an empty graphics list says nothing of CUDA)."""
    seen: dict[int, dict[str, Any]] = {}
    answered = False
    for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        procs = _process_list(nvml, fn, handle)
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


def _ecc(nvml: Nvml, handle: Any) -> dict[str, Any]:
    """`nvidia-smi --query-gpu=ecc.mode.current,ecc.errors.uncorrected.volatile.total,...`."""
    m = nvml.module
    unc = getattr(m, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    volatile = nvml.get("nvmlDeviceGetTotalEccErrors", handle, unc,
                        getattr(m, "NVML_VOLATILE_ECC", 0))
    aggregate = nvml.get("nvmlDeviceGetTotalEccErrors", handle, unc,
                         getattr(m, "NVML_AGGREGATE_ECC", 1))
    return {"ecc_mode": _enabled(nvml.get("nvmlDeviceGetEccMode", handle)),
            "ecc_volatile_uncorrected": volatile, "ecc_aggregate_uncorrected": aggregate}


def _retirement(nvml: Nvml, handle: Any) -> dict[str, Any]:
    """Retired pages, remapped rows (`nvidia-smi -q -d ROW_REMAPPER`) and bank remaps."""
    pending_pages = nvml.get("nvmlDeviceGetRetiredPagesPendingStatus", handle)
    rows = nvml.get("nvmlDeviceGetRemappedRows", handle)
    banks = read_fields(nvml, handle, BANK_FIELDS)
    pending_bank = banks.pop("bank_remap_pending")
    return {
        "retired_pages_pending": None if pending_pages is None else bool(pending_pages),
        "remapped_rows_pending": None if rows is None else bool(rows[2]),
        "remapped_rows_failed": None if rows is None else bool(rows[3]),
        **{k: None if v is None else int(v) for k, v in banks.items()},
        "bank_remap_pending": None if pending_bank is None else bool(pending_bank),
    }


def _pcie(nvml: Nvml, handle: Any) -> dict[str, Any]:
    """`nvidia-smi --query-gpu=pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.*`."""
    return {
        "pcie_gen_current": nvml.get("nvmlDeviceGetCurrPcieLinkGeneration", handle),
        "pcie_gen_max": nvml.get("nvmlDeviceGetMaxPcieLinkGeneration", handle),
        "pcie_width_current": nvml.get("nvmlDeviceGetCurrPcieLinkWidth", handle),
        "pcie_width_max": nvml.get("nvmlDeviceGetMaxPcieLinkWidth", handle),
    }


def _identity(nvml: Nvml, handle: Any) -> dict[str, Any]:
    pci = nvml.get("nvmlDeviceGetPciInfo", handle)
    cc = nvml.get("nvmlDeviceGetCudaComputeCapability", handle)
    return {
        "name": nvml.get("nvmlDeviceGetName", handle),
        "uuid": nvml.get("nvmlDeviceGetUUID", handle),
        "pci_bus_id": None if pci is None else str(decode(pci.busId)),
        "compute_capability": None if cc is None else f"{cc[0]}.{cc[1]}",
    }


def _mig(nvml: Nvml, handle: Any) -> dict[str, Any]:
    """`nvidia-smi --query-gpu=mig.mode.current,mig.mode.pending`."""
    modes = nvml.get("nvmlDeviceGetMigMode", handle)
    pending = modes[1] if isinstance(modes, (list, tuple)) and len(modes) > 1 else None
    return {"mig_mode": _enabled(modes),
            "mig_mode_pending": None if pending is None else bool(pending)}


def _member(value: Any) -> float | int | None:
    if int(value.nvmlReturn) != 0:  # NVML_SUCCESS
        return None
    member = _VALUE_MEMBERS.get(int(value.valueType))
    return None if member is None else getattr(value.value, member)


def read_fields(nvml: NvmlDoor, handle: Any,
                wanted: Mapping[K, tuple[str, int]]) -> dict[K, float | int | None]:
    """Several `nvmlDeviceGetFieldValues` fields in one call: name -> (pynvml constant,
    scopeId); None per field pynvml or the GPU lacks."""
    m = nvml.module
    ids = {n: getattr(m, c) for n, (c, _) in wanted.items() if getattr(m, c, None) is not None}
    out: dict[K, float | int | None] = dict.fromkeys(wanted)
    if not ids:
        return out
    values = nvml.get("nvmlDeviceGetFieldValues", handle,
                      [(field_id, wanted[n][1]) for n, field_id in ids.items()])
    for name, value in zip(ids, values or (), strict=False):
        out[name] = _member(value)
    return out


def field_value(nvml: NvmlDoor, handle: Any, constant: str) -> float | int | None:
    """One `nvmlDeviceGetFieldValues` field by its pynvml constant; None when n/a."""
    return read_fields(nvml, handle, {"value": (constant, 0)})["value"]


def read_recovery_action(nvml: Nvml, handle: Any) -> tuple[str | None, str | None]:
    """NVML's recovery action for this GPU (`nvidia-smi -q` "Recovery Action", R565+) and,
    when n/a, which side is too old: "nvidia-ml-py" (cannot ask) or "driver"."""
    m = nvml.module
    if getattr(m, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None) is None \
            or getattr(m, "nvmlDeviceGetFieldValues", None) is None:
        return None, "nvidia-ml-py"
    value = field_value(nvml, handle, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION")
    if value is None:
        return None, "driver"
    return RECOVERY_ACTIONS.get(int(value), f"unknown ({int(value)})"), None


def _state(nvml: Nvml, handle: Any) -> dict[str, Any]:
    m = nvml.module
    util = nvml.get("nvmlDeviceGetUtilizationRates", handle)
    sm = getattr(m, "NVML_CLOCK_SM", 1)
    return {
        "persistence_mode": _enabled(nvml.get("nvmlDeviceGetPersistenceMode", handle)),
        **_mig(nvml, handle),
        "temperature_c": nvml.get("nvmlDeviceGetTemperature", handle,
                                  getattr(m, "NVML_TEMPERATURE_GPU", 0)),
        "power_draw_w": _watts(nvml.get("nvmlDeviceGetPowerUsage", handle)),
        "power_limit_w": _watts(nvml.get("nvmlDeviceGetEnforcedPowerLimit", handle)),
        "sm_clock_mhz": nvml.get("nvmlDeviceGetClockInfo", handle, sm),
        "sm_clock_max_mhz": nvml.get("nvmlDeviceGetMaxClockInfo", handle, sm),
        "utilization_gpu_pct": None if util is None else int(util.gpu),
        "utilization_memory_pct": None if util is None else int(util.memory),
    }


def _cpu_affinity(nvml: Nvml, handle: Any) -> tuple[int, ...]:
    """`nvidia-smi topo -m`'s "CPU Affinity" (64-bit words); () when NVML cannot say."""
    # Room for every CPU id, 1024 at least: ids can pass the count of configured CPUs.
    words = max(os.cpu_count() or 0, 1024) // 64 + 1
    mask = nvml.get("nvmlDeviceGetCpuAffinity", handle, words)
    if mask is None:
        return ()
    return tuple(64 * i + bit for i, word in enumerate(mask) for bit in range(64)
                 if int(word) >> bit & 1)


def _numa(nvml: Nvml, handle: Any, bus_id: str | None, sysfs: Path) -> dict[str, Any]:
    """The GPU's NUMA node from sysfs and the CPUs near it (not nvmlDeviceGetNumaNodeId:
    on Grace Hopper that is the node of the GPU's own memory)."""
    if bus_id is None:
        return {"numa_node": None, "cpu_affinity": None}
    cpus = _cpu_affinity(nvml, handle) or read_local_cpus(bus_id, sysfs)
    return {"numa_node": read_numa_node(bus_id, sysfs), "cpu_affinity": cpulist(cpus) or None}


# The newest struct first (v3 adds healthSummary, v2 has healthMask); an older driver
# answers ArgumentVersionMismatch or FunctionNotFound.
FABRIC_CALLS = (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v3_t"),
                ("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
                ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"))
_OLDER_DRIVER = ("NVMLError_FunctionNotFound", "NVMLError_ArgumentVersionMismatch")


def _return_name(module: Any, code: int) -> str:
    """An nvmlReturn_t as its pynvml constant name ("NVML_ERROR_NOT_READY (27)")."""
    names = [n for n in dir(module) if n.startswith("NVML_ERROR_")
             and getattr(module, n) == code]
    return f"{names[0]} ({code})" if names else f"NVML error {code}"


def _fabric_info(nvml: Nvml, handle: Any) -> Any:
    """The GPU's fabric struct (byref: pynvml hands it to C as is), None without one."""
    m = nvml.module
    for fn, struct in FABRIC_CALLS:
        cls = getattr(m, struct, None)
        if cls is None:
            continue  # a pynvml too old to know this struct
        info = cls()
        try:
            nvml.call(fn, handle, ctypes.byref(info))
        except NvmlFailure as exc:
            if exc.kind in _OLDER_DRIVER:
                continue  # an older driver: try the older struct or call
            if exc.not_available:
                return None
            raise
        return info
    return None


def read_fabric(nvml: Nvml, handle: Any) -> dict[str, Any]:
    """`nvidia-smi -q` "Fabric": state, status once completed, health mask and summary."""
    info = _fabric_info(nvml, handle)
    if info is None:
        return {"fabric_state": None, "fabric_status": None,
                "fabric_health_mask": None, "fabric_health_summary": None}
    m = nvml.module
    state = FABRIC_STATES.get(int(info.state), f"unknown ({int(info.state)})")
    status = None
    # NVML: `status` is valid only once the state is COMPLETED.
    if int(info.state) == getattr(m, "NVML_GPU_FABRIC_STATE_COMPLETED", 3):
        code = int(info.status)
        status = "success" if code == getattr(m, "NVML_SUCCESS", 0) else _return_name(m, code)
    mask = getattr(info, "healthMask", None)
    summary = getattr(info, "healthSummary", None)
    return {"fabric_state": state, "fabric_status": status,
            "fabric_health_mask": None if mask is None else int(mask),
            "fabric_health_summary": None if not summary else HEALTH_SUMMARIES.get(
                int(summary), f"unknown ({int(summary)})")}


def read_gpu(nvml: Nvml, index: int, sysfs: Path = SYSFS) -> GpuRecord:
    """Everything `nvidia-smi -q -i <index>` shows that matters here."""
    fields: dict[str, Any] = {}
    try:
        handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
        fields.update(_identity(nvml, handle))
        total, used = _memory(nvml, handle)
        fields.update(memory_total_bytes=total, memory_used_bytes=used)
        fields.update(_state(nvml, handle), **_pcie(nvml, handle), **_ecc(nvml, handle))
        fields.update(_retirement(nvml, handle))
        fields["clock_event_reasons"] = _clock_reasons(nvml, handle)
        procs = _processes(nvml, handle)
        fields.update(process_count=None if procs is None else len(procs),
                      processes=procs or [])
        fields["nvlink_active_links"] = nvlink_active(nvml, handle)
        fields.update(read_fabric(nvml, handle))
        fields["recovery_action"], fields["recovery_action_na"] = read_recovery_action(
            nvml, handle)
        fields.update(_numa(nvml, handle, fields.get("pci_bus_id"), sysfs))
    except NvmlFailure as exc:
        fields.update(error=str(exc), error_kind=exc.kind, error_hint=exc.hint)
    return GpuRecord(index=index, **fields)

