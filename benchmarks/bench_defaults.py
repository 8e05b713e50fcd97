"""How long does `gpucheck bench` with its defaults take, start-up included?

The plain command (--quiet and a JSON report only) in fresh processes: each run's wall
time with what its report says of the timed loop, then the median (issue bar: at most
45 s on a 2-core CPU; docs/bench.md).

    python benchmarks/bench_defaults.py --runs 5 [-- extra bench options]
"""

from __future__ import annotations

import argparse
import os

from common import gpucheck_report, section, spread


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("extra", nargs="*", help="options passed to gpucheck bench")
    args = parser.parse_args()
    walls = []
    for i in range(args.runs):
        wall, report = gpucheck_report("bench", *args.extra, check=True, timeout=300)
        walls.append(wall)
        setup, timing = section(report, "bench"), section(report, "timing")
        print(f"run {i + 1}: {wall:.1f} s total; {setup['ranks']} ranks x "
              f"{setup['timed_iters']} iters x batch {setup['batch_size']} {setup['model']} "
              f"{setup['dtype']}: job wall {timing['job_wall_s']:.2f} s, "
              f"{timing['aggregate_images_per_s']:.1f} images/s", flush=True)
    print(f"{args.runs} runs: {spread(walls, digits=1)} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
