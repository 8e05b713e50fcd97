"""How much the comm sweep's own machinery costs: gpucheck's reported all_reduce
bandwidth against a bare loop of the same collective, side by side in one job.

Each round runs gpucheck's measurement (`gpucheck.comm.worker.measure_size`) and a bare
loop, alternating which goes first, both reporting the slowest rank: on CPU (gloo on
loopback) a plain all_reduce loop, on CUDA the nccl-tests loop (back to back, one
synchronisation). The median of the rounds and the ratio gpucheck / bare per size.

    .venv/bin/python benchmarks/comm_overhead.py [--ranks 2] [--rounds 7] [--device cuda]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpucheck.comm.worker import CommSpec, measure_size
from gpucheck.distributed.launch import launch_local
from gpucheck.distributed.session import process_group

SIZES = (4 << 20, 16 << 20, 64 << 20)


def _bare_cuda(buf: Any, iters: int) -> float:
    """Seconds for `iters` all_reduces the nccl-tests way: launched back to back."""
    import torch
    import torch.distributed as dist

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    works = [dist.all_reduce(buf, async_op=True) for _ in range(iters)]
    for work in works:
        work.block_current_stream()  # the stream waits; the host does not
    end.record()
    torch.cuda.synchronize()
    return float(start.elapsed_time(end)) / 1000


def _bare(size: int, iters: int, warmup: int, device: str) -> float:
    """algbw in GB/s of a bare all_reduce loop, slowest rank."""
    import torch
    import torch.distributed as dist

    buf = torch.zeros(size // 4, device=device)
    for _ in range(warmup):
        dist.all_reduce(buf)
    if device == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    if device == "cuda":
        seconds = _bare_cuda(buf, iters)
    else:
        began = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        seconds = time.perf_counter() - began
    elapsed = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return size * iters / float(elapsed) / 1e9


def worker(rounds: int, iters: int, warmup: int,
           device: str = "cpu") -> dict[int, tuple[list[float], list[float]]]:
    backend = "nccl" if device == "cuda" else "gloo"
    spec = CommSpec(device=device, backend=backend, timeout_s=120, iters=iters, warmup=warmup)
    results: dict[int, tuple[list[float], list[float]]] = {s: ([], []) for s in SIZES}
    with process_group(backend, device, 120) as world:
        for k in range(rounds):
            for size in SIZES:
                ours = lambda: measure_size("all_reduce", size, spec, world)["algbw_gbps"]  # noqa: E731,B023
                bare = lambda: _bare(size, iters, warmup, device)  # noqa: E731,B023
                first, second = (ours, bare) if k % 2 == 0 else (bare, ours)
                a, b = first(), second()
                got, plain = (a, b) if k % 2 == 0 else (b, a)
                results[size][0].append(got)
                results[size][1].append(plain)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: gloo on loopback; cuda: NCCL, one rank per GPU")
    args = parser.parse_args()
    results = launch_local(worker, (args.rounds, args.iters, args.warmup, args.device),
                           args.ranks)[0]
    where = "NCCL ranks" if args.device == "cuda" else "gloo ranks on loopback"
    print(f"all_reduce, {args.ranks} {where}, {args.rounds} rounds x "
          f"{args.iters} iters, median algbw (GB/s)")
    print(f"{'size':>8}  {'gpucheck':>9}  {'bare loop':>9}  {'ratio':>6}")
    for size, (ours, bare) in results.items():
        mine, plain = statistics.median(ours), statistics.median(bare)
        print(f"{size >> 20:>5} MiB  {mine:>9.3f}  {plain:>9.3f}  {mine / plain:>6.3f}")


if __name__ == "__main__":
    main()
