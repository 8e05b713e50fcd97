"""The per-rank frame: join the process group with a timeout, leave it cleanly."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator
from contextlib import contextmanager

from gpucheck.dist.world import World, world_from_env

SINGLE = World(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
               master_addr="127.0.0.1", master_port=0, launcher="none")


@contextmanager
def process_group(backend: str, device: str, timeout_s: float) -> Iterator[World]:
    """Join the job's process group (or a private one-rank group) for the block.

    `timeout_s` bounds every collective, so a rank that stops answering ends
    the run with an error instead of NCCL's default 10-minute wait.
    """
    import torch
    import torch.distributed as dist

    world = world_from_env() or SINGLE
    if device == "cuda":
        torch.cuda.set_device(world.local_rank)
    timeout = _dt.timedelta(seconds=timeout_s)
    if world is SINGLE:
        # Started on its own with one rank: no launcher, no port, no rendezvous.
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout)
    else:
        dist.init_process_group(backend, timeout=timeout)
    try:
        yield world
    finally:
        dist.destroy_process_group()
