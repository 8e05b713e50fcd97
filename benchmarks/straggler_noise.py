"""Does `gpucheck bench`'s straggler verdict hold on a noisy machine, for both kinds?

The default `gpucheck bench` (2 CPU ranks, as a new user runs it) N times for each kind,
interleaved so all kinds see the same load, the planted rank alternating between 0 and
1 (the rank spawned second tends to run a few percent slower here): healthy; slowed
(15% more computation: the device kind); throttled (stopped from outside 15% of the
time, as a CPU quota does: the host kind); fine and coarse stalls of two strengths
(issue 21: fine-2x, fine-1.3x, coarse-2x, coarse-1.3x). Goal: no WARN in
the healthy runs, the planted rank alone named with the right kind in every other. The
summary also judges the same runs at other thresholds. Measured runs: docs/bench.md.

    python benchmarks/straggler_noise.py --runs 20 [--kinds healthy,slowed,throttled]
    python benchmarks/straggler_noise.py --runs 10 --busy 1   # busy loops competing
    python benchmarks/straggler_noise.py --runs 20 --keep DIR -- --model resnet18 ...
    python benchmarks/straggler_noise.py --reports DIR   # kept reports, judged again
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common import ROOT as REPO

THROTTLE = {1: "bench_workers:throttle_rank_one_by_15_percent",
            0: "bench_workers:throttle_rank_zero_by_15_percent"}
# Stalls from outside, issue 21: (stopped share of the time let run, period in seconds).
STALLS = {"fine-2x": (1.0, 0.1), "fine-1.3x": (0.3, 0.1),
          "coarse-2x": (1.0, 0.6), "coarse-1.3x": (0.3, 0.6)}
HOOKS = {"slowed": {1: "bench_workers:slow_rank_one_by_15_percent",
                    0: "bench_workers:slow_rank_zero_by_15_percent"},
         "throttled": THROTTLE, **{kind: THROTTLE for kind in STALLS}}
KINDS = ("healthy", "slowed", "throttled", *STALLS)
# The kind of straggler each planted run must be named as (gpucheck.bench.stragglers).
EXPECTED = {"slowed": "device", "throttled": "host", **{kind: "host" for kind in STALLS}}
# Runs `gpucheck bench` with its gathered records saved as JSON (argv[1]) for --keep.
RECORDER = """
import dataclasses, json, sys
import gpucheck.bench.findings as findings
import hooked
original = findings.bench_sections
def recording(spec, images, outcome, threshold):
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        json.dump([dataclasses.asdict(r) for r in outcome.records], out)
    return original(spec, images, outcome, threshold)
