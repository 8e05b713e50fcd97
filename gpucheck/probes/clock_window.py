"""A second look at a GPU whose one clock sample showed a slowdown: is it held?

`env` and `health` read each GPU once, and one clock-event reasons mask is one
instant: a loaded GPU touching its thermal limit for a moment sets the SW thermal bit
in it as surely as a GPU with a failed fan. `health` runs while jobs use the GPUs, so
judging that one bit drains healthy nodes. So when a GPU's sample shows a thermal or
power-brake slowdown, it is watched for WINDOW_S more (`nvidia-smi -q -d PERFORMANCE`
twice, with samples in between):

- the driver's own slowdown-time counters (`nvmlDeviceGetFieldValues` with
  NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN, ..._HW_THERM_SLOWDOWN,
  ..._HW_POWER_BRAKE_SLOWDOWN: cumulative ns the reason held the clocks down; the
  "Clocks Event Reasons Counters" of `nvidia-smi -q -d PERFORMANCE`), read at both ends:
  their delta over the window is the share of it the reason held the clocks, exact
  where the driver has them;
- the reasons mask, sampled every TICK_S: the share of the samples each reason was
  set in, the evidence where the counters are n/a (older drivers and GPUs).

A reason is held when it held the clocks HELD_SHARE of the window or more by its
counter, or was set in HELD_SHARE of at least MIN_SAMPLES samples spread over the
window (either evidence: the counter sees pulses between samples, the samples serve
where the counter is n/a). Only a held reason is a WARN (gpu_judge.clock_finding).
The run-time judge (gpucheck/faults/judge_clocks.py) asks for 10 % of a timed loop of
minutes; a window of one second asks for more of it, so that a moment at the limit is
not a fault.
HW slowdown (0x8) has no counter and NVML also sets it at P-state and clock changes:
it is never looked at here (alone it is noted, not warned).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from gpucheck.probes.gpu_record import BAD_CLOCK_REASONS, CLOCK_REASONS, GpuRecord
from gpucheck.probes.nvml import Nvml, NvmlFailure

WINDOW_S = 1.0  # how long a GPU with a slowdown in its sample is watched
TICK_S = 0.05  # between two samples of the reasons mask
HELD_SHARE = 0.5  # of the window: held, not touched
MIN_SAMPLES = 5  # fewer samples cannot tell held from touched
# Reason -> the pynvml field id of its cumulative time counter (ns, nvml.h).
SLOWDOWN_FIELDS: dict[str, str] = {
    "sw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "hw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
    "hw_power_brake_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
}
LOOKED_AT = tuple(r for r in BAD_CLOCK_REASONS if r != "hw_slowdown")
_MASK_FUNCTIONS = ("nvmlDeviceGetCurrentClocksEventReasons",
                   "nvmlDeviceGetCurrentClocksThrottleReasons")
_ULL = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def needs_look(gpu: GpuRecord) -> bool:
    """Whether the GPU's one sample showed a reason worth a second look."""
    return bool(set(gpu.clock_event_reasons or ()) & set(LOOKED_AT)) and not gpu.error


def _mask(nvml: Nvml, handle: Any) -> int | None:
    for function in _MASK_FUNCTIONS:
        mask = nvml.get(function, handle)
        if mask is not None:
            return int(mask)
    return None


def _counters_ns(nvml: Nvml, handle: Any) -> dict[str, int | None]:
    """Each reason's cumulative ns (None: this pynvml, driver or GPU lacks it)."""
    m = nvml.module
    ids = {r: getattr(m, c) for r, c in SLOWDOWN_FIELDS.items() if hasattr(m, c)}
    out: dict[str, int | None] = dict.fromkeys(SLOWDOWN_FIELDS)
    values = nvml.get("nvmlDeviceGetFieldValues", handle, list(ids.values())) if ids else None
    for reason, value in zip(ids, values or (), strict=False):
        member = _ULL.get(int(value.valueType))
        if int(value.nvmlReturn) == 0 and member is not None:
            out[reason] = int(getattr(value.value, member))
    return out


