"""FaultWatch end to end on the fake pynvml: a watched "load" (a sleep) while the test,
playing the driver, changes counters and delivers events mid-run."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable

import pytest

from gpucheck.faults import FaultWatch, fault_findings, faults_section
from gpucheck.faults.watch import THREAD_NAME
from gpucheck.probes.nvml import Nvml
from gpucheck.report import Finding, Status
from tests.fake_pynvml import FakeGpu, FakeNvml

BUS = "00000000:9A:00.0"
XID, DBE = 0x8, 0x2  # nvmlEventTypeXidCriticalError, nvmlEventTypeDoubleBitEccError
HW_THERMAL, IDLE, POWER_CAP, HW_SLOWDOWN = 0x40, 0x1, 0x4, 0x8
HW_THERM_FIELD = 270  # NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN (ns)
LABEL = f"GPU 1 (NVIDIA H200, bus {BUS}, GPU-00000001-0000-0000-0000-000000000000)"


def _fake(monkeypatch: pytest.MonkeyPatch, **gpu1) -> FakeNvml:
    """Two H200s; the watched one is GPU 1 at BUS."""
    fake = FakeNvml([FakeGpu(bus_id="00000000:18:00.0"), FakeGpu(bus_id=BUS, **gpu1)])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    return fake


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    """Wait for the watcher's thread; the deadline only keeps a broken test from hanging."""
    deadline = time.monotonic() + 10.0
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.002)


def _run(load: Callable[[FaultWatch], None] = lambda w: None, bus: str | None = BUS,
         rank: int = 3, nvml: Nvml | None = None) -> dict:
    """Watch `bus` around warm-up, a timed loop running `load`, and a tail."""
    with FaultWatch(bus, nvml=nvml or Nvml(2.0), sample_s=0.005, rank=rank) as watch:
        time.sleep(0.01)
        watch.mark_start()
        load(watch)
        time.sleep(0.02)
        watch.mark_end()
    return watch.result()


def _bad(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.status in (Status.WARN, Status.FAIL)]


def _one(findings: list[Finding], check: str) -> Finding:
    found = [f for f in findings if f.check == check]
    assert len(found) == 1, [(f.check, f.status, f.message) for f in findings]
    return found[0]


def test_a_healthy_gpu_under_a_watched_load_stays_ok_with_every_counter_unchanged(
        monkeypatch):
    result = _run(lambda w: _wait_until(lambda: w.clock_samples >= 5, "5 clock samples"),
                  nvml=None)
    assert result["status"] == "watched" and result["gpu"] == LABEL
    deltas = {name: row["delta"] for name, row in result["counters"].items()}
    # An H200 has no bank remapper or NVLink5 counters: those are n/a, the rest unchanged.
    lacking = {n for n in deltas if n.startswith(("bank_", "nvlink5_"))}
    assert lacking and {deltas[n] for n in lacking} == {None}
    assert set(deltas.values()) - {None} == {0} and len(deltas) > len(lacking)
    assert result["events"] == [] and result["errors"] == []
    assert result["events_registered"] == ["ecc_corrected", "ecc_uncorrected", "xid"]
    findings = fault_findings([result])
    assert [(f.check, f.status) for f in findings] == [("faults.summary", Status.OK)]
    assert findings[0].subject.label == f"rank 3 on {LABEL}"
    assert "no new hardware fault" in findings[0].message


@pytest.fixture(autouse=True)
def _fake_gpus(request, monkeypatch):
    """Every test here gets the default two-GPU fake unless it builds its own."""
    if "fake" not in request.fixturenames:
        _fake(monkeypatch)


@pytest.fixture
def fake(monkeypatch) -> FakeNvml:
    return _fake(monkeypatch)


