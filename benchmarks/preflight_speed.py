"""Seconds from launch to the job command's first line, with and without preflight.

`torchrun --nproc-per-node 2` (gloo, CPU ranks) of a small training-like command,
alone and behind `-m gpucheck preflight -q --`, in turn, a new launch each time;
medians of --runs (goal: preflight adds at most 20 s here; docs/preflight.md).

    PYTHONPATH=. python benchmarks/preflight_speed.py [--runs 5] [--budget 60]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, spread

sys.path.insert(0, str(ROOT))

from tests.comm_workers import clean_env, free_port

COMMAND = """\
import datetime, os, torch, torch.distributed as dist
print("FIRST LINE", os.environ["RANK"], flush=True)
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
value = torch.ones(1)
dist.all_reduce(value)
print("SUM", value.item(), flush=True)
"""


def one_run(script: Path, preflight: bool, budget: float) -> float:
    """Seconds from the launch to the command's first line (inf when it never came)."""
    gate = ["-m", "gpucheck", "preflight", "-q", "--budget", str(budget), "--",
            sys.executable] if preflight else []
    args = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
            "--max-restarts", "0", *(gate or []), str(script)]
    start = time.monotonic()
    proc = subprocess.Popen(args, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    first = float("inf")
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("FIRST LINE") and first == float("inf"):
            first = time.monotonic() - start
    proc.wait(timeout=300)
    return first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--budget", type=float, default=60.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "train.py"
        script.write_text(COMMAND)
        alone, gated = [], []
        for k in range(args.runs):
            alone.append(one_run(script, False, args.budget))
            gated.append(one_run(script, True, args.budget))
            print(f"run {k + 1}: command alone {alone[-1]:.2f} s, behind preflight "
                  f"{gated[-1]:.2f} s", flush=True)
    print(f"command alone: {spread(alone)}\nbehind preflight: {spread(gated)}")
    print(f"preflight adds {statistics.median(gated) - statistics.median(alone):.2f} s "
          "(goal: at most 20 s on 2 CPU ranks)")


if __name__ == "__main__":
    main()