findings.bench_sections = recording
sys.exit(hooked.main(sys.argv[2:]))
"""
HOST_WORDS = "its host did not run it"
RUN_TIMEOUT_S = 600
SWEEP = (0.05, 0.075, 0.10, 0.125, 0.15, 0.20)


@dataclass(frozen=True)
class Outcome:
    """One run: which ranks were named stragglers and as which kind, and what the
    verdict looked at."""

    kind: str  # "healthy", "slowed" or "throttled"
    planted: int | None  # the slowed or throttled rank
    total_s: float
    named: dict[int, str]  # rank -> "device" or "host"
    ranks: tuple[dict[str, Any], ...]  # the report's ranks table
    load: float  # 1-minute load average when the run ended

    def describe(self) -> str:
        cells = "  ".join(f"r{r['rank']} p50 {r['p50_ms']:.0f} ms x{r['vs_others']:.3f} cpu "
                          f"x{r.get('wall_vs_others') or 0:.3f} wall "
                          f"x{r.get('hold_back') or 0:.3f} loop"
                          f"{_again_cell(r)}" for r in self.ranks)
        named = ",".join(f"{r}:{k}" for r, k in sorted(self.named.items())) or "-"
        kind = self.kind if self.planted is None else f"{self.kind} r{self.planted}"
        return (f"{kind:14} {self.total_s:5.1f} s  WARN: {named:9}  {cells}  "
                f"hold-back {self.hold_back():.3f}  load {self.load:.1f}")

    def correct(self) -> bool:
        """Healthy: nobody named; planted: that rank alone, as the right kind."""
        if self.planted is None:
            return not self.named
        return self.named == {self.planted: EXPECTED[self.kind]}

    def hold_back(self) -> float:
        """The planted rank's whole-loop wall time over the other rank's (healthy: the
        slower rank's over the faster's)."""
        walls = {int(r["rank"]): float(r["wall_s"]) for r in self.ranks}
        if self.planted is None:
            return max(walls.values()) / min(walls.values())
        others = [w for k, w in walls.items() if k != self.planted]
        return walls[self.planted] / statistics.median(others)


def _again_cell(row: dict[str, Any]) -> str:
    """" (x1.12 then x1.15 again)" when the loop ran a second time, else ""."""
    if row.get("loop_again") is None:
        return ""
    return (f" (x{row.get('whole_loop') or 0:.3f} then x{row['loop_again']:.3f} again, "
            f"x{row.get('both_loops') or 0:.3f} both)")


def one_run(kind: str, planted: int | None, extra: list[str], keep: Path | None,
            index: int) -> Outcome:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "r.json"
        env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}"}
        hooks = ["--model", HOOKS[kind][planted]] if planted is not None else []
        if kind in STALLS:
            env["GPUCHECK_TEST_THROTTLE_SHARE"] = str(STALLS[kind][0])
            env["GPUCHECK_TEST_THROTTLE_PERIOD"] = str(STALLS[kind][1])
        records = Path(folder) / "records.json"
        # tests/hooked.py: the planted fault reaches the ranks (tests/plant.py).
        launcher = ["-c", RECORDER, str(records)] if keep else [str(REPO / "tests" / "hooked.py")]
        started = time.perf_counter()
        done = subprocess.run([sys.executable, *launcher, *hooks, "gpucheck", "bench", "--quiet",
                               "--output", str(out), *extra], cwd=folder, env=env,
                              timeout=RUN_TIMEOUT_S, check=False, capture_output=True,
                              text=True)
        total = time.perf_counter() - started
        if not out.is_file():
            raise SystemExit(f"{kind} run {index} wrote no report (exit {done.returncode}):\n"
                             f"{done.stderr[-2000:]}")
        report, load = json.loads(out.read_text()), _load()
        if keep:
            suffix = "" if planted is None else f"-r{planted}"
            shutil.copy(out, keep / f"{index:03d}-{kind}{suffix}.json")
            if records.is_file():
                shutil.copy(records, keep / f"{index:03d}-{kind}{suffix}.records.json")
            with (keep / "loads.txt").open("a", encoding="utf-8") as loads:
                loads.write(f"{index:03d} {load:.2f} {total:.1f}\n")
        return outcome_of(report, kind, planted, total, load)


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def outcome_of(report: dict[str, Any], kind: str, planted: int | None, total_s: float,
               load: float) -> Outcome:
    timing = next(s for s in report["sections"] if s["name"] == "timing")
    named = {int(f["subject"].split()[-1]): "host" if HOST_WORDS in f["message"] else "device"
             for f in timing["findings"]
             if f["check"] == "bench.rank.straggler" and f["status"] == "WARN"}
    return Outcome(kind, planted, total_s, named, tuple(timing["data"]["ranks"]), load)


def kept_outcomes(folder: Path) -> list[Outcome]:
    """Reports saved by --keep: NNN-healthy.json, NNN-slowed-rK.json, NNN-throttled-rK.json,
    and loads.txt ("NNN load seconds" per run)."""
    lines = (folder / "loads.txt").read_text(encoding="utf-8").splitlines() \
        if (folder / "loads.txt").is_file() else []
    loads = {i: (float(load), float(total)) for i, load, total in map(str.split, lines)}
    outcomes = []
    for path in sorted(folder.glob("*.json")):
        if path.name.endswith(".records.json"):
            continue
        load, total = loads.get(path.stem[:3], (float("nan"), float("nan")))
        kind = max((k for k in KINDS if k in path.stem), key=len, default="healthy")
        tail = path.stem.rpartition("-r")[2]
        planted = int(tail) if kind != "healthy" and tail.isdigit() else None
        report = json.loads(path.read_text())
        records = path.with_name(f"{path.stem}.records.json")
        if records.is_file():  # judged again by today's code
            report = rejudged(report, json.loads(records.read_text()))
        outcomes.append(outcome_of(report, kind, planted, total, load))
    return outcomes


def rejudged(report: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """`report` with its timing section recomputed from the run's saved records."""
    from gpucheck.bench.findings import timing_section
    from gpucheck.bench.pace import aggregate
    from gpucheck.bench.records import RankRecord

    records = tuple(RankRecord(**{k: tuple(v) if isinstance(v, list) else v
                                  for k, v in row.items()}) for row in rows)
    timing = timing_section(records, aggregate(records)).to_dict()
    return {**report, "sections": [timing if s["name"] == "timing" else s
                                   for s in report["sections"]]}


