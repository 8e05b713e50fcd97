"""What the CPU ranks' re-placement and core rotation do to two healthy ranks' spread.

Two processes run bench's CPU loop side by side (ResNet50, batch 4, one thread each,
12 timed iterations in segments of 3 after a barrier each), in three modes interleaved:
"one placement" (tensors stay where allocated), "re-placed" (copied to fresh memory
between segments, as bench does) and "re-placed, fixed cores" (no core rotation). Per
run each rank's vs_others (`gpucheck.bench.pace.rank_paces`) and rank 0 / rank 1 per
segment; per mode the slower rank's vs_others and the median iteration (docs/bench.md).

    python benchmarks/cpu_placement.py --runs 8
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpucheck.bench.model import CoreRotation, plan_rotation, relayout, segment_sizes
from gpucheck.bench.pace import rank_paces
from gpucheck.bench.records import RankRecord
from gpucheck.numa import cpulist

RANKS = 2
ITERS = 12
WARMUP = 3
RUN_TIMEOUT_S = 300
MODES = {"one placement": (False, True), "re-placed": (True, True),
         "re-placed, fixed cores": (True, False)}  # mode -> (re-place, rotate)


def rank_loop(rank: int, mode: str, barrier: Any, results: Any) -> None:
    """One rank: warm up, then the segments, each after a barrier with the other."""
    import torch

    from gpucheck.bench import model as bench_model

    replace, rotate = MODES[mode]
    allowed = sorted(os.sched_getaffinity(0))
    torch.set_num_threads(max(1, len(allowed) // RANKS))
    model = bench_model.build_model(
        "resnet50", bench_model.resolve_weights("random", "resnet50", download=False))
    batch = torch.randn(4, 3, 224, 224)
    plan = plan_rotation(allowed, rank, RANKS, [cpulist(tuple(allowed))] * RANKS) if (
        rotate) else None
    took: list[float] = []
    ends: list[float] = []
    with torch.inference_mode():
        for _ in range(WARMUP):
            model(batch)
        with CoreRotation(plan):
            origin = None
            for index, size in enumerate(segment_sizes(ITERS, relayout=True)):
                if index and replace:
                    batch = relayout(model, batch)
                barrier.wait()
                origin = origin or time.perf_counter()
                for _ in range(size):
                    cpu = time.process_time()
                    model(batch)
                    took.append((time.process_time() - cpu) * 1e3)
                    ends.append((time.perf_counter() - origin) * 1e3)
    results.put((rank, took, ends))


def one_run(mode: str) -> tuple[list[float], list[float], list[float]]:
    """(each rank's vs_others, each rank's median iteration ms, rank 0 / rank 1 per
    segment)."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(RANKS), ctx.Queue()
    procs = [ctx.Process(target=rank_loop, args=(r, mode, barrier, results))
             for r in range(RANKS)]
    for proc in procs:
        proc.start()
    got = sorted(results.get(timeout=RUN_TIMEOUT_S) for _ in procs)
    for proc in procs:
        proc.join(timeout=RUN_TIMEOUT_S)
    records = [RankRecord(rank=rank, host="here", node_rank=0, local_rank=rank, device="cpu",
                          device_name="cpu", device_uuid=None, images=4 * ITERS, iters=ITERS,
                          wall_s=ends[-1] / 1e3, span_s=ends[-1] / 1e3,
                          device_s=ends[-1] / 1e3, peak_memory_bytes=None, threads=1,
                          iter_ms=tuple(took), iter_end_ms=tuple(ends))
               for rank, took, ends in got]
    segments, start = [], 0
    for size in segment_sizes(ITERS, relayout=True):
        medians = [statistics.median(r.iter_ms[start:start + size]) for r in records]
        segments.append(medians[0] / medians[1])
        start += size
    return ([p.vs_others for p in rank_paces(records)],
            [statistics.median(r.iter_ms) for r in records], segments)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8, help="runs of each mode (default 8)")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < RANKS:
        raise SystemExit(f"needs {RANKS} CPUs")
    worst: dict[str, list[float]] = {mode: [] for mode in MODES}
    iteration: dict[str, list[float]] = {mode: [] for mode in MODES}
    order = list(MODES)
    for index in range(args.runs):
        for mode in order[index % len(order):] + order[:index % len(order)]:
            paces, medians, segments = one_run(mode)
            worst[mode].append(max(paces))
            iteration[mode] += medians
            print(f"run {index + 1:2d} {mode:22}  vs_others "
                  + " ".join(f"{p:.3f}" for p in paces) + "  r0/r1 per segment "
                  + " ".join(f"{s:.3f}" for s in segments)
                  + "  median iteration " + " ".join(f"{m:.0f}" for m in medians) + " ms",
                  flush=True)
    print(f"\non {os.cpu_count()} CPUs, {args.runs} runs of each, load average at the end "
          f"{os.getloadavg()[0]:.2f}")
    for mode in MODES:
        above = {bar: sum(1 for w in worst[mode] if w > bar) for bar in (1.05, 1.10)}
        print(f"{mode:22}: slower rank's vs_others median {statistics.median(worst[mode]):.3f}"
              f", largest {max(worst[mode]):.3f}, above 1.05 in {above[1.05]} and above 1.10 "
              f"in {above[1.10]} of {args.runs} runs; median iteration "
              f"{statistics.median(iteration[mode]):.0f} ms")


if __name__ == "__main__":
    main()
