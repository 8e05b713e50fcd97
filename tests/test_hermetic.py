"""The suite never reads this machine's kernel log (tests/conftest.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from gpucheck.probes.kernel_log import read_kernel_log

FAKE_BIN = Path(__file__).resolve().parent / "fake_bin"  # put first on PATH by conftest.py
LINES = len((FAKE_BIN / "kernel.log").read_text().splitlines())


def test_the_log_commands_on_path_are_the_tests_own() -> None:
    assert shutil.which("dmesg") == str(FAKE_BIN / "dmesg")
    assert shutil.which("journalctl") == str(FAKE_BIN / "journalctl")


def test_the_live_kernel_log_is_the_clean_one_the_tests_provide() -> None:
    log = read_kernel_log(None)
    assert (log.source, log.lines_scanned, log.events) == ("dmesg", LINES, ())


def test_a_command_started_by_a_test_reads_the_same_log(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    done = subprocess.run([sys.executable, "-m", "gpucheck", "env", "-q", "-o", str(out)],
                          capture_output=True, text=True, timeout=120, check=False,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode in (0, 1), done.stderr[-2000:]
    (section,) = [s for s in json.loads(out.read_text())["sections"]
                  if s["name"] == "kernel_log"]
    assert (section["data"]["source"], section["data"]["lines_scanned"]) == ("dmesg", LINES)
