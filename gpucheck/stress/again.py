"""Stress's second look, inside the worker (`gpucheck.confirm.remeasure`): every rank
measures a phase again at once, as in the first pass (a GPU slow only under a shared
power or cooling budget must be loaded the same way), when rank 0 found a rank below a
bound (`gpucheck.stress.verdicts.suspect_ranks`, the report's own bounds)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpucheck.confirm import remeasure
from gpucheck.context import RunContext
from gpucheck.stress.gemm import Figure
from gpucheck.stress.hooks import Hook
from gpucheck.stress.verdicts import suspect_ranks

AGAIN_SUFFIX = ".again"  # the test hook sees "gemm.again", "membw.again"


def again_hook(hook: Hook | None) -> Hook | None:
    """The test hook of the second measurement, its phase named with AGAIN_SUFFIX (a
    hook can slow the first measurement only: an unstable rank)."""
    if hook is None:
        return None
    return lambda phase, i, out: hook(phase + AGAIN_SUFFIX, i, out)


def measure_again(rank: int, records: Sequence[Mapping[str, Any]], key: str,
                  ranks: Sequence[Mapping[str, Any]], bounds: tuple[float, float],
                  figure_of: Callable[[str | None], Figure | None],
                  measure: Callable[[], Any], gather: Callable[[Any], list[Any]],
                  higher_is_better: bool = True, *, ctx: RunContext) -> list[Any] | None:
    """Every rank's second record (`gather(measure())`) when a rank's `key` is below a
    bound, (peer fraction, expected fraction), else None."""
    values = {int(r["rank"]): float(r[key]) for r in records}
    suspects, again = remeasure(
        rank, lambda: suspect_ranks(values, ranks, bounds[0], figure_of, bounds[1],
                                    higher_is_better), lambda _: gather(measure()), ctx)
    return None if again is None else [dict(r) | {"suspects": suspects} for r in again]
