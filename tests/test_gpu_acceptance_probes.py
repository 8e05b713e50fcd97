"""benchmarks/acceptance_probes.py and the acceptance steps that use it, without a GPU:
NVML's raw answers against the fake (which answers as NVML does: NotFound when no process
has a sample, NotSupported per field), the new collectives on a 1-rank gloo group, and the
steps' SKIP with why when NVML is absent."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fake_pynvml import FakeGpu, FakeNvml
from tests.test_gpu_acceptance import _args, ga

ap = sys.modules["acceptance_probes"]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(*gpus: FakeGpu, **kwargs: Any) -> Any:
        fake = FakeNvml(list(gpus), **kwargs)
        monkeypatch.setitem(sys.modules, "pynvml", fake.module)
        module, why = ap.open_nvml()
        assert why is None
        return module
    return install


def test_field_values_are_read_raw_and_each_field_says_if_it_answered(nvml: Any) -> None:
    module = nvml(FakeGpu(field_values={303: 2, 304: 0, 215: 0}))
    readings = ap.field_readings(module, module.nvmlDeviceGetHandleByIndex(0))
    assert set(readings) == {str(i) for i in ap.FIELD_IDS}
    assert readings["303"] == {"return": 0, "value": 2}
    assert readings["219"]["return"] != 0 and readings["219"]["value"] is None
    summary = ap.fields_summary(readings)
    assert (summary["read"], summary["nonzero"]) == (3, {"303": 2})
    assert summary["read"] + summary["not_read"] == len(ap.FIELD_IDS)


def test_a_refused_field_call_is_recorded_not_raised(nvml: Any) -> None:
    module = nvml(FakeGpu(unsupported={"nvmlDeviceGetFieldValues"}))
    readings = ap.field_readings(module, module.nvmlDeviceGetHandleByIndex(0))
    assert "error" in readings and ap.fields_summary(readings)["read"] == 0


def test_topology_classes_name_each_pair_and_one_gpu_has_none(nvml: Any) -> None:
    module = nvml(FakeGpu(), FakeGpu(bus_id="00:19", nvlinks=0), topology=50)
    topo = ap.topology_classes(module)
    assert [g["nvlinks_up"] for g in topo["gpus"]] == [ap.NVLINK_MAX, None]
    assert topo["pairs"] == [{"pair": [0, 1], "ancestor": 50, "ancestor_class":
                              ap.TOPOLOGY[50], "p2p_read": "not supported"}]
    assert topo["classes"] == {f"{ap.TOPOLOGY[50]} / p2p not supported": 1}
    single = ap.topology_classes(nvml(FakeGpu()))
    assert single["pairs"] == [] and single["note"]


def test_an_idle_process_is_listed_without_samples_and_the_busy_one_has_some(
        nvml: Any) -> None:
    module = nvml(FakeGpu(pids=[100, 200], proc_util={200: 97}))
    view = ap.process_view(module, module.nvmlDeviceGetHandleByIndex(0),
                           {"idle": 100, "busy": 200}, window_s=8)
    assert view["processes"]["idle"] == {"pid": 100, "listed": True, "sm_util_samples": []}
    assert view["processes"]["busy"]["sm_util_samples"] == [97]
    assert ap.process_verdict(view)[0] == "PASS"


def test_no_sample_at_all_is_nvmls_notfound_and_fails_the_busy_check(nvml: Any) -> None:
    module = nvml(FakeGpu(pids=[100, 200]))  # nobody has a sample: NVML raises NotFound
    view = ap.process_view(module, module.nvmlDeviceGetHandleByIndex(0),
                           {"idle": 100, "busy": 200}, window_s=8)
    assert view["samples_error"] and not view["processes"]["busy"]["sm_util_samples"]
    assert ap.process_verdict(view)[0] == "FAIL"


def test_power_under_load_is_the_highest_draw_against_the_enforced_limit(nvml: Any) -> None:
    module = nvml(FakeGpu(power_mw=640_000, power_limit_mw=700_000))
    sample = ap.power_sample(module, module.nvmlDeviceGetHandleByIndex(0))
    assert (sample["power_w"], sample["limit_w"], sample["default_limit_w"]) == (
        640.0, 700.0, 700.0) and sample["errors"] == {}
    refused = nvml(FakeGpu(unsupported={"nvmlDeviceGetPowerManagementDefaultLimit"}))
    sample_refused = ap.power_sample(refused, refused.nvmlDeviceGetHandleByIndex(0))
    assert set(sample_refused["errors"]) == {"default_limit"}  # named, not hidden
    figures = ap.power_figures([sample, {**sample, "power_w": 500.0},
                                {**sample, "default_limit_w": 700.0}])
    assert (figures["max_w"], figures["max_over_limit"]) == (640.0, round(640 / 700, 3))
    low = ap.power_figures([{"power_w": 300.0, "limit_w": 400.0, "default_limit_w": 700.0}])
    assert low["limit_below_default"] is True
    assert ap.power_figures([])["samples"] == 0


def test_without_nvml_the_nvml_step_says_skip_and_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml([], init_error="NVMLError_LibraryNotFound")
    monkeypatch.setitem(sys.modules, "pynvml", fake.module)
    session = ga.Session(ga.make_plan(_args("--out", str(tmp_path)), gpus=1), {"count": 1})
    monkeypatch.setattr(ga.Session, "run", lambda *a, **k: pytest.fail("nothing may run"))
    step: dict[str, Any] = {}
    ga.step_nvml(session, step)
    assert (step["status"], step["verdict"]) == ("skipped", "SKIP") and "NVML" in step["figure"]
    assert ga.nvml_topology()["status"] == "skipped"


@pytest.mark.parametrize("collective", ga.NEW_COLLECTIVES)
def test_the_new_collectives_run_and_count_bandwidth_like_nccl_tests(collective: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        row = ga._bare_size(collective, 4096, {"device": "cpu", "iters": 2, "warmup": 1})
    finally:
        dist.destroy_process_group()
    assert row["size_bytes"] == 4096 and row["busbw_gbps"] == pytest.approx(row["algbw_gbps"])
    factor = {"reduce_scatter": 3 / 4, "all_to_all": 3 / 4, "broadcast": 1.0}[collective]
    assert ga.bus_factor(collective, 4) == pytest.approx(factor)
    gathered = collective == "reduce_scatter"
    assert ga.bandwidths(collective, 1000, 4, 1e-6)[0] == pytest.approx(
        (4000 if gathered else 1000) / 1e-6 / 1e9)


def test_the_steps_run_most_informative_first_and_leave_no_step_out() -> None:
    assert ga.STEPS[:4] == ("env", "nvml", "flight", "collectives")
    assert set(ga.STEP_FUNCTIONS) == set(ga.STEPS)
    assert ga.DEFAULT_BUDGET_S <= 300


def test_a_step_timeout_never_reaches_past_the_budget_less_the_reserve(
        tmp_path: Path) -> None:
    plan = ga.make_plan(_args("--out", str(tmp_path), "--budget", "100"), gpus=1)
    session = ga.Session(plan, {"count": 1})
    session.started -= 80  # 20 s of the budget left
    assert session.timeout("gpucheck") == pytest.approx(20 - ga.RESERVE_S, abs=0.5)
    session.started -= 30
    assert session.timeout("gpucheck") == 1.0


def test_pack_leaves_summary_and_one_archive_and_nothing_more(tmp_path: Path) -> None:
    import tarfile

    plan = ga.make_plan(_args("--out", str(tmp_path / "out")), gpus=1)
    session = ga.Session(plan, {"count": 1})
    (plan.work / "env.json").write_text("{}")
    session.save()
    archive = ga.pack(plan)
    assert sorted(p.name for p in plan.out.iterdir()) == ["acceptance.tar.gz", "summary.json"]
    with tarfile.open(archive) as tar:
        assert {"acceptance/env.json", "acceptance/logs"} <= set(tar.getnames())


def test_sigterm_during_a_step_stops_the_run_instead_of_the_next_step_starting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = ga.make_plan(_args("--out", str(tmp_path), "--dry-run-cpu"), 0)
    session = ga.Session(plan, {"count": 0})

    def terminated(_s: Any, _step: dict[str, Any]) -> None:
        raise ga.Terminated()

    monkeypatch.setattr(ga, "STEP_FUNCTIONS", {name: lambda s, step: pytest.fail(
        "no step may start after SIGTERM") for name in ga.STEPS} | {"env": terminated})
    with pytest.raises(ga.Terminated):
        ga.run_steps(session)
    assert session.summary["steps"]["env"]["status"] == "interrupted"


def test_stress_figures_keep_stress_own_power_reach_when_the_report_has_it() -> None:
    gemm = {"name": "gemm", "data": {"results": [{"dtype": "bf16", "rank": 0,
                                                  "tflops_p50": 700.0}],
                                     "power under load (W)": [{"rank": 0, "reach": 0.93}]}}
    report = {"verdict": "OK", "sections": [gemm]}
    assert ga.stress_figures(report)["power_reach"] == [0.93]
    del gemm["data"]["power under load (W)"]  # a gpucheck before stress's power reach
    assert ga.stress_figures(report)["power_reach"] is None
