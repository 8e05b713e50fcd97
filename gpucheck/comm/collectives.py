"""Timing all_reduce and all_gather on one rank, and checking their results.

Every rank: warm up, synchronise the device, pass a barrier, start the clock (CUDA
events on GPU, perf_counter on CPU), run `iters` operations, synchronise, stop. The
buffers are float32; the timed buffers are zeros (so repeated sums stay finite), then
one more call on a rank-specific pattern counts the wrong elements.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ELEMENT_BYTES = 4  # float32
KIB = 1024
MIB = 1024 * KIB
DEFAULT_MIN_BYTES = KIB
CPU_MAX_BYTES = 16 * MIB
CUDA_MAX_BYTES = 1024 * MIB


@dataclass(frozen=True)
class RankTiming:
    """One rank's measurement of one size."""

    time_s: float  # mean time per operation
    wrong: int  # elements that differ from the expected result


def sweep_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of two from min_bytes to max_bytes (both included), whole float32 elements."""
    sizes, size = [], max(min_bytes, ELEMENT_BYTES)
    while size <= max_bytes:
        sizes.append(size - size % ELEMENT_BYTES)
        size *= 2
    if max_bytes >= min_bytes and (not sizes or sizes[-1] < max_bytes - max_bytes % 4):
        sizes.append(max_bytes - max_bytes % ELEMENT_BYTES)
    return sorted(set(s for s in sizes if s > 0))


def default_max_bytes(device: str, world_size: int, free_bytes: int) -> int:
    """Largest buffer: a power of two that leaves room for all_gather's n-fold output."""
    cap = CUDA_MAX_BYTES if device == "cuda" else CPU_MAX_BYTES
    room = free_bytes // (2 * (world_size + 2))
    size = DEFAULT_MIN_BYTES
    while size * 2 <= min(cap, room):
        size *= 2
    return size


def free_bytes(device: str) -> int:
    if device == "cuda":
        import torch

        return int(torch.cuda.mem_get_info()[0])
    import psutil

    return int(psutil.virtual_memory().available)


def pattern(rank: int, count: int, device: Any) -> Any:
    """Small exact float32 integers that differ by rank and by position."""
    import torch

    return (torch.arange(count, device=device) % 7 + 1).float() * (rank + 1)


def synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def time_op(op: Callable[[], Any], iters: int, warmup: int, device: str) -> float:
    """Mean seconds per op, started together with the other ranks after a barrier."""
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        op()
    synchronize(device)
    dist.barrier()
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            op()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000 / iters
    began = time.perf_counter()
    for _ in range(iters):
        op()
    return (time.perf_counter() - began) / iters


def measure(collective: str, size_bytes: int, iters: int, warmup: int,
            device: str) -> RankTiming:
    """Time one collective at one size on this rank and count wrong elements."""
    import torch.distributed as dist

    count = max(size_bytes // ELEMENT_BYTES, 1)
    where = "cuda" if device == "cuda" else "cpu"
    rank, world = dist.get_rank(), dist.get_world_size()
    import torch

    buf = torch.zeros(count, dtype=torch.float32, device=where)
    if collective == "all_reduce":
        time_s = time_op(lambda: dist.all_reduce(buf), iters, warmup, device)
        buf.copy_(pattern(rank, count, where))
        dist.all_reduce(buf)
        expected = pattern(0, count, where) * (world * (world + 1) // 2)
        wrong = int((buf != expected).sum())
    else:
        out = torch.zeros(count * world, dtype=torch.float32, device=where)
        time_s = time_op(lambda: dist.all_gather_into_tensor(out, buf), iters, warmup, device)
        buf.copy_(pattern(rank, count, where))
        dist.all_gather_into_tensor(out, buf)
        expected = torch.cat([pattern(r, count, where) for r in range(world)])
        wrong = int((out != expected).sum())
    synchronize(device)
    return RankTiming(time_s, wrong)
