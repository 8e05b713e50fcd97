"""`gpucheck fleet` on 1,000 node reports beside a bare json.load of the same files.

A synthetic fleet from tests/data/reports (env, bench, comm and stress joined, as
`gpucheck all` writes; or --source FILE), 2% noise on every measured figure, four
planted problems (a rank at 60% speed, an old driver, a FAIL finding, a missing
report) and one unreadable file. Prints both medians, their ratio (issue 35: at most
2.5x) and whether the planted nodes are the ones named.

    python benchmarks/fleet_scale.py [--nodes 1000] [--runs 5] [--ranks 8] [--source FILE]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "tests" / "data" / "reports"
# Sections whose floats are measurements (noise goes there, not into settings).
MEASURED = {"timing", "all_reduce", "all_gather", "pairwise", "gemm", "membw", "copies",
            "sdc", "p2p"}
PLANTED = {"slow": 0.137, "old_driver": 0.421, "failing": 0.777, "missing": 0.999}


def planted(nodes: int) -> dict[str, int]:
    """Which node gets which problem: the same fractions of any fleet size."""
    return {what: int(fraction * nodes) for what, fraction in PLANTED.items()}


def combined_source() -> dict[str, Any]:
    """env, bench, comm and stress of the samples as one report (command "all")."""
    parts = [json.loads((SAMPLES / f"{name}.json").read_text())
             for name in ("env", "bench", "comm", "stress")]
    joined = copy.deepcopy(parts[0])
    joined["command"] = "all"
    joined["sections"] = [s for part in parts for s in part["sections"]]
    return joined


def widen(report: dict[str, Any], ranks: int) -> None:
    """Every per-rank table given `ranks` rows (copies of the rows there are)."""
    for section in report["sections"]:
        for key, table in list(section.get("data", {}).items()):
            if isinstance(table, list) and table and all(
                    isinstance(r, dict) and isinstance(r.get("rank"), int) for r in table):
                have = sorted({r["rank"] for r in table})
                section["data"][key] = [dict(r, rank=rank) for rank in range(ranks)
                                        for r in table if r["rank"] == have[rank % len(have)]]


def _noisy(value: Any, rng: random.Random) -> Any:
    if isinstance(value, float):
        return value * (1 + rng.gauss(0, 0.02))
    if isinstance(value, dict):
        return {k: _noisy(v, rng) for k, v in value.items()}
    if isinstance(value, list):
        return [_noisy(v, rng) for v in value]
    return value


def node_report(source: dict[str, Any], index: int, rng: random.Random,
                plant: dict[str, int]) -> dict[str, Any]:
    report = copy.deepcopy(source)
    report["host"] = f"node{index:04d}"
    for section in report["sections"]:
        if section["name"] in MEASURED:
            section["data"] = _noisy(section["data"], rng)
            for metric in section.get("metrics") or []:
                metric["value"] = _noisy(metric["value"], rng)
    if index == plant["slow"]:
        _slow_rank(report, rank=1, factor=0.6)
    if index == plant["old_driver"]:
        for section in report["sections"]:
            if section["name"] == "driver":
                section["data"]["driver_version"] = "535.104.05"
    if index == plant["failing"]:
        report["sections"][-1]["findings"].append({
            "check": "stress.sdc.repeat", "status": "FAIL", "message": "rank 1 gave a "
            "different result in 3 of 417 repeats of the same product", "hint": "drain it",
            "subject": "rank 1", "action": "drain-node"})
    return report


def _slow_rank(report: dict[str, Any], rank: int, factor: float) -> None:
    """The rank's throughputs (its metrics and table rows) times `factor`."""
    for section in report["sections"]:
        for metric in section.get("metrics") or []:
            if (metric.get("subject") or {}).get("rank") == rank and any(
                    word in metric["name"] for word in ("images_per_s", "tflops")):
                metric["value"] *= factor
        for table in section.get("data", {}).values():
            for row in table if isinstance(table, list) else []:
                if isinstance(row, dict) and row.get("rank") == rank:
                    for key in ("images_per_s", "tflops_p50", "tflops"):
                        if isinstance(row.get(key), float):
                            row[key] *= factor


