"""How the clocks are judged: slowdowns in the timed window.

From the clock-event reasons the watcher sampled (`gpucheck.faults.clocks`) and
the driver's own slowdown-time counters. docs/faults.md has the thresholds.

HW slowdown (0x8) counts only where the watcher corroborated it, sample by sample
(HW thermal or power-brake bits with it, or the SM clock at SM_LOW_FRACTION of its
maximum or less while busy) in runs of SUSTAINED_SAMPLES in a row: NVML documents
that the bit is also set during P-state and clock changes (gpucheck/faults/clocks.py
quotes it). The bit alone is never a WARN, so never a `drain-node`; it is noted
in the OK line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck.faults.clocks import REASON_WORDS
from gpucheck.faults.verdict import Verdict, na, ok, rank_of
from gpucheck.probes.gpu_record import BAD_CLOCK_REASONS
from gpucheck.report import Status

SLOWDOWN_WARN_FRACTION = 0.10  # of the window: at least ~5% of throughput lost
SLOWDOWN_MIN_SAMPLES = 5  # fewer cannot tell 10% from noise

_COOLING = ("the GPU slowed itself down to protect itself: check cooling (fans, airflow, "
            "inlet temperature) and the power supply; nvidia-smi -q -d "
            "PERFORMANCE,TEMPERATURE,POWER shows the reasons and their counters")


def _slowdown_shares(clocks: Mapping[str, Any]) -> dict[str, tuple[float, float | None]]:
    """Per bad reason: (share of samples, share from the driver's counter or None)."""
    fractions = clocks.get("fractions") or {}
    counters = clocks.get("slowdown_ms") or {}
    window_s = clocks.get("window_s") or 0.0
    shares: dict[str, tuple[float, float | None]] = {}
    for reason in BAD_CLOCK_REASONS:
        if reason == "hw_slowdown":  # no counter; only its held, corroborated samples
            shares[reason] = (_hw_held_share(clocks), None)
            continue
        ms = counters.get(reason)
        counted = ms / 1000.0 / window_s if ms is not None and window_s > 0 else None
        shares[reason] = (float(fractions.get(reason, 0.0)), counted)
    return shares


def _hw_held_share(clocks: Mapping[str, Any]) -> float:
    """Share of the samples in which HW slowdown was held and corroborated (0.0 when the
    result has no corroboration: a watcher that did not check counts as not held)."""
    samples = int(clocks.get("samples") or 0)
    held = int((clocks.get("hw_slowdown") or {}).get("held") or 0)
    return held / samples if samples else 0.0


def _hw_evidence(clocks: Mapping[str, Any]) -> str:
    """What corroborated HW slowdown: "up to 40 samples in a row; HW thermal or power
    brake bits with it in 10; the SM clock at 30% of its 1980 MHz maximum, busy, in 90"."""
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


def _hw_note(clocks: Mapping[str, Any]) -> str | None:
    """The OK line's note on a HW slowdown flag that was not held and corroborated."""
    flagged = float((clocks.get("fractions") or {}).get("hw_slowdown", 0.0))
    if not flagged:
        return None
    return (f"HW slowdown flag {flagged * 100:.0f}%, {_hw_held_share(clocks) * 100:.0f}% held "
            "with a low SM clock or thermal/power-brake bits (NVML also sets the flag at "
            "P-state and clock changes)")


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
    """The slowdowns held for SLOWDOWN_WARN_FRACTION of the window or more: sampled (with
    at least SLOWDOWN_MIN_SAMPLES samples), or by the driver's own counter alone."""
    judged = int(clocks.get("samples") or 0) >= SLOWDOWN_MIN_SAMPLES
    return {r: s for r, s in _slowdown_shares(clocks).items()
            if (judged and s[0] >= SLOWDOWN_WARN_FRACTION)
            or (s[1] is not None and s[1] >= SLOWDOWN_WARN_FRACTION)}


def _window_words(clocks: Mapping[str, Any]) -> str:
    return "timed loop" if clocks.get("window") == "timed" else "watched run"


def judge_clocks(result: Mapping[str, Any]) -> Verdict:
    """HW slowdown, HW/SW thermal slowdown or HW power brake for SLOWDOWN_WARN_FRACTION
    of the window or more (sampled, or by the driver's own counter): WARN."""
    check, clocks = "faults.clocks.slowdown", result.get("clocks") or {}
    if clocks.get("fractions") is None:
        return na(check, "clock-event reasons")
    window = _window_words(clocks)
    samples, window_s = int(clocks.get("samples") or 0), clocks.get("window_s")
    shares = _slowdown_shares(clocks)
    judged = samples >= SLOWDOWN_MIN_SAMPLES
    bad = _bad_slowdowns(clocks)
    if bad:
        words = ", ".join(_headline(r, s) for r, s in bad.items())
        details = "; ".join(_detail(r, s, clocks) for r, s in bad.items())
        return Verdict(check, Status.WARN, f"was in {words} of the {window} ({window_s} s: "
                       f"{details})", "drain-node", _COOLING)
    span = f"{window_s} s, {samples} samples"
    if not judged:
        return na(check, f"slowdowns (too few clock samples: {span})")
    seen = [_headline(r, s) for r, s in shares.items()
            if r != "hw_slowdown" and (s[0] or s[1])]
    seen += [note] if (note := _hw_note(clocks)) else []
    power = (clocks.get("fractions") or {}).get("sw_power_cap")
    if power:  # the power limit is doing its job: information
        seen.append(f"at its power limit {power * 100:.0f}%")
    return ok(check, f"no slowdown in the {window} ({span})" + (
        f"; briefly: {', '.join(seen)}" if seen else ""))


def slowdown_pct(clocks: Mapping[str, Any]) -> float | None:
    """The largest share of the window any bad reason held the clocks, in % (the
    section's `slowdown_pct` column); None when the reasons were n/a."""
    if clocks.get("fractions") is None:
        return None
    return round(100 * max(s[0] for s in _slowdown_shares(clocks).values()), 1)


def slowdown_causes(results: Sequence[Mapping[str, Any]],
                    window: str | None = None) -> dict[int, str]:
    """Rank -> why its clocks were down, for ranks over the slowdown threshold:
    "was in HW thermal slowdown 40% of the timed loop" (the words of the
    faults.clocks.slowdown WARN). For the straggler findings, which name a slow rank
    and can then say what slowed it. `window` replaces the window's words ("measured
    phases"); n/a and unwatched ranks are left out."""
    causes: dict[int, str] = {}
    for position, result in enumerate(results):
        clocks = result.get("clocks") or {}
        if result.get("status") != "watched" or clocks.get("fractions") is None:
            continue
        bad = _bad_slowdowns(clocks)
        if bad:
            words = ", ".join(_headline(r, s) for r, s in bad.items())
            causes[rank_of(result, position)] = (f"was in {words} of the "
                                                 f"{window or _window_words(clocks)}")
    return causes
