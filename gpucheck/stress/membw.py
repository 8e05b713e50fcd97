"""Device memory bandwidth: copy one large buffer into another, on the device.

Bandwidth counts the copied bytes once: buffer / time, as nvbandwidth prints for the
same copy (`device_local_copy`: cuMemcpyAsync between two buffers of one GPU,
bandwidth = copy size x loop count / time; nvbandwidth memcpy.cpp,
`MemcpyOperation::doMemcpyCore`), so a user can set the two side by side. The memory
itself moves twice that (each byte read, then written): a datasheet's "4.8 TB/s"
counts both, so the expected figures (`gpucheck.stress.specs`) allow half of it.
Before 2026-11 gpucheck counted read + write (2 x buffer / time): such reports say
so in `counted`, and compare/fleet halve them. The buffer is far larger than any
cache (2 GiB on a GPU), so this is memory, not L2.
"""

from __future__ import annotations

from typing import Any

from gpucheck.stress.hooks import Hook
from gpucheck.stress.records import CopyRecord as CopyRecord  # its home: records.py
from gpucheck.timing import summarise, timed_window

GPU_COPY_BYTES = 2 << 30
CPU_COPY_BYTES = 64 << 20


def copy_bytes(kind: str, free_bytes: int | None) -> int:
    """The buffer: 2 GiB on a GPU (at most a quarter of free memory: source and
    destination must fit beside the other phases' leftovers), 64 MiB on CPU."""
    if kind != "cuda":
        return CPU_COPY_BYTES
    if free_bytes is None:
        return GPU_COPY_BYTES
    return max(64 << 20, min(GPU_COPY_BYTES, (free_bytes // 4) >> 20 << 20))


def free_device_bytes(kind: str) -> int | None:
    if kind != "cuda":
        return None
    import torch

    return int(torch.cuda.mem_get_info()[0])


def measure_copy(rank: int, size: int, device: Any, kind: str, warmup_s: float,
                 window_s: float, hook: Hook | None) -> CopyRecord:
    import torch

    src = torch.ones(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)

    def step(i: int) -> None:
        dst.copy_(src)
        if hook is not None:
            hook("membw", i, dst)

    stats = summarise(timed_window(step, kind, warmup_s, window_s))
    moved = float(size)  # counted once, as nvbandwidth (see the module docstring)
    return CopyRecord(rank=rank, size_bytes=size, iters=stats.iters,
                      gbps=moved * stats.iters / stats.total_s / 1e9,
                      gbps_p50=moved / stats.p50_s / 1e9,
                      p50_ms=stats.p50_s * 1e3, p99_ms=stats.p99_s * 1e3)
