"""benchmarks/gpu_acceptance.py without a GPU: its arithmetic, report reading, goals,
summary table and command-line errors. Fast: one subprocess at most (the no-GPU exit)."""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpucheck.comm.aggregate import bus_factor as gpucheck_bus_factor
from gpucheck.comm.collectives import sweep_sizes as gpucheck_sweep_sizes

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_acceptance.py"


def _load() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_acceptance", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_acceptance"] = module
    spec.loader.exec_module(module)
    return module


ga = _load()
KIB, GIB = 1024, 1 << 30


def comm_report(rows: dict[str, dict[int, float]], world_size: int = 1) -> dict[str, Any]:
    """A comm report shaped like `gpucheck comm --format json` writes it."""
    sections: list[dict[str, Any]] = [{"name": "comm", "title": "setup", "findings": [],
                                       "data": {"world_size": world_size, "ranks": [
                                           {"rank": 0, "device": "cuda:0"}]}}]
    for collective, busbw in rows.items():
        results = [{"size_bytes": size, "count": size // 4, "time_us": 1.0,
                    "algbw_gbps": value, "busbw_gbps": value, "wrong": 0}
                   for size, value in busbw.items()]
        sections.append({"name": collective, "title": collective, "data": {
            "sizes_done": f"{len(results)} of {len(results)}", "results": results},
            "findings": [{"check": f"comm.{collective}.correct", "status": "OK",
                          "message": "right", "hint": None, "subject": None}]})
    return {"schema_version": 1, "command": "comm", "verdict": "OK", "sections": sections}


BENCH_REPORT: dict[str, Any] = {
    "schema_version": 1, "command": "bench", "verdict": "WARN",
    "sections": [
        {"name": "bench", "data": {"model": "resnet50", "dtype": "bf16", "channels_last": True,
                                   "device": "cuda", "backend": "nccl", "ranks": 2,
                                   "threads_per_rank": 8, "batch_size": 128,
                                   "warmup_iters": 20, "timed_iters": 100}, "findings": []},
        {"name": "timing", "data": {"ranks": [{"rank": 0, "images_per_s": 3000.0},
                                              {"rank": 1, "images_per_s": 2000.0}]},
         "findings": [{"check": "bench.rank.straggler", "status": "WARN",
                       "message": "rank 1 slow", "hint": "look", "subject": "rank 1"}]},
    ]}


# ---------------------------------------------------------------- numbers


def test_human_size_names_binary_units() -> None:
    assert ga.human_size(KIB) == "1 KiB"
    assert ga.human_size(64 * KIB) == "64 KiB"
    assert ga.human_size(GIB) == "1 GiB"
    assert ga.human_size(16 << 20) == "16 MiB"
    assert ga.human_size(1000) == "1000 B"


def test_median_and_ratio_skip_what_was_not_measured() -> None:
    assert ga.median_of([3.0, None, 1.0, 2.0]) == 2.0
    assert ga.median_of([None, float("nan")]) is None
    assert ga.safe_ratio(1.0, 2.0) == 0.5
    assert ga.safe_ratio(None, 2.0) is None
    assert ga.safe_ratio(1.0, 0.0) is None


def test_sweep_covers_both_goal_sizes_like_gpucheck() -> None:
    sizes = ga.sweep_sizes(KIB, GIB)
    assert sizes == gpucheck_sweep_sizes(KIB, GIB)
    assert 64 * KIB in sizes and GIB in sizes and len(sizes) == 21


@pytest.mark.parametrize("collective", ["all_reduce", "all_gather"])
@pytest.mark.parametrize("world", [2, 8])
def test_bus_factor_matches_gpucheck(collective: str, world: int) -> None:
    # Same formula on both sides, so the busbw ratio is the time ratio.
    assert ga.bus_factor(collective, world) == pytest.approx(
        gpucheck_bus_factor(collective, world))