def test_a_gpu_without_pcie_replay_or_nvlink_counters_gives_na_never_a_fail(monkeypatch):
    # No field value supported: NVML answers NotSupported per field, not for the call.
    _fake(monkeypatch, nvlinks=0, unsupported={"nvmlDeviceGetPcieReplayCounter"},
          field_values={})
    result = _run()
    rows = result["counters"]
    assert rows["pcie_replays"] == {"before": None, "after": None, "delta": None}
    assert rows["nvlink_crc_flit"]["delta"] is None and rows["nvlink_active_links"]["after"] is None
    assert set(result["clocks"]["slowdown_ms"].values()) == {None}
    findings = fault_findings([result])
    assert not _bad(findings)
    summary = _one(findings, "faults.summary")
    assert summary.status is Status.OK
    assert "n/a: PCIe replay counter, NVLink (none on this GPU)" in summary.message


def test_nvlink_error_counters_the_driver_lacks_are_na_too(monkeypatch):
    _fake(monkeypatch, unsupported={"nvmlDeviceGetNvLinkErrorCounter"})
    result = _run()
    assert result["counters"]["nvlink_active_links"]["after"] == 18
    assert result["counters"]["nvlink_replay"]["delta"] is None
    findings = fault_findings([result])
    assert not _bad(findings) and "NVLink error counters" in findings[0].message


def test_an_uncorrected_ecc_error_mid_run_fails_naming_the_gpu_and_the_rank(fake):
    def load(watch: FaultWatch) -> None:
        fake.gpus[1].ecc_volatile_unc += 1
        assert fake.deliver_event(1, DBE) == 1

    result = _run(load)
    assert result["counters"]["ecc_uncorrected"] == {"before": 0, "after": 1, "delta": 1}
    failed = _one(fault_findings([result]), "faults.ecc.uncorrected")
    assert failed.status is Status.FAIL and failed.subject.label == f"rank 3 on {LABEL}"
    assert failed.message == "1 new uncorrected (double-bit) ECC error during the run"
    assert failed.action == "drain-node" and "nvidia-smi -r -i 1" in failed.hint


def test_a_row_remap_that_becomes_pending_mid_run_fails_with_reset_gpu(fake):
    def load(watch: FaultWatch) -> None:
        fake.gpus[1].remapped = (0, 1, 1, 0)  # (correctable, uncorrectable, pending, failure)

    findings = fault_findings([_run(load)])
    failed = _one(findings, "faults.remapped_rows.pending")
    assert failed.status is Status.FAIL and "became pending during the run" in failed.message
    assert failed.action == "reset-gpu"
    assert {f.check for f in _bad(findings)} == {"faults.remapped_rows.pending"}


def test_an_xid_79_delivered_mid_run_fails_with_the_xid_meaning(fake):
    result = _run(lambda w: fake.deliver_event(1, XID, 79))
    assert [(e["kind"], e["xid"], e["in_timed_loop"]) for e in result["events"]] == [
        ("xid", 79, True)]
    failed = _one(fault_findings([result]), "faults.xid")
    assert failed.status is Status.FAIL and failed.subject.label == f"rank 3 on {LABEL}"
    assert "XID 79 (GPU has fallen off the bus) once during the run" in failed.message
    assert "in the timed loop" in failed.message
    assert failed.action == "drain-node"


def test_an_xid_before_the_timed_loop_is_reported_but_not_as_in_the_loop(fake):
    with FaultWatch(BUS, nvml=Nvml(2.0), sample_s=0.005, rank=0) as watch:
        fake.deliver_event(1, XID, 48)
        _wait_until(lambda: watch.result()["events"], "the thread to poll the XID")
        watch.mark_start()
        watch.mark_end()
    events = watch.result()["events"]
    assert [(e["xid"], e["in_timed_loop"]) for e in events] == [(48, False)]
    failed = _one(fault_findings([watch.result()]), "faults.xid")
    assert "in the timed loop" not in failed.message


