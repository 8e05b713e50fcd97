"""The report as a person meets it (issue 27): figures, `all`'s scope, library warnings,
the burn-in's seconds, wrapped tables, fault thresholds, Markdown without tables, collect_env."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

import pytest

from gpucheck.commands import all as all_command
from gpucheck.context import RunContext, RunOptions
from gpucheck.distributed import progress
from gpucheck.faults import faults_section
from gpucheck.probes import system as collect_env
from gpucheck.render import render
from gpucheck.render.headline import headline_rows
from gpucheck.render.text import render_text
from gpucheck.report import Report, Section, Status

REPORTS = Path(__file__).parent / "data" / "reports"
ROOT = Path(__file__).resolve().parents[1]


def saved(name: str) -> Report:
    return Report.from_dict(json.loads((REPORTS / f"{name}.json").read_text()))


def test_an_ok_report_shows_its_figures_before_the_problems_in_html() -> None:
    report = saved("stress")  # text and Markdown: tests/golden/stress.*
    assert report.verdict() is Status.OK
    text = render(report, "html")
    figures = text.index("Figures")
    assert figures < text.index("No ") < text.index("Stress: setup")
    assert "tflops_p50" in text[figures:text.index("No ")]


def test_json_carries_the_same_figures_and_still_reads_back() -> None:
    report = saved("comm")
    raw = json.loads(render(report, "json"))
    assert raw["figures"] == headline_rows(report)
    assert Report.from_dict(raw).sections[0].name == report.sections[0].name


def test_all_gathers_its_commands_figures_and_the_scope_of_its_narrowest_part() -> None:
    outcomes = [all_command.Outcome(n, "ran", report=saved(n)) for n in ("bench", "comm")]
    combined = all_command.combined_report(outcomes)
    expected = headline_rows(saved("bench")) + headline_rows(saved("comm"))
    assert sorted(r["figure"] for r in headline_rows(combined)) == \
        sorted(r["figure"] for r in expected)
    env = Report("env", scope="no NVIDIA GPU or driver found: software checks only")
    outcomes = [all_command.Outcome("env", "ran", report=env),
                all_command.Outcome("bench", "ran", report=Report("bench"))]
    assert all_command.combined_report(outcomes).scope == env.scope
    assert all_command.combined_report(outcomes[1:]).scope is None


def test_a_library_warning_on_a_rank_is_caught_and_reaches_the_launcher_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kept: list[dict[str, Any]] = []
    with progress.caught(0, kept, None):
        warnings.warn("torch.distributed.all_gather_into_tensor is deprecated", FutureWarning,
                      stacklevel=1)
    assert capsys.readouterr().err == ""
    rows = progress.log_rows(kept)
    assert [(r["category"], r["ranks"]) for r in rows] == [("FutureWarning", [0])]
    assert progress.log_rows(kept) == []  # taken once
    for rank in (0, 1):  # each rank's own list: the launcher reads the files
        with progress.caught(rank, [], tmp_path):
            warnings.warn("deprecated", FutureWarning, stacklevel=1)
    launcher: list[dict[str, Any]] = []
    progress.gather(tmp_path, launcher)
    rows = progress.log_rows(launcher)
    assert len(rows) == 1 and rows[0]["ranks"] == [0, 1]


def test_the_cli_puts_caught_warnings_in_the_reports_log_section() -> None:
    from gpucheck.cli import add_log

    ctx = RunContext()
    progress.remember(ctx.warnings, [{"category": "FutureWarning", "message": "m",
                                    "where": "x.py:1", "ranks": [1]}])
    report = Report("comm")
    add_log(report, ctx)
    log = report.section("log")
    assert log is not None and log.data["warnings"][0]["category"] == "FutureWarning"
    assert log.findings == []


def test_a_timed_bar_counts_seconds_while_its_block_runs_and_only_with_progress() -> None:
    ctx = RunContext(RunOptions(show_progress=True))
    moved = threading.Event()
    with progress.timed(ctx, "sdc burn-in", 3, tick_s=0.01) as bar:
        for _ in range(500):  # bounded: at most 5 s of waiting for the first tick
            if bar.tqdm.n >= 1:
                moved.set()
                break
            moved.wait(0.01)
        assert bar.tqdm.total == 3
    assert moved.is_set()
    with progress.timed(RunContext(RunOptions(show_progress=False)), "sdc burn-in", 30) as bar:
        assert bar.tqdm is None


def test_a_fault_watch_that_watched_nothing_shows_no_thresholds() -> None:
    section = faults_section([{"rank": 0, "status": "n/a", "reason": "no GPU"}])
    assert section.verdict() is Status.SKIP
    assert "thresholds" not in section.data


def test_a_watched_gpu_keeps_its_thresholds_and_every_row_lines_up() -> None:
    from tests.test_faults_findings import healthy

    section = faults_section([healthy()])
    assert "thresholds" in section.data
    text = render_text(Report("stress", [section]))
    start = text.index("thresholds:")
    keys = list(section.data["thresholds"])
    rows = [line for line in text[start:].splitlines()[1:] if line.split()[:1] and
            line.split()[0] in keys]
    assert len(rows) == len(keys)
    assert len({len(re.match(r"\s+\S+\s+", r)[0]) for r in rows}) == 1


LEAK_SCRIPT = """
import multiprocessing as mp, os, sys
def child():
    lock = mp.get_context("spawn").Lock()
    os._exit(130)
