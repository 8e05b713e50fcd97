"""Matrix-multiply throughput of one device, and the inputs every rank shares.

FLOPs per product are 2 n^3 (n^3 multiply-adds). The throughput inputs are random
(seeded) rather than zeros or uninitialised memory: a GPU multiplying zeros draws
less power and runs faster (about 894 against 788 TFLOP/s on an H200), which is not
what a real workload sees.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gpucheck.stress.hooks import Hook
from gpucheck.stress.records import GemmRecord as GemmRecord  # its home: records.py
from gpucheck.timing import summarise, timed_window

if TYPE_CHECKING:
    import torch

DTYPES = ("bf16", "fp16", "tf32", "fp32")
CPU_DTYPES = ("fp32", "bf16")
THROUGHPUT_SEED = 1234


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32,
            "fp32": torch.float32}[name]


@contextlib.contextmanager
def matmul_precision(dtype: str) -> Iterator[None]:
    """tf32 and fp32 are both float32 tensors: the matmul precision setting picks
    TF32 tensor cores ("high") or IEEE fp32 ("highest") for the block."""
    import torch

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def seeded_pair(n: int, seed: int, device: Any, dtype: str,
                on_cpu: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Two n x n standard-normal matrices. With `on_cpu` they are drawn on the CPU and
    then moved, so every rank (and the CPU reference) gets bit-identical inputs
    whatever its device; otherwise drawn on `device` (faster, same per model)."""
    import torch

    where = torch.device("cpu") if on_cpu else torch.device(device)
    generator = torch.Generator(device=where).manual_seed(seed)
    pair = [torch.randn(n, n, generator=generator, device=where, dtype=torch.float32)
            for _ in range(2)]
    return (pair[0].to(device=device, dtype=torch_dtype(dtype)),
            pair[1].to(device=device, dtype=torch_dtype(dtype)))


def measure_gemm(rank: int, dtype: str, n: int, device: Any, kind: str,
                 warmup_s: float, window_s: float, hook: Hook | None) -> GemmRecord:
    """Warm up, then time back-to-back products into a preallocated output."""
    import torch

    with torch.inference_mode(), matmul_precision(dtype):
        a, b = seeded_pair(n, THROUGHPUT_SEED, device, dtype)
        out = torch.empty_like(a)

        def step(i: int) -> None:
            torch.matmul(a, b, out=out)
            if hook is not None:
                hook("gemm", i, out)

        stats = summarise(timed_window(step, kind, warmup_s, window_s))
    flops = 2.0 * n**3
    return GemmRecord(rank=rank, dtype=dtype, size=n, iters=stats.iters,
                      tflops=flops * stats.iters / stats.total_s / 1e12,
                      tflops_p50=flops / stats.p50_s / 1e12,
                      p50_ms=stats.p50_s * 1e3, p99_ms=stats.p99_s * 1e3)
