"""Harness overhead of `gpucheck stress`: its reported rates vs bare loops.

Each side runs in its own process, alternating (gpucheck, bare, bare, gpucheck, ...)
so both see the same machine load: `gpucheck stress --n-gpus 1` (one rank, in its
process: process group, NUMA placement, per-iteration timestamps, hooks check,
gathering, report) against a bare script that multiplies the same size and dtype
into a preallocated output for the same timed window after the same warm-up, and
copies a buffer of the same size, with nothing around it. Compared: GEMM TFLOP/s
per dtype (gpucheck's `tflops`, all products over their total time, like the bare
loop) and the device copy GB/s (2 x bytes / time on both sides). Prints every
pair and the ratio of the medians; the goal is at least 0.95 (within 5-10%).

    python benchmarks/stress_overhead.py --runs 5
    taskset -c 1 python benchmarks/stress_overhead.py --runs 5      # one core: less noise
    python benchmarks/stress_overhead.py --runs 5 -- --device cuda   # on a GPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def gpucheck_rates(extra: list[str]) -> dict[str, Any]:
    """One `gpucheck stress` run in its own process: {"fp32": TFLOP/s, ..., "copy": GB/s}."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "stress.json"
        subprocess.run([sys.executable, "-m", "gpucheck", "stress", "--n-gpus", "1",
                        "--duration", "1", "-q", "-o", str(out), *extra], cwd=ROOT,
                       check=False, capture_output=True, timeout=600)
        report = json.loads(out.read_text())
    sections = {s["name"]: s["data"] for s in report["sections"]}
    rates: dict[str, Any] = {r["dtype"]: r["tflops"] for r in sections["gemm"]["results"]}
    copy = sections["membw"]["results"][0]
    rates["copy"] = copy["gbps"]
    rates["setup"] = {"device": sections["stress"]["device"], "size": sections["stress"]["size"],
                      "dtypes": sections["stress"]["dtypes"], "copy_bytes": copy["size_bytes"]}
    return rates


def bare_rates(setup: dict[str, Any]) -> dict[str, float]:
    """The bare loops, in a fresh process (this script with --bare)."""
    done = subprocess.run([sys.executable, __file__, "--bare", json.dumps(setup)], cwd=ROOT,
                          check=True, capture_output=True, text=True, timeout=600)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _loop(step: Any, sync: Any, warmup_s: float, window_s: float) -> tuple[int, float]:
    """(iterations, seconds) of back-to-back steps after a warm-up."""
    started = time.perf_counter()
    while time.perf_counter() - started < warmup_s:
        step()
    sync()
    count, started = 0, time.perf_counter()
    while True:
        step()
        count += 1
        if count % 8 == 0 or time.perf_counter() - started >= window_s:
            sync()
            elapsed = time.perf_counter() - started
            if elapsed >= window_s:
                return count, elapsed


def run_bare(setup: dict[str, Any]) -> dict[str, float]:
    import torch

    from gpucheck.commands.stress import DEFAULTS
    from gpucheck.stress.gemm import matmul_precision, seeded_pair

    kind = setup["device"]
    device = torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")
    if kind == "cpu":
        torch.set_num_threads(len(os.sched_getaffinity(0)))
    sync = torch.cuda.synchronize if kind == "cuda" else (lambda: None)
    defaults, n, rates = DEFAULTS[kind], setup["size"], {}
    with torch.inference_mode():
        for dtype in setup["dtypes"]:
            with matmul_precision(dtype):
                a, b = seeded_pair(n, 1234, device, dtype)
                out = torch.empty_like(a)
                count, elapsed = _loop(lambda a=a, b=b, out=out: torch.matmul(a, b, out=out),
                                       sync, defaults.warmup_s, defaults.gemm_window_s)
            rates[dtype] = 2.0 * n**3 * count / elapsed / 1e12
        src = torch.ones(setup["copy_bytes"], dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        count, elapsed = _loop(lambda: dst.copy_(src), sync, defaults.warmup_s,
                               defaults.membw_window_s)
        rates["copy"] = 2.0 * setup["copy_bytes"] * count / elapsed / 1e9
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--bare", default=None, help=argparse.SUPPRESS)
    parser.add_argument("extra", nargs="*", help="options passed to gpucheck stress")
    args = parser.parse_args()
    if args.bare is not None:
        sys.path.insert(0, str(ROOT))
        print(json.dumps(run_bare(json.loads(args.bare))))
        return
    ours: list[dict[str, Any]] = []
    bare: list[dict[str, float]] = []
    for i in range(args.runs):
        if i % 2 == 0:
            ours.append(gpucheck_rates(args.extra))
            bare.append(bare_rates(ours[-1]["setup"]))
        else:
            bare.append(bare_rates(ours[-1]["setup"]))
            ours.append(gpucheck_rates(args.extra))
        cells = ", ".join(f"{k} {ours[-1][k]:.4g} vs {bare[-1][k]:.4g}" for k in bare[-1])
        print(f"pair {i + 1} (gpucheck vs bare): {cells}", flush=True)
    setup = ours[0]["setup"]
    print(f"{setup['device']}, n={setup['size']}, copy {setup['copy_bytes'] >> 20} MiB; "
          f"medians of {args.runs} runs (TFLOP/s for GEMM, GB/s for copy):")
    for key in bare[0]:
        mine = statistics.median(o[key] for o in ours)
        theirs = statistics.median(b[key] for b in bare)
        print(f"  {key:5s} gpucheck {mine:.4g}  bare {theirs:.4g}  ratio {mine / theirs:.3f}")


if __name__ == "__main__":
    main()
