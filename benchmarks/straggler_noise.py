"""Does `gpucheck bench`'s straggler verdict hold on a noisy machine?

Runs the default `gpucheck bench` (no options but --quiet and a JSON report, as a
new user would: 2 CPU ranks without a GPU) N times healthy and N times with rank 1
slowed by 15% in every iteration (the test hook
tests/bench_workers.py:slow_rank_one_by_15_percent), interleaved so both see the
same machine load, and counts the straggler WARNs. Issue 8's goal: 0 WARNs in the
healthy runs, rank 1 (and only rank 1) named in every slowed run.

    python benchmarks/straggler_noise.py --runs 20 [--keep DIR] [-- extra bench options]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SLOW_HOOK = "bench_workers:slow_rank_one_by_15_percent"
SLOW_RANK = 1
RUN_TIMEOUT_S = 600


@dataclass(frozen=True)
class Outcome:
    """One run: which ranks were called stragglers, and what the verdict looked at."""

    kind: str  # "healthy" or "slowed"
    total_s: float
    warned_ranks: tuple[int, ...]
    ranks: tuple[dict[str, Any], ...]  # the report's ranks table

    def describe(self) -> str:
        cells = "  ".join(f"r{r['rank']} p50 {r['p50_ms']:.0f} ms p99 {r['p99_ms']:.0f} ms "
                          f"x{r['vs_others']:.3f} slower in {r['slower_share']:.0%}"
                          for r in self.ranks)
        warned = ",".join(map(str, self.warned_ranks)) or "-"
        return f"{self.kind:8} {self.total_s:5.1f} s  WARN ranks: {warned:4}  {cells}"


def one_run(kind: str, extra: list[str], keep: Path | None, index: int) -> Outcome:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "r.json"
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
        env.pop("GPUCHECK_TEST_HOOK", None)
        if kind == "slowed":
            env["GPUCHECK_TEST_HOOK"] = SLOW_HOOK
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "gpucheck", "bench", "--quiet",
                               "--output", str(out), *extra], cwd=folder, env=env,
                              timeout=RUN_TIMEOUT_S, check=False, capture_output=True,
                              text=True)
        total = time.perf_counter() - started
        if not out.is_file():
            raise SystemExit(f"{kind} run {index} wrote no report (exit {done.returncode}):\n"
                             f"{done.stderr[-2000:]}")
        if keep:
            shutil.copy(out, keep / f"{index:03d}-{kind}.json")
        report = json.loads(out.read_text())
    timing = next(s for s in report["sections"] if s["name"] == "timing")
    warned = tuple(sorted(int(f["subject"].split()[-1]) for f in timing["findings"]
                          if f["check"] == "bench.rank.straggler" and f["status"] == "WARN"))
    return Outcome(kind, total, warned, tuple(timing["data"]["ranks"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of each kind (default 20)")
    parser.add_argument("--keep", type=Path, default=None, help="save every JSON report here")
    parser.add_argument("extra", nargs="*", help="options passed to gpucheck bench")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []
    for _ in range(args.runs):
        for kind in ("healthy", "slowed"):  # interleaved: both kinds see the same load
            outcome = one_run(kind, args.extra, args.keep, len(outcomes))
            outcomes.append(outcome)
            print(f"run {len(outcomes):3d} {outcome.describe()}", flush=True)
    summarise(outcomes)


def summarise(outcomes: list[Outcome]) -> None:
    healthy = [o for o in outcomes if o.kind == "healthy"]
    slowed = [o for o in outcomes if o.kind == "slowed"]
    false_healthy = sum(1 for o in healthy if o.warned_ranks)
    caught = sum(1 for o in slowed if o.warned_ranks == (SLOW_RANK,))
    false_slowed = sum(1 for o in slowed if set(o.warned_ranks) - {SLOW_RANK})
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"healthy runs with a straggler WARN (false alarms): {false_healthy} of {len(healthy)}")
    print(f"slowed runs naming rank {SLOW_RANK} and only it (caught): {caught} of {len(slowed)}"
          f"; naming a healthy rank: {false_slowed}")
    worst = max((r["vs_others"] or 0.0, r["slower_share"] or 0.0) for o in healthy
                for r in o.ranks)
    slow = min((r["vs_others"] or 0.0, r["slower_share"] or 0.0) for o in slowed
               for r in o.ranks if r["rank"] == SLOW_RANK)
    print(f"margins: healthy ranks' largest vs_others {worst[0]:.3f} (slower_share "
          f"{worst[1]:.2f}); slowed rank's smallest {slow[0]:.3f} (slower_share {slow[1]:.2f})")
    print(f"on {os.cpu_count()} cores, load average at the end {load:.2f}")


if __name__ == "__main__":
    main()
