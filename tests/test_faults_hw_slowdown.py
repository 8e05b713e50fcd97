"""The HW slowdown (0x8) rule, sample by sample: the bit counts only where it is
corroborated (thermal or power-brake bits with it, or a low SM clock while busy)
and held for SUSTAINED_SAMPLES ticks in a row, because NVML also sets it during
P-state and clock changes (gpucheck/faults/clocks.py quotes the NVML reference)."""

from __future__ import annotations

import pytest

from gpucheck.faults.clocks import (
    SM_LOW_FRACTION,
    SUSTAINED_SAMPLES,
    ClockTally,
    corroboration,
    needs_sm_clock,
)

IDLE, POWER_CAP, HW_SLOW, HW_THERMAL, HW_BRAKE = 0x1, 0x4, 0x8, 0x40, 0x80
LOW, FULL = SM_LOW_FRACTION / 2, 0.95  # SM clock / its maximum


def _tally(samples: list[tuple[int, float | None]]) -> dict:
    tally = ClockTally()
    for mask, ratio in samples:
        tally.add(mask, ratio)
    return tally.hw_slowdown()


@pytest.mark.parametrize(("mask", "ratio", "why"), [
    (HW_SLOW | HW_THERMAL, None, "bits"), (HW_SLOW | HW_BRAKE, FULL, "bits"),
    (HW_SLOW, LOW, "low_clock"), (HW_SLOW | POWER_CAP, LOW, "low_clock"),
    (HW_SLOW, FULL, None),  # the clock is not down: a clock change, not a slowdown
    (HW_SLOW | IDLE, LOW, None),  # idle: the clock is low because nothing runs
    (HW_SLOW, None, None),  # the SM clock is n/a: nothing corroborates the bit
    (HW_THERMAL, LOW, None)])  # no 0x8: judged as HW thermal slowdown, not here
def test_each_hw_slowdown_sample_is_corroborated_only_by_bits_or_a_low_busy_clock(
        mask, ratio, why):
    assert corroboration(mask, ratio) == why


def test_the_sm_clock_is_read_only_for_a_busy_sample_with_the_bit_alone():
    assert needs_sm_clock(HW_SLOW) and needs_sm_clock(HW_SLOW | POWER_CAP)
    assert not any(needs_sm_clock(m) for m in (0, IDLE, POWER_CAP, HW_SLOW | IDLE,
                                              HW_SLOW | HW_THERMAL, HW_SLOW | HW_BRAKE))


def test_transitions_with_the_bit_set_briefly_are_never_held():
    # A comm loop: busy at full clock, and at each idle-busy transition the bit for a
    # sample or two while the clock ramps (low, busy): corroborated, but never sustained.
    busy, ramp = (POWER_CAP, FULL), (HW_SLOW, LOW)
    pattern = [busy, ramp, busy, busy, ramp, ramp, busy, (HW_SLOW | IDLE, LOW)]
    hw = _tally(pattern * 50)
    assert hw["flagged"] == 200 and hw["corroborated_by_low_clock"] == 150
    assert hw["held"] == 0 and hw["longest_run"] == SUSTAINED_SAMPLES - 1


def test_a_run_of_exactly_the_sustained_length_counts_and_one_shorter_does_not():
    short = [(HW_SLOW, LOW)] * (SUSTAINED_SAMPLES - 1) + [(0, None)]
    held = [(HW_SLOW | HW_BRAKE, None)] * SUSTAINED_SAMPLES + [(0, None)]
    assert _tally(short)["held"] == 0
    assert _tally(held)["held"] == SUSTAINED_SAMPLES
    assert _tally(held)["corroborated_by_bits"] == SUSTAINED_SAMPLES
    # A run still going when the window is read counts too.
    assert _tally(held[:-1])["held"] == SUSTAINED_SAMPLES


def test_a_new_window_starts_from_nothing():
    tally = ClockTally()
    for _ in range(10):
        tally.add(HW_SLOW, LOW)
    tally.reset()
    assert tally.hw_slowdown()["held"] == 0 and tally.hw_slowdown()["flagged"] == 0