def write_fleet(folder: Path, source: dict[str, Any], nodes: int, seed: int) -> None:
    rng, plant = random.Random(seed), planted(nodes)
    for index in range(nodes):
        if index != plant["missing"]:
            report = node_report(source, index, rng, plant)
            (folder / f"node{index:04d}.json").write_text(json.dumps(report))
    (folder / "garbage.json").write_text('{"schema_version": 2, "tool": "gpu')


# The yardstick: what reading the same files costs a process that does nothing else.
BARE_LOAD = """import json, os, sys
for name in sorted(os.listdir(sys.argv[1])):
    with open(os.path.join(sys.argv[1], name), "rb") as f:
        try:
            json.load(f)
        except ValueError:
            pass
"""


def timed(argv: list[str], pycache: Path) -> float:
    # Bytecode cached, as an installed package has it (pip compiles on install): with
    # PYTHONDONTWRITEBYTECODE set, every run would compile gpucheck again (~0.06 s).
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1",
           "PYTHONPYCACHEPREFIX": str(pycache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    wall = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{argv[2]} exited {proc.returncode}: {proc.stderr.strip()}")
    return wall


def time_fleet(folder: Path, nodes: int, out: Path) -> tuple[float, float]:
    """(gpucheck fleet's wall seconds, a bare json.load of the files' wall seconds)."""
    pycache = out.parent / "pycache"
    fleet = timed([sys.executable, "-m", "gpucheck", "fleet", str(folder), "--nodes",
                   f"node[0000-{nodes - 1:04d}]", "-o", str(out), "-q"], pycache)
    return fleet, timed([sys.executable, "-c", BARE_LOAD, str(folder)], pycache)


def named_nodes(out: Path) -> dict[str, str]:
    """Node -> the first reason the ranked list gives for it."""
    report = json.loads(out.read_text())
    actions = next(s for s in report["sections"] if s["name"] == "actions")
    return {row["node"]: f"{row['status']} {row['action']}: {row['reason']}"
            for row in actions["data"]["nodes"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--ranks", type=int, default=None,
                        help="widen every per-rank table to this many ranks (e.g. 8)")
    parser.add_argument("--source", type=Path, default=None,
                        help="a real report to copy (default: the samples joined)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, default=None,
                        help="write the fleet to this new directory and keep it")
    args = parser.parse_args()
    source = json.loads(args.source.read_text()) if args.source else combined_source()
    if args.ranks:
        widen(source, args.ranks)
    with tempfile.TemporaryDirectory() as tmp:
        folder, out = args.keep or Path(tmp) / "reports", Path(tmp) / "fleet.json"
        folder.mkdir()
        write_fleet(folder, source, args.nodes, args.seed)
        size = sum(f.stat().st_size for f in folder.iterdir())
        time_fleet(folder, args.nodes, out)  # untimed: writes the bytecode, warms the cache
        pairs = [time_fleet(folder, args.nodes, out) for _ in range(args.runs)]
        named = named_nodes(out)
    planted_nodes = {f"node{i:04d}" for i in planted(args.nodes).values()}
    walls, bare = [p[0] for p in pairs], [p[1] for p in pairs]
    fleet_s, bare_s = statistics.median(walls), statistics.median(bare)
    print(f"{args.nodes} node reports ({size / 2**20:.1f} MiB, {args.ranks or 'sample'} "
          f"ranks each): gpucheck fleet median {fleet_s:.2f} s "
          f"(runs: {', '.join(f'{w:.2f}' for w in walls)}); bare json.load median "
          f"{bare_s:.2f} s; ratio {fleet_s / bare_s:.2f}x (median of the runs' own "
          f"ratios {statistics.median(w / b for w, b in pairs):.2f}x)")
    for node in sorted(planted_nodes):
        print(f"  planted {node}: {named.get(node, 'NOT NAMED')}")
    others = sorted(set(named) - planted_nodes)
    print(f"  other nodes named: {len(others)}" + (f" ({', '.join(others[:10])})"
                                                  if others else ""))
    return 0 if planted_nodes <= set(named) else 1


if __name__ == "__main__":
    sys.exit(main())
