"""Test-only hooks for `gpucheck stress`, given as `Plant(stress=...)`
(tests/plant.py; `tests/hooked.py --stress stress_workers:<function>` in a subprocess).

Each is called on every rank as hook(rank, phase, iteration, out) after every timed
iteration of the "gemm", "membw" and "burn" loops (burn iteration 0 is the first
result, the one the later products are compared with). Nothing in gpucheck imports
this module; only tests pass its functions.
"""

from __future__ import annotations

import os
import time
from typing import Any

SLOW_RANK = 1
# Over twice a 64 MiB copy and far more than a 256^3 fp32 product or burn-in repetition
# on this shared 2-core VM under load (25-40 ms, a few ms), so that a slowed rank stays
# below half its peers in both measurements and in the burn-in, whatever the load.
SLEEP_S = 0.1
WRONG_RANK = 1
CHANGE_AFTER = 5


def _plant(out: Any) -> None:
    """A wrong element far beyond any tolerance (and every bit pattern changes)."""
    out.view(-1)[7] = out.view(-1)[7] * -2 + 1000


def wrong_rank_one_always(rank: int, phase: str, iteration: int, out: Any) -> None:
    """Rank 1's every burn-in product is wrong the same way: it agrees with itself,
    so only the other ranks and the CPU reference can tell."""
    if rank == WRONG_RANK and phase == "burn":
        _plant(out)


def changes_on_rank_one(rank: int, phase: str, iteration: int, out: Any) -> None:
    """Rank 1's products go wrong from burn-in repetition CHANGE_AFTER on."""
    if rank == WRONG_RANK and phase == "burn" and iteration >= CHANGE_AFTER:
        _plant(out)


def slow_rank_one_changes_on_rank_two(rank: int, phase: str, iteration: int,
                                      out: Any) -> None:
    """Three ranks: rank 1 sleeps in every iteration of every loop (a slow GPU), also
    when measured again ("gemm.again"); rank 2's burn-in products go wrong after
    CHANGE_AFTER repetitions."""
    if rank == SLOW_RANK:
        time.sleep(SLEEP_S)
    if rank == 2 and phase == "burn" and iteration >= CHANGE_AFTER:
        _plant(out)


def slow_wrong_rank_one_changes_on_rank_two(rank: int, phase: str, iteration: int,
                                            out: Any) -> None:
    """Three ranks: rank 1 sleeps in every iteration and its every burn-in product is
    wrong the same way (it agrees with itself: the other ranks and the CPU reference
    name it); rank 2's burn-in products go wrong after CHANGE_AFTER repetitions."""
    slow_rank_one_changes_on_rank_two(rank, phase, iteration, out)
    wrong_rank_one_always(rank, phase, iteration, out)


def wrong_rank_one_always_slow_once(rank: int, phase: str, iteration: int,
                                    out: Any) -> None:
    """As `wrong_rank_one_always`, and rank 1 sleeps in every GEMM and memory iteration
    of the first measurement only, not when measured again ("gemm.again"): unstable."""
    wrong_rank_one_always(rank, phase, iteration, out)
    if rank == SLOW_RANK and phase in ("gemm", "membw"):
        time.sleep(SLEEP_S)


def crash_rank_one_in_burn(rank: int, phase: str, iteration: int, out: Any) -> None:
    """Rank 1 dies (no clean-up, as a crash) when the burn-in starts, after the GEMM
    and memory phases have been measured and published."""
    if rank == 1 and phase == "burn":
        os._exit(3)


def wrong_tile_band_two(rank: int, phase: str, iteration: int, out: Any) -> None:
    """Every burn-in product wrong the same way in rows 256-383 (a faulty tile band):
    in each row the element closest to 1 in size has its sign flipped. Deterministic,
    so the rank agrees with itself; only the CPU reference can tell."""
    import torch

    if phase != "burn":
        return
    band = out[256:384]
    cols = (band.abs() - 1).abs().argmin(dim=1)
    rows = torch.arange(band.shape[0], device=band.device)
    band[rows, cols] = -band[rows, cols]
