"""Blackwell's newer signals around a load: the NVLink5 counters (link recovery events,
effective and symbol errors and BER, FEC history: field values 215, 219-222, 235-250,
summed over the links) and the bank remapper (303/304/307) beside the row remapper,
read before and after by the fault watch; in `env`, the bank remapper beside row remaps.
Thresholds are DCGM's (docs/faults.md); a GPU without them is a SKIP, never an alarm."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import pytest

from gpucheck.faults import FaultWatch, fault_findings
from gpucheck.faults.judge import (
    effective_ber_too_high,
    judge_links,
    judge_memory,
    symbol_ber_too_high,
)
from gpucheck.probes.gpus import probe_nvml
from gpucheck.probes.nvml import Nvml
from gpucheck.report import Status
from tests.fake_pynvml import ALL_LINKS, FakeGpu, FakeNvml, blackwell_gpu

BUS = "00000000:9A:00.0"
RECOVERY, EFFECTIVE, EFFECTIVE_BER, SYMBOL, SYMBOL_BER, FEC_1 = 215, 219, 220, 221, 222, 236
ACTIVE_BANKS, INACTIVE_BANKS, PENDING_BANK = 303, 304, 307


def _ber(mantissa: int, exponent: int) -> int:
    return mantissa << 8 | exponent


def _watched(monkeypatch: pytest.MonkeyPatch, gpu: FakeGpu,
             during: Callable[[FakeGpu], None] = lambda g: None) -> dict:
    """The GPU watched around a load; `during` changes it while the load runs."""
    fake = FakeNvml([gpu])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    with FaultWatch(BUS, nvml=Nvml(2.0), sample_s=0.005, rank=0) as watch:
        watch.mark_start()
        during(fake.gpus[0])
        time.sleep(0.02)
        watch.mark_end()
    return watch.result()


def _problems(result: dict) -> list[tuple[str, Status, str | None]]:
    return [(f.check, f.status, f.action) for f in fault_findings([result])
            if f.status in (Status.WARN, Status.FAIL)]


def _grow(field_id: int, by: int, scope: int | None = ALL_LINKS) -> Callable[[FakeGpu], None]:
    """Grow a field value (scoped, or the bare id with scope None) while the load runs."""
    def during(gpu: FakeGpu) -> None:
        key: int | tuple[int, int] = field_id if scope is None else (field_id, scope)
        gpu.field_values[key] = gpu.field_values.get(key, 0) + by
    return during


def test_a_healthy_b200_under_load_reads_its_nvlink5_counters_and_stays_ok(monkeypatch):
    result = _watched(monkeypatch, blackwell_gpu(bus_id=BUS))
    counters = result["counters"]
    assert counters["nvlink5_recovery_events"] == {"before": 0, "after": 0, "delta": 0}
    assert counters["nvlink5_fec_history_15"]["delta"] == 0
    assert counters["bank_remaps_active"]["delta"] == 0
    assert _problems(result) == []
    verdicts = {v.check: v.status for v in judge_links(result) + judge_memory(result)}
    assert verdicts["faults.nvlink5.errors"] is Status.OK
    assert verdicts["faults.bank_remaps"] is Status.OK


def test_an_h200_without_nvlink5_counters_is_a_skip_saying_so_never_an_alarm(monkeypatch):
    result = _watched(monkeypatch, FakeGpu(bus_id=BUS))
    assert result["counters"]["nvlink5_symbol_errors"]["after"] is None
    verdicts = {v.check: v.status for v in judge_links(result) + judge_memory(result)}
    assert verdicts["faults.nvlink5"] is Status.SKIP
    assert "faults.bank_remaps" not in verdicts and _problems(result) == []


def test_a_link_recovery_event_during_the_load_fails_with_a_gpu_reset(monkeypatch):
    result = _watched(monkeypatch, blackwell_gpu(bus_id=BUS), _grow(RECOVERY, 1))
    assert result["counters"]["nvlink5_recovery_events"]["delta"] == 1
    assert _problems(result) == [("faults.nvlink5.recovery", Status.FAIL, "reset-gpu")]


@pytest.mark.parametrize("during", [
    lambda g: g.field_values.__setitem__((EFFECTIVE_BER, ALL_LINKS), _ber(3, 11)),
    lambda g: g.field_values.__setitem__((SYMBOL_BER, ALL_LINKS), _ber(2, 9))])
def test_post_fec_errors_or_a_ber_over_dcgms_threshold_warn_replace_hardware(
        monkeypatch, during):
    result = _watched(monkeypatch, blackwell_gpu(bus_id=BUS), during)
    assert _problems(result) == [("faults.nvlink5.errors", Status.WARN, "replace-hardware")]


def test_post_fec_errors_alone_a_deprecated_field_warn_rerun_not_a_part(monkeypatch):
    result = _watched(monkeypatch, blackwell_gpu(bus_id=BUS), _grow(EFFECTIVE, 3))
    assert _problems(result) == [("faults.nvlink5.errors", Status.WARN, "rerun")]


def test_symbol_errors_the_fec_corrected_are_counted_not_alarmed(monkeypatch):
    def during(gpu: FakeGpu) -> None:
        _grow(SYMBOL, 40)(gpu)
        _grow(FEC_1, 40)(gpu)
    result = _watched(monkeypatch, blackwell_gpu(bus_id=BUS), during)
    assert result["counters"]["nvlink5_symbol_errors"]["delta"] == 40
    assert result["counters"]["nvlink5_fec_history_1"]["delta"] == 40
    assert _problems(result) == []


def test_fec_bin_0_codewords_that_needed_no_correction_are_not_summed(monkeypatch):
    result = _watched(monkeypatch, blackwell_gpu(bus_id=BUS), _grow(FEC_1 - 1, 1000))
    ok = [v for v in judge_links(result) if v.check == "faults.nvlink5.errors"]
    assert [v.status for v in ok] == [Status.OK] and "+1000" not in ok[0].message


def test_effective_ber_threshold_is_dcgms_1e_minus_12():
    """DCGM's own test vectors (common/tests/DcgmUtilitiesTests.cpp)."""
    cases = {(15, 255): False, (1, 12): False, (2, 12): True, (10, 13): False,
             (11, 13): True, (1, 11): True, (0, 3): False}
    assert {k: effective_ber_too_high(_ber(*k)) for k in cases} == cases
    assert not symbol_ber_too_high(_ber(15, 255)) and symbol_ber_too_high(_ber(1, 200))


