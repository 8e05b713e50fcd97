"""The suite never reads this machine's kernel log (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpucheck.errors import UsageError
from gpucheck.probes.kernel_log import KERNEL_LOG_VAR, checked_kernel_log_path

ROOT = Path(__file__).resolve().parents[1]
CLEAN_LOG = ROOT / "tests" / "data" / "kernel_logs" / "suite_clean.log"
LINES = len(CLEAN_LOG.read_text().splitlines())


def test_every_test_is_given_the_clean_log_an_empty_sysfs_and_no_gpu_count() -> None:
    from gpucheck.devices import EXPECT_VAR, NODE_GPUS_VARS, SYSFS_VAR

    assert os.environ[KERNEL_LOG_VAR] == str(CLEAN_LOG)
    assert os.listdir(os.environ[SYSFS_VAR]) == []
    assert not {EXPECT_VAR, *NODE_GPUS_VARS, "NVIDIA_VISIBLE_DEVICES"} & set(os.environ)


def test_the_variable_names_the_log_the_option_wins_and_an_unreadable_one_is_refused(
        tmp_path: Path) -> None:
    given = tmp_path / "saved.log"
    given.write_text("[    1.0] NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n")
    environ = {KERNEL_LOG_VAR: str(CLEAN_LOG)}
    assert checked_kernel_log_path(None, environ) == str(CLEAN_LOG)
    assert checked_kernel_log_path(str(given), environ) == str(given)
    assert checked_kernel_log_path(None, {}) is None  # this boot's live log
    with pytest.raises(UsageError, match=f"^{KERNEL_LOG_VAR}=.*missing.log: cannot read it"):
        checked_kernel_log_path(None, {KERNEL_LOG_VAR: str(tmp_path / "missing.log")})


def test_a_command_started_by_a_test_reads_the_clean_log(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    done = subprocess.run([sys.executable, "-m", "gpucheck", "env", "-q", "-o", str(out)],
                          capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    (section,) = [s for s in json.loads(out.read_text())["sections"]
                  if s["name"] == "kernel_log"]
    assert (section["data"]["source"], section["data"]["lines_scanned"]) == (
        str(CLEAN_LOG), LINES)
