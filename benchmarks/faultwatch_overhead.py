"""Fault watching's cost: bench's images/s with and without the watcher, side by side.

One rank in this process, three modes interleaved run by run: off (`--no-fault-watch`),
on (the default: the real watcher on a GPU, the frame's bookkeeping only on a CPU rank)
and, on a CPU, fake (the watcher's real thread against tests/fake_pynvml.py's H200:
a bound on its own Python work). Per mode the median images/s against off and the
watcher thread's CPU share (goal: on and fake at least 0.99 of off; docs/faults.md).

    .venv/bin/python benchmarks/faultwatch_overhead.py --runs 5 [-- --device cuda]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

from common import ROOT, spread

sys.path.insert(0, str(ROOT))  # gpucheck and tests.*

from gpucheck.cli import build_parser
from gpucheck.commands import bench
from gpucheck.context import RunContext
from tests.plant import Plant, planted

FAKE_BUS = "00000000:9A:00.0"


def _install_fake(on: bool) -> None:
    """The fake pynvml for the `fake` mode (the run watches it through the bus
    override, `Plant.fault_bus` of tests/plant.py); the real one otherwise."""
    from tests.fake_pynvml import FakeGpu, FakeNvml

    sys.modules.pop("pynvml", None)
    if on:
        sys.modules["pynvml"] = FakeNvml([FakeGpu(bus_id=FAKE_BUS)]).module


def one_run(mode: str, extra: list[str]) -> tuple[float, dict[str, Any] | None, str]:
    """(images/s, the watched GPU's row of the faults section or None, the setup)."""
    _install_fake(mode == "fake")
    flags = ["--no-fault-watch"] if mode == "off" else []
    args = build_parser().parse_args(["bench", "--n-gpus", "1", "--quiet", *flags, *extra])
    with planted(Plant(fault_bus=(FAKE_BUS,) if mode == "fake" else ())):
        report = bench.run(args, RunContext())
    assert report is not None
    timing, setup = report.section("timing").data, report.section("bench").data
    gpus = report.section("faults").data["gpus"]
    what = (f"{setup['model']} {setup['dtype']} batch {setup['batch_size']} x "
            f"{setup['timed_iters']} iters, {setup['threads_per_rank']} threads")
    return float(timing["aggregate_images_per_s"]), (gpus[0] if gpus else None), what


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per mode")
    parser.add_argument("extra", nargs="*", help="options passed to gpucheck bench")
    args = parser.parse_args()
    modes = ["off", "on"] if "cuda" in args.extra else ["off", "on", "fake"]
    rates: dict[str, list[float]] = {m: [] for m in modes}
    cpu_pct: dict[str, list[float]] = {m: [] for m in modes}
    for i in range(args.runs):
        for mode in modes[i % len(modes):] + modes[:i % len(modes)]:
            rate, gpu, what = one_run(mode, args.extra)
            rates[mode].append(rate)
            if gpu is not None and gpu.get("watcher_cpu_pct") is not None:
                cpu_pct[mode].append(float(gpu["watcher_cpu_pct"]))
            watched = (f", watcher thread {gpu['watcher_cpu_pct']:.3f}% CPU, "
                       f"{gpu['clock_samples']} clock samples") if gpu else ""
            print(f"run {i + 1} {mode:>4}: {rate:.2f} images/s ({what}){watched}", flush=True)
    _install_fake(False)
    base = statistics.median(rates["off"])
    for mode in modes:
        median = statistics.median(rates[mode])
        thread = (f"; watcher thread median {statistics.median(cpu_pct[mode]):.3f}% of one "
                  "core" if cpu_pct[mode] else "")
        print(f"{mode:>4}: {spread(rates[mode], 'images/s')}, {median / base:.3f} of off{thread}")
    print(f"{os.cpu_count()} cores; goal: on and fake at least 0.99 of off")


if __name__ == "__main__":
    main()