def test_a_bank_remap_that_becomes_pending_fails_with_a_gpu_reset(monkeypatch):
    result = _watched(monkeypatch, blackwell_gpu(bus_id=BUS),
                      _grow(PENDING_BANK, 1, scope=None))
    assert _problems(result) == [("faults.bank_remap.pending", Status.FAIL, "reset-gpu")]


def test_new_bank_remappings_during_the_load_warn_to_watch(monkeypatch):
    result = _watched(monkeypatch, blackwell_gpu(bus_id=BUS),
                      _grow(ACTIVE_BANKS, 2, scope=None))
    assert result["counters"]["bank_remaps_active"]["delta"] == 2
    assert _problems(result) == [("faults.bank_remaps", Status.WARN, "rerun")]


def _env(monkeypatch, gpus):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus).module)
    result = probe_nvml(Nvml(2.0))
    return result, [f for s in result.sections for f in s.findings]


def test_env_shows_bank_remappings_beside_row_remaps_and_fails_a_pending_one(monkeypatch):
    gpus = [blackwell_gpu(bus_id="00000000:18:00.0"), blackwell_gpu(bus_id="00000000:28:00.0"),
            FakeGpu(bus_id="00000000:38:00.0")]
    gpus[0].field_values[ACTIVE_BANKS] = 3
    gpus[1].field_values[PENDING_BANK] = 1
    result, findings = _env(monkeypatch, gpus)
    rows = result.sections[1].data["gpus"]
    assert [(r["bank_remaps_active"], r["bank_remap_pending"]) for r in rows] == [
        (3, False), (0, True), (None, None)]
    bad = [(f.check, f.status, f.action, f.subject.label.split(" (")[0]) for f in findings
           if f.status in (Status.WARN, Status.FAIL)]
    assert bad == [("gpu.bank_remap.pending", Status.FAIL, "reset-gpu", "GPU 1")]
    retirement = {f.subject.label.split(" (")[0]: f.status for f in findings
                  if f.check == "gpu.memory_retirement"}
    assert retirement == {"GPU 0": Status.OK, "GPU 2": Status.OK}


def test_a_driver_answering_nvlink5_counters_per_link_only_is_summed_over_the_links(
        monkeypatch):
    """NVRx reads them with scopeId = link; a driver without the all-links scope gives
    them that way: recovery events summed, the worst link's BER kept."""
    per_link = {(field_id, link): 0 for field_id in (RECOVERY, EFFECTIVE, SYMBOL)
                for link in range(18)}
    per_link |= {(EFFECTIVE_BER, link): _ber(15, 255) for link in range(18)}
    gpu = blackwell_gpu(bus_id=BUS, field_values={**per_link, 307: 0})
    result = _watched(monkeypatch, gpu, _grow(RECOVERY, 1, scope=7))
    assert result["counters"]["nvlink5_recovery_events"] == {"before": 0, "after": 1,
                                                             "delta": 1}
    assert result["counters"]["nvlink5_effective_ber"]["after"] == _ber(15, 255)
    assert _problems(result) == [("faults.nvlink5.recovery", Status.FAIL, "reset-gpu")]