def test_hw_thermal_slowdown_most_of_the_timed_loop_warns_naming_rank_gpu_and_share(fake):
    gpu = fake.gpus[1]

    def load(watch: FaultWatch) -> None:
        gpu.clock_reasons = HW_THERMAL | POWER_CAP
        _wait_until(lambda: watch.clock_samples >= 20, "20 hot samples")
        gpu.clock_reasons = IDLE
        _wait_until(lambda: watch.clock_samples >= 22, "cooler samples after them")

    result = _run(load)
    share = result["clocks"]["fractions"]["hw_thermal_slowdown"]
    assert result["clocks"]["window"] == "timed" and share >= 0.5
    warned = _one(fault_findings([result]), "faults.clocks.slowdown")
    assert warned.status is Status.WARN and warned.subject.label == f"rank 3 on {LABEL}"
    assert f"was in HW thermal slowdown {share * 100:.0f}% of the timed loop" in warned.message
    assert warned.action == "drain-node"


def _busy_hw_slowdown(fake: FakeNvml, sm_mhz: int) -> dict:
    """A timed loop in which the watched GPU is busy with 0x8 set at every sample and
    its SM clock at `sm_mhz` (of 1980)."""
    fake.gpus[1].clock_reasons, fake.gpus[1].sm_clock = HW_SLOWDOWN | POWER_CAP, sm_mhz
    return _run(lambda w: _wait_until(lambda: w.clock_samples >= 20, "20 busy samples"))


def test_the_hw_slowdown_bit_at_full_clock_under_load_stays_ok_with_a_note(fake):
    result = _busy_hw_slowdown(fake, sm_mhz=1900)
    hw = result["clocks"]["hw_slowdown"]
    assert hw["flagged"] >= 20 and hw["held"] == 0 and hw["sm_clock_max_mhz"] == 1980
    findings = fault_findings([result])
    assert not _bad(findings)
    assert "HW slowdown flag" in _one(findings, "faults.summary").message


def test_a_sustained_hw_slowdown_with_a_low_sm_clock_under_load_warns_naming_rank_and_gpu(
        fake):
    result = _busy_hw_slowdown(fake, sm_mhz=700)
    hw = result["clocks"]["hw_slowdown"]
    assert hw["held"] == result["clocks"]["samples"] >= 20
    assert hw["lowest_sm_ratio"] == round(700 / 1980, 3)
    warned = _one(fault_findings([result]), "faults.clocks.slowdown")
    assert warned.status is Status.WARN and warned.subject.label == f"rank 3 on {LABEL}"
    assert warned.message.startswith("was in HW slowdown ")
    assert "the SM clock down to 35% of its 1980 MHz maximum, busy" in warned.message
    assert warned.action == "drain-node"


def test_the_hw_slowdown_bit_on_a_gpu_without_its_max_clock_is_not_corroborated(fake):
    fake.gpus[1].unsupported = {"nvmlDeviceGetMaxClockInfo"}
    result = _busy_hw_slowdown(fake, sm_mhz=700)
    assert result["clocks"]["hw_slowdown"]["held"] == 0 and result["errors"] == []
    assert not _bad(fault_findings([result]))


def test_slowdown_before_the_timed_loop_does_not_count(fake):
    gpu = fake.gpus[1]
    gpu.clock_reasons = HW_THERMAL
    with FaultWatch(BUS, nvml=Nvml(2.0), sample_s=0.005, rank=3) as watch:
        _wait_until(lambda: watch.clock_samples >= 5, "hot samples before the loop")
        gpu.clock_reasons = IDLE
        watch.mark_start()
        gpu.field_values[HW_THERM_FIELD] += 10**9  # 1 s of slowdown, all before the loop
        _wait_until(lambda: watch.clock_samples >= 5, "cool samples in the loop")
        watch.mark_end()
    result = watch.result()
    assert "hw_thermal_slowdown" not in result["clocks"]["fractions"]
    assert not _bad(fault_findings([result]))


def test_the_drivers_slowdown_counter_is_read_over_the_timed_loop_only(fake):
    def load(watch: FaultWatch) -> None:
        fake.gpus[1].field_values[HW_THERM_FIELD] += 7_000_000  # 7 ms, in ns

    clocks = _run(load)["clocks"]
    assert clocks["slowdown_ms"]["hw_thermal_slowdown"] == 7.0
    assert clocks["slowdown_ms"]["sw_power_cap"] == 0.0


