"""Harness overhead: gpucheck's reported images/s with 1 rank vs a bare loop.

Side by side in one process, alternating: gpucheck's whole in-process bench path
against a bare loop of the same model, weights, dtype, memory format, batch (the same
decoded images), warm-up, iterations and threads with nothing around it but inference
mode and a device synchronisation. Each pair, the median per-pair ratio and the ratio
of the medians (bar: at least 0.95; docs/bench.md).

    python benchmarks/bench_overhead.py --runs 7 [-- --device cuda]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from common import ROOT, pairs

sys.path.insert(0, str(ROOT))

from gpucheck.bench import model as bench_model
from gpucheck.bench.model import WeightsChoice
from gpucheck.cli import build_parser
from gpucheck.commands import bench
from gpucheck.context import RunContext


def gpucheck_rate(extra: list[str]) -> tuple[float, dict[str, Any]]:
    args = build_parser().parse_args(["bench", "--n-gpus", "1", "--quiet", *extra])
    report = bench.run(args, RunContext())
    assert report is not None
    setup = report.section("bench").data  # type: ignore[union-attr]
    timing = report.section("timing").data  # type: ignore[union-attr]
    return float(timing["aggregate_images_per_s"]), setup


def bare_rate(setup: dict[str, Any]) -> float:
    import torch

    device = torch.device("cuda", 0) if setup["device"] == "cuda" else torch.device("cpu")
    torch.set_num_threads(setup["threads_per_rank"])
    dtype = bench_model.torch_dtype(setup["dtype"])
    fmt = torch.channels_last if setup["channels_last"] else torch.contiguous_format
    model = bench_model.build_model(setup["model"], WeightsChoice("random"))
    model = model.to(device=device, dtype=dtype, memory_format=fmt)
    images = bench_model.load_tensor(setup["images_dir"],
                                     bench_model.scan_images(setup["images_dir"]).files)
    x = bench_model.fill_batch(images, setup["batch_size"]).to(device=device, dtype=dtype,
                                                               memory_format=fmt)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.inference_mode():
        for _ in range(setup["warmup_iters"]):
            model(x)
        sync()
        start = time.perf_counter()
        for _ in range(setup["timed_iters"]):
            model(x)
        sync()
        elapsed = time.perf_counter() - start
    return setup["batch_size"] * setup["timed_iters"] / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("extra", nargs="*", help="options passed to gpucheck bench")
    args = parser.parse_args()
    setups: list[dict[str, Any]] = []  # the bare loop copies gpucheck's latest setup

    def ours() -> float:
        rate, setup = gpucheck_rate(args.extra)
        setups.append(setup)
        return rate

    def show(i: int, mine: float, plain: float) -> None:
        setup = setups[-1]
        print(f"pair {i}: gpucheck {mine:.2f} images/s, bare loop {plain:.2f} images/s, "
              f"ratio {mine / plain:.3f} ({setup['model']} {setup['dtype']} batch "
              f"{setup['batch_size']} x {setup['timed_iters']} iters, "
              f"{setup['threads_per_rank']} threads)", flush=True)

    ours_rates, bare = pairs(args.runs, ours, lambda: bare_rate(setups[-1]), show)
    ours_ = ours_rates
    ratios = [o / b for o, b in zip(ours_, bare, strict=True)]
    print(f"median gpucheck {statistics.median(ours_):.2f} images/s, median bare loop "
          f"{statistics.median(bare):.2f} images/s; ratio of medians "
          f"{statistics.median(ours_) / statistics.median(bare):.3f}, median per-pair ratio "
          f"{statistics.median(ratios):.3f} (bar: >= 0.95)")


if __name__ == "__main__":
    main()
