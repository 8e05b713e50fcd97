"""What NVML says about the driver (`DriverInfo`) and one GPU (`GpuRecord`, its
`nvidia-smi -q` view), as plain records read by `gpu_read` and judged by `gpu_judge`:
field names follow `nvidia-smi --query-gpu=...`, None is n/a."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpucheck import subject as subjects
from gpucheck.devices import GpuIdentity
from gpucheck.probes.nvml import NvmlFailure

# Clock-event (throttle) reason bits, as in nvml.h / pynvml nvmlClocksEventReason*.
CLOCK_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
BAD_CLOCK_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                     "hw_power_brake_slowdown")

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
    recovery_action: str | None = None  # gpu_read.RECOVERY_ACTIONS; None: n/a (pre-R565)
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
        """"GPU 3 (NVIDIA H200, bus 00000000:9A:00.0, GPU-...)", as in every other section,
        with its index, bus id and UUID as fields."""
        label = GpuIdentity(None, self.index, self.name, self.pci_bus_id, self.uuid).label()
        return subjects.gpu(self.index, label, bus_id=self.pci_bus_id, uuid=self.uuid)

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

