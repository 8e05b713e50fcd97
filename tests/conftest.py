"""Every test reads a kernel log and a sysfs the tests provide, never the machine's.

`gpucheck env`, `health` and `all` read a saved log instead of this boot's when
GPUCHECK_KERNEL_LOG names one (gpucheck.probes.kernel_log.checked_kernel_log_path).
Setting it here, before any test, reaches every test, in-process and in the rank and
CLI processes they start (they inherit the environment), so a host whose kernel log
holds an Xid line cannot fail a test. A test that plants an Xid passes its own log
(`--kernel-log FILE`, which wins, or a runner); one that tests the live sources
unsets the variable. GPUCHECK_SYSFS points at an empty folder the same way: the GPUs a
node should have (NVIDIA functions on the PCI bus) and its InfiniBand ports are the
tests' own (tests/health_fakes.py builds a fake sysfs), not this machine's; the other
sources of that count (the job's GRES, the container's GPUs, the recipes' setting) are
taken out of the environment, so a GPU machine's runner cannot change a verdict.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from gpucheck.devices import EXPECT_VAR, NODE_GPUS_VARS, SYSFS_VAR
from gpucheck.probes.kernel_log import KERNEL_LOG_VAR

CLEAN_LOG = Path(__file__).resolve().parent / "data" / "kernel_logs" / "suite_clean.log"


def pytest_configure(config: pytest.Config) -> None:
    os.environ[KERNEL_LOG_VAR] = str(CLEAN_LOG)
    os.environ[SYSFS_VAR] = tempfile.mkdtemp(prefix="gpucheck-empty-sysfs-")
    for name in (EXPECT_VAR, *NODE_GPUS_VARS, "NVIDIA_VISIBLE_DEVICES"):
        os.environ.pop(name, None)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(os.environ.pop(SYSFS_VAR, ""), ignore_errors=True)
