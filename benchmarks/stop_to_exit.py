"""From a stopped rank (SIGSTOP) to the command's exit, against --timeout.

`gpucheck comm` with a long sweep; once results exist rank 1 is stopped and the time to
exit measured, and no worker may be left (promise: at most --timeout + 10 s).

    python benchmarks/stop_to_exit.py [--timeout 10] [--ranks 3] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from comm_workers import (
    clean_env,
    gpucheck,
    start,
    tracked,
    wait_for_file,
    wait_gone,
)


def one_run(timeout_s: float, ranks: int) -> tuple[float, int, int]:
    """(seconds from SIGSTOP to exit, exit code, processes left)."""
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp)
        proc = start(gpucheck("comm", "--n-gpus", str(ranks), "--timeout", str(timeout_s),
                              "--max-bytes", "64K", "--iters", "20000", "--no-pairwise",
                              "-q", "-o", str(run / "out.json")),
                     clean_env(GPUCHECK_RUN_DIR=str(run)))
        with tracked([proc]) as seen:
            roster = wait_for_file(run / "roster.json", 120, proc)
            seen.extend(r["pid"] for r in roster)
            wait_for_file(run / "partial.json", 120, proc)
            stopped = time.monotonic()
            os.kill(roster[1]["pid"], signal.SIGSTOP)
            proc.communicate(timeout=timeout_s + 120)
            elapsed = time.monotonic() - stopped
            return elapsed, proc.returncode, len(wait_gone(list(seen), 2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--ranks", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(f"gpucheck comm, {args.ranks} gloo ranks, --timeout {args.timeout:g}, rank 1 stopped")
    for k in range(args.runs):
        elapsed, code, left = one_run(args.timeout, args.ranks)
        print(f"run {k + 1}: exit {code} after {elapsed:.1f} s "
              f"(timeout + {elapsed - args.timeout:.1f} s), processes left: {left}", flush=True)


if __name__ == "__main__":
    main()
