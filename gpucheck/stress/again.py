"""Confirm before condemning: measure a phase again when a rank fell below a bound.

Runs inside the worker, while the process group is alive. Rank 0 picks the suspects
from the gathered records (`gpucheck.stress.verdicts.suspect_ranks`, the same bounds
the report applies) and broadcasts them, so every rank agrees on whether a second
measurement happens; then every rank measures again at once, as in the first pass
(a GPU slow only under a shared power or cooling budget must be loaded the same way),
and the records are gathered. Every step is a collective bounded by the process
group's timeout: a rank that dies or hangs here ends the run with the usual roll
call, never a hang. The report judges the second figures (`verdicts.Again`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpucheck.stress.hooks import Hook
from gpucheck.stress.specs import Figure
from gpucheck.stress.verdicts import suspect_ranks

AGAIN_SUFFIX = ".again"  # the test hook sees "gemm.again", "membw.again"


def again_hook(hook: Hook | None) -> Hook | None:
    """The test hook for the second measurement: the phase name gets AGAIN_SUFFIX, so
    a hook can slow the first measurement only (an unstable rank)."""
    if hook is None:
        return None
    return lambda phase, i, out: hook(phase + AGAIN_SUFFIX, i, out)


def agreed(suspects: list[int]) -> list[int]:
    """Rank 0's suspects on every rank (torch.distributed.broadcast_object_list)."""
    import torch.distributed as dist

    box: list[Any] = [suspects]
    dist.broadcast_object_list(box, src=0)
    return list(box[0])


def measure_again(rank: int, records: Sequence[Mapping[str, Any]], key: str,
                  ranks: Sequence[Mapping[str, Any]], bounds: tuple[float, float],
                  figure_of: Callable[[str | None], Figure | None],
                  measure: Callable[[], Any],
                  gather: Callable[[Any], list[Any]],
                  higher_is_better: bool = True) -> list[Any] | None:
    """Every rank's second record when any rank is below a bound, else None.

    `records`: the first pass, gathered; `key`: the figure judged (`tflops_p50`);
    `bounds`: (peer fraction, expected fraction); `measure`: this rank's measurement
    (with `again_hook`); `gather`: the worker's all_gather; `higher_is_better`: False
    for a time (the burn-in's median product time, `stress.sdc.straggler`).
    """
    values = {int(r["rank"]): float(r[key]) for r in records}
    mine = suspect_ranks(values, ranks, bounds[0], figure_of, bounds[1],
                         higher_is_better) if rank == 0 else []
    suspects = agreed(mine)
    if not suspects:
        return None
    return [dict(r) | {"suspects": suspects} for r in gather(measure())]
