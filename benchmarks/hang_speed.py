"""From `gpucheck hang` to its verdict, on a gloo job that hangs on purpose.

A job of --ranks ranks (tests/hang_jobs.py "user": rank 1 loops in its own code, the
others wait in all_reduce); the command run afresh each time, with the ranks' PIDs and
without; each run must name rank 1 alone (goal: at most 10 s; docs/hang.md).
--neighbours N adds N made-up ranks of another job (sleep processes named python3 with
hostile RANK/WORLD_SIZE values): the run without PIDs must stay within the goal.

    PYTHONPATH=. python benchmarks/hang_speed.py [--ranks 3] [--runs 5] [--window 2]
                                                 [--neighbours 200]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, gpucheck_report, spread

sys.path.insert(0, str(ROOT))

from tests.comm_workers import clean_env, free_port
from tests.hang_launch import hang_job


def one_run(pids: list[int] | None, window: float) -> tuple[float, list[str]]:
    """(seconds to the verdict, the subjects named)."""
    elapsed, report = gpucheck_report("hang", *map(str, pids or []), "--window", str(window),
                                      env=clean_env(), timeout=120)
    named = [f["subject"] for s in report["sections"] for f in s["findings"]
             if f["status"] == "FAIL" and f["check"].startswith("hang.rank.")
             and (pids is None or s["data"].get("ranks"))]
    return elapsed, named


def measure(label: str, pids: list[int] | None, runs: int, window: float,
            want: str) -> None:
    times = []
    for k in range(runs):
        elapsed, named = one_run(pids, window)
        mine = [n for n in named if n.startswith(want)]
        print(f"  {label} run {k + 1}: {elapsed:.2f} s, named {mine or named}")
        times.append(elapsed)
    print(f"{label}: {spread(times)} over {runs} runs")


@contextlib.contextmanager
def neighbours(count: int):  # type: ignore[no-untyped-def]
    """`count` made-up ranks of one other job, killed on exit."""
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        fake = Path(tmp) / "python3"
        fake.symlink_to(shutil.which("sleep") or "/bin/sleep")
        port = free_port()
        try:
            for rank in range(count):
                env = clean_env(RANK=str(rank), WORLD_SIZE=str(count),
                                LOCAL_WORLD_SIZE=str(10**12), MASTER_ADDR="127.0.0.1",
                                MASTER_PORT=str(port))
                procs.append(subprocess.Popen([str(fake), "600"], env=env))
            yield
        finally:
            for proc in procs:
                proc.kill()
            for proc in procs:
                proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--window", type=float, default=2.0)
    parser.add_argument("--neighbours", type=int, default=0)
    args = parser.parse_args()
    with hang_job("user", odd=1, n=args.ranks) as job, neighbours(args.neighbours):
        if args.neighbours:
            print(f"{args.neighbours} made-up ranks of another job beside it")
        print(f"{args.ranks} gloo ranks, rank 1 stuck in user code, --window {args.window:g}")
        measure("gpucheck hang PIDS", job.pids, args.runs, args.window, "rank 1 ")
        measure("gpucheck hang (no PIDs)", None, args.runs, args.window, "rank 1 ")


if __name__ == "__main__":
    main()
