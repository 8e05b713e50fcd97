"""Test-only per-iteration hook for `gpucheck stress`.

A test's `TestHooks.stress` (gpucheck.context) is called by every rank as
function(rank, phase, iteration, out) after each timed iteration of the GEMM
("gemm"), memory ("membw") and burn-in ("burn"; iteration 0 is the first result,
the one the later ones are compared with) loops. A test hook can sleep (a slow
GPU) or change `out` in place (a GPU computing wrong results). Only the test suite
sets it (tests/stress_workers.py, through tests/hooked.py); nothing in gpucheck does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from gpucheck.context import StressHook

Hook = Callable[[str, int, Any], None]  # (phase, iteration, output tensor)


def rank_hook(hook: StressHook | None, rank: int) -> Hook | None:
    """The test hook bound to this rank, or None (always, outside the tests)."""
    return functools.partial(hook, rank) if hook is not None else None
