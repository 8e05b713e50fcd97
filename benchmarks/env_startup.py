"""Wall time of `gpucheck env` next to `import torch` and torch's collect_env.

Runs the three commands interleaved (so load drifts hit all of them alike),
N times each, and prints the median, min and the ratio to `import torch`.

    python benchmarks/env_startup.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    "python -m torch.utils.collect_env": [sys.executable, "-m", "torch.utils.collect_env"],
    "python -m gpucheck env": [sys.executable, "-m", "gpucheck", "env"],
}



def _child_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_once(argv: list[str]) -> tuple[float, float]:
    """(wall s, CPU s of the child and its children) of one run."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    cpu = _child_cpu_s()
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, timeout=300)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr[-500:]}")
    return elapsed, _child_cpu_s() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7, help="runs of each command (>= 5)")
    runs = max(5, parser.parse_args().runs)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    cpu: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for argv in COMMANDS.values():  # warm the page cache once, untimed
        time_once(argv)
    for _ in range(runs):
        for name, argv in COMMANDS.items():
            wall, cpu_s = time_once(argv)
            times[name].append(wall)
            cpu[name].append(cpu_s)
    base = statistics.median(times["python -c 'import torch'"])
    cpu_base = statistics.median(cpu["python -c 'import torch'"])
    print(f"{runs} runs each, interleaved, on {os.cpu_count()} CPU(s), load average "
          f"{os.getloadavg()[0]:.1f}\n")
    print(f"{'command':36} {'median s':>9} {'min s':>6} {'vs import torch':>17} "
          f"{'median CPU s':>13} {'CPU vs torch':>12}")
    for name, values in times.items():
        median, cpu_median = statistics.median(values), statistics.median(cpu[name])
        print(f"{name:36} {median:9.2f} {min(values):6.2f} {median / base:8.2f}x "
              f"{median - base:+6.2f} s {cpu_median:13.2f} {cpu_median - cpu_base:+10.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
