"""Test-only hooks for `gpucheck preflight` (`tests/hooked.py --stress
preflight_workers:<function>`, Plant.stress): called on every rank after each timed
GEMM and burn-in iteration, as for stress. Nothing in gpucheck
imports this module."""

from __future__ import annotations

import os
import signal
from typing import Any


def stop_rank_zero(rank: int, phase: str, iteration: int, out: Any) -> None:
    """Rank 0 stops itself (SIGSTOP) at its first timed GEMM: the reporting rank hung."""
    if rank == 0 and phase == "gemm" and iteration == 0:
        os.kill(os.getpid(), signal.SIGSTOP)


def remove_report_folder(rank: int, phase: str, iteration: int, out: Any) -> None:
    """Rank 0 removes PREFLIGHT_TEST_FOLDER (where its -o goes) at its first timed GEMM:
    a report checked writable at the start that can no longer be written."""
    import shutil

    folder = os.environ.get("PREFLIGHT_TEST_FOLDER")
    if rank == 0 and phase == "gemm" and iteration == 0 and folder:
        shutil.rmtree(folder, ignore_errors=True)
