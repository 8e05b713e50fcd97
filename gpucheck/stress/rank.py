"""What every stress phase on a rank works with: the job's settings (`StressSpec`), the
rank's fixed facts (`RankContext`), and the three collectives the phases share (gather,
barrier, publish). Plain frame, no phase of its own (gpucheck.stress.worker runs them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpucheck.context import RunContext
from gpucheck.distributed import progress
from gpucheck.distributed.deadline import gather_objects
from gpucheck.distributed.world import World
from gpucheck.stress.hooks import Hook


@dataclass(frozen=True)
class StressSpec:
    """Everything a rank needs, settled before any rank starts (picklable)."""

    device: str  # "cuda" or "cpu"
    backend: str
    timeout_s: float
    dtypes: tuple[str, ...]  # GEMM dtypes; the first is the burn-in's
    size: int  # n of the n x n x n products
    duration_s: float  # the burn-in's length
    warmup_s: float  # before each timed window
    gemm_window_s: float  # timed GEMM per dtype
    membw_window_s: float
    pin_numa: bool = True
    fault_watch: bool = True  # watch every rank's GPU (gpucheck.distributed.faultwatch)
    # The report's bounds: a rank below one is measured again (gpucheck.stress.again).
    peer_fraction: float = 0.9
    expected_fraction: float = 0.8
    copy_fraction: float = 0.6


@dataclass(frozen=True)
class RankContext:
    """This rank's fixed facts for the phases."""

    spec: StressSpec
    world: World
    device: Any  # torch.device
    hook: Hook | None
    bus_id: str | None
    run: RunContext  # the rank's run context: its progress, session and bars


Phase = Callable[[RankContext, dict[str, Any]], None]


def gather(ctx: RankContext, mine: Any) -> list[Any]:
    return gather_objects(mine, ctx.run)


def barrier(ctx: RankContext) -> None:
    """Every rank starts the next phase together. On CUDA name this rank's GPU, and
    poll the barrier under gpucheck's deadline (`distributed.deadline.settle`)."""
    import torch.distributed as dist

    from gpucheck.distributed.deadline import settle

    if ctx.spec.device == "cuda":
        work = dist.barrier(async_op=True, device_ids=[ctx.world.cuda_index])
        settle([work] if work is not None else [], ctx.spec.timeout_s, "barrier")
    else:
        dist.barrier()


def publish(ctx: RankContext, result: dict[str, Any]) -> None:
    if ctx.world.is_reporter:
        progress.publish_partial(ctx.run, result)
