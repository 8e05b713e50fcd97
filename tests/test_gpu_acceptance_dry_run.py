"""The whole acceptance script on CPU (--dry-run-cpu), once: a test of its structure, not
of any figure (gloo on a shared CPU is noise). It runs every step it can without a GPU,
leaves summary.json and one acceptance.tar.gz, and ends on the one-screen table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.test_gpu_acceptance import ROOT, SCRIPT, ga

ALLOWED = {"OK", "PASS", "FIGURE", "SKIP"}  # a dry run judges nothing, breaks nothing


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, dict[str, Any]]:
    out = tmp_path_factory.mktemp("acceptance") / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--dry-run-cpu"],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    summary = json.loads((out / "summary.json").read_text())
    return out, proc, summary


def test_the_dry_run_leaves_a_summary_and_one_archive_and_nothing_more(
        dry_run: tuple[Path, Any, dict[str, Any]]) -> None:
    out, proc, summary = dry_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["acceptance.tar.gz", "summary.json"]
    with tarfile.open(out / "acceptance.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"acceptance/logs", "acceptance/env.json"} <= names
    assert summary["complete"] is True and summary["mode"] == "dry-run-cpu"


def test_every_step_has_a_verdict_and_the_planted_timeout_is_read_back(
        dry_run: tuple[Path, Any, dict[str, Any]]) -> None:
    _, _, summary = dry_run
    steps = summary["steps"]
    assert list(steps) == ["facts", *ga.STEPS]
    verdicts = {name: ga.step_row(name, step)[0] for name, step in steps.items()}
    assert set(verdicts.values()) <= ALLOWED, verdicts
    assert verdicts["nvml"] == "SKIP" and steps["nvml"]["figure"]  # no NVML here: why
    if verdicts["flight"] != "SKIP":  # the budget may cut it on a crowded machine
        assert verdicts["flight"] == "PASS" and steps["flight"]["hang"]["ranks_dumped"] == [0, 1]
    libraries = summary["gpu"]["libraries"]
    assert {"nccl_build", "nccl_loaded", "nccl_path", "cublas_loaded"} <= set(libraries)
    assert summary["gpu"]["topology"]["status"] == "skipped"


def test_the_one_screen_table_is_the_last_output(
        dry_run: tuple[Path, Any, dict[str, Any]]) -> None:
    _, proc, summary = dry_run
    lines = proc.stdout.rstrip().splitlines()
    header = max(i for i, line in enumerate(lines) if line.startswith("step "))
    table = lines[header:]
    assert [line.split()[0] for line in table[1:len(summary["steps"]) + 1]] == list(
        summary["steps"])
    assert len(table) <= 25 and "acceptance.tar.gz" in table[-1]