def _shares(start: dict[str, int | None], end: dict[str, int | None],
            window_s: float) -> dict[str, float | None]:
    """Per reason, the share of the window its counter grew by; None when n/a or past
    the window itself (a counter that is not what pynvml names: dropped, not believed)."""
    shares: dict[str, float | None] = {}
    for reason in SLOWDOWN_FIELDS:
        a, b = start.get(reason), end.get(reason)
        share = None if a is None or b is None or b < a else (b - a) / 1e9 / window_s
        shares[reason] = round(share, 3) if share is not None and share <= 1.05 else None
    return shares


def _held(fractions: dict[str, float], counted: dict[str, float | None],
          samples: int) -> list[str]:
    sampled = samples >= MIN_SAMPLES
    return [r for r in LOOKED_AT if (counted.get(r) or 0.0) >= HELD_SHARE
            or (sampled and fractions.get(r, 0.0) >= HELD_SHARE)]


def _read_counters(nvml: Nvml, handles: dict[int, Any],
                   ) -> dict[int, tuple[float, float, dict[str, int | None]]]:
    """Each GPU's counters, with when its call began and ended. A share is taken over
    the outer bracket of its own two reads (start call's beginning to end call's end):
    the driver samples a counter somewhere inside a call, so a slow call (a busy
    driver) can never make a reason look held longer than it was; measured over the
    window between the reads instead, a counter sampled early in a slow first call
    grew over more time than that window (a 0.45 share read as 0.67: a drain)."""
    read = {}
    for i, handle in handles.items():
        before = time.monotonic()
        values = _counters_ns(nvml, handle)
        read[i] = (before, time.monotonic(), values)
    return read


def _watch(nvml: Nvml, handles: dict[int, Any], window_s: float,
           tick_s: float) -> dict[int, dict[str, Any]]:
    """Sample every GPU's mask for `window_s`, counters at both ends."""
    start = _read_counters(nvml, handles)
    began = time.monotonic()
    seen: dict[int, dict[str, int]] = {i: {} for i in handles}
    samples = 0
    while True:
        for i, handle in handles.items():
            mask = _mask(nvml, handle) or 0
            for bit, name in CLOCK_REASONS.items():
                if mask & bit:
                    seen[i][name] = seen[i].get(name, 0) + 1
        samples += 1
        if time.monotonic() - began >= window_s:
            break
        time.sleep(tick_s)
    end = _read_counters(nvml, handles)
    elapsed = time.monotonic() - began
    looks = {}
    for i in handles:
        fractions = {r: round(n / samples, 3) for r, n in sorted(seen[i].items())}
        counted = _shares(start[i][2], end[i][2], max(end[i][1] - start[i][0], 1e-6))
        looks[i] = {"window_s": round(elapsed, 3), "samples": samples,
                    "fractions": fractions, "counter_share": counted,
                    "held": _held(fractions, counted, samples)}
    return looks


def second_look(nvml: Nvml, gpus: Sequence[GpuRecord], window_s: float | None = None,
                tick_s: float | None = None) -> list[GpuRecord]:
    """`gpus` with `clock_window` filled for each whose sample showed a thermal or
    power-brake slowdown (all of them watched together, one window); the others, and
    all of them when NVML fails during the look, unchanged (one sample: not judged)."""
    suspects = [g for g in gpus if needs_look(g)]
    if not suspects:
        return list(gpus)
    try:
        handles = {g.index: nvml.call("nvmlDeviceGetHandleByIndex", g.index) for g in suspects}
        looks = _watch(nvml, handles, WINDOW_S if window_s is None else window_s,
                       TICK_S if tick_s is None else tick_s)
    except NvmlFailure:
        return list(gpus)  # the GPU's own failures are judged elsewhere (gpu.query)
    return [dataclasses.replace(g, clock_window=looks[g.index]) if g.index in looks else g
            for g in gpus]
