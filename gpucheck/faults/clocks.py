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

HW slowdown (0x8) alone proves little. NVML API reference (NvmlClocksEventReasons,
nvmlClocksEventReasonHwSlowdown): "HW Slowdown (reducing the core clocks by a
factor of 2 or more) is engaged. This is an indicator of: temperature being too
high; External Power Brake Assertion is triggered (e.g. by the system power
supply); Power draw is too high and Fast Trigger protection is reducing the
clocks; May be also reported during PState or clock change. This behavior may be
removed in a later release." A load full of idle-busy transitions (comm, stress)
sets it at transitions on a healthy GPU. So each 0x8 sample is corroborated or not
(`corroboration`): by the HW thermal (0x40) or HW power brake (0x80) bit set with
it, or, with the GPU busy (no GPU-idle bit), by the SM clock read right then at
SM_LOW_FRACTION of its maximum or less (a real HW slowdown halves the clock). Only
corroborated samples in runs of SUSTAINED_SAMPLES consecutive ticks or more count
as held (`HwSlowdownRuns`): a P-state or clock change lasts milliseconds, not
three ticks. The SM clock is read only for a 0x8 sample that needs it, so a
healthy GPU costs no extra call.
"""

from __future__ import annotations

import threading
from typing import Any

from gpucheck.faults.counters import LOST_KINDS
from gpucheck.probes.gpu_read import NvmlDoor
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
# Clock-event reason bits (nvml.h nvmlClocksEventReason*) the HW slowdown rule reads.
GPU_IDLE, HW_SLOWDOWN, HW_THERMAL, HW_POWER_BRAKE = 0x1, 0x8, 0x40, 0x80
SM_LOW_FRACTION = 0.6  # SM clock / max at or below which a busy 0x8 sample is believed
SUSTAINED_SAMPLES = 3  # consecutive corroborated 0x8 samples that make a held slowdown
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
        self._max_mhz: int | None = None  # 0: n/a on this GPU

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

    def sm_ratio(self, mask: int) -> float | None:
        """The SM clock now over its maximum (`nvidia-smi --query-gpu=clocks.sm,
        clocks.max.sm`), read only for a sample whose 0x8 needs it; None when not
        needed or n/a. The maximum is read once."""
        if not needs_sm_clock(mask):
            return None
        sm = getattr(self._nvml.module, "NVML_CLOCK_SM", 1)
        if self._max_mhz is None:
            self._max_mhz = int(self._nvml.get("nvmlDeviceGetMaxClockInfo", self._handle, sm)
                                or 0)
        if not self._max_mhz:  # n/a here: no clock to corroborate with
            return None
        current = self._nvml.get("nvmlDeviceGetClockInfo", self._handle, sm)
        if current is None:
            return None
        return int(current) / self._max_mhz

    @property
    def sm_max_mhz(self) -> int | None:
        """The SM clock's maximum, once read (0 or None: n/a or not needed)."""
        return self._max_mhz or None


def corroboration(mask: int, sm_ratio: float | None) -> str | None:
    """Why a sample with 0x8 set is believed: "bits" (HW thermal or power brake set
    with it), "low_clock" (busy, SM clock at SM_LOW_FRACTION of its max or less), or
    None (not corroborated, or 0x8 not set)."""
    if not mask & HW_SLOWDOWN:
        return None
    if mask & (HW_THERMAL | HW_POWER_BRAKE):
        return "bits"
    if mask & GPU_IDLE or sm_ratio is None:
        return None
    return "low_clock" if sm_ratio <= SM_LOW_FRACTION else None


def needs_sm_clock(mask: int) -> bool:
    """Whether `corroboration` would read the SM clock for this sample."""
    return bool(mask & HW_SLOWDOWN) and not mask & (HW_THERMAL | HW_POWER_BRAKE | GPU_IDLE)


class HwSlowdownRuns:
    """The 0x8 samples of a window: how many, how many corroborated, and how many in
    runs of SUSTAINED_SAMPLES consecutive corroborated samples or more (held)."""

    def __init__(self) -> None:
        self.flagged = 0  # samples with 0x8 set
        self.by = {"bits": 0, "low_clock": 0}
        self.held_closed = 0  # samples of finished runs that were long enough
        self.run = 0  # the current run of corroborated samples
        self.longest = 0
        self.lowest_ratio: float | None = None

    def add(self, mask: int, sm_ratio: float | None) -> None:
        why = corroboration(mask, sm_ratio)
        self.flagged += bool(mask & HW_SLOWDOWN)
        if why is None:
            if self.run >= SUSTAINED_SAMPLES:
                self.held_closed += self.run
            self.run = 0
            return
        self.by[why] += 1
        self.run += 1
        self.longest = max(self.longest, self.run)
        if why == "low_clock" and sm_ratio is not None:
            self.lowest_ratio = (sm_ratio if self.lowest_ratio is None
                                 else min(sm_ratio, self.lowest_ratio))

    def summary(self) -> dict[str, Any]:
        """Plain JSON for the result (the current run counts if already long enough)."""
        held = self.held_closed + (self.run if self.run >= SUSTAINED_SAMPLES else 0)
        return {"flagged": self.flagged, "corroborated_by_bits": self.by["bits"],
                "corroborated_by_low_clock": self.by["low_clock"], "held": held,
                "longest_run": self.longest, "lowest_sm_ratio": (
                    None if self.lowest_ratio is None else round(self.lowest_ratio, 3))}


class ClockTally:
    """Per-reason sample counts over the window; written by the sampler thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples = 0
        self._counts: dict[str, int] = {}
        self._hw = HwSlowdownRuns()

    def reset(self) -> None:
        with self._lock:
            self._samples, self._counts = 0, {}
            self._hw = HwSlowdownRuns()

    def add(self, mask: int, sm_ratio: float | None = None) -> None:
        """One sample: the reasons mask, and the SM clock / max when it was read."""
        with self._lock:
            self._samples += 1
            for bit, name in CLOCK_REASONS.items():
                if mask & bit:
                    self._counts[name] = self._counts.get(name, 0) + 1
            self._hw.add(mask, sm_ratio)

    def hw_slowdown(self) -> dict[str, Any]:
        """How the window's 0x8 samples were corroborated (HwSlowdownRuns.summary)."""
        with self._lock:
            return self._hw.summary()

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
