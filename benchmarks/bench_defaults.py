"""How long does `gpucheck bench` with its defaults take, start-up included?

Runs the plain command (no options but --quiet and a JSON report) several times
in fresh processes and prints each run's wall time and the median, with what the
report says about the timed loop. The issue's bar: at most 45 s on a 2-core CPU.

    /work/venv/bin/python benchmarks/bench_defaults.py --runs 5
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

REPO = Path(__file__).resolve().parents[1]


def one_run(extra: list[str]) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "r.json"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gpucheck", "bench", "--quiet", "--output",
                        str(out), *extra], cwd=folder, env=env, check=True, timeout=300)
        elapsed = time.perf_counter() - started
        return elapsed, json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("extra", nargs="*", help="options passed to gpucheck bench")
    args = parser.parse_args()
    walls = []
    for i in range(args.runs):
        wall, report = one_run(args.extra)
        walls.append(wall)
        setup = next(s for s in report["sections"] if s["name"] == "bench")["data"]
        timing = next(s for s in report["sections"] if s["name"] == "timing")["data"]
        print(f"run {i + 1}: {wall:.1f} s total; {setup['ranks']} ranks x "
              f"{setup['timed_iters']} iters x batch {setup['batch_size']} {setup['model']} "
              f"{setup['dtype']}: job wall {timing['job_wall_s']:.2f} s, "
              f"{timing['aggregate_images_per_s']:.1f} images/s", flush=True)
    print(f"median of {args.runs}: {statistics.median(walls):.1f} s "
          f"(min {min(walls):.1f}, max {max(walls):.1f}) on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
