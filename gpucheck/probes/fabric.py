"""The NVSwitch fabric of a GPU (`nvidia-smi -q` "Fabric"): its registration state and
health read through NVML (judged in gpu_judge: `gpu.fabric`, `gpu.fabric.*`)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from gpucheck.probes.nvml import Nvml, NvmlFailure

# NVML_GPU_FABRIC_STATE_* (pynvml) -> the words the report uses.
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}


@dataclass(frozen=True)
class HealthField:
    """One sub-field of healthMask: where it sits and what its values say."""

    name: str  # our word, also the key in the record's decoded health
    shift: int
    width: int
    words: dict[int, str]  # value -> word; 0 is always "not supported" (left out)


# pynvml NVML_GPU_FABRIC_HEALTH_MASK_{SHIFT,WIDTH}_<FIELD> and the value names.
_TRUE_FALSE = {1: "true", 2: "false"}
HEALTH_FIELDS = (
    HealthField("degraded_bandwidth", 0, 0x3, _TRUE_FALSE),
    HealthField("route_recovery", 2, 0x3, {1: "in_progress", 2: "false"}),
    HealthField("route_unhealthy", 4, 0x3, _TRUE_FALSE),
    HealthField("access_timeout_recovery", 6, 0x3, {1: "in_progress", 2: "false"}),
    HealthField("incorrect_configuration", 8, 0xF, {
        1: "none", 2: "INCORRECT_SYSGUID", 3: "INCORRECT_CHASSIS_SN", 4: "NO_PARTITION",
        5: "INSUFFICIENT_NVLINKS", 6: "INCOMPATIBLE_GPU_FW", 7: "INVALID_LOCATION",
        8: "GPU_STATE_INVALID"}),
    HealthField("partition_assigned", 12, 0x3, _TRUE_FALSE),
    HealthField("gfm_state", 14, 0x3, {1: "connected", 2: "disconnected"}),
)
# NVML_GPU_FABRIC_HEALTH_SUMMARY_*: 0 is "not supported" (None in the record).
HEALTH_SUMMARIES = {1: "healthy", 2: "unhealthy", 3: "limited_capacity"}


def decode_health(mask: int | None) -> dict[str, str]:
    """healthMask -> {field: word} for the fields this GPU/driver supports (value != 0);
    an undocumented value is kept as "unknown (N)" rather than dropped."""
    if mask is None:
        return {}
    decoded = {}
    for f in HEALTH_FIELDS:
        value = (int(mask) >> f.shift) & f.width
        if value:
            decoded[f.name] = f.words.get(value, f"unknown ({value})")
    return decoded


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
