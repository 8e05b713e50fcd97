"""compare and fleet read reports only: they run where importing torch fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "tests" / "data" / "reports"


def run_without_torch(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m gpucheck ...` with a `torch` first on the path that raises on import."""
    (tmp_path / "torch").mkdir(exist_ok=True)
    (tmp_path / "torch" / "__init__.py").write_text(
        "raise ImportError('torch must not be imported by compare or fleet')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           "NO_COLOR": "1"}
    return subprocess.run([sys.executable, "-m", "gpucheck", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_compare_runs_with_a_torch_that_cannot_be_imported(tmp_path: Path) -> None:
    proc = run_without_torch(tmp_path, "compare", str(REPORTS / "bench.json"),
                             str(REPORTS / "bench_slow.json"))
    assert proc.returncode == 1, proc.stderr
    assert "compare.regression" in proc.stdout and "torch must not" not in proc.stderr


def test_fleet_runs_with_a_torch_that_cannot_be_imported(tmp_path: Path) -> None:
    out = tmp_path / "fleet.md"
    proc = run_without_torch(tmp_path, "fleet", str(REPORTS), "--save-baseline",
                             str(tmp_path / "baseline.json"), "-o", str(out), "-q")
    assert proc.returncode == 1, proc.stderr  # the folder holds FAIL nodes
    assert out.read_text().startswith("# gpucheck fleet: **FAIL**")
    assert (tmp_path / "baseline.json").exists()


def test_the_check_itself_would_catch_an_import_of_torch(tmp_path: Path) -> None:
    proc = run_without_torch(tmp_path, "env", "--no-gpu-test")
    assert "torch must not be imported" in proc.stdout + proc.stderr
