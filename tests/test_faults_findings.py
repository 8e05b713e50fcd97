"""The verdicts on FaultWatch results, one counter at a time: each threshold has a
case that stays OK (or n/a) and one that is caught, named and given its action."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from gpucheck.faults import fault_findings, faults_section, findings, slowdown_causes
from gpucheck.faults.clocks import (
    SLOWDOWN_MIN_SAMPLES,
    SLOWDOWN_WARN_FRACTION,
    SM_LOW_FRACTION,
    SUSTAINED_SAMPLES,
    ClockTally,
    corroboration,
    needs_sm_clock,
)
from gpucheck.faults.counters import COUNTERS
from gpucheck.faults.judge import CORRECTED_ECC_WARN, NVLINK_ERRORS_PER_S, PCIE_REPLAYS_PER_MIN
from gpucheck.probes.xid_table import ACTIONS
from gpucheck.report import Finding, Status

BUS = "00000000:9A:00.0"
LABEL = f"GPU 3 (NVIDIA H200, bus {BUS}, GPU-8c1e0000-0000-0000-0000-000000000000)"
SUBJECT = f"rank 3 on {LABEL}"


def healthy(**top: Any) -> dict[str, Any]:
    """A minute-long watched run of an H200 on which nothing happened."""
    counters = {name: {"before": 0, "after": 0, "delta": 0} for name in COUNTERS}
    counters["nvlink_active_links"] = {"before": 18, "after": 18, "delta": 0}
    result = {
        "version": 1, "rank": 3, "host": "node1", "bus_id": BUS, "gpu": LABEL,
        "nvml_index": 3, "nvml_bus_id": BUS, "status": "watched", "reason": None,
        "watched_s": 60.0, "counters": counters, "nvlink_links_grown": {},
        "events_registered": ["ecc_corrected", "ecc_uncorrected", "xid"],
        "events_reason": None, "events": [],
        "clocks": {"window": "timed", "window_s": 50.0, "samples": 250, "fractions": {},
                   "source": "nvmlDeviceGetCurrentClocksEventReasons",
                   "slowdown_ms": {"sw_power_cap": 0.0, "sw_thermal_slowdown": 0.0,
                                   "hw_thermal_slowdown": 0.0,
                                   "hw_power_brake_slowdown": 0.0}},
        "errors": [], "cost": {"sample_s": 0.2, "ticks": 300, "nvml_calls": 600,
                               "nvml_call_s": 0.03, "thread_cpu_s": 0.02},
    }
    result.update(top)
    return result


def bump(result: dict[str, Any], name: str, after: int | None, before: int | None = 0) -> dict:
    out = copy.deepcopy(result)
    delta = None if after is None or before is None else after - before
    out["counters"][name] = {"before": before, "after": after, "delta": delta}
    return out


def event(kind: str, data: int = 0, t_s: float = 12.5, in_loop: bool = True) -> dict:
    return {"kind": kind, "xid": data if kind == "xid" else None, "data": data, "t_s": t_s,
            "in_timed_loop": in_loop, "time": "2025-01-01T00:00:12.500+00:00"}


def _one(findings: list[Finding], check: str) -> Finding:
    found = [f for f in findings if f.check == check]
    assert len(found) == 1, [(f.check, f.status.value, f.message) for f in findings]
    return found[0]


def _bad(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.status in (Status.WARN, Status.FAIL)]


def _summary(result: dict[str, Any]) -> Finding:
    findings = fault_findings([result])
    assert not _bad(findings), [(f.check, f.message) for f in _bad(findings)]
    return _one(findings, "faults.summary")


def test_a_healthy_run_is_one_ok_summary_with_every_counter_listed():
    summary = _summary(healthy())
    assert summary.status is Status.OK and summary.subject.label == SUBJECT
    for words in ("uncorrected ECC +0", "corrected ECC +0", "no row remap pending or failed",
                  "retired pages +0", "PCIe replays +0", "NVLink CRC/replay +0, recovery +0",
                  "no slowdown in the timed loop (50.0 s, 250 samples)"):
        assert words in summary.message


def test_a_gpu_with_every_counter_na_is_a_skip_never_a_fail():
    result = healthy(events_registered=None, events_reason="not supported")
    for name in COUNTERS:
        result = bump(result, name, None, None)
    result["clocks"]["fractions"] = None
    findings = fault_findings([result])
    assert [(f.check, f.status) for f in findings] == [("faults.summary", Status.SKIP)]


# -- ECC ----------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["counter", "event"])
def test_an_uncorrected_ecc_error_fails_with_drain_node(source):
    result = healthy()
    if source == "counter":
        result = bump(result, "ecc_uncorrected", 2)
    else:  # the counter is n/a, the driver's event still tells
        result = bump(result, "ecc_uncorrected", None, None)
        result["events"] = [event("ecc_uncorrected")]
    failed = _one(fault_findings([result]), "faults.ecc.uncorrected")
    assert failed.status is Status.FAIL and failed.subject.label == SUBJECT
    assert failed.action == "drain-node" and "nvidia-smi -r -i 3" in failed.hint


def test_uncorrected_errors_from_before_the_run_are_not_blamed_on_it():
    summary = _summary(bump(healthy(), "ecc_uncorrected", 4, before=4))
    assert "uncorrected ECC +0" in summary.message


def test_ecc_off_is_na_not_a_failure():
    result = bump(bump(healthy(events_registered=["xid"]), "ecc_uncorrected", None, None),
                  "ecc_corrected", None, None)
    assert "n/a: uncorrected ECC (ECC off or not reported), corrected ECC" in _summary(
        result).message


def test_a_few_corrected_ecc_errors_are_normal_and_stay_ok():
    summary = _summary(bump(healthy(), "ecc_corrected", CORRECTED_ECC_WARN - 1))
    assert f"corrected ECC +{CORRECTED_ECC_WARN - 1} (corrected, no data lost" in summary.message


def test_a_corrected_ecc_storm_event_warns_whatever_the_count():
    result = healthy(events_registered=["ecc_corrected_storm", "xid"],
                     events=[event("ecc_corrected_storm")])
    assert _one(fault_findings([result]), "faults.ecc.corrected").status is Status.WARN


# -- row remapping and page retirement ---------------------------------------------


def test_a_gpu_without_a_row_remapper_is_na():
    result = bump(bump(healthy(), "remapped_rows_pending", None, None),
                  "remapped_rows_failed", None, None)
    assert "row remapping (not on this GPU)" in _summary(result).message


@pytest.mark.parametrize(("counter", "before", "after", "check", "status", "words", "action"), [
    ("ecc_corrected", 0, CORRECTED_ECC_WARN, "faults.ecc.corrected", Status.WARN,
     f"{CORRECTED_ECC_WARN} corrected (single-bit) ECC errors", "rerun"),
    ("remapped_rows_failed", 0, 1, "faults.remapped_rows.failed", Status.FAIL,
     "failed during the run", "replace-hardware"),
    ("remapped_rows_pending", 1, 1, "faults.remapped_rows.pending", Status.FAIL,
     "already pending before the run", "reset-gpu"),
    ("retired_pages_dbe", 0, 1, "faults.retired_pages", Status.FAIL, "double-bit", "reset-gpu"),
    ("retired_pages_sbe", 0, 1, "faults.retired_pages", Status.WARN, "single-bit", "reset-gpu"),
    ("nvlink_active_links", 18, 17, "faults.nvlink.down", Status.FAIL,
     "18 active before, 17 after", "reset-gpu")])
def test_a_counter_that_changed_during_the_run_gets_its_verdict_and_action(
        counter, before, after, check, status, words, action):
    found = _one(fault_findings([bump(healthy(), counter, after, before=before)]), check)
    assert found.status is status and words in found.message and found.action == action


# -- PCIe and NVLink -----------------------------------------------------------------


def test_pcie_replays_at_the_limit_stay_ok_and_above_it_warn():
    assert "PCIe replays +8" in _summary(bump(healthy(), "pcie_replays", 8)).message
    warned = _one(fault_findings([bump(healthy(), "pcie_replays", PCIE_REPLAYS_PER_MIN + 1)]),
                  "faults.pcie.replay")
    assert warned.status is Status.WARN and "9 PCIe replays" in warned.message
    assert warned.action == "replace-hardware" and "riser" in warned.hint


def test_pcie_replays_are_judged_as_a_rate_over_a_long_run():
    slow = bump(healthy(watched_s=1200.0), "pcie_replays", 100)  # 5 a minute
    assert "PCIe replays +100" in _summary(slow).message


def _nvlink(result: dict[str, Any], counter: str, count: int, link: int = 7) -> dict:
    out = bump(result, counter, count)
    out["nvlink_links_grown"] = {str(link): {counter: count}}
    return out


def test_a_few_nvlink_crc_errors_are_noted_but_ok():
    summary = _summary(_nvlink(healthy(), "nvlink_crc_flit", 50))
    assert "NVLink CRC/replay +50 (link 7), corrected by replay, 0.8/s" in summary.message


def test_nvlink_crc_errors_at_nvidias_rate_warn_naming_the_link():
    count = int(NVLINK_ERRORS_PER_S * 60) + 60
    warned = _one(fault_findings([_nvlink(healthy(), "nvlink_replay", count)]),
                  "faults.nvlink.crc")
    assert warned.status is Status.WARN and "(link 7)" in warned.message
    assert warned.action == "replace-hardware"


def test_an_nvlink_recovery_fails_with_reset_gpu():
    failed = _one(fault_findings([_nvlink(healthy(), "nvlink_recovery", 1, link=2)]),
                  "faults.nvlink.recovery")
    assert failed.status is Status.FAIL and "(link 2)" in failed.message
    assert failed.action == "reset-gpu"


# -- events ----------------------------------------------------------------------------


@pytest.mark.parametrize(("xid", "status", "action"), [
    (79, Status.FAIL, "drain-node"), (64, Status.FAIL, "replace-hardware"),
    (94, Status.WARN, "restart-app"), (109, Status.FAIL, "reset-gpu"),
    (154, Status.WARN, "reset-gpu"), (999, Status.WARN, "rerun")])
def test_xid_events_take_their_verdict_and_action_from_the_xid_table(xid, status, action):
    found = _one(fault_findings([healthy(events=[event("xid", xid)])]), "faults.xid")
    assert found.status is status and found.action == action
    assert f"XID {xid} (" in found.message and found.subject.label == SUBJECT


@pytest.mark.parametrize("xid", [13, 31, 43, 45])
def test_application_level_xids_are_information_not_gpu_faults(xid):
    assert f"application-level XID {xid}" in _summary(healthy(events=[event("xid", xid)])).message


def test_a_repeated_xid_is_one_finding_with_its_count():
    events = [event("xid", 79, t_s=3.0), event("xid", 79, t_s=4.0, in_loop=False)]
    found = _one(fault_findings([healthy(events=events)]), "faults.xid")
    assert "2 times during the run (first 3.0 s after the watch began, in the timed loop)" \
        in found.message


@pytest.mark.parametrize(("kind", "data", "check", "action"), [
    ("dram_retirement_failure", 0, "faults.event.dram_retirement_failure", "replace-hardware"),
    ("poison_uncontained", 0, "faults.event.poison_uncontained", "reset-gpu"),
    ("gpu_recovery_action", 1, "faults.event.gpu_recovery_action", "reset-gpu"),
    ("gpu_recovery_action", 2, "faults.event.gpu_recovery_action", "drain-node")])
def test_memory_and_recovery_events_fail_with_their_action(kind, data, check, action):
    failed = _one(fault_findings([healthy(events=[event(kind, data)])]), check)
    assert failed.status is Status.FAIL and failed.action == action


def test_a_recovery_event_asking_for_no_action_is_not_a_fault():
    _summary(healthy(events=[event("gpu_recovery_action", 0)]))


# -- clocks --------------------------------------------------------------------------


def _clocks(result: dict[str, Any], **changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(result)
    out["clocks"].update(changes)
    return out


def test_a_brief_slowdown_below_the_threshold_is_noted_and_ok():
    share = SLOWDOWN_WARN_FRACTION / 2
    summary = _summary(_clocks(healthy(), fractions={"hw_thermal_slowdown": share}))
    assert f"briefly: HW thermal slowdown {share * 100:.0f}%" in summary.message


def _hw(held: int, bits: int = 0, low_clock: int = 0, longest: int = 0,
        ratio: float | None = None, flagged: int | None = None) -> dict[str, Any]:
    """The watcher's HW slowdown (0x8) corroboration for a 250-sample loop."""
    return {"flagged": held if flagged is None else flagged, "corroborated_by_bits": bits,
            "corroborated_by_low_clock": low_clock, "held": held, "longest_run": longest,
            "lowest_sm_ratio": ratio, "sm_clock_max_mhz": 1980}


