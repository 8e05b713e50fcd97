"""`env` and `health` judge a slowdown held through a second look, never one clock sample.

A GPU at work touches its thermal or power limit for a moment; the clock-event reasons
mask read once shows that moment as surely as a failed fan. The second look
(gpucheck/probes/gpus.py) watches a GPU whose sample showed a thermal or
power-brake slowdown: the driver's slowdown-time counters at both ends (fake: they
grow by `slowdown_share` of real time) and the mask sampled in between.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from gpucheck import cli
from gpucheck.probes import gpus as clock_window
from gpucheck.probes.gpus import probe_nvml
from gpucheck.probes.nvml import Nvml
from gpucheck.report import Status
from tests.fake_pynvml import FakeGpu, FakeNvml
from tests.health_fakes import healthy_ib_node, write_log

SW_THERMAL, HW_THERMAL, POWER_BRAKE, HW_SLOWDOWN, IDLE = 0x20, 0x40, 0x80, 0x8, 0x1
SW_THERM_NS, HW_THERM_NS, BRAKE_NS = 269, 270, 271  # NVML_FI_DEV_CLOCKS_EVENT_REASON_*
CHECK = "gpu.clocks.event_reasons"


@pytest.fixture(autouse=True)
def _short_window(monkeypatch):
    """A shorter look keeps the suite quick; MIN_SAMPLES still fit in it many times."""
    monkeypatch.setattr(clock_window, "WINDOW_S", 0.4)
    monkeypatch.setattr(clock_window, "TICK_S", 0.02)


def _gpus(**gpu1) -> list[FakeGpu]:
    return [FakeGpu(bus_id="00000000:18:00.0"), FakeGpu(bus_id="00000000:28:00.0", **gpu1)]


def _env(monkeypatch, fake: FakeNvml):
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    result = probe_nvml(Nvml(2.0))
    findings = [f for s in result.sections for f in s.findings if f.check == CHECK]
    return result, {f.subject.label.split(" (")[0]: f for f in findings}


@pytest.mark.parametrize("bit", [SW_THERMAL, HW_THERMAL, POWER_BRAKE])
def test_one_slowdown_bit_in_one_sample_is_not_drained(monkeypatch, bit):
    """The first read shows the bit; the look sees it neither in the samples nor in the
    driver's counters: a moment at the limit, OK."""
    fake = FakeNvml(_gpus(clock_reasons_seq=[bit], clock_reasons=0))
    result, found = _env(monkeypatch, fake)
    assert found["GPU 1"].status is Status.OK and found["GPU 1"].action is None
    assert found["GPU 0"].status is Status.OK
    look = result.gpus[1].clock_window
    assert look["held"] == [] and look["samples"] >= clock_window.MIN_SAMPLES
    assert result.sections[1].data["gpus"][1]["clock_held"] is None
    assert result.gpus[0].clock_window is None  # nothing seen, nothing looked at


@pytest.mark.parametrize("bits, share, reason", [
    (HW_THERMAL | HW_SLOWDOWN, {HW_THERM_NS: 1.0}, "hw_thermal_slowdown"),
    (SW_THERMAL, {SW_THERM_NS: 0.9}, "sw_thermal_slowdown"),
    (POWER_BRAKE, {BRAKE_NS: 1.0}, "hw_power_brake_slowdown")])
def test_a_slowdown_held_through_the_look_is_named_and_drains(monkeypatch, bits, share,
                                                               reason):
    fake = FakeNvml(_gpus(clock_reasons=bits, slowdown_share=share))
    result, found = _env(monkeypatch, fake)
    assert (found["GPU 1"].status, found["GPU 1"].action) == (Status.WARN, "drain-node")
    assert result.gpus[1].clock_window["held"] == [reason]
    assert result.sections[1].data["gpus"][1]["clock_held"] == reason
    assert found["GPU 0"].status is Status.OK


def test_a_power_brake_pulsing_between_samples_is_caught_by_the_drivers_counter(
        monkeypatch):
    """The bit in the first sample only, but the counter says 80 % of the window."""
    fake = FakeNvml(_gpus(clock_reasons_seq=[POWER_BRAKE], clock_reasons=0,
                          slowdown_share={BRAKE_NS: 0.8}))
    result, found = _env(monkeypatch, fake)
    assert found["GPU 1"].status is Status.WARN
    look = result.gpus[1].clock_window
    assert look["held"] == ["hw_power_brake_slowdown"]
    assert look["counter_share"]["hw_power_brake_slowdown"] >= 0.5


def test_a_slow_counter_read_never_makes_a_reason_look_held(monkeypatch):
    """The driver samples the counter inside its call: here at the start of a first
    call that then takes 0.2 s (a busy driver). Over the window after that call, the
    counter's growth read 0.45 as 0.67 (held: a drain); over its own reads' bracket it
    can only read low."""
    real, calls = clock_window.read_slowdown_ns, []

    def sampled_then_slow(nvml, handle):
        values = real(nvml, handle)
        calls.append(handle)
        if len(calls) == 1:
            time.sleep(0.2)
        return values

    monkeypatch.setattr(clock_window, "read_slowdown_ns", sampled_then_slow)
    fake = FakeNvml(_gpus(clock_reasons_seq=[SW_THERMAL], clock_reasons=0,
                          slowdown_share={SW_THERM_NS: 0.45}))
    result, found = _env(monkeypatch, fake)
    assert found["GPU 1"].status is Status.OK
    share = result.gpus[1].clock_window["counter_share"]["sw_thermal_slowdown"]
    assert share is not None and share <= 0.45


@pytest.mark.parametrize("steady, status", [(0, Status.OK), (SW_THERMAL, Status.WARN)])
def test_without_the_drivers_counters_the_samples_decide(monkeypatch, steady, status):
    fake = FakeNvml(_gpus(clock_reasons_seq=[SW_THERMAL], clock_reasons=steady,
                          field_values={}))
    result, found = _env(monkeypatch, fake)
    assert found["GPU 1"].status is status
    assert result.gpus[1].clock_window["counter_share"]["sw_thermal_slowdown"] is None


def test_health_during_a_job_does_not_drain_a_gpu_that_touched_its_limit_once(
        tmp_path: Path, monkeypatch, capsys):
    healthy_ib_node(tmp_path / "sys")
    write_log(tmp_path / "dmesg.txt", [])
    gpus = _gpus(clock_reasons_seq=[SW_THERMAL], clock_reasons=0, pids=[4242],
                 util=(100, 60))
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(gpus).module)
    code = cli.main(["health", "--sysfs", str(tmp_path / "sys"), "--kernel-log",
                     str(tmp_path / "dmesg.txt"), "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    clocks = [f for s in report["sections"] for f in s["findings"] if f["check"] == CHECK]
    assert [f["status"] for f in clocks] == ["OK", "OK"]
    assert code == 0
