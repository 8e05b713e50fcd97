"""`gpucheck all`: every command in turn, one report, failures contained."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpucheck.cli import main
from gpucheck.commands import all as all_cmd
from gpucheck.render import render
from gpucheck.report import Report, Section, ok

# Short settings so a test run takes seconds per command (2 CPU ranks): the smallest
# model (the bench's own runs test resnet50, the default), one GEMM dtype at a small size,
# the smallest sizes a comm sweep and its pairs measure, once each.
FAST = {"bench": ("--model", "mobilenet_v3_small", "--iters", "1", "--warmup", "0",
                  "--batch-size", "1"),
        "stress": ("--dtypes", "fp32", "--size", "128"),
        "comm": ("--max-bytes", "4K", "--iters", "1", "--warmup", "0")}
SHORT = ["--duration", "0.5", "--timeout", "60", "-q"]


def _run_all(tmp_path: Path, *extra: str, name: str = "all.json") -> tuple[int, dict[str, Any]]:
    out = tmp_path / name
    code = main(["all", *SHORT, *extra, "-o", str(out)])
    return code, json.loads(out.read_text())


def _rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    summary = report["sections"][0]
    assert summary["name"] == "summary"
    return {row["command"]: row for row in summary["data"]["commands"]}


@pytest.fixture
def fast_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    for command, settings in FAST.items():
        monkeypatch.setitem(all_cmd.CPU_SETTINGS, command, settings)


@pytest.mark.usefixtures("fast_commands")
def test_all_runs_every_command_into_one_report_with_a_summary_row_each(
        tmp_path: Path) -> None:
    # One rank each, in this process: every command's group joined and left in turn
    # (two ranks per command: test_all_torchrun.py).
    code, report = _run_all(tmp_path, "--n-gpus", "1")
    assert report["command"] == "all"
    names = [s["name"] for s in report["sections"]]
    assert len(names) == len(set(names)), "section names must stay unique"
    for command in all_cmd.ORDER:
        assert any(n.startswith(f"{command}.") for n in names), (command, names)
    rows = _rows(report)
    assert list(rows) == list(all_cmd.ORDER)
    assert {r["outcome"] for r in rows.values()} == {"ran"}
    assert all(r["verdict"] in ("OK", "WARN", "SKIP") for r in rows.values()), rows
    assert code == 0
    markdown = render(Report.from_dict(report), "markdown")
    assert markdown.startswith(f"# gpucheck all: **{report['verdict']}**")
    assert "<b>bench: " in markdown and "<b>Commands</b>" in markdown


@pytest.mark.usefixtures("fast_commands")
def test_a_failing_command_is_a_fail_finding_and_the_next_one_still_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucheck.commands import env

    def broken(args: argparse.Namespace, ctx: object) -> Report:
        raise RuntimeError("probe exploded\nsecond line")

    monkeypatch.setattr(env, "run", broken)
    code, report = _run_all(tmp_path, "--skip", "stress,bench", "--n-gpus", "1")
    rows = _rows(report)
    assert rows["env"]["outcome"] == "failed"
    assert "RuntimeError: probe exploded" in rows["env"]["why"]
    assert [rows[c]["outcome"] for c in ("stress", "bench")] == ["skipped", "skipped"]
    assert rows["comm"]["outcome"] == "ran"
    assert any(s["name"].startswith("comm.") for s in report["sections"])
    failed = [f for f in report["sections"][0]["findings"] if f["status"] == "FAIL"]
    assert [(f["check"], f["action"]) for f in failed] == [("all.env.failed", "rerun")]
    assert code == 1
    markdown = render(Report.from_dict(report), "markdown")
    problems = markdown.index("## Problems")
    assert markdown.index("all.env.failed") > problems
    assert problems < markdown.index("<details>")


def test_skip_leaves_the_command_out_with_a_skip_finding(tmp_path: Path) -> None:
    code, report = _run_all(tmp_path, "--skip", "stress, bench,comm")
    rows = _rows(report)
    assert [r["outcome"] for r in rows.values()] == ["ran", "skipped", "skipped", "skipped"]
    skipped = [f["check"] for f in report["sections"][0]["findings"]]
    assert skipped == ["all.stress.skipped", "all.bench.skipped", "all.comm.skipped"]
    assert all(s["name"].startswith(("summary", "env.")) for s in report["sections"])
    assert code == 0


@pytest.mark.parametrize("options, words", [
    (["--skip", "gpu"], "unknown command(s) gpu"),
    (["--skip", "env,stress,bench,comm"], "leaves nothing to run"),
    (["--duration", "-1"], "--duration -1"),
    (["--timeout", "0"], "--timeout 0"),
    (["--n-gpus", "0"], "--n-gpus 0"),
])
def test_bad_options_are_a_usage_error_and_nothing_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str],
        words: str) -> None:
    out = tmp_path / "all.json"
    assert main(["all", *options, "-q", "-o", str(out)]) == 2
    assert words in capsys.readouterr().err
    assert not out.exists()


def test_an_interrupt_writes_what_finished_and_names_what_never_ran(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpucheck.commands import stress

    def stopped(args: argparse.Namespace, ctx: object) -> Report:
        raise KeyboardInterrupt

    monkeypatch.setattr(stress, "run", stopped)
    monkeypatch.setattr(stress, "partial_report", lambda args, ctx: Report(
        command="stress", sections=[Section("gemm", "GEMM", {"tflops": 1.0},
        [ok("gpu.numa", "y")])]))
    out = tmp_path / "all.json"
    assert main(["all", *SHORT, "-o", str(out)]) == 130
    report = json.loads(out.read_text())
    rows = _rows(report)
    assert [rows[c]["outcome"] for c in all_cmd.ORDER] == [
        "ran", "interrupted", "not run", "not run"]
    names = [s["name"] for s in report["sections"]]
    assert "stress.gemm" in names and names[-1] == "interrupted"
    assert report["verdict"] == "FAIL"


def test_local_ignores_the_launcher_variables(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An srun step of 2 tasks, one per node: without --local this would be a 2-rank job.
    for name, value in (("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2"), ("SLURM_NODEID", "0")):
        monkeypatch.setenv(name, value)
    code, report = _run_all(tmp_path, "--local", "--skip", "stress,bench,comm")
    assert _rows(report)["env"]["outcome"] == "ran"
    assert code == 0
    # The commands were given an environment without them; the process keeps its own.
    assert os.environ["SLURM_PROCID"] == "0"
    env = next(s for s in report["sections"] if s["name"] == "env.environment")
    assert "SLURM_PROCID" not in env["data"]["variables"]
    assert env["data"]["variables"]["SLURM_NTASKS"] == "2"


def test_each_command_checks_in_on_its_own_part_of_the_job_store() -> None:
    import torch.distributed as dist

    from gpucheck.context import RunContext
    from gpucheck.distributed.checkin import _key
    from gpucheck.distributed.session import scoped_store

    ctx = RunContext()
    store = dist.HashStore()
    bench = scoped_store(store, ctx.scoped("bench").scope)
    comm = scoped_store(store, ctx.scoped("comm").scope)
    bench.set(_key("checkin", 0), "bench's rank 0")
    assert not comm.check([_key("checkin", 0)]) and not store.check([_key("checkin", 0)])
    assert scoped_store(store, ()) is store
    # A command's context shares the run (the partial report's state), not the scope.
    assert ctx.scoped("bench").all_run is ctx.all_run and ctx.scope == ()
    assert ctx.scoped("bench").scoped("x").scope == ("bench", "x")


def test_sub_commands_get_their_own_defaults_plus_the_cpu_settings() -> None:
    args = argparse.Namespace(quiet=True, n_gpus=2, device=None, backend=None,
                              master_port=None, timeout=30.0, fault_watch=False,
                              duration=3.0)
    argv = all_cmd._sub_argv("stress", args, "cpu")
    ns = all_cmd._parse(argv)
    assert (ns.duration, ns.n_gpus, ns.timeout, ns.fault_watch) == (3.0, 2, 30.0, False)
    assert ns.size is None  # stress's own default
    assert all_cmd._sub_argv("env", args, "cpu") == ["env", "--quiet"]