def test_the_hw_slowdown_flag_alone_in_every_sample_stays_ok_and_is_noted():
    # 0x8 at every sample, never with a low clock under load nor thermal/brake bits:
    # the P-state and clock changes NVML says also set it.
    result = _clocks(healthy(), fractions={"hw_slowdown": 1.0}, hw_slowdown=_hw(0, flagged=250))
    summary = _summary(result)
    assert "HW slowdown flag 100%, 0% held with a low SM clock or thermal/power-brake bits " \
        "(NVML also sets the flag at P-state and clock changes)" in summary.message
    assert slowdown_causes([result]) == {}


def test_a_result_without_corroboration_never_warns_on_the_hw_slowdown_flag():
    _summary(_clocks(healthy(), fractions={"hw_slowdown": 0.9}))


def test_hw_slowdown_with_thermal_or_power_brake_bits_warns_naming_those_bits():
    result = _clocks(healthy(), fractions={"hw_slowdown": 0.5, "hw_power_brake_slowdown": 0.5},
                     hw_slowdown=_hw(125, bits=125, longest=125))
    warned = _one(fault_findings([result]), "faults.clocks.slowdown")
    assert warned.status is Status.WARN and warned.subject.label == SUBJECT
    assert "HW slowdown 50%, HW power brake slowdown 50%" in warned.message
    assert "HW thermal or power brake bits with it in 125" in warned.message
    assert faults_section([result]).data["gpus"][0]["slowdown_pct"] == 50.0


