"""Why the clocks were held down during the timed loop: the watcher's samples of the
clock-event reasons and their verdict `faults.clocks.slowdown` (docs/faults.md says
why HW slowdown, 0x8, needs corroboration)."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck.faults.judge import fault
from gpucheck.probes.gpu_read import BAD_CLOCK_REASONS, CLOCK_REASONS, MASK_FUNCTIONS, read_mask
from gpucheck.probes.gpus import SLOWDOWN_FIELDS, held_s
from gpucheck.probes.nvml import NvmlDoor
from gpucheck.report import Finding, Status, ok, skip

# Clock-event reason bits (nvml.h nvmlClocksEventReason*) the HW slowdown rule reads.
GPU_IDLE, HW_SLOWDOWN, HW_THERMAL, HW_POWER_BRAKE = 0x1, 0x8, 0x40, 0x80
SM_LOW_FRACTION = 0.6  # SM clock / max at or below which a busy 0x8 sample is believed
SUSTAINED_SAMPLES = 3  # consecutive corroborated 0x8 samples that make a held slowdown
SLOWDOWN_WARN_FRACTION = 0.10  # of the window: at least ~5% of throughput lost
SLOWDOWN_MIN_SAMPLES = 5  # fewer cannot tell 10% from noise
REASON_WORDS = {
    "hw_slowdown": "HW slowdown", "sw_thermal_slowdown": "SW thermal slowdown",
    "hw_thermal_slowdown": "HW thermal slowdown",
    "hw_power_brake_slowdown": "HW power brake slowdown", "sw_power_cap": "SW power cap",
}
_COOLING = ("the GPU slowed itself down to protect itself: check cooling (fans, airflow, "
            "inlet temperature) and the power supply; nvidia-smi -q -d "
            "PERFORMANCE,TEMPERATURE,POWER shows the reasons and their counters")


class ClockReader:
    """Reads the reasons mask, and the SM clock when a 0x8 sample needs it."""

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
        return read_mask(self._nvml, self._handle, self._functions)

    def sm_ratio(self, mask: int) -> float | None:
        """The SM clock over its maximum, read only for a sample whose 0x8 needs it."""
        if not needs_sm_clock(mask):
            return None
        sm = getattr(self._nvml.module, "NVML_CLOCK_SM", 1)
        if self._max_mhz is None:
            self._max_mhz = int(self._nvml.get("nvmlDeviceGetMaxClockInfo", self._handle, sm)
                                or 0)
        if not self._max_mhz:
            return None
        current = self._nvml.get("nvmlDeviceGetClockInfo", self._handle, sm)
        return None if current is None else int(current) / self._max_mhz

    @property
    def sm_max_mhz(self) -> int | None:
        return self._max_mhz or None


def corroboration(mask: int, sm_ratio: float | None) -> str | None:
    """Why a 0x8 sample is believed: "bits" (HW thermal or power brake with it),
    "low_clock" (busy, SM clock at SM_LOW_FRACTION of its max or less), or None."""
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


class ClockTally:
    """Per-reason sample counts over the window (written by the sampler thread), and
    its 0x8 samples: flagged, corroborated, held (runs of SUSTAINED_SAMPLES or more)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._samples, self._counts = 0, dict[str, int]()
            self._flagged, self._by = 0, {"bits": 0, "low_clock": 0}
            self._held_closed = self._run = self._longest = 0  # held: in finished runs
            self._lowest: float | None = None

    def add(self, mask: int, sm_ratio: float | None = None) -> None:
        with self._lock:
            self._samples += 1
            for bit, name in CLOCK_REASONS.items():
                if mask & bit:
                    self._counts[name] = self._counts.get(name, 0) + 1
            why = corroboration(mask, sm_ratio)
            self._flagged += bool(mask & HW_SLOWDOWN)
            if why is None:
                if self._run >= SUSTAINED_SAMPLES:
                    self._held_closed += self._run
                self._run = 0
                return
            self._by[why] += 1
            self._run += 1
            self._longest = max(self._longest, self._run)
            if why == "low_clock" and sm_ratio is not None:
                self._lowest = sm_ratio if self._lowest is None else min(sm_ratio,
                                                                         self._lowest)

    def hw_slowdown(self) -> dict[str, Any]:
        with self._lock:
            held = self._held_closed + (self._run if self._run >= SUSTAINED_SAMPLES else 0)
            return {"flagged": self._flagged, "corroborated_by_bits": self._by["bits"],
                    "corroborated_by_low_clock": self._by["low_clock"], "held": held,
                    "longest_run": self._longest, "lowest_sm_ratio": (
                        None if self._lowest is None else round(self._lowest, 3))}

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


def slowdown_ms(start: dict[str, int | None] | None, end: dict[str, int | None] | None,
                window_s: float | None) -> dict[str, float | None]:
    """Per reason, ms held down during the window by the driver's counter (None: n/a)."""
    if start is None or end is None or not window_s:
        return dict.fromkeys(SLOWDOWN_FIELDS)
    return {r: None if s is None else round(s * 1000, 3)
            for r, s in held_s(start, end, window_s).items()}


# -- the verdict ----------------------------------------------------------------------

def _shares(clocks: Mapping[str, Any]) -> dict[str, tuple[float, float | None]]:
    """Per bad reason: (share of samples, share by the driver's counter or None); HW
    slowdown has no counter and counts its held, corroborated samples only."""
    fractions = clocks.get("fractions") or {}
    counters = clocks.get("slowdown_ms") or {}
    window_s = clocks.get("window_s") or 0.0
    shares: dict[str, tuple[float, float | None]] = {}
    for reason in BAD_CLOCK_REASONS:
        if reason == "hw_slowdown":
            shares[reason] = (_hw_held_share(clocks), None)
            continue
        ms = counters.get(reason)
        counted = ms / 1000.0 / window_s if ms is not None and window_s > 0 else None
        shares[reason] = (float(fractions.get(reason, 0.0)), counted)
    return shares


