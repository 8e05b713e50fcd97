"""GPU acceptance: gpucheck's own commands on a real GPU, each judged by its JSON report.

    PYTHONPATH=. python3 benchmarks/gpu_acceptance.py --out DIR [--budget 300] [--only STEP,...]
    PYTHONPATH=. python3 benchmarks/gpu_acceptance.py --out DIR --dry-run   # on the CPU

Each step runs one command as a person types it, `--format json --output DIR/STEP.json`
(its output in DIR/STEP.log), and judges the report: readable by gpucheck's own reader,
that command's, its exit code agreeing with its verdict; a WARN or FAIL on a healthy
machine is a possible false alarm. --budget cuts every child's timeout to what is left.
Bare-loop figures: *_overhead.py with `-- --device cuda`; the NCCL timeout path:
nccl_timeout_probe.py. Exit 0: every step said OK or WARN (or SKIP); 1: one broke,
timed out or FAILed, or the run was interrupted; 2: bad input or no GPU (README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpucheck.report import Report  # noqa: E402  (after the line above: no install step)

SCHEMA = "gpucheck-gpu-acceptance/2"
MIN_STEP_S = 20.0  # a step is not started with less of the budget left than this
PROBLEMS = ("WARN", "FAIL")
PASSING = ("OK", "WARN", "SKIP")


@dataclass(frozen=True)
class Step:
    """One gpucheck command and how long it may take."""

    name: str
    command: str
    args: tuple[str, ...] = ()
    timeout_s: float = 120.0
    torchrun: int = 0  # ranks under torchrun; 0: gpucheck starts its own
    job: tuple[str, ...] = ()  # preflight's job command, after --
    env: Mapping[str, str] = field(default_factory=dict)
    skip: str | None = None  # why this step does not run in this mode

    def argv(self, report: Path) -> list[str]:
        launch = [sys.executable, "-m", "gpucheck"]
        if self.torchrun:
            launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                      "--nproc-per-node", str(self.torchrun), "-m", "gpucheck"]
        tail = ["--", *self.job] if self.job else []
        return [*launch, self.command, *self.args, "--format", "json", "--output",
                str(report), *tail]


def plan(dry_run: bool, gpus: int, first_gpu: str = "0") -> list[Step]:
    """The steps, most informative first, so a run cut by --budget still answers most."""
    job = (sys.executable, "-c", "print('JOB STARTED')")
    if not dry_run:
        gloo = ("--n-gpus", "2", "--backend", "gloo", "--timeout", "60")
        return [Step("env", "env"), Step("health", "health", timeout_s=60),
                Step("stress", "stress", ("--duration", "20"), 240),
                Step("bench", "bench", (), 180), Step("comm", "comm", (), 240),
                Step("preflight", "preflight", ("--budget", "60"), 150, job=job),
                Step("bench_torchrun", "bench", ("--iters", "20"), 150, torchrun=gpus),
                Step("shared_gloo", "comm", (*gloo, "--max-bytes", "16M"), 120,
                     env={"CUDA_VISIBLE_DEVICES": first_gpu})]
    cpu = ("--device", "cpu", "--n-gpus", "1")
    why = "needs a GPU: on the CPU it is the bench and comm steps' path again"
    return [Step("env", "env", ("--no-gpu-test",)), Step("health", "health", timeout_s=60),
            Step("stress", "stress", (*cpu, "--duration", "0.1", "--size", "16", "--dtypes",
                                      "fp32")),
            Step("bench", "bench", (*cpu, "--model", "mobilenet_v3_small", "--batch-size",
                                    "1", "--warmup", "1", "--iters", "1"), 180),
            Step("comm", "comm", (*cpu, "--max-bytes", "4K", "--iters", "1", "--warmup",
                                  "1", "--collectives", "all_reduce", "--no-pairwise")),
            Step("preflight", "preflight", (*cpu, "--budget", "60"), 150, job=job),
            Step("bench_torchrun", "bench", skip=why), Step("shared_gloo", "comm", skip=why)]


def judge(command: str, rc: int | None, report: Path) -> dict[str, Any]:
    """A step's row from its exit code (None: timed out) and its report."""
    if rc is None:
        return {"status": "TIMEOUT", "why": "killed at its timeout"}
    try:
        raw = json.loads(report.read_text())
        Report.from_dict(raw)  # gpucheck's own reader: a report it cannot read is broken
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return {"status": "BROKE", "why": f"exit {rc}, no readable report ({exc})"[:300]}
    verdict = raw.get("verdict")
    if raw.get("command") != command:
        return {"status": "BROKE", "why": f"a report of {raw.get('command')!r}, not {command}"}
    if rc not in (0, 1) or (rc == 1) != (verdict == "FAIL"):
        return {"status": "BROKE", "why": f"exit {rc} with verdict {verdict}"}
    found = [f for s in raw["sections"] for f in s["findings"] if f["status"] in PROBLEMS]
    problems = [f"{f['status']} {f['check']}" + (f" ({f['subject']})" if f.get("subject")
                                                 else "") for f in found]
    figures = [f"{f['figure']} {f['value']} {f['unit']}".strip() for f in raw.get("figures") or []]
    return {"status": verdict, "problems": problems, "figures": figures,
            "scope": raw.get("scope")}