def test_the_power_limit_at_work_is_information_not_a_slowdown():
    summary = _summary(_clocks(healthy(), fractions={"sw_power_cap": 1.0}))
    assert "at its power limit 100%" in summary.message


def test_too_few_samples_cannot_warn_from_sampling_alone():
    result = _clocks(healthy(), samples=SLOWDOWN_MIN_SAMPLES - 1,
                     fractions={"hw_power_brake_slowdown": 1.0})
    assert "slowdowns (too few clock samples" in _summary(result).message


def test_the_drivers_slowdown_counter_alone_can_warn():
    slow = {"sw_power_cap": 0.0, "sw_thermal_slowdown": 0.0, "hw_thermal_slowdown": 0.0,
            "hw_power_brake_slowdown": 25_000.0}  # 25 s of a 50 s loop
    warned = _one(fault_findings([_clocks(healthy(), samples=2, slowdown_ms=slow)]),
                  "faults.clocks.slowdown")
    assert warned.status is Status.WARN and "HW power brake slowdown 50%" in warned.message
    assert "50% by the driver's counter" in warned.message


def test_clock_reasons_the_driver_lacks_are_na():
    assert "clock-event reasons" in _summary(_clocks(healthy(), fractions=None)).message


# -- the watcher itself, ranks and the section ---------------------------------------