def test_one_rank_is_compared_by_algbw_where_gpucheck_prints_no_busbw() -> None:
    assert gpucheck_bus_factor("all_reduce", 1) is None
    assert ga.bus_factor("all_reduce", 1) == 1.0  # the bare loop's busbw is its algbw
    report = comm_report({"all_reduce": {GIB: 2.0}})
    report["sections"][1]["data"]["results"][0]["busbw_gbps"] = None
    assert ga.comm_busbw(report, "all_reduce") == {GIB: 2.0}


def test_bandwidths_count_all_gather_output_and_one_rank_is_algbw() -> None:
    algbw, busbw = ga.bandwidths("all_gather", 1_000_000, 4, 0.002)
    assert algbw == pytest.approx(2.0)
    assert busbw == pytest.approx(1.5)
    assert ga.bandwidths("all_reduce", GIB, 1, 0.5) == pytest.approx((GIB / 0.5e9,) * 2)
    assert ga.bandwidths("all_reduce", GIB, 2, 0.0) == (0.0, 0.0)


def test_goal_result_passes_at_the_bar_and_leaves_unmeasured_open() -> None:
    assert ga.goal_result("g", 0.95, 0.95)["pass"] is True
    assert ga.goal_result("g", 0.9499, 0.95)["pass"] is False
    assert ga.goal_result("g", None, 0.95) == {"name": "g", "value": None, "goal": 0.95,
                                                "pass": None, "figure_only": False}
    assert ga.goal_result("g", 0.5, 0.95, figure_only=True)["pass"] is None


# ---------------------------------------------------------------- reading reports


def test_comm_busbw_reads_rows_by_size() -> None:
    report = comm_report({"all_reduce": {KIB: 1.0, GIB: 400.0}}, world_size=2)
    assert ga.comm_busbw(report, "all_reduce") == {KIB: 1.0, GIB: 400.0}
    assert ga.comm_world_size(report) == 2


def test_comm_busbw_finds_renamed_rows_and_names_what_is_missing() -> None:
    report = comm_report({"all_reduce": {KIB: 1.0}})
    data = report["sections"][1]["data"]
    data["rows"] = data.pop("results")
    assert ga.comm_busbw(report, "all_reduce") == {KIB: 1.0}
    with pytest.raises(ga.ReportError, match=r"no section 'all_gather'.*comm, all_reduce"):
        ga.comm_busbw(report, "all_gather")
    del data["rows"][0]["busbw_gbps"]
    with pytest.raises(ga.ReportError, match="no busbw field"):
        ga.comm_busbw(report, "all_reduce")
    with pytest.raises(ga.ReportError, match="no 'sections' list"):
        ga.comm_busbw({"command": "comm"}, "all_reduce")


def test_bench_setup_and_rates_and_flagged_findings() -> None:
    setup = ga.bench_setup(BENCH_REPORT)
    assert (setup["dtype"], setup["batch_size"], setup["timed_iters"]) == ("bf16", 128, 100)
    assert setup["ranks"] == 2 and setup["threads"] == 8
    assert ga.bench_rank_rates(BENCH_REPORT) == [3000.0, 2000.0]
    assert ga.flagged_findings(BENCH_REPORT) == [
        {"section": "timing", "check": "bench.rank.straggler", "status": "WARN",
         "subject": "rank 1", "message": "rank 1 slow"}]
    figures = ga.bench_figures(BENCH_REPORT)
    assert figures["per_gpu_images_per_s"] == 2500.0


def test_bench_setup_names_a_missing_field() -> None:
    report = copy.deepcopy(BENCH_REPORT)
    del report["sections"][0]["data"]["dtype"]
    with pytest.raises(ga.ReportError, match="no field 'dtype'"):
        ga.bench_setup(report)


def test_shared_figures_show_where_each_rank_ran() -> None:
    report = comm_report({"all_reduce": {KIB: 0.1, 16 << 20: 5.0}})
    figures = ga.shared_figures(report)
    assert figures["rank_devices"] == ["cuda:0"]
    assert figures["all_reduce_busbw_gbps_at_largest"] == {"size": "16 MiB", "busbw_gbps": 5.0}


# ---------------------------------------------------------------- aggregation and goals


