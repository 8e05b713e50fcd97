"""Does `gpucheck bench`'s straggler verdict hold on a noisy machine?

Runs the default `gpucheck bench` (no options but --quiet and a JSON report, as a
new user would: 2 CPU ranks without a GPU) N times healthy and N times with one
rank slowed by 15% in every iteration (15% more computation after each forward: the
test hooks tests/bench_workers.py:slow_rank_{one,zero}_by_15_percent, rank 1 and
rank 0 in turn: the rank spawned second tends to run a few percent slower here, so
slowing only rank 1 would flatter the catch rate), interleaved so both kinds see
the same machine load, and counts the straggler WARNs. Issue 8's goal: 0 WARNs in
the healthy runs, the slowed rank (and only it) named in every slowed run.

    python benchmarks/straggler_noise.py --runs 20 [--keep DIR] [-- extra bench options]
    python benchmarks/straggler_noise.py --runs 10 --busy 1   # a busy loop competing
    python benchmarks/straggler_noise.py --reports DIR    # summarise kept reports again

`--busy N` runs N busy-loop processes beside the benchmark for its whole length (a
neighbour that always wants a core: the loaded case, reproducibly).

The summary adds what other thresholds would have said of the same runs (the verdict
is vs_others > 1 + threshold, so it can be recomputed from the reports).
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
SLOW_HOOKS = {1: "bench_workers:slow_rank_one_by_15_percent",
              0: "bench_workers:slow_rank_zero_by_15_percent"}
RUN_TIMEOUT_S = 600
SWEEP = (0.05, 0.075, 0.10, 0.125, 0.15, 0.20)


@dataclass(frozen=True)
class Outcome:
    """One run: which ranks were called stragglers, and what the verdict looked at."""

    kind: str  # "healthy" or "slowed"
    slowed_rank: int | None
    total_s: float
    warned_ranks: tuple[int, ...]
    ranks: tuple[dict[str, Any], ...]  # the report's ranks table

    def describe(self) -> str:
        cells = "  ".join(f"r{r['rank']} p50 {r['p50_ms']:.0f} ms p99 {r['p99_ms']:.0f} ms "
                          f"x{r['vs_others']:.3f} slower in {r['slower_share']:.0%}"
                          for r in self.ranks)
        warned = ",".join(map(str, self.warned_ranks)) or "-"
        kind = self.kind if self.slowed_rank is None else f"slowed r{self.slowed_rank}"
        return f"{kind:9} {self.total_s:5.1f} s  WARN ranks: {warned:4}  {cells}"


def one_run(slowed_rank: int | None, extra: list[str], keep: Path | None,
            index: int) -> Outcome:
    kind = "healthy" if slowed_rank is None else "slowed"
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "r.json"
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
        env.pop("GPUCHECK_TEST_HOOK", None)
        if slowed_rank is not None:
            env["GPUCHECK_TEST_HOOK"] = SLOW_HOOKS[slowed_rank]
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
            suffix = "" if slowed_rank is None else f"-r{slowed_rank}"
            shutil.copy(out, keep / f"{index:03d}-{kind}{suffix}.json")
        return outcome_of(json.loads(out.read_text()), slowed_rank, total)


def outcome_of(report: dict[str, Any], slowed_rank: int | None, total_s: float) -> Outcome:
    timing = next(s for s in report["sections"] if s["name"] == "timing")
    warned = tuple(sorted(int(f["subject"].split()[-1]) for f in timing["findings"]
                          if f["check"] == "bench.rank.straggler" and f["status"] == "WARN"))
    kind = "healthy" if slowed_rank is None else "slowed"
    return Outcome(kind, slowed_rank, total_s, warned, tuple(timing["data"]["ranks"]))


def kept_outcomes(folder: Path) -> list[Outcome]:
    """Reports saved by --keep: NNN-healthy.json, NNN-slowed-rK.json."""
    outcomes = []
    for path in sorted(folder.glob("*.json")):
        tail = path.stem.rpartition("-r")[2]
        slowed = int(tail) if "slowed" in path.stem and tail.isdigit() else None
        outcomes.append(outcome_of(json.loads(path.read_text()), slowed, float("nan")))
    return outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of each kind (default 20)")
    parser.add_argument("--keep", type=Path, default=None, help="save every JSON report here")
    parser.add_argument("--reports", type=Path, default=None,
                        help="run nothing: summarise the reports --keep saved in this folder")
    parser.add_argument("--busy", type=int, default=0,
                        help="busy-loop processes to run beside the benchmark (default 0)")
    parser.add_argument("extra", nargs="*", help="options passed to gpucheck bench")
    args = parser.parse_args()
    if args.reports:
        outcomes = kept_outcomes(args.reports)
        for i, outcome in enumerate(outcomes):
            print(f"run {i + 1:3d} {outcome.describe()}")
        summarise(outcomes)
        return
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.busy)]
    try:
        for i in range(args.runs):
            for slowed in (None, 1 - i % 2):  # interleaved: both kinds see the same load
                outcome = one_run(slowed, args.extra, args.keep, len(outcomes))
                outcomes.append(outcome)
                print(f"run {len(outcomes):3d} {outcome.describe()}", flush=True)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    if args.busy:
        print(f"with {args.busy} busy-loop process(es) beside the benchmark")
    summarise(outcomes)


def summarise(outcomes: list[Outcome]) -> None:
    healthy = [o for o in outcomes if o.kind == "healthy"]
    slowed = [o for o in outcomes if o.kind == "slowed"]
    false_healthy = sum(1 for o in healthy if o.warned_ranks)
    caught = sum(1 for o in slowed if o.warned_ranks == (o.slowed_rank,))
    false_slowed = sum(1 for o in slowed if set(o.warned_ranks) - {o.slowed_rank})
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"healthy runs with a straggler WARN (false alarms): {false_healthy} of {len(healthy)}")
    by_rank = {r: f"{sum(1 for o in slowed if o.slowed_rank == r and o.warned_ranks == (r,))}"
                  f" of {sum(1 for o in slowed if o.slowed_rank == r)}" for r in sorted(SLOW_HOOKS)}
    print(f"slowed runs naming the slowed rank and only it (caught): {caught} of "
          f"{len(slowed)} (rank 0: {by_rank[0]}, rank 1: {by_rank[1]}); naming a healthy "
          f"rank: {false_slowed}")
    worst = max((r["vs_others"] or 0.0, r["slower_share"] or 0.0) for o in healthy
                for r in o.ranks)
    slow = min((r["vs_others"] or 0.0, r["slower_share"] or 0.0) for o in slowed
               for r in o.ranks if r["rank"] == o.slowed_rank)
    print(f"margins: healthy ranks' largest vs_others {worst[0]:.3f} (slower_share "
          f"{worst[1]:.2f}); slowed rank's smallest {slow[0]:.3f} (slower_share {slow[1]:.2f})")
    print(f"on {os.cpu_count()} cores, load average at the end {load:.2f}")
    for threshold in SWEEP:  # the same runs judged at other thresholds
        over = [(o, {int(r["rank"]) for r in o.ranks if r["vs_others"] is not None
                     and r["vs_others"] > 1 + threshold}) for o in outcomes]
        false = sum(1 for o, warned in over if o.kind == "healthy" and warned)
        caught = sum(1 for o, warned in over if o.kind == "slowed" and warned == {o.slowed_rank})
        print(f"  at --straggler-threshold {threshold:<5g}: false alarms {false} of "
              f"{len(healthy)}, caught {caught} of {len(slowed)}")


if __name__ == "__main__":
    main()
