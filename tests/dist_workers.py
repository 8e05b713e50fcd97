"""Module-level worker functions for launch tests (spawned ranks import them by name)."""

from __future__ import annotations

import os

from gpucheck.context import RunContext
from gpucheck.distributed.session import process_group


def gather_ranks(ctx: RunContext, tag: str) -> list[dict[str, object]] | None:
    """Every rank reports who it is; rank 0 returns the gathered list."""
    import torch.distributed as dist

    with process_group("gloo", "cpu", timeout_s=30, ctx=ctx) as world:
        records: list[object] = [None] * world.world_size
        dist.all_gather_object(records, {"rank": world.rank, "tag": tag, "pid": os.getpid()})
        return records if world.rank == 0 else None  # type: ignore[return-value]


def fail_on_rank_one(message: str) -> None:
    """Started by launch_local itself (no run_job): the rank's context is made here,
    from the variables the elastic agent set."""
    ctx = RunContext(launcher_env=dict(os.environ))
    with process_group("gloo", "cpu", timeout_s=30, ctx=ctx) as world:
        if world.rank == 1:
            raise RuntimeError(message)