def plan(runs: int, kinds: list[str]) -> list[tuple[str, int | None]]:
    """Each round runs every kind once, the planted rank alternating between rounds (and
    between the two planted kinds within a round)."""
    return [(kind, None if kind == "healthy" else (i + kinds.index(kind)) % 2)
            for i in range(runs) for kind in kinds]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of each kind (default 20)")
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="comma-separated kinds to run (default: all three)")
    parser.add_argument("--keep", type=Path, default=None, help="save every JSON report here")
    parser.add_argument("--reports", type=Path, default=None,
                        help="run nothing: summarise the reports --keep saved in this folder")
    parser.add_argument("--busy", type=int, default=0,
                        help="busy-loop processes to run beside the benchmark (default 0)")
    parser.add_argument("--throttle-share", type=float, default=None,
                        help="throttled runs: stopped for this share of the time the rank "
                             "is let run (default 0.15)")
    parser.add_argument("extra", nargs="*", help="options passed to gpucheck bench")
    args = parser.parse_args()
    if args.throttle_share is not None:
        os.environ["GPUCHECK_TEST_THROTTLE_SHARE"] = str(args.throttle_share)
    kinds = [k for k in args.kinds.split(",") if k]
    if set(kinds) - set(KINDS):
        parser.error(f"--kinds: choose among {', '.join(KINDS)}")
    if args.reports:
        outcomes = kept_outcomes(args.reports)
        for i, outcome in enumerate(outcomes):
            print(f"run {i + 1:3d} {outcome.describe()}")
        summarise(outcomes)
        return
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
    summarise(run_all(plan(args.runs, kinds), args.extra, args.keep, args.busy))


def run_all(order: list[tuple[str, int | None]], extra: list[str], keep: Path | None,
            busy_loops: int) -> list[Outcome]:
    outcomes: list[Outcome] = []
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(busy_loops)]
    try:
        for kind, planted in order:
            outcome = one_run(kind, planted, extra, keep, len(outcomes))
            outcomes.append(outcome)
            print(f"run {len(outcomes):3d} {outcome.describe()}", flush=True)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    if busy_loops:
        print(f"with {busy_loops} busy-loop process(es) beside the benchmark")
    return outcomes


def summarise(outcomes: list[Outcome]) -> None:
    for kind in KINDS:
        runs = [o for o in outcomes if o.kind == kind]
        if runs:
            print(_kind_line(kind, runs))
    loads = [o.load for o in outcomes if o.load == o.load]
    if loads:
        print(f"on {os.cpu_count()} cores, 1-minute load average at the runs' ends: median "
              f"{statistics.median(loads):.2f}, min {min(loads):.2f}, max {max(loads):.2f}")
    for threshold in SWEEP:  # the same runs judged at other thresholds
        print(f"  at --straggler-threshold {threshold:<5g}: " + ", ".join(
            f"{kind} {sum(1 for o in outcomes if o.kind == kind and _right_at(o, threshold))}"
            f" of {sum(1 for o in outcomes if o.kind == kind)} right"
            for kind in KINDS if any(o.kind == kind for o in outcomes)))