@pytest.mark.parametrize(("kind", "words", "action"), [
    ("NVMLError_GpuIsLost", "NVML says the GPU is lost", "drain-node"),
    ("NVMLError_ResetRequired", "NVML says the GPU needs a reset", "reset-gpu"),
    ("Timeout", "never came back", "drain-node")])
def test_a_gpu_lost_by_nvmls_word_or_by_a_hang_fails_named_with_its_action(kind, words,
                                                                           action):
    error = {"phase": "during the run", "kind": kind, "function": "nvmlDeviceGetIndex",
             "message": "nvmlDeviceGetIndex: ..."}
    failed = _one(fault_findings([healthy(errors=[error])]), "faults.gpu_lost")
    assert failed.status is Status.FAIL and failed.subject.label == SUBJECT
    assert words in failed.message and failed.action == action


SLOW = {"function": "nvmlDeviceGetCurrentClocksEventReasons", "waited_s": 4.2,
        "budget_s": 3.0}


def test_several_slow_calls_name_the_slowest():
    calls = [SLOW, {**SLOW, "function": "nvmlEventSetWait_v2", "waited_s": 7.5}]
    slow = _one(fault_findings([healthy(nvml_slow=calls)]), "faults.nvml_slow")
    assert "2 NVML calls answered late, the slowest nvmlEventSetWait_v2 answered after " \
        "7.5 s" in slow.message


def test_a_lost_gpu_is_said_once_even_after_slow_calls():
    error = {"phase": "during the run", "kind": "Timeout", "function": "x", "message": "x"}
    findings = fault_findings([healthy(nvml_slow=[SLOW], errors=[error])])
    assert [f.check for f in _bad(findings)] == ["faults.gpu_lost"]


def test_other_watcher_trouble_warns_with_rerun_and_is_no_gpu_fault():
    error = {"phase": "during the run", "kind": "KeyError", "function": None,
             "message": "watcher error: 'x'"}
    warned = _one(fault_findings([healthy(errors=[error])]), "faults.watch")
    assert warned.status is Status.WARN and warned.action == "rerun"


def test_every_fault_carries_an_action_from_the_fixed_list_as_cause_and_rows():
    result = healthy(events=[event("xid", 79), event("poison_contained")])
    for name, after in (("ecc_uncorrected", 1), ("ecc_corrected", 50), ("pcie_replays", 99),
                        ("remapped_rows_pending", 1), ("retired_pages_sbe", 1),
                        ("nvlink_recovery", 1)):
        result = bump(result, name, after)
    result = _clocks(result, fractions={"hw_slowdown": 0.5}, hw_slowdown=_hw(125, low_clock=125))
    section = faults_section([result])
    bad = _bad(section.findings)
    assert len(bad) == 9
    for finding in bad:
        assert finding.action in ACTIONS and finding.cause == f"table.{finding.action}"
        assert not finding.hint.startswith("action:")  # plain advice
    assert {row["action"] for row in section.data["faults"]} <= set(ACTIONS)
    assert section.data["gpus"][0]["verdict"] == "FAIL"
    assert section.data["gpus"][0]["action"] in ACTIONS


