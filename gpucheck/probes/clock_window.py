"""The one NVML clock-event reader (the reasons mask and the driver's slowdown-time
counters), and the second look `env` and `health` give a GPU whose one sample showed a
thermal or power-brake slowdown: is it held? docs/env.md ("One clock sample is an
instant") says why and how it is judged."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck.probes.gpu_read import NvmlDoor, read_fields
from gpucheck.probes.gpu_record import BAD_CLOCK_REASONS, CLOCK_REASONS, GpuRecord
from gpucheck.probes.nvml import NvmlFailure

WINDOW_S = 1.0  # how long a GPU with a slowdown in its sample is watched
TICK_S = 0.05  # between two samples of the reasons mask
HELD_SHARE = 0.5  # of the window: held, not touched
MIN_SAMPLES = 5  # fewer samples cannot tell held from touched
MASK_FUNCTIONS = ("nvmlDeviceGetCurrentClocksEventReasons",
                  "nvmlDeviceGetCurrentClocksThrottleReasons")
# Reason -> the pynvml field id of its cumulative time counter (ns, nvml.h).
SLOWDOWN_FIELDS: dict[str, str] = {
    "sw_power_cap": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
    "sw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "hw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
    "hw_power_brake_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
}
LOOKED_AT = tuple(r for r in BAD_CLOCK_REASONS if r != "hw_slowdown")


def read_mask(nvml: NvmlDoor, handle: Any, functions: list[str]) -> int | None:
    """The reasons bitmask now (`nvidia-smi --query-gpu=clocks_event_reasons.active`);
    a function this driver lacks is dropped from `functions`, never asked again."""
    while functions:
        mask = nvml.get(functions[0], handle)
        if mask is not None:
            return int(mask)
        functions.pop(0)
    return None


def read_slowdown_ns(nvml: NvmlDoor, handle: Any) -> dict[str, int | None]:
    """Cumulative ns each reason held the clocks down (`nvidia-smi -q -d PERFORMANCE`
    "Clocks Event Reasons Counters"); None per field this pynvml, driver or GPU lacks."""
    values = read_fields(nvml, handle, {r: (c, 0) for r, c in SLOWDOWN_FIELDS.items()})
    return {r: None if v is None else int(v) for r, v in values.items()}


def held_s(start: Mapping[str, int | None], end: Mapping[str, int | None],
           window_s: float) -> dict[str, float | None]:
    """Per reason, the seconds its counter grew by over the window; None when n/a or
    longer than the window (a pynvml whose field ids differ from the driver's)."""
    out: dict[str, float | None] = {}
    for reason in SLOWDOWN_FIELDS:
        a, b = start.get(reason), end.get(reason)
        grown = None if a is None or b is None or b < a else (b - a) / 1e9
        out[reason] = grown if grown is not None and grown <= window_s * 1.05 else None
    return out


def needs_look(gpu: GpuRecord) -> bool:
    """Whether the GPU's one sample showed a reason worth a second look."""
    return bool(set(gpu.clock_event_reasons or ()) & set(LOOKED_AT)) and not gpu.error


def _read_counters(nvml: NvmlDoor, handles: dict[int, Any],
                   ) -> dict[int, tuple[float, float, dict[str, int | None]]]:
    """Each GPU's counters with when its call began and ended: a share is taken over
    the outer bracket of its two reads, so a slow call can only make it read low."""
    read = {}
    for i, handle in handles.items():
        before = time.monotonic()
        values = read_slowdown_ns(nvml, handle)
        read[i] = (before, time.monotonic(), values)
    return read


def _watch(nvml: NvmlDoor, handles: dict[int, Any], window_s: float,
           tick_s: float) -> dict[int, dict[str, Any]]:
    """Sample every GPU's mask for `window_s`, counters at both ends."""
    start = _read_counters(nvml, handles)
    began = time.monotonic()
    functions = {i: list(MASK_FUNCTIONS) for i in handles}
    seen: dict[int, dict[str, int]] = {i: {} for i in handles}
    samples = 0
    while True:
        for i, handle in handles.items():
            mask = read_mask(nvml, handle, functions[i]) or 0
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
        span = max(end[i][1] - start[i][0], 1e-6)
        grown = held_s(start[i][2], end[i][2], span)
        counted = {r: None if (g := grown[r]) is None else round(g / span, 3)
                   for r in SLOWDOWN_FIELDS if r in LOOKED_AT}
        held = [r for r in LOOKED_AT if (counted.get(r) or 0.0) >= HELD_SHARE
                or (samples >= MIN_SAMPLES and fractions.get(r, 0.0) >= HELD_SHARE)]
        looks[i] = {"window_s": round(elapsed, 3), "samples": samples,
                    "fractions": fractions, "counter_share": counted, "held": held}
    return looks


def second_look(nvml: NvmlDoor, gpus: Sequence[GpuRecord], window_s: float | None = None,
                tick_s: float | None = None) -> list[GpuRecord]:
    """`gpus` with `clock_window` filled for each whose sample showed a thermal or
    power-brake slowdown (watched together, one window); the others, and all of them
    when NVML fails during the look, unchanged (one sample: not judged)."""
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