def _kind_line(kind: str, runs: list[Outcome]) -> str:
    right = sum(1 for o in runs if o.correct())
    holds = [o.hold_back() for o in runs]
    hold = (f"hold-back median {statistics.median(holds):.3f} (min {min(holds):.3f}, "
            f"max {max(holds):.3f})")
    if kind == "healthy":
        worst = max(max(r["vs_others"] or 0.0 for r in o.ranks) for o in runs)
        worst_wall = max(max(r.get("wall_vs_others") or 0.0 for r in o.ranks) for o in runs)
        worst_loop = max(max(r.get("hold_back") or 0.0 for r in o.ranks) for o in runs)
        return (f"healthy  : a straggler WARN (false alarm) in {len(runs) - right} of "
                f"{len(runs)}; largest vs_others {worst:.3f} cpu, {worst_wall:.3f} wall, "
                f"hold_back {worst_loop:.3f}; {hold}")
    by_rank = {r: (sum(1 for o in runs if o.planted == r and o.correct()),
                   sum(1 for o in runs if o.planted == r)) for r in (0, 1)}
    kinds = {k: sum(1 for o in runs if o.planted in o.named and o.named[o.planted] == k)
             for k in ("device", "host")}
    healthy = sum(1 for o in runs if set(o.named) - {o.planted})
    column = "vs_others" if kind == "slowed" else "hold_back"
    least = min(next(r.get(column) or 0.0 for r in o.ranks if r["rank"] == o.planted)
                for o in runs)
    # On a loaded machine a stopped rank may cost the job little: the scheduler gives a
    # stopped process back part of the turn it missed. Those that cost 10% or more:
    costly = [o for o in runs if o.hold_back() >= 1.1]
    return (f"{kind:11}: planted rank named alone as {EXPECTED[kind]} (caught) in {right} of "
            f"{len(runs)} (rank 0: {by_rank[0][0]} of {by_rank[0][1]}, rank 1: "
            f"{by_rank[1][0]} of {by_rank[1][1]}); named as device {kinds['device']}, as "
            f"host {kinds['host']}; a healthy rank named in {healthy}; planted rank's "
            f"smallest {column} {least:.3f}; {hold}; of the {len(costly)} whose whole loop "
            f"held the job back 1.1x or more, caught {sum(1 for o in costly if o.correct())}")


def _right_at(outcome: Outcome, threshold: float) -> bool:
    """Would the verdict have been right at this threshold (pace.straggler_kind, from
    the ranks table: r["hold_back"] is the pace's hold_back)?"""
    named = {}
    for r in outcome.ranks:
        bar = 1 + max(threshold, r.get("others_spread") or 0.0)
        device, wall = r["vs_others"] or 0.0, r.get("wall_vs_others") or 0.0
        hold_back = r.get("hold_back") or 0.0
        # A suspect (its whole loop past the bar) is judged over both loops when the
        # second look ran (when the default threshold asked for it), else on its loop
        # without its longest stall (pace.held_back).
        whole, both = r.get("whole_loop") or 0.0, r.get("both_loops")
        judged = both if both is not None else hold_back
        if whole <= bar or judged <= bar:  # named only for what it cost the job
            continue
        held = max(hold_back, wall, 1.0)
        explains = math.log(max(device, 1.0)) >= 0.5 * math.log(held)
        named[int(r["rank"])] = "device" if device > 1 + threshold and explains else "host"
    if outcome.planted is None:
        return not named
    return named == {outcome.planted: EXPECTED[outcome.kind]}


if __name__ == "__main__":
    main()
