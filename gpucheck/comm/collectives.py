"""Timing the five collectives on one rank and checking their results: on NCCL back to
back from a start aligned on the device, on gloo one op at a time (docs/comm.md, "How it
measures")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpucheck.comm.verdicts import ELEMENT_BYTES
from gpucheck.distributed.deadline import settle, synchronize
from gpucheck.distributed.session import barrier
from gpucheck.timing import Marks

KIB = 1024
MIB = 1024 * KIB
DEFAULT_MIN_BYTES = KIB
CPU_MAX_BYTES = 16 * MIB
CUDA_MAX_BYTES = 1024 * MIB
# The most NCCL ops queued before the host polls the oldest one: a launch into a full
# CUDA queue would block the host beyond gpucheck's deadline if a peer hangs. Each op takes a few
# queue entries (events, stream waits, the kernel), so 64 ops stay far below the queue's
# ~1024 entries. `--iters` up to this many run as one uninterrupted batch.
MAX_IN_FLIGHT = 64


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


class Work(Protocol):
    """What `time_batch` needs of a `torch.distributed.Work` handle."""

    def wait(self) -> Any: ...

    def is_completed(self) -> bool: ...

    def block_current_stream(self) -> None: ...


def started(work: Work | None) -> Work:
    """The handle of an `async_op=True` launch; None (torch's type allows it) is an error."""
    if work is None:
        raise RuntimeError("torch.distributed returned no Work handle for an async_op call")
    return work


class Clock(Protocol):
    """A batch's start and end marks (`gpucheck.timing.Marks`); `ended` never blocks."""

    def begin(self) -> None: ...

    def mark(self) -> None: ...

    def ended(self) -> bool: ...

    def span_s(self) -> float: ...


class NullClock:
    """For untimed batches (warm-up, the receiving side of a pair)."""

    def begin(self) -> None:
        pass

    def mark(self) -> None:
        pass

    def ended(self) -> bool:
        return True

    def span_s(self) -> float:
        return 0.0


def make_clock(device: str) -> Clock:
    """CUDA events on the current stream (polled by `time_batch`), else the host clock."""
    return Marks(device)


def back_to_back() -> bool:
    """Launch a batch without waiting per op: NCCL only."""
    import torch.distributed as dist

    return str(dist.get_backend()) == "nccl"


def time_batch(launches: Sequence[Callable[[], Work]], clock: Clock,
               back_to_back: bool, wait_s: float,
               align: Callable[[], Work] | None = None) -> float:
    """Seconds for every launch once, in order. Back to back: `align`'s untimed op, start
    mark, every launch, the stream waits on every op, end mark, then the host polls for at
    most `wait_s`. Otherwise each op is waited before the next."""
    if not back_to_back:
        clock.begin()
        for launch in launches:
            launch().wait()
        clock.mark()
        return clock.span_s()
    untimed: list[Work] = [align()] if align is not None else []
    for work in untimed:
        work.block_current_stream()
    clock.begin()
    works: list[Work] = []
    for launch in launches:
        if len(untimed) + len(works) >= MAX_IN_FLIGHT:
            oldest = (untimed + works)[len(untimed) + len(works) - MAX_IN_FLIGHT]
            settle([oldest], wait_s, "a queued collective")
        works.append(launch())
    for work in works:
        work.block_current_stream()
    clock.mark()
    settle(untimed + works, wait_s, "a timed batch of collectives", clock.ended)
    for work in untimed + works:
        work.wait()
    return clock.span_s()


def time_op(launch: Callable[[], Work], iters: int, warmup: int, device: str,
            wait_s: float) -> float:
    """Mean seconds per op, started together with the other ranks (a barrier, and on
    NCCL an untimed 1-element all_reduce on the stream)."""
    import torch
    import torch.distributed as dist

    in_a_row = back_to_back()
    time_batch([launch] * warmup, NullClock(), in_a_row, wait_s)
    synchronize(device)
    barrier(wait_s)
    flag = torch.zeros(1, dtype=torch.float32, device="cuda" if device == "cuda" else "cpu")
    align = (lambda: dist.all_reduce(flag, async_op=True)) if in_a_row else None
    return time_batch([launch] * iters, make_clock(device), in_a_row, wait_s,
                      align) / iters


def element_count(collective: str, size_bytes: int, world: int) -> int:
    """float32 elements of the per-rank buffer; all_to_all's rounded down to a multiple of
    the world size (as nccl-tests does)."""
    count = max(size_bytes // ELEMENT_BYTES, 1)
    if collective == "all_to_all":
        return max(count // world, 1) * world
    return count


def _torch_op(current: str, older: str) -> Callable[..., Any]:
    """torch.distributed's current name for an op (torch 2.14's), or its older one."""
    import torch.distributed as dist

    op: Callable[..., Any] = getattr(dist, current, None) or getattr(dist, older)
    return op


# The timed launch; the pattern it is checked on (written into its input); the wrong
# elements of its output after one more call on that pattern.
Case = tuple[Callable[[], Work], Callable[[], None], Callable[[], int]]


def _case(collective: str, count: int, rank: int, world: int, where: str) -> Case:
    """all_reduce and broadcast (from rank 0, nccl-tests' default root) in place; the others
    into an output: all_gather's n x, reduce_scatter's input n x (each rank gets back the
    sum of every rank's chunk of its own), all_to_all's chunk j of every rank to rank j.
    Rank r's pattern is (r + 1) x rank 0's, so a sum is rank 0's x n(n + 1)/2."""
    import torch
    import torch.distributed as dist

    buf = torch.zeros(count * world if collective == "reduce_scatter" else count,
                      dtype=torch.float32, device=where)
    out = buf if collective in ("all_reduce", "broadcast") else torch.zeros(
        count * world if collective == "all_gather" else count, dtype=torch.float32,
        device=where)
    summed, chunk = world * (world + 1) // 2, count // world
    launches: dict[str, Callable[[], Work]] = {
        "all_reduce": lambda: dist.all_reduce(buf, async_op=True),
        "all_gather": lambda: _torch_op("all_gather_single", "all_gather_into_tensor")(
            out, buf, async_op=True),
        "reduce_scatter": lambda: _torch_op("reduce_scatter_single", "reduce_scatter_tensor")(
            out, buf, async_op=True),
        "all_to_all": lambda: started(dist.all_to_all_single(out, buf, async_op=True)),
        "broadcast": lambda: started(dist.broadcast(buf, 0, async_op=True))}
    expected: dict[str, Callable[[], Any]] = {  # made only after the timing
        "all_reduce": lambda: pattern(0, count, where) * summed,
        "all_gather": lambda: torch.cat([pattern(r, count, where) for r in range(world)]),
        "reduce_scatter": lambda: (pattern(0, count * world, where) * summed)[
            rank * count:(rank + 1) * count],
        "all_to_all": lambda: torch.cat([pattern(r, count, where)[rank * chunk:(rank + 1) * chunk]
                                         for r in range(world)]),
        "broadcast": lambda: pattern(0, count, where)}

    def fill() -> None:
        buf.copy_(pattern(rank, buf.numel(), where))
    return launches[collective], fill, lambda: int((out != expected[collective]()).sum())


def measure(collective: str, size_bytes: int, iters: int, warmup: int,
            device: str, wait_s: float) -> RankTiming:
    """Time one collective at one size, then count the wrong elements of one more call
    on a rank-specific pattern."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    where = "cuda" if device == "cuda" else "cpu"
    launch, fill, wrong = _case(collective, element_count(collective, size_bytes, world),
                                rank, world, where)
    time_s = time_op(launch, iters, warmup, device, wait_s)
    fill()
    time_batch([launch], NullClock(), back_to_back(), wait_s)
    return RankTiming(time_s, wrong())