def test_pair_rows_and_medians_per_size() -> None:
    runs = [ga.pair_rows({KIB: 1.0, GIB: 90.0}, {KIB: 2.0, GIB: 100.0}),
            ga.pair_rows({KIB: 1.0, GIB: 99.0}, {KIB: 1.0, GIB: 100.0}),
            ga.pair_rows({GIB: 96.0}, {KIB: 1.0, GIB: 100.0})]
    assert runs[2][0] == {"size_bytes": KIB, "gpucheck_busbw_gbps": None,
                          "bare_busbw_gbps": 1.0, "ratio": None}
    medians = {r["size_bytes"]: r for r in ga.median_rows(runs)}
    assert medians[GIB]["ratio"] == pytest.approx(0.96)
    assert medians[GIB]["pairs"] == 3 and medians[GIB]["size"] == "1 GiB"
    assert medians[KIB]["ratio"] == pytest.approx(0.75)  # median of 0.5 and 1.0
    assert medians[KIB]["pairs"] == 2


def test_bench_medians_report_both_ratios() -> None:
    pairs = [{"gpucheck_per_gpu_images_per_s": 100.0, "bare_images_per_s": 100.0, "ratio": 1.0},
             {"gpucheck_per_gpu_images_per_s": 90.0, "bare_images_per_s": 100.0, "ratio": 0.9},
             {"gpucheck_per_gpu_images_per_s": None, "bare_images_per_s": 50.0, "ratio": None}]
    medians = ga.bench_medians(pairs)
    assert medians["median_pair_ratio"] == pytest.approx(0.95)
    assert medians["ratio_of_medians"] == pytest.approx(95 / 100)
    assert medians["pairs"] == 2


def test_all_goals_from_steps() -> None:
    medians = {"all_reduce": ga.median_rows([ga.pair_rows({64 * KIB: 0.89, GIB: 96.0},
                                                          {64 * KIB: 1.0, GIB: 100.0})]),
               "all_gather": []}
    steps = {"comm": {"world_size": 1, "medians": medians},
             "bench": {"setup": {"ranks": 8}, "medians": {"median_pair_ratio": 0.97}}}
    goals = ga.all_goals(steps, ga.COMM_GOALS, "nccl", False)
    by_name = {g["name"]: g for g in goals}
    assert by_name["bench images/s per GPU / bare eager loop (nccl, 8 ranks)"]["pass"] is True
    # one rank: the comm ratios are figures (host overhead per call), never a FAIL
    small = by_name["comm all_reduce busbw / bare loop at 64 KiB (nccl, 1 rank)"]
    assert (small["value"], small["goal"], small["pass"], small["figure_only"]) == (
        0.89, 0.90, None, True)
    assert ga.goal_verdict([g for g in goals if g["name"].startswith("comm")]) == "FIGURE"
    steps["comm"]["world_size"] = 8
    by_name = {g["name"]: g for g in ga.all_goals(steps, ga.COMM_GOALS, "nccl", False)}
    assert by_name["comm all_reduce busbw / bare loop at 1 GiB (nccl, 8 ranks)"]["pass"] is True
    small = by_name["comm all_reduce busbw / bare loop at 64 KiB (nccl, 8 ranks)"]
    assert (small["value"], small["goal"], small["pass"]) == (0.89, 0.90, False)
    assert by_name["comm all_gather busbw / bare loop at 1 GiB (nccl, 8 ranks)"]["pass"] is None
    assert len(ga.all_goals({}, ga.COMM_GOALS, "nccl", False)) == 5
    assert all(g["pass"] is None for g in ga.all_goals(steps, ga.COMM_GOALS, "gloo", True))


def test_exit_and_step_statuses() -> None:
    assert ga.exit_status(0, False) == "ok"
    assert ga.exit_status(1, False) == "fail"
    assert ga.exit_status(2, False) == "refused"
    assert ga.exit_status(None, True) == "timeout"
    assert ga.exit_status(-9, False) == "error"
    assert ga.worst_status(["ok", "refused", "fail"]) == "refused"
    assert ga.worst_status([]) == "ok"