def test_ranks_on_several_hosts_are_named_with_their_host():
    a = healthy(host="node1", events=[event("xid", 79)])
    b = healthy(host="node2", rank=11)
    findings = fault_findings([a, b])
    assert _one(findings, "faults.xid").subject.label == f"rank 3 on node1 {LABEL}"
    assert [f.subject.label for f in findings if f.check == "faults.summary"] == [
        f"rank 3 on node1 {LABEL}", f"rank 11 on node2 {LABEL}"]


def test_the_callers_gpu_names_win_over_the_watchers_own():
    findings = fault_findings([healthy()], names={3: "GPU 3 (from the roster)"})
    assert findings[0].subject.label == "rank 3 on GPU 3 (from the roster)"


def test_no_results_at_all_is_a_skip():
    section = faults_section([])
    assert [(f.check, f.status) for f in section.findings] == [("faults.watch", Status.SKIP)]
    assert section.name == "faults" and section.title == "Hardware faults during the run"


def test_cpu_ranks_are_one_skip_per_reason():
    cpu = {"rank": 0, "status": "n/a", "reason": "no GPU: this rank runs on the CPU"}
    findings = fault_findings([cpu, {**cpu, "rank": 1}, healthy()])
    skipped = _one(findings, "faults.watch")
    assert skipped.status is Status.SKIP and "ranks 0, 1" in skipped.message


def test_the_docs_name_every_check_id_and_threshold():
    docs = (Path(__file__).parents[1] / "docs" / "faults.md").read_text()
    # Every module of gpucheck/faults that makes a verdict.
    source = "\n".join(p.read_text() for p in Path(findings.__file__).parent.glob("*.py"))
    ids = set(re.findall(r'"(faults\.[a-z_.]+)"', source))
    ids |= {f"faults.event.{kind}" for kind in findings.EVENT_VERDICTS}
    assert [i for i in sorted(ids) if f"`{i}`" not in docs] == []
    for words in (f"{CORRECTED_ECC_WARN} or more", f"more than {PCIE_REPLAYS_PER_MIN} a minute",
                  f"{NVLINK_ERRORS_PER_S:.0f} a second", f"{SLOWDOWN_WARN_FRACTION:.0%} of the",
                  f"at least {SLOWDOWN_MIN_SAMPLES} samples"):
        assert words in docs


# --- the HW slowdown (0x8) rule, sample by sample: the bit counts only where it is
# corroborated (thermal or power-brake bits with it, or a low SM clock while busy) and
# held for SUSTAINED_SAMPLES ticks in a row (NVML also sets it at P-state changes) ---

IDLE, POWER_CAP, HW_SLOW, HW_THERMAL, HW_BRAKE = 0x1, 0x4, 0x8, 0x40, 0x80
LOW, FULL = SM_LOW_FRACTION / 2, 0.95  # SM clock / its maximum


def _hw_tally(samples: list[tuple[int, float | None]]) -> dict:
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
    hw = _hw_tally(pattern * 50)
    assert hw["flagged"] == 200 and hw["corroborated_by_low_clock"] == 150
    assert hw["held"] == 0 and hw["longest_run"] == SUSTAINED_SAMPLES - 1


def test_a_run_of_exactly_the_sustained_length_counts_and_one_shorter_does_not():
    short = [(HW_SLOW, LOW)] * (SUSTAINED_SAMPLES - 1) + [(0, None)]
    held = [(HW_SLOW | HW_BRAKE, None)] * SUSTAINED_SAMPLES + [(0, None)]
    assert _hw_tally(short)["held"] == 0
    assert _hw_tally(held)["held"] == SUSTAINED_SAMPLES
    assert _hw_tally(held)["corroborated_by_bits"] == SUSTAINED_SAMPLES
    # A run still going when the window is read counts too.
    assert _hw_tally(held[:-1])["held"] == SUSTAINED_SAMPLES


def test_a_new_window_starts_from_nothing():
    tally = ClockTally()
    for _ in range(10):
        tally.add(HW_SLOW, LOW)
    tally.reset()
    assert tally.hw_slowdown()["held"] == 0 and tally.hw_slowdown()["flagged"] == 0