def run(argv: Sequence[str], log: Path, timeout_s: float,
        env: Mapping[str, str]) -> int | None:
    """The child's exit code, None when it ran past its timeout (its group is killed)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent,
                                env={**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1",
                                     **env}, start_new_session=True)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        finally:
            if proc.poll() is None:  # timed out or interrupted: its whole group goes
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def write_json(path: Path, value: Any) -> None:
    """Atomically: a killed run leaves the last complete summary."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(tmp, path)


def table(summary: Mapping[str, Any]) -> str:
    """One line per step: status, wall time, its first problem or figure or why."""
    lines = [f"{'step':<15} {'status':<8} {'wall':>6}  first problem / figure"]
    for name, row in summary["steps"].items():
        said = (row.get("problems") or row.get("figures")
                or [row.get("why") or row.get("scope") or ""])[0]
        wall = f"{row['wall_s']:.0f} s" if row.get("wall_s") is not None else ""
        lines.append(f"{name:<15} {row['status']:<8} {wall:>6}  {said}"[:118])
    lines.append(f"every report and log in {summary['out']}, summary.json beside them")
    return "\n".join(lines)


def visible_gpus() -> list[str]:
    """`nvidia-smi -L`'s GPU lines ([] without the tool or a driver)."""
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line for line in done.stdout.splitlines() if line.startswith("GPU ")]


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu_acceptance.py",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for every file")
    parser.add_argument("--budget", type=float, default=300.0, help="seconds, all steps")
    parser.add_argument("--only", default=None, help="comma-separated step names")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, tiny sizes")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    if not args.budget > 0:
        parser.error("--budget must be a number of seconds above 0")
    names = {s.name for s in plan(True, 1)}
    args.only = set(args.only.split(",")) if args.only else names
    if args.only - names:
        parser.error(f"--only: no step {sorted(args.only - names)}; the steps: "
                     f"{', '.join(sorted(names))}")
    return args


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM ends the run as Ctrl-C does: children killed, summary kept


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    started = time.monotonic()
    gpus = [] if args.dry_run else visible_gpus()
    if not args.dry_run and not gpus:
        print("gpu_acceptance.py: no NVIDIA GPU (nvidia-smi -L lists none); "
              "--dry-run runs the steps on the CPU", file=sys.stderr)
        return 2
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or "0"
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _interrupt)
    summary: dict[str, Any] = {"schema": SCHEMA, "mode": "dry-run" if args.dry_run else "gpu",
                               "gpus": gpus, "out": str(args.out), "budget_s": args.budget,
                               "complete": False, "steps": {}}
    try:
        for step in plan(args.dry_run, len(gpus), visible):
            left = args.budget - (time.monotonic() - started)
            why = step.skip or ("left out by --only" if step.name not in args.only else None)
            if why is None and left < MIN_STEP_S:
                why = f"the budget was spent ({left:.0f} s left)"
            if why is not None:
                summary["steps"][step.name] = {"status": "SKIP", "why": why}
                continue
            report, log = args.out / f"{step.name}.json", args.out / f"{step.name}.log"
            report.unlink(missing_ok=True)
            began = time.monotonic()
            rc = run(step.argv(report), log, min(step.timeout_s, left), step.env)
            row = {**judge(step.command, rc, report), "rc": rc,
                   "wall_s": round(time.monotonic() - began, 1), "report": str(report)}
            summary["steps"][step.name] = row
            print(f"{step.name}: {row['status']} in {row['wall_s']} s", flush=True)
            write_json(args.out / "summary.json", summary)
        summary["complete"] = True
    except KeyboardInterrupt:
        print("interrupted: the summary keeps the steps that ended", file=sys.stderr)
    write_json(args.out / "summary.json", summary)
    print(table(summary))
    statuses = [row["status"] for row in summary["steps"].values()]
    return 0 if summary["complete"] and all(s in PASSING for s in statuses) else 1


if __name__ == "__main__":
    sys.exit(main())
