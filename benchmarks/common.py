"""What the benchmark scripts share: a gpucheck command's JSON report from a fresh
process, a report's section, several runs' median and range, side-by-side pairs."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def gpucheck_report(*args: str, env: dict[str, str] | None = None, check: bool = False,
                    timeout: float = 600) -> tuple[float, dict[str, Any]]:
    """(seconds, report) of `python -m gpucheck ARGS -q -o REPORT`, started afresh."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "report.json"
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gpucheck", *args, "-q", "-o", str(out)],
                       cwd=folder, check=check, timeout=timeout,
                       env=env or {**os.environ, "PYTHONPATH": str(ROOT)})
        return time.perf_counter() - started, json.loads(out.read_text())


def section(report: dict[str, Any], name: str) -> dict[str, Any]:
    """The data of the report's section `name`."""
    return next(s["data"] for s in report["sections"] if s["name"] == name)


def spread(values: Sequence[float], unit: str = "s", digits: int = 2) -> str:
    """"median 2.95 s (2.84 to 3.05)"."""
    return (f"median {statistics.median(values):.{digits}f} {unit} "
            f"({min(values):.{digits}f} to {max(values):.{digits}f})")


def pairs(runs: int, ours: Callable[[], T], bare: Callable[[], T],
          show: Callable[[int, T, T], None]) -> tuple[list[T], list[T]]:
    """`runs` side-by-side pairs, the order alternating (ours first, then bare first) so
    both see the same machine load; `show` prints each pair as it ends."""
    mine: list[T] = []
    theirs: list[T] = []
    for i in range(runs):
        if i % 2 == 0:
            mine.append(ours())
            theirs.append(bare())
        else:
            theirs.append(bare())
            mine.append(ours())
        show(i + 1, mine[-1], theirs[-1])
    return mine, theirs