def test_a_cpu_rank_is_a_no_op_that_reports_na(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # NVML is never even imported
    with FaultWatch(None, rank=5) as watch:
        watch.mark_start()
        watch.mark_end()
    result = watch.result()
    assert result["status"] == "n/a" and "CPU" in result["reason"]
    section = faults_section([result])
    assert [(f.check, f.status) for f in section.findings] == [("faults.watch", Status.SKIP)]
    assert "rank 5" in section.findings[0].message
    assert section.data["not_watched"] == [{"ranks": "5", "reason": result["reason"]}]


@pytest.mark.parametrize("install", ["no pynvml", "no driver"])
def test_without_nvml_the_watch_is_a_skip_that_says_why(monkeypatch, install):
    if install == "no pynvml":
        monkeypatch.setitem(sys.modules, "pynvml", None)
    else:
        fake = FakeNvml([FakeGpu(bus_id=BUS)], init_error="NVMLError_LibraryNotFound")
        monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    result = _run(rank=0)
    assert result["status"] == "n/a" and result["reason"].startswith("NVML unavailable")
    findings = fault_findings([result])
    assert [(f.check, f.status) for f in findings] == [("faults.watch", Status.SKIP)]


def test_a_gpu_nvml_does_not_know_is_na(monkeypatch):
    result = _run(bus="00000000:C1:00.0")
    assert result["status"] == "n/a" and "00000000:C1:00.0" in result["reason"]
    assert not _bad(fault_findings([result]))


def test_a_gpu_lost_mid_run_fails_as_lost(fake):
    def load(watch: FaultWatch) -> None:
        fake.gpus[1].lost = True
        _wait_until(lambda: watch.result()["errors"], "the thread to see the loss")

    result = _run(load)
    assert result["errors"][0]["kind"] == "NVMLError_GpuIsLost"
    failed = _one(fault_findings([result]), "faults.gpu_lost")
    assert failed.status is Status.FAIL and "during the run" in failed.message
    assert failed.action == "drain-node"


def test_one_slow_nvml_call_mid_run_is_a_warn_nvml_slow_and_not_a_lost_gpu(fake):
    # The clock read waits 0.3 s behind other driver work: past its 0.1 s budget, well
    # inside the second one (10 s). Every count is still read and judged.
    fake.hang_s, fake.gpus[1].hang = 0.3, {"nvmlDeviceGetCurrentClocksEventReasons"}
    nvml = Nvml(0.1, retry_timeout_s=10.0)
    result = _run(lambda w: _wait_until(lambda: nvml.slow_calls, "a slow call"), nvml=nvml)
    assert result["errors"] == [] and result["nvml_slow"]
    # Calls queued behind it are late too (one worker): the budget counts the queue.
    assert "nvmlDeviceGetCurrentClocksEventReasons" in {c["function"] for c in
                                                        result["nvml_slow"]}
    findings = fault_findings([result])
    slow = _one(findings, "faults.nvml_slow")
    assert slow.status is Status.WARN and slow.subject.label == f"rank 3 on {LABEL}"
    assert slow.message.startswith("NVML slow, not lost: ")
    assert slow.action == "none"
    assert not [f for f in findings if f.status is Status.FAIL]
    assert "uncorrected ECC +0" in _one(findings, "faults.summary").message


def test_a_gpu_whose_nvml_call_hangs_through_both_budgets_fails_as_lost_naming_it(fake):
    fake.hang_s, fake.gpus[1].hang = 3.0, {"nvmlDeviceGetCurrentClocksEventReasons"}
    result = _run(lambda w: _wait_until(lambda: w.result()["errors"], "the hang"),
                  nvml=Nvml(0.1, retry_timeout_s=0.3))
    assert result["errors"][0]["kind"] == "Timeout"
    failed = _one(fault_findings([result]), "faults.gpu_lost")
    assert failed.status is Status.FAIL and failed.subject.label == f"rank 3 on {LABEL}"
    assert "never came back" in failed.message and "nor in 0.3 s more" in failed.message
    assert failed.action == "drain-node"


def test_a_slow_call_of_a_shared_doorway_before_the_watch_is_not_the_watchs(fake):
    fake.hang_s, fake.gpus[1].hang = 0.3, {"nvmlDeviceGetName"}
    nvml = Nvml(0.1, retry_timeout_s=10.0)
    nvml.call("nvmlDeviceGetName", nvml.call("nvmlDeviceGetHandleByPciBusId", BUS))
    assert len(nvml.slow_calls) == 1
    fake.gpus[1].hang = set()
    assert _run(nvml=nvml)["nvml_slow"] == []


def test_a_gpu_already_lost_when_the_run_starts_fails_as_lost(monkeypatch):
    _fake(monkeypatch, lost=True)
    result = _run()
    assert result["status"] == "watched" and result["gpu"] is None
    failed = _one(fault_findings([result]), "faults.gpu_lost")
    assert failed.status is Status.FAIL
    assert failed.subject.label == f"rank 3 on the GPU at bus {BUS}"
    assert "when it was looked up" in failed.message


def test_the_watcher_thread_stops_and_the_event_set_is_freed_on_exit(fake):
    def load(watch: FaultWatch) -> None:
        assert any(t.name == THREAD_NAME for t in threading.enumerate())
        raise RuntimeError("the load failed")

    with pytest.raises(RuntimeError, match="the load failed"):
        _run(load)
    assert not any(t.name == THREAD_NAME for t in threading.enumerate())
    assert fake.event_sets and all(s.freed for s in fake.event_sets)


def test_a_private_nvml_is_shut_down_and_a_shared_one_is_not(fake):
    with FaultWatch(BUS, sample_s=0.005):
        pass
    assert not fake.initialised
    shared = Nvml(2.0)
    with FaultWatch(BUS, nvml=shared, sample_s=0.005):
        pass
    assert fake.initialised


def test_drivers_without_event_sets_still_get_their_counters_judged(monkeypatch):
    _fake(monkeypatch, event_types=0)
    result = _run()
    assert result["events_registered"] is None and result["events_reason"]
    findings = fault_findings([result])
    assert not _bad(findings) and "XID/ECC events (" in findings[0].message


def test_ranks_sharing_one_gpu_get_one_finding_naming_both(fake):
    results = []
    watches = [FaultWatch(BUS, nvml=Nvml(2.0), sample_s=0.005, rank=r) for r in (0, 1)]
    for watch in watches:
        watch.start()
    assert fake.deliver_event(1, XID, 79) == 2
    for watch in watches:
        watch.stop()
        results.append(watch.result())
    section = faults_section(results)
    failed = _one(section.findings, "faults.xid")
    assert failed.subject.label == f"ranks 0, 1 on {LABEL}"
    assert len(section.data["events"]) == 1 and section.data["gpus"][0]["ranks"] == "0, 1"


def test_the_result_and_the_section_are_plain_json(fake):
    result = _run(lambda w: fake.deliver_event(1, XID, 79))
    assert json.loads(json.dumps(result)) == result
    section = faults_section([result], names={3: "GPU 1 (as the roster names it)"})
    data = json.loads(json.dumps(section.to_dict()))
    assert data["name"] == "faults" and data["title"] == "Hardware faults during the run"
    assert data["data"]["faults"][0]["action"] == "drain-node"
    assert section.findings[0].subject.label == "rank 3 on GPU 1 (as the roster names it)"


def test_the_watcher_reports_what_it_cost(fake):
    result = _run(lambda w: _wait_until(lambda: w.clock_samples >= 3, "3 samples"))
    cost = result["cost"]
    # Each tick: a 0 ms event-set wait, and a clock-reasons read while the loop runs.
    assert cost["ticks"] >= 3 and cost["nvml_calls"] >= cost["ticks"] + 3
    # The watcher's own thread ran every tick: its CPU time (a nanosecond clock) is
    # counted, not left at the 0.0 it starts from.
    assert cost["thread_cpu_s"] > 0.0
    assert cost["nvml_call_max_s"] > 0.0  # a thread-hop through the doorway at least
