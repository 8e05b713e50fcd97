"""benchmarks/gpu_acceptance.py without a GPU: how it judges a command's JSON report,
its plans, its bad input, and the whole script once on the CPU (--dry-run), a test of
its structure, not of any figure."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpucheck import subject
from gpucheck.render import render
from gpucheck.report import Report, Section, fail, ok, warn

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_acceptance.py"
_spec = importlib.util.spec_from_file_location("gpu_acceptance", SCRIPT)
assert _spec is not None and _spec.loader is not None
ga: Any = importlib.util.module_from_spec(_spec)
sys.modules["gpu_acceptance"] = ga  # dataclasses look their module up there
_spec.loader.exec_module(ga)


def _report(tmp_path: Path, command: str = "bench", *findings: Any) -> Path:
    report = Report(command, [Section("s", "S", findings=list(findings) or [
        ok("gpu.numa", "fine")])])
    path = tmp_path / f"{command}.json"
    path.write_text(render(report, "json"))  # as --format json writes it
    return path


def test_an_ok_report_with_exit_0_is_ok_with_its_figures(tmp_path: Path) -> None:
    row = ga.judge("bench", 0, _report(tmp_path))
    assert row["status"] == "OK" and row["problems"] == [] and isinstance(row["figures"], list)


def test_warn_and_fail_findings_are_listed_as_possible_false_alarms(tmp_path: Path) -> None:
    path = _report(tmp_path, "env", warn("gpu.busy", "shared", "h", subject.gpu(1)),
                   fail("gpu.lost", "gone", "h"))
    row = ga.judge("env", 1, path)
    assert row["status"] == "FAIL"
    assert row["problems"] == ["WARN gpu.busy (GPU 1)", "FAIL gpu.lost"]


@pytest.mark.parametrize(("rc", "findings", "why"), [
    (0, [fail("gpu.lost", "gone", "h")], "exit 0 with verdict FAIL"),
    (1, [ok("gpu.numa", "fine")], "exit 1 with verdict OK"),
    (3, [ok("gpu.numa", "fine")], "exit 3"),
])
def test_an_exit_code_that_disagrees_with_the_verdict_is_broken(
        tmp_path: Path, rc: int, findings: list[Any], why: str) -> None:
    row = ga.judge("env", rc, _report(tmp_path, "env", *findings))
    assert row["status"] == "BROKE" and why in row["why"]


def test_a_missing_damaged_or_foreign_report_is_broken(tmp_path: Path) -> None:
    assert ga.judge("env", 0, tmp_path / "none.json")["status"] == "BROKE"
    damaged = _report(tmp_path, "env")
    raw = json.loads(damaged.read_text())
    raw["sections"][0]["findings"][0]["status"] = "MAYBE"
    damaged.write_text(json.dumps(raw))
    assert ga.judge("env", 0, damaged)["status"] == "BROKE"
    row = ga.judge("comm", 0, _report(tmp_path, "bench"))
    assert row["status"] == "BROKE" and "'bench'" in row["why"]
    assert ga.judge("env", None, damaged)["status"] == "TIMEOUT"


def test_the_dry_run_keeps_every_step_on_the_cpu_and_names_the_same_steps() -> None:
    dry, real = ga.plan(True, 0), ga.plan(False, 8, "3")
    assert [s.name for s in dry] == [s.name for s in real]
    for step in dry:
        assert step.skip or step.command in ("env", "health") or \
            ("--device" in step.args and step.args[step.args.index("--device") + 1] == "cpu")
    argv = next(s for s in real if s.name == "bench_torchrun").argv(Path("r.json"))
    assert argv[argv.index("--nproc-per-node") + 1] == "8"
    assert next(s for s in real if s.name == "shared_gloo").env == {"CUDA_VISIBLE_DEVICES": "3"}
    preflight = next(s for s in real if s.name == "preflight").argv(Path("p.json"))
    assert preflight[preflight.index("--output") + 1] == "p.json" and "--" in preflight


@pytest.mark.parametrize("bad", [["--budget", "0"], ["--only", "env,nosuch"], []])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, bad: list[str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        ga.parse(["--out", str(tmp_path), *bad] if bad else [])
    assert ended.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1]


def test_without_a_gpu_the_real_run_exits_2_and_names_the_dry_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ga, "visible_gpus", lambda: [])
    assert ga.main(["--out", str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()


def test_a_step_past_its_timeout_is_cut_and_says_so(tmp_path: Path) -> None:
    sleeper = [sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"]
    assert ga.run(sleeper, tmp_path / "slow.log", 1.0, {}) is None
    assert "started" in (tmp_path / "slow.log").read_text()
    assert ga.run([sys.executable, "-c", "raise SystemExit(3)"], tmp_path / "x.log", 30, {}) == 3


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, dict[str, Any]]:
    out = tmp_path_factory.mktemp("acceptance") / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--dry-run",
                           "--budget", "500"], capture_output=True, text=True, timeout=600,
                          env=env, cwd=ROOT)
    return out, proc, json.loads((out / "summary.json").read_text())


def test_the_dry_run_judges_every_step_and_keeps_each_report(
        dry_run: tuple[Path, Any, dict[str, Any]]) -> None:
    out, proc, summary = dry_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert summary["complete"] is True and summary["mode"] == "dry-run"
    commands = {s.name: s.command for s in ga.plan(True, 0)}
    assert list(summary["steps"]) == list(commands)
    for name, row in summary["steps"].items():
        assert row["status"] in ("OK", "SKIP"), (name, row)
        if row["status"] != "SKIP":
            report = json.loads((out / f"{name}.json").read_text())
            assert report["command"] == commands[name] and row["rc"] == 0
            assert (out / f"{name}.log").is_file()
    assert summary["steps"]["bench_torchrun"]["why"].startswith("needs a GPU")


def test_the_one_screen_table_is_the_last_output(
        dry_run: tuple[Path, Any, dict[str, Any]]) -> None:
    _, proc, summary = dry_run
    lines = proc.stdout.rstrip().splitlines()
    header = max(i for i, line in enumerate(lines) if line.startswith("step "))
    table = lines[header:]
    assert [line.split()[0] for line in table[1:-1]] == list(summary["steps"])
    assert len(table) <= 25 and "summary.json" in table[-1]
