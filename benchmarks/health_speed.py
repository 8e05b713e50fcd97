"""Wall time of `gpucheck health` next to a bare `python -c "import pynvml"`.

Both run on the fake NVML of tests/fake_nvml_site (GPUCHECK_FAKE_NVML: eight healthy
H200s), so importing `pynvml` costs the same in both and the difference is
gpucheck's own: its imports, the checks (NVML, this boot's kernel log, /sys), the
report. A third command shows the budget holding on a node whose NVML hangs (one
call on GPU 5 never answers): its wall time against `--budget`.

Interleaved (load drifts hit every command alike), N runs each; prints the median,
the min and the difference to the bare import.

    python benchmarks/health_speed.py [--runs 9] [--budget 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEALTHY = json.dumps({"gpus": [{}] * 8})
HUNG = json.dumps({"gpus": [{}] * 5 + [{"hang": ["nvmlDeviceGetTotalEccErrors"]}] + [{}] * 2})
BARE = "python -c 'import pynvml'"


def commands(budget: float) -> dict[str, tuple[list[str], str]]:
    health = [sys.executable, "-m", "gpucheck", "health", "--format", "line"]
    return {
        BARE: ([sys.executable, "-c", "import pynvml"], HEALTHY),
        "gpucheck health (8 healthy GPUs)": (health, HEALTHY),
        f"gpucheck health --budget {budget:g} (NVML hangs)":
            ([*health, "--budget", f"{budget:g}", "--nvml-timeout", "60"], HUNG),
    }


def time_once(argv: list[str], scenario: str) -> float:
    env = {**os.environ, "NO_COLOR": "1", "GPUCHECK_FAKE_NVML": scenario,
           "PYTHONPATH": os.pathsep.join((str(ROOT), str(ROOT / "tests" / "fake_nvml_site")))}
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr[-500:]}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="runs of each command (>= 5)")
    parser.add_argument("--budget", type=float, default=2.0, help="budget of the hung case")
    options = parser.parse_args()
    runs = max(5, options.runs)
    table = commands(options.budget)
    times: dict[str, list[float]] = {name: [] for name in table}
    for argv, scenario in table.values():  # warm the page cache once, untimed
        time_once(argv, scenario)
    for _ in range(runs):
        for name, (argv, scenario) in table.items():
            times[name].append(time_once(argv, scenario))
    base = statistics.median(times[BARE])
    print(f"{runs} runs each, interleaved, on {os.cpu_count()} CPU(s), load average "
          f"{os.getloadavg()[0]:.1f}\n")
    print(f"{'command':42} {'median s':>9} {'min s':>6} {'max s':>6} {'vs bare import':>15}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:42} {median:9.3f} {min(values):6.3f} {max(values):6.3f} "
              f"{median - base:+13.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