def test_interleave_alternates_which_side_goes_first() -> None:
    order: list[str] = []
    for index in range(3):
        ga.interleave(index, lambda: order.append("gpucheck"), lambda: order.append("bare"))
    assert order == ["gpucheck", "bare", "bare", "gpucheck", "gpucheck", "bare"]


def test_first_visible_gpu() -> None:
    assert ga.first_visible_gpu(None) == "0"
    assert ga.first_visible_gpu(" ") == "0"
    assert ga.first_visible_gpu("3,5") == "3"
    assert ga.first_visible_gpu("GPU-8c1e,GPU-aa") == "GPU-8c1e"


# ---------------------------------------------------------------- summary and options


def test_the_closing_table_gives_each_step_its_verdict_figure_and_goal_on_one_screen() -> None:
    bench = [ga.goal_result("bench images/s per GPU / bare eager loop (nccl, 1 rank)", 0.97,
                            0.95)]
    comm = [ga.goal_result("comm all_reduce busbw / bare loop at 1 GiB (nccl, 1 rank)", 0.7,
                           0.95, figure_only=True)]
    summary = {"steps": {"env": {"status": "ok", "wall_s": 8.25, "note": "verdict OK"},
                         "nvml": {"status": "skipped", "verdict": "SKIP", "figure": "no NVML",
                                  "goal": "needs NVML"},
                         "comm": {"status": "ok", "goals": comm},
                         "bench": {"status": "ok", "goals": bench},
                         "stress": {"status": "timeout", "note": "cut"},
                         "shared": {"status": "refused", "note": "comm refused"}},
               "errors": ["shared: refused"], "mode": "gpu", "elapsed_s": 280.0,
               "options": {"budget_s": 300.0}, "out": "/x"}
    lines = ga.format_table(summary).splitlines()
    rows = {line.split()[0]: line.split()[1] for line in lines[1:7]}
    assert rows == {"env": "OK", "nvml": "SKIP", "comm": "FIGURE", "bench": "PASS",
                    "stress": "TIMEOUT", "shared": "REFUSED"}
    assert "figure only" in lines[3] and "0.970" in lines[4] and ">=0.95" in lines[4]
    assert len(lines) <= 25 and all(len(line) <= ga.TABLE_WIDTH for line in lines)
    assert ga.ARCHIVE + ".tar.gz" in lines[-1]


def test_parse_skip_and_out_dir_problems(tmp_path: Path) -> None:
    assert ga.parse_skip("env, shared") == {"env", "shared"}
    assert ga.parse_skip(None) == frozenset()
    with pytest.raises(ValueError, match="--skip facts: unknown step"):
        ga.parse_skip("facts")
    a_file = tmp_path / "f.json"
    a_file.write_text("{}")
    assert "is a file" in (ga.out_dir_problem(a_file) or "")
    assert ga.out_dir_problem(tmp_path / "new" / "deeper") is None
    assert ga.out_dir_problem(tmp_path) is None


def _args(*argv: str) -> argparse.Namespace:
    return ga.build_parser().parse_args(list(argv))


def test_make_plan_gpu_defaults_quick_and_dry_run(tmp_path: Path) -> None:
    plan = ga.make_plan(_args("--out", str(tmp_path)), gpus=1)
    assert (plan.runs, plan.device, plan.backend, plan.comm_ranks) == (1, "cuda", "nccl", 1)
    assert plan.budget_s == 300 and plan.work == tmp_path / ga.ARCHIVE
    assert plan.comm_max == GIB and plan.bench_args == ()
    assert ga.make_plan(_args("--out", str(tmp_path), "--quick"), gpus=8).runs == 1
    assert ga.make_plan(_args("--out", str(tmp_path), "--quick", "--runs", "2"), 8).runs == 2
    dry = ga.make_plan(_args("--out", str(tmp_path), "--dry-run-cpu"), gpus=0)
    assert (dry.device, dry.backend, dry.comm_ranks) == ("cpu", "gloo", 1)
    assert {size for size, _ in dry.comm_goals} <= set(ga.sweep_sizes(KIB, dry.comm_max))
    assert ga.plan_notes(dry) and "dry run" in ga.plan_notes(dry)[0]
    assert "one GPU" in ga.plan_notes(plan)[0]


