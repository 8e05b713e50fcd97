"""Why the clocks were held down during the timed loop.

Two sources, both through the `Nvml` doorway:
- the clock-event reasons bitmask (`nvidia-smi --query-gpu=clocks_event_reasons.active`,
  `nvmlDeviceGetCurrentClocksEventReasons`, or the older ...ThrottleReasons), sampled
  by the watcher's thread: the fraction of samples in which each reason was active;
- the driver's own slowdown-time counters (`nvidia-smi -q -d PERFORMANCE`, "Clocks
  Event Reasons Counters"; `nvmlDeviceGetFieldValues` with
  NVML_FI_DEV_CLOCKS_EVENT_REASON_*), read at the start and end of the window:
  exact where they exist (recent drivers and GPUs), n/a elsewhere. HW slowdown
  (0x8) has no counter, so sampling is the one source that covers every reason.
"""

from __future__ import annotations

import threading
from typing import Any

from gpucheck.faults.counters import LOST_KINDS, NvmlDoor
from gpucheck.probes.gpus import CLOCK_REASONS
from gpucheck.probes.nvml import NvmlFailure

MASK_FUNCTIONS = ("nvmlDeviceGetCurrentClocksEventReasons",
                  "nvmlDeviceGetCurrentClocksThrottleReasons")
# Reason -> the pynvml field id constant of its cumulative time counter (ns, per nvml.h).
SLOWDOWN_FIELDS: dict[str, str] = {
    "sw_power_cap": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
    "sw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "hw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
    "hw_power_brake_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
}
# c_nvmlFieldValue_t.valueType (NVML_VALUE_TYPE_*) -> the member of its value union.
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
                  6: "usVal"}
# Words the report uses for a reason ("HW thermal slowdown").
REASON_WORDS = {
    "hw_slowdown": "HW slowdown", "sw_thermal_slowdown": "SW thermal slowdown",
    "hw_thermal_slowdown": "HW thermal slowdown",
    "hw_power_brake_slowdown": "HW power brake slowdown", "sw_power_cap": "SW power cap",
}


class ClockReader:
    """Reads the reasons bitmask, remembering which of the two functions this driver has."""

    def __init__(self, nvml: NvmlDoor, handle: Any) -> None:
        self._nvml, self._handle = nvml, handle
        self._functions = list(MASK_FUNCTIONS)

    @property
    def available(self) -> bool:
        return bool(self._functions)

    @property
    def function(self) -> str | None:
        return self._functions[0] if self._functions else None

    def read(self) -> int | None:
        """The mask now; None when neither function exists here (n/a from then on)."""
        while self._functions:
            mask = self._nvml.get(self._functions[0], self._handle)
            if mask is not None:
                return int(mask)
            self._functions.pop(0)  # not on this driver: never ask again
        return None


class ClockTally:
    """Per-reason sample counts over the window; written by the sampler thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples = 0
        self._counts: dict[str, int] = {}

    def reset(self) -> None:
        with self._lock:
            self._samples, self._counts = 0, {}

    def add(self, mask: int) -> None:
        with self._lock:
            self._samples += 1
            for bit, name in CLOCK_REASONS.items():
                if mask & bit:
                    self._counts[name] = self._counts.get(name, 0) + 1

    @property
    def samples(self) -> int:
        with self._lock:
            return self._samples

    def fractions(self) -> dict[str, float]:
        """{reason: fraction of samples it was active in}, only reasons seen."""
        with self._lock:
            if not self._samples:
                return {}
            return {name: round(count / self._samples, 4)
                    for name, count in sorted(self._counts.items())}


def _field_value(value: Any) -> int | None:
    if int(value.nvmlReturn) != 0:  # NVML_SUCCESS; anything else: this field is n/a
        return None
    member = _VALUE_MEMBERS.get(int(value.valueType))
    return None if member is None else int(getattr(value.value, member))


def read_slowdown_ns(nvml: NvmlDoor, handle: Any) -> dict[str, int | None]:
    """Cumulative ns each reason has held the clocks down (n/a per field).

    One nvmlDeviceGetFieldValues call; a field this driver does not know answers
    its own error in the returned array, and a pynvml that lacks the constant
    leaves that reason n/a.
    """
    m = nvml.module
    ids = {name: getattr(m, constant) for name, constant in SLOWDOWN_FIELDS.items()
           if hasattr(m, constant)}
    result: dict[str, int | None] = dict.fromkeys(SLOWDOWN_FIELDS)
    if not ids:
        return result
    try:
        values = nvml.get("nvmlDeviceGetFieldValues", handle, list(ids.values()))
    except NvmlFailure as exc:
        if exc.kind in LOST_KINDS:
            raise
        return result  # an unexpected answer for optional counters: n/a
    if values is None:
        return result
    for name, value in zip(ids, values, strict=True):
        result[name] = _field_value(value)
    return result


def slowdown_ms(start: dict[str, int | None] | None, end: dict[str, int | None] | None,
                window_s: float | None) -> dict[str, float | None]:
    """Per reason, ms held down during the window; None when n/a or implausible.

    A value longer than the window itself means the counter is not what we think
    (a pynvml whose field ids differ from the driver's: NVIDIA renumbered these
    fields between releases), so it is dropped rather than believed.
    """
    out: dict[str, float | None] = dict.fromkeys(SLOWDOWN_FIELDS)
    if start is None or end is None or not window_s:
        return out
    for name in SLOWDOWN_FIELDS:
        a, b = start.get(name), end.get(name)
        if a is None or b is None or b < a:
            continue
        ms = (b - a) / 1e6
        out[name] = round(ms, 3) if ms <= window_s * 1000 * 1.05 else None
    return out
