"""Every test reads a kernel log the tests provide, never the machine's own.

`gpucheck env`, `health` and `all` read a saved log instead of this boot's when
GPUCHECK_KERNEL_LOG names one (gpucheck.probes.kernel_log.checked_kernel_log_path).
Setting it here, before any test, reaches every test, in-process and in the rank and
CLI processes they start (they inherit the environment), so a host whose kernel log
holds an Xid line cannot fail a test. A test that plants an Xid passes its own log
(`--kernel-log FILE`, which wins, or a runner); one that tests the live sources
unsets the variable.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpucheck.probes.kernel_log import KERNEL_LOG_VAR

CLEAN_LOG = Path(__file__).resolve().parent / "data" / "kernel_logs" / "suite_clean.log"


def pytest_configure(config: pytest.Config) -> None:
    os.environ[KERNEL_LOG_VAR] = str(CLEAN_LOG)