def test_write_json_atomic_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "summary.json"
    ga.write_json_atomic(target, {"a": 1})
    ga.write_json_atomic(target, {"a": 2})
    assert json.loads(target.read_text()) == {"a": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]


@pytest.mark.parametrize("argv, words", [
    (["--runs", "0", "--out", "x"], "positive"),
    (["--quick"], "--out"),
    (["--out", "x", "--budget", "abc"], "not a number"),
])
def test_bad_options_are_one_line_exit_2(argv: list[str], words: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        ga.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err


def test_out_pointing_at_a_file_is_exit_2(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "report.json"
    a_file.write_text("{}")
    with pytest.raises(SystemExit) as exc:
        ga.main(["--out", str(a_file)])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().endswith("is a file, not a folder")


def test_no_gpu_is_exit_2_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(ga, "collect_facts", lambda _timeout: {
        "torch": "2.x", "cuda": "12.8", "count": 0,
        "nvidia_smi": {"ok": False, "error": "nvidia-smi is not on PATH"}})
    out = tmp_path / "results"
    with pytest.raises(SystemExit) as exc:
        ga.main(["--out", str(out)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "needs an NVIDIA GPU" in err and "use tests/ for GPU-less checks" in err
    assert not out.exists()


def _torch_sees_a_gpu() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.device_count() > 0


@pytest.mark.skipif(_torch_sees_a_gpu(), reason="this machine has a GPU")
def test_script_exits_2_without_a_gpu(tmp_path: Path) -> None:
    """The real thing, as a user runs it: facts from torch in a child process."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("gpu_acceptance.py: error: this script needs an "
                                          "NVIDIA GPU")


def test_key_line_finds_why_a_run_failed() -> None:
    torchrun_log = ("*****\nSetting OMP_NUM_THREADS ...\n*****\n"
                    "gpucheck comm: error: --n-gpus 2 but only 1 GPU(s) are visible\n"
                    "Traceback (most recent call last):\n  File \"x\", line 1\n"
                    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
                    "=====\ngpucheck FAILED\n-----\n[0]:\n  exitcode  : 2\n=====\n")
    assert ga.key_line(torchrun_log) == ("gpucheck comm: error: --n-gpus 2 but only 1 GPU(s) "
                                         "are visible")
    crash = "Traceback (most recent call last):\n  x\ntorch.AcceleratorError: CUDA error: " \
            "invalid device ordinal\n"
    assert ga.key_line(crash) == "torch.AcceleratorError: CUDA error: invalid device ordinal"
    assert ga.key_line("starting\n=====\n") == "starting"
    assert ga.key_line("") is None


def test_run_steps_survives_a_broken_step_and_saves_after_each(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = ga.make_plan(_args("--out", str(tmp_path), "--dry-run-cpu", "--skip", "shared"), 0)
    session = ga.Session(plan, {"count": 0})
    seen: list[str] = []

    def broken(_s: Any, _step: dict[str, Any]) -> None:
        raise KeyError("sections")

    def fine(s: Any, step: dict[str, Any]) -> None:
        seen.append(json.loads((tmp_path / "summary.json").read_text())["steps"]["env"]
                    ["status"])
        step["status"] = "ok"

    monkeypatch.setattr(ga, "STEP_FUNCTIONS", {name: fine for name in ga.STEPS} | {
        "env": broken})
    ga.run_steps(session)
    steps = json.loads((tmp_path / "summary.json").read_text())["steps"]
    ran = len([n for n in ga.STEPS if n not in plan.skip and n not in plan.dry_skip])
    assert steps["env"]["status"] == "error" and seen == ["error"] * (ran - 1)
    assert all(steps[name]["status"] == "skipped" for name in plan.dry_skip)
    assert steps["shared"] == {"status": "skipped", "note": "--skip"}
    assert session.summary["errors"] == ["env: internal error KeyError: 'sections'"]
