"""benchmarks/gpu_acceptance.py's GPU-only steps without a GPU: clock-mask summaries,
spread across GPUs, the parked / not parked comparison, the blocking-wait table, the
one-GPU SKIP, the clock sampler against the fake pynvml, and the p2p ranks for real
(gloo CPU stand-in, both modes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fake_pynvml import FakeGpu, FakeNvml
from tests.test_gpu_acceptance import _args, ga

ag = sys.modules["acceptance_gpu"]
KIB, GIB = 1024, 1 << 30


def _sample(t: float, mask: int, util: int, sm: int = 1980, gpu: int = 0) -> dict[str, Any]:
    return {"t": t, "gpu": gpu, "mask": mask, "sm_mhz": sm, "sm_max_mhz": 1980, "util": util}


def test_hw_slowdown_next_to_an_idle_busy_change_counts_as_a_transition() -> None:
    series = [_sample(0, 0x1, 0, 345), _sample(1, 0x1, 0, 345),
              _sample(2, 0x8, 100, 1200),  # first busy sample: P-state change
              _sample(3, 0x0, 100), _sample(4, 0x0, 100), _sample(5, 0x8, 100, 1500),
              _sample(6, 0x0, 100), _sample(7, 0x1, 0, 345)]
    summary = ag.clock_summary([*series, _sample(0, 0x0, 100, gpu=1)])
    gpu0 = summary["0"]
    assert gpu0["masks"] == {"0x0": 3, "0x1": 3, "0x8": 2}
    assert (gpu0["hw_slowdown_samples"], gpu0["hw_slowdown_at_transition"],
            gpu0["hw_slowdown_steady"], gpu0["hw_slowdown_longest_run"]) == (2, 1, 1, 1)
    assert gpu0["busy_sm_mhz"] == {"min": 1200, "median": 1980, "max": 1980}
    assert gpu0["hw_slowdown_sm_of_max"]["min"] == pytest.approx(1200 / 1980, abs=1e-3)
    assert summary["1"]["hw_slowdown_samples"] == 0


def test_without_utilisation_the_idle_bit_tells_busy_from_idle() -> None:
    series = [{**_sample(0, 0x1, 0), "util": None}, {**_sample(1, 0x8, 0), "util": None}]
    assert ag.clock_summary(series)["0"]["hw_slowdown_at_transition"] == 1


def _stress_report(tflops: dict[int, float], burn_ms: dict[int, float]) -> dict[str, Any]:
    gemm = [{"rank": r, "dtype": "bf16", "tflops_p50": v} for r, v in tflops.items()]
    sdc = [{"rank": r, "p50_ms": v} for r, v in burn_ms.items()]
    return {"command": "stress", "verdict": "OK", "sections": [
        {"name": "gemm", "data": {"results": gemm}, "findings": []},
        {"name": "membw", "data": {"counted": "once", "results": [
            {"rank": 0, "gbps_p50": 2150.0}]}, "findings": []},
        {"name": "sdc", "data": {"results": sdc}, "findings": []}]}


def test_spread_names_the_slowest_gpu_against_the_median() -> None:
    spread = ga.stress_figures(_stress_report({0: 780.0, 1: 790.0, 2: 700.0},
                                              {0: 1.40, 1: 1.38, 2: 1.60}))["spread"]
    bf16 = spread["gemm_tflops"]["bf16"]
    assert bf16["min"] == 700.0 and bf16["min_over_median"] == pytest.approx(700 / 780, 1e-3)
    assert spread["burn_in_p50_ms"]["max_over_min"] == pytest.approx(1.6 / 1.38, 1e-3)
    assert spread["membw_gbps_p50"] == {"0": 2150.0} and "note" not in spread
    one = ag.spread_figures(_stress_report({0: 780.0}, {0: 1.4}))
    assert one["note"].startswith("one rank")


def _p2p_run(mode: str, gbps: float, nvml_ms: float | None) -> dict[str, Any]:
    return {"mode": mode, "pairs": [{"src": 0, "dst": 1, "gbps": gbps},
                                    {"src": 1, "dst": 0, "gbps": gbps / 2},
                                    {"src": 0, "dst": 2, "gbps": None}],
            "nvml_max_call_ms": {"0": 1.0, "1": nvml_ms}}


def test_p2p_comparison_pairs_up_the_modes_and_keeps_the_longest_nvml_call() -> None:
    runs = [_p2p_run("parked", 400.0, 2.0), _p2p_run("not_parked", 320.0, 900.0),
            _p2p_run("parked", 380.0, None), _p2p_run("not_parked", 300.0, 5.0)]
    result = ag.p2p_comparison(runs)
    first = result["pairs"][0]
    assert (first["src"], first["dst"], first["parked_gbps"], first["not_parked_gbps"]) == (
        0, 1, 390.0, 310.0)
    assert result["median_parked_over_not"] == pytest.approx(390 / 310, 1e-3)
    assert result["nvml_max_call_ms"] == {"parked": 2.0, "not_parked": 900.0}
    assert ag.p2p_comparison([])["median_parked_over_not"] is None


def _medians(ours: float, bare: float) -> dict[str, Any]:
    rows = ga.median_rows([ga.pair_rows({GIB: ours}, {GIB: bare})])
    return {"medians": {"all_reduce": rows, "all_gather": []}}


def test_blocking_wait_table_puts_the_four_runs_side_by_side() -> None:
    steps = {"comm": _medians(ours=98.0, bare=100.0),  # both off: gpucheck's default
             "comm_wait": _medians(ours=95.0, bare=80.0)}  # both with blocking wait on
    row = ga.blocking_wait_table(steps)["all_reduce"][0]
    assert row["size"] == "1 GiB"
    assert row["gpucheck_on_over_bare_off"] == pytest.approx(0.95)
    assert row["gpucheck_off_over_bare_off"] == pytest.approx(0.98)
    assert row["bare_on_over_bare_off"] == pytest.approx(0.80)
    assert ga.blocking_wait_table({})["all_gather"] == []


def test_on_one_gpu_the_p2p_step_says_skip_and_why_without_running_anything(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    session = ga.Session(ga.make_plan(_args("--out", str(tmp_path)), gpus=1), {"count": 1})
    monkeypatch.setattr(ga.Session, "run", lambda *a, **k: pytest.fail("nothing may run"))
    step: dict[str, Any] = {}
    ga.step_p2p(session, step)
    assert step["status"] == "skipped"
    assert "2+ GPUs" in step["note"] and "share one GPU" in step["note"]
    assert any("p2p step is skipped" in n for n in ga.plan_notes(session.plan))


def test_the_clock_sampler_reads_every_gpu_through_nvml(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([FakeGpu(clock_reasons=0x8, util=(100, 0)), FakeGpu(bus_id="00:19")])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    monkeypatch.setattr(ag, "SAMPLE_S", 0.001)
    with ag.ClockSampler() as sampler:
        while len(sampler.samples) < 6 and sampler.error is None:
            sampler._stop.wait(0.01)
    summary = sampler.summary()
    assert summary["status"] == "ok" and set(summary["gpus"]) == {"0", "1"}
    assert summary["gpus"]["0"]["masks"] == {"0x8": summary["gpus"]["0"]["samples"]}
    assert summary["gpus"]["1"]["masks"].keys() == {"0x1"}
    assert summary["max_nvml_call_ms"] >= 0


def test_without_nvml_the_clock_sampler_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([], init_error="NVMLError_LibraryNotFound")
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    with ag.ClockSampler() as sampler:
        pass
    summary = sampler.summary()
    assert summary["status"] == "skipped" and "NVML not available" in summary["note"]


@pytest.mark.parametrize("mode", ag.P2P_MODES)
def test_the_p2p_ranks_run_both_modes_on_gloo_cpu_ranks(tmp_path: Path, mode: str) -> None:
    out = tmp_path / f"{mode}.json"
    ag.p2p_main({"mode": mode, "world_size": 2, "device": "cpu", "backend": "gloo",
                 "timeout_s": 60}, out)
    result = json.loads(out.read_text())
    assert result["mode"] == mode
    assert [(p["src"], p["dst"]) for p in result["pairs"]] == [(0, 1), (1, 0)]
    assert set(result["nvml_max_call_ms"]) == {"0", "1"}