if __name__ == "__main__":
    from gpucheck.distributed.launch import quiet_resource_tracker
    quiet_resource_tracker()
    p = mp.get_context("spawn").Process(target=child)
    p.start(); p.join()
"""


def test_no_leaked_semaphore_line_when_a_rank_exits_at_once(tmp_path: Path) -> None:
    script = tmp_path / "leak.py"
    script.write_text(LEAK_SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, check=False, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert "leaked semaphore" not in proc.stderr


def _outside_fences(text: str) -> list[str]:
    lines, fence = [], None
    for line in text.splitlines():
        opener = re.match(r"^(`{3,})", line)
        if fence is None and opener:
            fence = opener[1]
        elif fence is not None and line == fence:
            fence = None
        elif fence is None:
            lines.append(line)
    assert fence is None, "an unclosed code fence"
    return lines


def test_a_backtick_fence_in_a_value_cannot_close_the_code_block() -> None:
    report = Report("env", [Section("s", "S", {"rows": [{"name": "```", "v": 1}]})])
    outside = _outside_fences(render(report, "markdown-plain"))
    assert not any("```" in line for line in outside)


def test_collect_env_output_is_kept_verbatim_and_shown_as_code() -> None:
    script = "print('PyTorch version: 9.9\\nIs CUDA available: False')"
    section = collect_env.collect_env_section(command=(sys.executable, "-c", script))
    assert section.findings == []
    assert section.data["collect_env_output"] == "PyTorch version: 9.9\nIs CUDA available: False\n"
    report = Report("env", [section])
    md = render(report, "markdown")
    assert "```\nPyTorch version: 9.9\nIs CUDA available: False\n```" in md
    assert "<pre>PyTorch version: 9.9\nIs CUDA available: False</pre>" in render(report, "html")
    assert "PyTorch version" not in render(report, "text")


@pytest.mark.parametrize(("command", "timeout"), [
    ((sys.executable, "-c", "import sys; sys.exit(3)"), 30.0),
    ((sys.executable, "-c", "import time; time.sleep(30)"), 0.5), (("/nonexistent/python",), 30.0)])
def test_a_failed_hung_or_missing_collect_env_is_a_skip(command: tuple[str, ...],
                                                      timeout: float) -> None:
    section = collect_env.collect_env_section(timeout, command)
    assert [f.check for f in section.findings] == ["env.collect_env"]
    assert section.verdict() is Status.SKIP


ALL = ["all", "--skip", "stress,bench,comm"]


@pytest.mark.parametrize(("argv", "wanted"), [
    (["env"], False), (["env", "-o", "e.json"], False), (["env", "--format", "markdown"], True),
    (["env", "-o", "e.json", "-o", "t.md"], True), (["env", "-o", "p.html"], True),
    (["env", "--format", "markdown-plain"], True), (ALL, False),
    ([*ALL, "-o", "node.json"], False), ([*ALL, "-o", "node.json", "-o", "ticket.md"], True)])
def test_collect_env_runs_only_for_markdown_and_html(argv: list[str], wanted: bool) -> None:
    from gpucheck.cli import build_parser
    from gpucheck.commands.env import wants_collect_env

    args = build_parser(argv).parse_args(argv)
    if argv[0] == "all":  # all asks env for it
        args = all_command._namespaces(args, ("env",), RunContext())[0]["env"]
    assert wants_collect_env(args) is wanted


def test_a_hostile_number_in_a_table_leaves_the_figures_and_the_report_renders() -> None:
    raw = json.loads((REPORTS / "comm.json").read_text())
    raw["sections"][1]["data"]["results"][0]["fastest_time_us"] = 10 ** 400
    report = Report.from_dict(raw)
    assert headline_rows(report) == headline_rows(saved("comm"))
    for fmt in ("text", "markdown", "markdown-plain", "html", "json"):
        assert render(report, fmt)
