"""Every test reads a kernel log the tests provide, never the machine's own.

`gpucheck env`, `health`, `all` and `preflight` read this boot's kernel log through
`dmesg` and `journalctl` found on PATH; tests/fake_bin holds both, printing one clean
log (tests/fake_bin/kernel.log). Putting that folder first on PATH here reaches every
test, in-process and in the rank and CLI processes they start (they inherit it), so a
host whose log holds an Xid line cannot fail a test. A test that plants an Xid passes
its own log (`--kernel-log FILE` or a runner).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

FAKE_BIN = Path(__file__).resolve().parent / "fake_bin"


def pytest_configure(config: pytest.Config) -> None:
    os.environ["PATH"] = os.pathsep.join((str(FAKE_BIN), os.environ.get("PATH", "")))
