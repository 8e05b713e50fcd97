"""Harness overhead of `gpucheck stress`: its reported rates vs bare loops, side by side.

`gpucheck stress --n-gpus 1` and a bare script (the same size and dtype multiplied into
a preallocated output for the same window after the same warm-up, and a copy of the
same size) run in their own processes, alternating; GEMM TFLOP/s per dtype and the
device copy GB/s, each pair and the ratio of the medians (goal >= 0.95; docs/stress.md).

    python benchmarks/stress_overhead.py --runs 5 [-- --device cuda]
    taskset -c 1 python benchmarks/stress_overhead.py --runs 5      # one core: less noise
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from common import ROOT, gpucheck_report, pairs, section


def gpucheck_rates(extra: list[str]) -> dict[str, Any]:
    """One `gpucheck stress` run in its own process: {"fp32": TFLOP/s, ..., "copy": GB/s}."""
    _, report = gpucheck_report("stress", "--n-gpus", "1", "--duration", "1", *extra)
    setup, copy = section(report, "stress"), section(report, "membw")["results"][0]
    rates: dict[str, Any] = {r["dtype"]: r["tflops"] for r in section(report, "gemm")["results"]}
    rates["copy"] = copy["gbps"]
    rates["setup"] = {"device": setup["device"], "size": setup["size"],
                      "dtypes": setup["dtypes"], "copy_bytes": copy["size_bytes"]}
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
    last: list[dict[str, Any]] = []  # bare copies the setup of gpucheck's latest run

    def ours() -> dict[str, Any]:
        last.append(gpucheck_rates(args.extra))
        return last[-1]

    def show(i: int, mine: dict[str, Any], plain: dict[str, float]) -> None:
        cells = ", ".join(f"{k} {mine[k]:.4g} vs {plain[k]:.4g}" for k in plain)
        print(f"pair {i} (gpucheck vs bare): {cells}", flush=True)

    mine_all, bare = pairs(args.runs, ours, lambda: bare_rates(last[-1]["setup"]), show)
    setup = mine_all[0]["setup"]
    print(f"{setup['device']}, n={setup['size']}, copy {setup['copy_bytes'] >> 20} MiB; "
          f"medians of {args.runs} runs (TFLOP/s for GEMM, GB/s for copy):")
    for key in bare[0]:
        mine = statistics.median(o[key] for o in mine_all)
        theirs = statistics.median(b[key] for b in bare)
        print(f"  {key:5s} gpucheck {mine:.4g}  bare {theirs:.4g}  ratio {mine / theirs:.3f}")


if __name__ == "__main__":
    main()
