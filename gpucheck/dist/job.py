"""Run a worker function on every rank, however the job was launched.

Three launch paths give the same result:
- `gpucheck CMD --n-gpus N`: gpucheck starts N local ranks through torch's
  elastic launcher (`launch_local`).
- `torchrun --nproc-per-node N -m gpucheck CMD`: every process is a rank already.
- `torchrun -m gpucheck CMD --n-gpus N`: torchrun's default single process then
  starts the N ranks itself, as in the first path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from gpucheck.dist.launch import launch_local
from gpucheck.dist.world import World, world_from_env
from gpucheck.errors import UsageError

S = TypeVar("S")


def launched_world() -> World | None:
    """The launcher's world when it has more than one rank; None when gpucheck launches."""
    world = world_from_env()
    return world if world is not None and world.world_size > 1 else None


def resolve_nproc(requested: int | None, default: int) -> int:
    """How many ranks to run; a launcher's world that disagrees is a usage error."""
    if requested is not None and requested < 1:
        raise UsageError(f"--n-gpus {requested}: give 1 or more ranks")
    world = launched_world()
    if world is None:
        return requested or default
    if requested is not None and requested != world.world_size:
        raise UsageError(
            f"--n-gpus {requested} disagrees with the launcher's WORLD_SIZE={world.world_size}; "
            "drop --n-gpus or launch one process (torchrun -m gpucheck ... --n-gpus N)"
        )
    return world.world_size


def run_job(worker: Callable[[S], Any], spec: S, nproc: int,
            master_port: int | None = None) -> Any:
    """Run `worker(spec)` on every rank; the reporting process gets rank 0's return value.

    Under a launcher with several ranks this process is one of them: it returns
    its own worker's value (None on ranks that do not report). Otherwise a single
    rank runs in this process, and several are started with the elastic launcher.
    """
    if launched_world() is not None or nproc == 1:
        return worker(spec)
    return launch_local(worker, (spec,), nproc, master_port)[0]
