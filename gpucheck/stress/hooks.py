"""Test-only per-iteration hook for `gpucheck stress`.

GPUCHECK_STRESS_TEST_HOOK=module:function makes every rank call
function(rank, phase, iteration, out) after each timed iteration of the GEMM
("gemm"), memory ("membw") and burn-in ("burn"; iteration 0 is the first result,
the one the later ones are compared with) loops. A test hook can sleep (a slow
GPU) or change `out` in place (a GPU computing wrong results). Only the test suite
sets the variable (tests/stress_workers.py); nothing in gpucheck does.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from typing import Any

TEST_HOOK_VAR = "GPUCHECK_STRESS_TEST_HOOK"

Hook = Callable[[str, int, Any], None]  # (phase, iteration, output tensor)


def load_hook(rank: int) -> Hook | None:
    target = os.environ.get(TEST_HOOK_VAR)
    if not target:
        return None
    module, _, function = target.partition(":")
    return functools.partial(getattr(importlib.import_module(module), function), rank)
