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


def gather_without_rank_one(ctx: RunContext, objects_timeout_s: float) -> None:
    """Rank 1 stops before an object collective; rank 0 gathers through the session's
    object group (here a gloo group with a short timeout beside the default group's
    10 s, which also sets the roll call's window)."""
    import datetime
    import time

    import torch.distributed as dist

    from gpucheck.distributed import deadline, progress

    with process_group("gloo", "cpu", timeout_s=10, ctx=ctx) as world:
        ctx.session.objects = dist.new_group(
            backend="gloo", timeout=datetime.timedelta(seconds=objects_timeout_s))
        if world.rank == 1:
            time.sleep(600)  # silent: the survivor ends it after the roll call
        progress.set_step(ctx, "all_gather of the test's objects")
        deadline.gather_objects({"rank": world.rank}, ctx)
