"""How much the comm sweep's own machinery costs: gpucheck's reported all_reduce
bandwidth against a bare loop of the same collective, side by side in one job.

    /work/venv/bin/python benchmarks/comm_overhead.py [--ranks 2] [--rounds 7]

Loopback gloo on CPU, large messages. Each round runs gpucheck's measurement
(`gpucheck.comm.worker._gather_size`: warm-up, barrier, timed loop, all_gather of
every rank's time, slowest rank) and a bare loop (barrier, perf_counter, all_reduce
x iters, slowest rank by an all_reduce MAX), alternating which goes first. Prints the
median of the rounds and the ratio gpucheck / bare (1.00 = no overhead).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpucheck.comm.worker import CommSpec, _gather_size
from gpucheck.distributed.launch import launch_local
from gpucheck.distributed.session import process_group

SIZES = (4 << 20, 16 << 20, 64 << 20)


def _bare(size: int, iters: int, warmup: int) -> float:
    """algbw in GB/s of a plain all_reduce loop, slowest rank."""
    import torch
    import torch.distributed as dist

    buf = torch.zeros(size // 4)
    for _ in range(warmup):
        dist.all_reduce(buf)
    dist.barrier()
    began = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    elapsed = torch.tensor([time.perf_counter() - began], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return size * iters / float(elapsed) / 1e9


def worker(rounds: int, iters: int, warmup: int) -> dict[int, tuple[list[float], list[float]]]:
    spec = CommSpec(device="cpu", backend="gloo", timeout_s=120, iters=iters, warmup=warmup)
    results: dict[int, tuple[list[float], list[float]]] = {s: ([], []) for s in SIZES}
    with process_group("gloo", "cpu", 120) as world:
        for k in range(rounds):
            for size in SIZES:
                ours = lambda: _gather_size("all_reduce", size, spec, world)["algbw_gbps"]  # noqa: E731,B023
                bare = lambda: _bare(size, iters, warmup)  # noqa: E731,B023
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
    args = parser.parse_args()
    results = launch_local(worker, (args.rounds, args.iters, args.warmup), args.ranks)[0]
    print(f"all_reduce, {args.ranks} gloo ranks on loopback, {args.rounds} rounds x "
          f"{args.iters} iters, median algbw (GB/s)")
    print(f"{'size':>8}  {'gpucheck':>9}  {'bare loop':>9}  {'ratio':>6}")
    for size, (ours, bare) in results.items():
        mine, plain = statistics.median(ours), statistics.median(bare)
        print(f"{size >> 20:>5} MiB  {mine:>9.3f}  {plain:>9.3f}  {mine / plain:>6.3f}")


if __name__ == "__main__":
    main()