def _hw_held_share(clocks: Mapping[str, Any]) -> float:
    samples = int(clocks.get("samples") or 0)
    held = int((clocks.get("hw_slowdown") or {}).get("held") or 0)
    return held / samples if samples else 0.0


def _hw_evidence(clocks: Mapping[str, Any]) -> str:
    """"up to 40 samples in a row; HW thermal or power brake bits with it in 10; ..."."""
    hw = clocks.get("hw_slowdown") or {}
    parts = [f"up to {hw.get('longest_run')} samples in a row"]
    if hw.get("corroborated_by_bits"):
        parts.append(f"HW thermal or power brake bits with it in {hw['corroborated_by_bits']}")
    if hw.get("corroborated_by_low_clock"):
        ratio, top = hw.get("lowest_sm_ratio"), hw.get("sm_clock_max_mhz")
        clock = f"down to {ratio * 100:.0f}%" if ratio is not None else "low"
        parts.append(f"the SM clock {clock} of its {top} MHz maximum, busy, in "
                     f"{hw['corroborated_by_low_clock']}")
    return "; ".join(parts)


def _headline(reason: str, share: tuple[float, float | None]) -> str:
    return f"{REASON_WORDS[reason]} {max(share[0], share[1] or 0.0) * 100:.0f}%"


def _detail(reason: str, share: tuple[float, float | None], clocks: Mapping[str, Any]) -> str:
    sampled, counted = share
    samples = int(clocks.get("samples") or 0)
    if reason == "hw_slowdown":
        return (f"{REASON_WORDS[reason]} held in {sampled * 100:.0f}% of {samples} samples "
                f"({_hw_evidence(clocks)})")
    text = f"{REASON_WORDS[reason]} in {sampled * 100:.0f}% of {samples} samples"
    return text + (f", {counted * 100:.0f}% by the driver's counter" if counted is not None
                   else "")


def _bad_slowdowns(clocks: Mapping[str, Any]) -> dict[str, tuple[float, float | None]]:
    """Reasons held for SLOWDOWN_WARN_FRACTION of the window or more: sampled (with
    SLOWDOWN_MIN_SAMPLES samples or more), or by the driver's counter alone."""
    judged = int(clocks.get("samples") or 0) >= SLOWDOWN_MIN_SAMPLES
    return {r: s for r, s in _shares(clocks).items()
            if (judged and s[0] >= SLOWDOWN_WARN_FRACTION)
            or (s[1] is not None and s[1] >= SLOWDOWN_WARN_FRACTION)}


def _window_words(clocks: Mapping[str, Any]) -> str:
    return "timed loop" if clocks.get("window") == "timed" else "watched run"


def judge_clocks(result: Mapping[str, Any]) -> Finding:
    """A slowdown held for SLOWDOWN_WARN_FRACTION of the window or more: WARN."""
    check, clocks = "faults.clocks.slowdown", result.get("clocks") or {}
    if clocks.get("fractions") is None:
        return skip(check, "clock-event reasons")
    window = _window_words(clocks)
    samples, window_s = int(clocks.get("samples") or 0), clocks.get("window_s")
    bad = _bad_slowdowns(clocks)
    if bad:
        words = ", ".join(_headline(r, s) for r, s in bad.items())
        details = "; ".join(_detail(r, s, clocks) for r, s in bad.items())
        return fault(check, Status.WARN, f"was in {words} of the {window} ({window_s} s: "
                     f"{details})", "drain-node", _COOLING)
    span = f"{window_s} s, {samples} samples"
    if samples < SLOWDOWN_MIN_SAMPLES:
        return skip(check, f"slowdowns (too few clock samples: {span})")
    seen = [_headline(r, s) for r, s in _shares(clocks).items()
            if r != "hw_slowdown" and (s[0] or s[1])]
    flagged = float((clocks.get("fractions") or {}).get("hw_slowdown", 0.0))
    if flagged:
        seen.append(f"HW slowdown flag {flagged * 100:.0f}%, {_hw_held_share(clocks) * 100:.0f}"
                    "% held with a low SM clock or thermal/power-brake bits (NVML also sets "
                    "the flag at P-state and clock changes)")
    power = (clocks.get("fractions") or {}).get("sw_power_cap")
    if power:  # the power limit is doing its job: information
        seen.append(f"at its power limit {power * 100:.0f}%")
    return ok(check, f"no slowdown in the {window} ({span})" + (
        f"; briefly: {', '.join(seen)}" if seen else ""))


def slowdown_pct(clocks: Mapping[str, Any]) -> float | None:
    """The largest share of the window any bad reason held the clocks, in %."""
    if clocks.get("fractions") is None:
        return None
    return round(100 * max(s[0] for s in _shares(clocks).values()), 1)


def slowdown_causes(results: Sequence[Mapping[str, Any]],
                    window: str | None = None) -> dict[int, str]:
    """Rank -> "was in HW thermal slowdown 40% of the timed loop" for ranks over the
    slowdown threshold, for the straggler findings; `window` replaces the window's words."""
    causes: dict[int, str] = {}
    for position, result in enumerate(results):
        clocks = result.get("clocks") or {}
        if result.get("status") != "watched" or clocks.get("fractions") is None:
            continue
        if bad := _bad_slowdowns(clocks):
            words = ", ".join(_headline(r, s) for r, s in bad.items())
            rank = result.get("rank")
            causes[position if rank is None else int(rank)] = (
                f"was in {words} of the {window or _window_words(clocks)}")
    return causes
