"""GPU acceptance run: what only a real GPU can settle about gpucheck, in 5 minutes on
one H100 or H200, carried off the machine as two files.

    PYTHONPATH=. python3 benchmarks/gpu_acceptance.py --out DIR [--budget SECONDS]
        [--quick] [--runs N] [--skip STEP,...]
    PYTHONPATH=. python3 benchmarks/gpu_acceptance.py --out DIR --dry-run-cpu

Needs torch already installed (no install step) and an NVIDIA GPU; without one it exits
2 (use tests/ for GPU-less checks, or --dry-run-cpu: the same pipeline on CPU with gloo
and tiny sizes, a test of its structure that CI runs). Steps, most informative first,
so a run cut by --budget (default 300 s, never exceeded: every child's timeout is cut
to what is left, less a reserve for the archive) still answers the most:
- facts: nvidia-smi -L; torch, CUDA; the NCCL torch was built with and the one really
  loaded (its path from /proc/self/maps, `ncclGetVersion`); the cuBLAS loaded
  (`cublasGetProperty`); the topology classes of every GPU pair
  (`nvmlDeviceGetTopologyCommonAncestor`, P2P read status, NVLinks up);
- env: `gpucheck env` with real NVML; every WARN/FAIL listed (possible false alarms);
- nvml: the raw NVLink5 and bank-remap field values (215, 219-222, 235-250, 303, 304)
  on every GPU; an idle and a busy process on the GPU, NVML's per-process view of
  each (listed? samples since the window began?) and gpucheck hang's reading of them;
  power draw under the busy process's GEMM against the enforced and default limits;
- flight: a planted collective timeout with the Flight Recorder armed (one NCCL rank
  whose all_reduce waits behind a GPU sleep: the watchdog times it out and dumps),
  read back with `gpucheck hang --traces`;
- collectives: reduce_scatter, all_to_all and broadcast timed directly with torch;
- comm: `gpucheck comm` against a bare back-to-back loop, busbw ratio per size (on one
  GPU a figure, not a goal: a 1-rank collective measures host overhead per call);
- stress: `gpucheck stress`, with every GPU's clock-event mask sampled meanwhile;
- bench: `gpucheck bench` against a bare eager loop of the same model; images/s ratio;
- p2p: peer copies with the other ranks parked or not (SKIP on one GPU, with why);
- comm_wait, comm_default, shared: the blocking-wait table, default comm, gloo ranks
  sharing a GPU.
Goals: bench images/s per GPU / bare >= 0.95; comm busbw / bare >= 0.95 at 1 GiB and
>= 0.90 at 64 KiB with 2+ ranks; nvml: the busy process has a sample, the idle one is
listed with none; flight: a dump per rank, read back. The rest are figures.

--out DIR ends up holding summary.json (rewritten atomically after every step, so a
killed run keeps what was measured) and acceptance.tar.gz (every report, bare-loop
output, dump and log), nothing more. The last output is a one-screen table: each
step's verdict, goal and figure. Exit 0: no step failed, broke or timed out; 1: one
did, or the run was interrupted; 2: bad input or no GPU.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the helper module below
if str(ROOT) not in sys.path:  # gpucheck itself, for the steps that call it in-process
    sys.path.append(str(ROOT))
import acceptance_gpu as ag  # noqa: E402  (needs the line above: benchmarks/ is no package)
import acceptance_probes as ap  # noqa: E402

PROG = "gpu_acceptance.py"
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
GB = 1e9  # bandwidths in GB/s of 1e9 bytes, as gpucheck and nccl-tests report them
ELEMENT_BYTES = 4  # float32 buffers, as in gpucheck comm
IMAGE_PX = 224  # gpucheck bench's centre crop: the bare loop uses the same input shape
COLLECTIVES = ("all_reduce", "all_gather")
NEW_COLLECTIVES = ("reduce_scatter", "all_to_all", "broadcast")  # issue 22 item 9
# Most informative first, so a run cut by --budget still answers the most: what no CPU
# test can show (NVML's real answers, a real Flight Recorder dump, the new collectives)
# before the comparisons with bare loops; shared (likeliest refused or hung) comes last.
STEPS = ("env", "nvml", "flight", "collectives", "comm", "stress", "bench", "p2p",
         "comm_wait", "comm_default", "shared")
DEFAULT_BUDGET_S = 300.0  # 5 minutes on one H200, everything included
# Kept back from every step: a timed-out child's end (SIGTERM, 5 s, SIGKILL, 5 s), the
# archive and the summary.
RESERVE_S = 15.0
ARCHIVE = "acceptance"  # the work folder under --out, packed into acceptance.tar.gz
BENCH_GOAL = 0.95
COMM_GOALS = ((GIB, 0.95), (64 * KIB, 0.90))  # (size, goal): busbw ratio at that size
EXIT_OK, EXIT_GOALS, EXIT_USAGE = 0, 1, 2
SUMMARY_SCHEMA = "gpucheck-gpu-acceptance/1"


class ReportError(ValueError):
    """A gpucheck report lacks a section or field this script needs."""


# ---------------------------------------------------------------- pure: numbers


def human_size(size: int) -> str:
    """1024 -> "1 KiB", 65536 -> "64 KiB", 1 << 30 -> "1 GiB"."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def median_of(values: Iterable[float | None]) -> float | None:
    """Median of the values that were measured (None when none was)."""
    kept = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.median(kept) if kept else None


def safe_ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, None when either is missing or the denominator is not > 0."""
    if numerator is None or denominator is None or not denominator > 0:
        return None
    return numerator / denominator


def sweep_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of two from min_bytes to max_bytes, as `gpucheck comm --min/--max-bytes`."""
    sizes, size = [], max(min_bytes, ELEMENT_BYTES)
    while size <= max_bytes:
        sizes.append(size)
        size *= 2
    return sizes


def bus_factor(collective: str, world_size: int) -> float:
    """busbw / algbw, nccl-tests' definition (doc/PERFORMANCE.md); 1 for one rank."""
    if world_size <= 1:
        return 1.0
    if collective == "all_reduce":
        return 2 * (world_size - 1) / world_size
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (world_size - 1) / world_size
    if collective == "broadcast":
        return 1.0
    raise ValueError(f"unknown collective {collective!r}")


def bandwidths(collective: str, size_bytes: int, world_size: int,
               time_s: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s. `size_bytes` is each rank's buffer; all_gather's and
    reduce_scatter's data is the whole gathered (or reduced) array, as nccl-tests counts
    it; all_to_all's and broadcast's the buffer itself."""
    gathered = collective in ("all_gather", "reduce_scatter")
    data = size_bytes * world_size if gathered else size_bytes
    algbw = data / time_s / GB if time_s > 0 else 0.0
    return algbw, algbw * bus_factor(collective, world_size)


def goal_result(name: str, value: float | None, goal: float,
                figure_only: bool = False) -> dict[str, Any]:
    """One goal line: pass is None when the value was not measured, or when it is a
    figure to read rather than a goal to meet (`figure_only`)."""
    judged = None if value is None or figure_only else value >= goal
    return {"name": name, "value": None if value is None else round(value, 4),
            "goal": goal, "pass": judged, "figure_only": figure_only}


# ---------------------------------------------------------------- pure: reports


def find_section(report: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """The section called `name`; a ReportError naming the sections there are otherwise."""
    sections = report.get("sections")
    if not isinstance(sections, list):
        raise ReportError(f"{report.get('command', '?')} report has no 'sections' list")
    for section in sections:
        if isinstance(section, dict) and section.get("name") == name:
            return section
    names = ", ".join(str(s.get("name")) for s in sections if isinstance(s, dict))
    raise ReportError(f"{report.get('command', '?')} report has no section {name!r} "
                      f"(it has: {names or 'none'})")


def section_data(report: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    data = find_section(report, name).get("data")
    if not isinstance(data, dict):
        raise ReportError(f"section {name!r} has no 'data' object")
    return data


def need(mapping: Mapping[str, Any], key: str, where: str) -> Any:
    """mapping[key], or a ReportError that lists the fields there are."""
    if key not in mapping:
        raise ReportError(f"{where}: no field {key!r} (fields: {', '.join(map(str, mapping))})")
    return mapping[key]


def _is_size_rows(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(r, dict) and "size_bytes" in r for r in value)


def comm_busbw(report: Mapping[str, Any], collective: str) -> dict[int, float]:
    """{size_bytes: busbw GB/s} from a comm report's section for `collective`."""
    data = section_data(report, collective)
    rows = data.get("results")
    if not _is_size_rows(rows):
        # Field renamed? take the one list of per-size rows the section holds.
        rows = next((v for v in data.values() if _is_size_rows(v)), None)
    if rows is None:
        raise ReportError(f"section {collective!r} has no per-size rows (fields: "
                          f"{', '.join(data)})")
    out: dict[int, float] = {}
    for row in rows:
        key = next((k for k in ("busbw_gbps", "busbw_GBps", "busbw") if k in row), None)
        if key is None:
            raise ReportError(f"{collective} row has no busbw field (fields: {', '.join(row)})")
        value = row[key]
        if value is None:  # one rank: gpucheck prints no busbw; the bare loop's is algbw
            value = row["algbw_gbps"]
        out[int(row["size_bytes"])] = float(value)
    return out


def comm_world_size(report: Mapping[str, Any]) -> int:
    return int(need(section_data(report, "comm"), "world_size", "section 'comm'"))


BENCH_SETUP_FIELDS = ("model", "dtype", "batch_size", "warmup_iters", "timed_iters",
                      "channels_last", "device")


def bench_setup(report: Mapping[str, Any]) -> dict[str, Any]:
    """What the bare loop must copy: model, dtype, batch, iterations, memory format."""
    data = section_data(report, "bench")
    setup = {key: need(data, key, "section 'bench'") for key in BENCH_SETUP_FIELDS}
    setup["threads"] = data.get("threads_per_rank")
    setup["ranks"] = data.get("ranks")
    return setup


def bench_rank_rates(report: Mapping[str, Any]) -> list[float]:
    """Images/s of every rank, in rank order."""
    ranks = need(section_data(report, "timing"), "ranks", "section 'timing'")
    return [float(need(r, "images_per_s", "a timing rank row")) for r in ranks]


def flagged_findings(report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every WARN or FAIL finding: (section, check, status, subject, message)."""
    flagged = []
    for section in report.get("sections") or []:
        for finding in section.get("findings") or []:
            if finding.get("status") in ("WARN", "FAIL"):
                flagged.append({"section": section.get("name"),
                                **{k: finding.get(k) for k in
                                   ("check", "status", "subject", "message")}})
    return flagged


def report_summary(report: Mapping[str, Any]) -> dict[str, Any]:
    return {"verdict": report.get("verdict"), "flagged": flagged_findings(report)}


# ---------------------------------------------------------------- pure: aggregation


def pair_rows(ours: Mapping[int, float], bare: Mapping[int, float]) -> list[dict[str, Any]]:
    """One row per size measured by either side: both busbw values and their ratio."""
    return [{"size_bytes": size, "gpucheck_busbw_gbps": ours.get(size),
             "bare_busbw_gbps": bare.get(size),
             "ratio": safe_ratio(ours.get(size), bare.get(size))}
            for size in sorted(set(ours) | set(bare))]


def median_rows(runs: Sequence[Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Per size over the runs: the median of each side and the median per-pair ratio."""
    sizes = sorted({int(r["size_bytes"]) for rows in runs for r in rows})
    out = []
    for size in sizes:
        rows = [r for run in runs for r in run if int(r["size_bytes"]) == size]
        ratios = [r.get("ratio") for r in rows]
        out.append({"size_bytes": size, "size": human_size(size),
                    "gpucheck_busbw_gbps": median_of(r.get("gpucheck_busbw_gbps") for r in rows),
                    "bare_busbw_gbps": median_of(r.get("bare_busbw_gbps") for r in rows),
                    "ratio": median_of(ratios), "pairs": sum(v is not None for v in ratios)})
    return out


def bench_medians(pairs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Medians over the (gpucheck, bare) pairs, and both ways of forming the ratio."""
    ours = median_of(p.get("gpucheck_per_gpu_images_per_s") for p in pairs)
    bare = median_of(p.get("bare_images_per_s") for p in pairs)
    return {"gpucheck_per_gpu_images_per_s": ours, "bare_images_per_s": bare,
            "median_pair_ratio": median_of(p.get("ratio") for p in pairs),
            "ratio_of_medians": safe_ratio(ours, bare),
            "pairs": sum(p.get("ratio") is not None for p in pairs)}


def comm_goals(step: Mapping[str, Any] | None, goals: Sequence[tuple[int, float]],
               label: str, one_rank: bool = False) -> list[dict[str, Any]]:
    """A goal per collective and goal size from a comm step's median rows. With one
    rank they are figures, not goals: a 1-rank collective against a bare loop of it
    measures host overhead per call, not a link."""
    out = []
    medians = (step or {}).get("medians") or {}
    for collective in COLLECTIVES:
        rows = {r["size_bytes"]: r for r in medians.get(collective, [])}
        for size, goal in goals:
            value = (rows.get(size) or {}).get("ratio")
            out.append(goal_result(f"comm {collective} busbw / bare loop at "
                                   f"{human_size(size)} ({label})", value, goal, one_rank))
    return out


def run_label(backend: str, ranks: Any, dry_run: bool) -> str:
    """"nccl, 8 ranks": which run a goal's figure comes from."""
    count = f"{ranks} rank{'' if ranks == 1 else 's'}" if ranks is not None else "? ranks"
    return f"{backend}, {count}" + (", CPU dry run" if dry_run else "")


def all_goals(steps: Mapping[str, Any], comm_goal_sizes: Sequence[tuple[int, float]],
              backend: str, dry_run: bool) -> list[dict[str, Any]]:
    """The bench goal and the comm goals, from the steps' medians (None: not measured)."""
    bench = steps.get("bench") or {}
    bench_ranks = (bench.get("setup") or {}).get("ranks")
    comm_ranks = (steps.get("comm") or {}).get("world_size")
    # A dry run's ratios are gloo and a shared CPU: noise, shown as figures.
    return [goal_result("bench images/s per GPU / bare eager loop ("
                        f"{run_label(backend, bench_ranks, dry_run)})",
                        (bench.get("medians") or {}).get("median_pair_ratio"), BENCH_GOAL,
                        dry_run),
            *comm_goals(steps.get("comm"), comm_goal_sizes,
                        run_label(backend, comm_ranks, dry_run), comm_ranks == 1 or dry_run)]


def exit_status(exit_code: int | None, timed_out: bool) -> str:
    """ok, fail (gpucheck's FAIL verdict), refused (usage error), timeout or error."""
    if timed_out:
        return "timeout"
    return {0: "ok", 1: "fail", 2: "refused"}.get(exit_code if exit_code is not None else -1,
                                                 "error")


def first_visible_gpu(cuda_visible_devices: str | None) -> str:
    """The GPU to share: the first of CUDA_VISIBLE_DEVICES when set, else GPU 0."""
    if cuda_visible_devices and cuda_visible_devices.strip():
        return cuda_visible_devices.split(",")[0].strip()
    return "0"


def parse_skip(text: str | None) -> frozenset[str]:
    names = frozenset(s.strip() for s in (text or "").split(",") if s.strip())
    unknown = sorted(names - set(STEPS))
    if unknown:
        raise ValueError(f"--skip {','.join(unknown)}: unknown step; use {', '.join(STEPS)}")
    return names


def out_dir_problem(path: Path) -> str | None:
    """Why --out cannot hold the results (None when it can, or can be created)."""
    if path.exists() and not path.is_dir():
        return f"--out {path} is a file, not a folder"
    probe = path if path.exists() else next((p for p in path.parents if p.exists()), None)
    if probe is None or not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        return f"--out {path}: cannot write there"
    return None


def _cell(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


VERDICT_OF_STATUS = {"ok": "OK", "fail": "FAIL", "skipped": "SKIP", "refused": "REFUSED",
                     "timeout": "TIMEOUT", "error": "ERROR", "interrupted": "CUT",
                     "running": "CUT"}
TABLE_WIDTH = 118


def goal_verdict(goals: Sequence[Mapping[str, Any]]) -> str | None:
    """FAIL if any goal failed, PASS if every judged one passed, FIGURE when they are
    figures only, None when nothing was measured."""
    judged = [g["pass"] for g in goals if g.get("pass") is not None]
    if judged:
        return "PASS" if all(judged) else "FAIL"
    return "FIGURE" if any(g.get("value") is not None for g in goals) else None


def goals_cells(goals: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """(figure, goal) cells of a step from its goal lines."""
    figure = ", ".join(f"{_short(g['name'])} {_cell(g['value'])}" for g in goals)
    marks = sorted({f">={g['goal']}" for g in goals})
    figure_only = all(g.get("figure_only") for g in goals)
    return figure, ("figure only" if figure_only else " / ".join(marks))


def _short(name: str) -> str:
    """"comm all_reduce busbw / bare loop at 1 GiB (nccl, 1 rank)" -> "all_reduce 1 GiB"."""
    words = name.split(" (")[0].replace("busbw / bare loop at ", "").replace("comm ", "")
    return words.replace("bench images/s per GPU / bare eager loop", "img/s ratio")


def step_row(name: str, step: Mapping[str, Any]) -> tuple[str, str, str]:
    """(verdict, figure, goal) of one step for the closing table."""
    goals = step.get("goals") or []
    figure, goal = goals_cells(goals) if goals else (
        str(step.get("figure") or step.get("note") or ""), str(step.get("goal") or "-"))
    verdict = step.get("verdict") or (goal_verdict(goals) if goals else None)
    status = str(step.get("status", "?"))
    if verdict is None or status in ("timeout", "error", "interrupted", "running"):
        verdict = VERDICT_OF_STATUS.get(status, status.upper())
    return str(verdict), figure, goal


def format_table(summary: Mapping[str, Any]) -> str:
    """The closing one-screen summary: each step's verdict, figure and goal."""
    lines = [f"{'step':<13}{'verdict':<9}{'wall s':>7}  {'goal':<24}figure"]
    for name, step in summary.get("steps", {}).items():
        verdict, figure, goal = step_row(name, step)
        line = (f"{name:<13}{verdict:<9}{_cell(step.get('wall_s'), 1):>7}  "
                f"{goal[:23]:<24}{figure}")
        lines.append(line if len(line) <= TABLE_WIDTH else line[:TABLE_WIDTH - 3] + "...")
    errors = summary.get("errors", [])
    if errors:
        lines.append(f"{len(errors)} error(s); first: {str(errors[0])[:TABLE_WIDTH - 24]}")
    lines.append(f"{summary.get('mode', '?')} run, {summary.get('elapsed_s', '?')} s of "
                 f"--budget {summary.get('options', {}).get('budget_s', '?')} s; "
                 f"details: summary.json and {ARCHIVE}.tar.gz in {summary.get('out', '?')}")
    return "\n".join(lines)


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Plan:
    """What this invocation runs, settled from the options before anything starts."""

    out: Path
    dry_run: bool
    quick: bool
    runs: int
    skip: frozenset[str]
    budget_s: float
    device: str  # where gpucheck's ranks compute: cuda, or cpu for the dry run
    backend: str  # nccl, or gloo for the dry run
    comm_ranks: int  # filled in from the GPU count
    comm_max: int
    comm_iters: int = 20  # gpucheck comm's defaults, passed explicitly to both sides
    comm_warmup: int = 5
    comm_goals: tuple[tuple[int, float], ...] = COMM_GOALS
    bench_args: tuple[str, ...] = ()
    shared_comm_max: int = 16 * MIB  # gloo copies through the host: keep it short
    shared_bench_args: tuple[str, ...] = ("--warmup", "5", "--iters", "30")
    default_comm_args: tuple[str, ...] = ()
    stress_args: tuple[str, ...] = ("--duration", "20")
    shared_variants: tuple[str, ...] = ("comm", "bench", "comm_torchrun", "bench_torchrun")
    timeouts: dict[str, float] = field(default_factory=dict)
    load_s: float = 8.0  # the idle and busy processes' sampled window (nvml step)
    p2p_modes: tuple[str, ...] = ag.P2P_MODES
    dry_skip: tuple[str, ...] = ()  # steps the CPU dry run leaves out (DRY_SKIP says why)
    collective_sizes: tuple[int, ...] = (MIB, 64 * MIB, GIB)

    @property
    def work(self) -> Path:
        """Everything but summary.json is written here, then packed into one archive."""
        return self.out / ARCHIVE


GPU_TIMEOUTS = {"env": 120, "gpucheck": 180, "bare": 150, "shared": 120, "facts": 60,
                "probe": 90}
DRY_TIMEOUTS = {"env": 90, "gpucheck": 120, "bare": 90, "shared": 120, "facts": 60,
                "probe": 60}


def make_plan(args: argparse.Namespace, gpus: int) -> Plan:
    """The plan for a GPU run, or for the CPU dry run (gloo, tiny sizes)."""
    # One pair per ratio by default: five minutes hold one of each step on one GPU.
    runs = args.runs if args.runs is not None else 1
    common = {"out": Path(args.out), "quick": args.quick, "runs": runs,
              "skip": parse_skip(args.skip), "budget_s": args.budget}
    if args.dry_run_cpu:
        # One rank, as on the one-GPU machines the real run is for (and no rank spawning:
        # the dry run's time goes to the structure, not to starting torch again).
        return Plan(**common, dry_run=True, device="cpu", backend="gloo", comm_ranks=1,
                    comm_max=256 * KIB, comm_goals=((256 * KIB, 0.95), (64 * KIB, 0.90)),
                    # resnet18, one image a batch, tiny loops: the dry run checks the
                    # pipeline, not speed (the bare loop copies these settings)
                    bench_args=("--device", "cpu", "--n-gpus", "1", "--model", "resnet18",
                                "--batch-size", "1", "--warmup", "1", "--iters", "2"),
                    shared_comm_max=64 * KIB,
                    shared_bench_args=("--model", "resnet18", "--warmup", "1", "--iters",
                                       "2", "--batch-size", "2"),
                    default_comm_args=("--device", "cpu", "--max-bytes", "256K"),
                    stress_args=("--device", "cpu", "--n-gpus", "1", "--duration", "1",
                                 "--size", "256"),
                    # one variant: the structure, not every launch path, on 2 cores
                    shared_variants=("comm",), collective_sizes=(64 * KIB,),
                    p2p_modes=ag.P2P_MODES[:1], dry_skip=tuple(DRY_SKIP),
                    timeouts=DRY_TIMEOUTS)
    quick_bench = ("--warmup", "10", "--iters", "40") if args.quick else ()
    return Plan(**common, dry_run=False, device="cuda", backend="nccl", comm_ranks=gpus,
                comm_max=GIB, bench_args=quick_bench, timeouts=GPU_TIMEOUTS)


# ---------------------------------------------------------------- running things


def plan_notes(plan: Plan) -> list[str]:
    """What a reader of the summary must know to read its figures right."""
    notes = []
    if plan.dry_run:
        notes.append("CPU dry run: checks that the pipeline works end to end; its ratios come "
                     "from gloo on loopback and tiny loops on a shared CPU and are noise, "
                     "not evidence about gpucheck on a GPU")
    elif plan.comm_ranks == 1:
        notes.append("one GPU: comm runs one NCCL rank; all_reduce in place on one rank does "
                     "little or no device work, so its ratio compares per-call overhead, "
                     "while all_gather still copies the buffer (device memory bandwidth); "
                     "busbw = algbw for one rank on both sides; so these ratios are "
                     "figures, not goals")
        notes.append(f"one GPU: the p2p step is skipped ({ag.ONE_GPU_P2P}); stress has "
                     "one rank, so there is no spread across GPUs")
    if plan.dry_run:
        notes.append("CPU dry run: one gloo rank as on one GPU; NVML is absent (nvml step "
                     "and clock samples skipped); the planted timeout uses two gloo ranks "
                     "that dump themselves; steps that need a GPU or repeat another's "
                     "pipeline say SKIP: it checks the steps run, nothing about a GPU")
    return notes


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment, with the repository importable (no install step) and no colour."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update({"NO_COLOR": "1", "PYTHONUNBUFFERED": "1", **(extra or {})})
    return env


GPUCHECK_LINE = re.compile(r"^gpucheck \w+: ")  # "gpucheck comm: error: ..." and the like
EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception|Failed)\w*: \S")


def key_line(text: str) -> str | None:
    """The line that says why a run failed: gpucheck's own one-line message (also when
    torchrun wraps it in its failure banner), else the last exception line, else the
    last line with words in it."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for pattern in (GPUCHECK_LINE, EXCEPTION_LINE):
        found = [ln for ln in lines if pattern.search(ln)]
        if found:
            return found[-1][:500]
    worded = [ln for ln in lines if any(ch.isalpha() for ch in ln)]
    return worded[-1][:500] if worded else None


def last_line(path: Path) -> str | None:
    try:
        return key_line(path.read_text(errors="replace"))
    except OSError:
        return None


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """End the child we started and the ranks it spawned (its own process group)."""
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_command(argv: Sequence[str], log_path: Path, timeout_s: float,
                env: Mapping[str, str]) -> dict[str, Any]:
    """Run one subprocess with a timeout; its output goes to log_path."""
    started = time.perf_counter()
    code: int | None = None
    timed_out = False
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(list(argv), cwd=ROOT, env=dict(env), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=max(timeout_s, 1.0))
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if proc.poll() is None:  # timeout, Ctrl-C or SIGTERM: leave nothing behind
                _end_group(proc)
    status = exit_status(code, timed_out)
    return {"command": shlex.join(argv), "exit_code": code, "timed_out": timed_out,
            "timeout_s": round(timeout_s, 1), "wall_s": round(time.perf_counter() - started, 2),
            "status": status, "log": str(log_path),
            "message": None if status == "ok" else last_line(log_path)}


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ReportError(f"{path} was not written") from None
    except (OSError, ValueError) as exc:
        raise ReportError(f"{path} is not readable JSON: {exc}") from None


def write_json_atomic(path: Path, value: Any) -> None:
    """Write, then rename over: a reader (or a kill) never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1, default=str) + "\n")
    os.replace(tmp, path)


class Session:
    """The running acceptance: its plan, clock, summary and where things are written."""

    def __init__(self, plan: Plan, gpu: dict[str, Any]) -> None:
        self.plan = plan
        self.started = time.monotonic()
        self.logs = plan.work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.summary: dict[str, Any] = {
            "schema": SUMMARY_SCHEMA, "mode": "dry-run-cpu" if plan.dry_run else "gpu",
            "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "complete": False, "options": {"runs": plan.runs, "quick": plan.quick,
                                           "skip": sorted(plan.skip), "budget_s": plan.budget_s},
            "gpu": gpu, "notes": plan_notes(plan), "steps": {}, "goals": [], "wall_times": {},
            "errors": []}

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def remaining(self) -> float:
        return self.plan.budget_s - self.elapsed()

    def log(self, message: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {message}", flush=True)

    def error(self, message: str) -> None:
        self.summary["errors"].append(message)
        self.log(f"error: {message}")

    def save(self) -> None:
        goals = all_goals(self.summary["steps"], self.plan.comm_goals, self.plan.backend,
                          self.plan.dry_run)
        self.summary["goals"] = goals
        for name in ("comm", "bench"):  # each step also shows its own goals
            if name in self.summary["steps"]:
                self.summary["steps"][name]["goals"] = [
                    g for g in goals if g["name"].startswith(name + " ")]
        self.summary["elapsed_s"] = round(self.elapsed(), 1)
        write_json_atomic(self.plan.out / "summary.json", self.summary)

    def timeout(self, kind: str) -> float:
        """The step kind's timeout, cut to what is left of the budget (less the reserve
        for the archive and the summary)."""
        return max(1.0, min(self.plan.timeouts[kind], self.remaining() - RESERVE_S))

    def run(self, name: str, argv: Sequence[str], kind: str,
            extra_env: Mapping[str, str] | None = None) -> dict[str, Any]:
        result = run_command(argv, self.logs / f"{name}.log", self.timeout(kind),
                             child_env(extra_env))
        note = f" ({result['message']})" if result["message"] else ""
        self.log(f"  {name}: {result['status']} in {result['wall_s']:.1f} s{note}")
        return result


def gpucheck_argv(command: str, report: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "gpucheck", command, *args, "--quiet", "-o", str(report)]


def self_argv(mode: str, config: Mapping[str, Any], out: Path) -> list[str]:
    """This script in one of its internal modes (a fresh process: no shared CUDA state)."""
    return [sys.executable, str(Path(__file__).resolve()), mode, json.dumps(config), str(out)]


def fresh(path: Path) -> Path:
    """A report path with no stale file from an earlier run that could be misread."""
    path.unlink(missing_ok=True)
    return path


def with_report(s: Session, step: dict[str, Any], name: str, path: Path,
                parse: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any] | None:
    """Merge parse(report) into step; a missing report or field is recorded, not raised
    (and a run that left no usable report measured nothing: its status becomes error)."""
    try:
        figures = parse(read_json(path))
    except (ReportError, KeyError, TypeError, ValueError) as exc:
        step["report_error"] = str(exc)
        if step.get("status") in ("ok", "fail"):
            step["status"] = "error"
        s.error(f"{name}: {exc}")
        return None
    step.update(figures)
    return figures


STATUS_ORDER = ("ok", "fail", "refused", "timeout", "error")


def worst_status(statuses: Iterable[str]) -> str:
    """The least good of the statuses (ok < fail < refused < timeout < error)."""
    rank = {name: i for i, name in enumerate(STATUS_ORDER)}
    return max(statuses, key=lambda st: rank.get(st, len(STATUS_ORDER)), default="ok")


# ---------------------------------------------------------------- step: facts


def nvidia_smi_list(timeout_s: float = 20.0) -> dict[str, Any]:
    """`nvidia-smi -L`: the driver's own list of GPUs, independent of torch."""
    try:
        proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except FileNotFoundError:
        return {"ok": False, "error": "nvidia-smi is not on PATH"}
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"nvidia-smi -L did not answer in {timeout_s:g} s"}
    except OSError as exc:
        return {"ok": False, "error": str(exc)}
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    error = (proc.stderr.strip().splitlines() or [None])[-1] if proc.returncode else None
    return {"ok": proc.returncode == 0, "exit_code": proc.returncode, "lines": lines,
            "error": error}


def collect_facts(timeout_s: float) -> dict[str, Any]:
    """Machine facts, from nvidia-smi and from torch in a child process (CUDA stays out of
    this one, so it holds no GPU memory while the steps run)."""
    smi = nvidia_smi_list()
    with tempfile.TemporaryDirectory(prefix="gpu-acceptance-") as folder:
        out = Path(folder) / "facts.json"
        result = run_command(self_argv("_facts", {}, out), Path(folder) / "facts.log",
                             timeout_s, child_env())
        try:
            facts = read_json(out)
        except ReportError as exc:
            facts = {"error": result["message"] or str(exc), "count": 0}
    return {**facts, "nvidia_smi": smi, "topology": nvml_topology(),
            "facts_wall_s": result["wall_s"]}


def nvml_topology() -> dict[str, Any]:
    """The topology classes of the machine's GPUs (NVML in this process: no CUDA)."""
    nvml, why = ap.open_nvml()
    if nvml is None:
        return {"status": "skipped", "note": why}
    try:
        return {"status": "ok", **ap.topology_classes(nvml)}
    finally:
        nvml.nvmlShutdown()


def facts_note(facts: Mapping[str, Any], gpus: int) -> str:
    """The facts step's figure: GPUs, torch and CUDA, the NCCL and cuBLAS loaded."""
    libs = facts.get("libraries") or {}
    classes = (facts.get("topology") or {}).get("classes") or {}
    return (f"{gpus} GPU(s) {', '.join(sorted(set(facts.get('names') or []))) or 'none'}; "
            f"torch {facts.get('torch')} CUDA {facts.get('cuda')}; NCCL loaded "
            f"{libs.get('nccl_loaded') or '-'} (build {libs.get('nccl_build') or '-'}); "
            f"cuBLAS {libs.get('cublas_loaded') or '-'}; pairs {classes or '-'}")


def facts_worker(_config: Mapping[str, Any], out: Path) -> None:
    import torch

    facts: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__,
                             "cuda": torch.version.cuda,
                             "cuda_available": torch.cuda.is_available()}
    try:
        import torchvision

        facts["torchvision"] = torchvision.__version__
    except ImportError as exc:
        facts["torchvision"] = f"not importable: {exc}"
    count = torch.cuda.device_count() if facts["cuda_available"] else 0
    facts["count"] = count
    facts["names"] = [torch.cuda.get_device_name(i) for i in range(count)]
    facts["memory_gib"] = [round(torch.cuda.get_device_properties(i).total_memory / GIB, 1)
                           for i in range(count)]
    facts["bf16"] = bool(count and torch.cuda.is_bf16_supported())
    try:  # a fact, not a requirement: never fail the run over it
        import torch.cuda.nccl
        import torch.distributed as dist

        if count and dist.is_nccl_available():
            version = torch.cuda.nccl.version()
            facts["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else (
                str(version))
    except (ImportError, RuntimeError, AttributeError) as exc:
        facts["nccl"] = f"unknown: {exc}"
    facts["libraries"] = ap.loaded_libraries()  # the NCCL and cuBLAS really loaded
    if count:  # the GPU the one-GPU steps run on, for NVML (cuda:0 of this process)
        from gpucheck.devices import bus_id_of

        facts["bus_id"] = bus_id_of(torch.cuda.get_device_properties(0))
    write_json_atomic(out, facts)


def no_gpu_message(facts: Mapping[str, Any]) -> str:
    why = facts.get("error") or (f"torch {facts.get('torch')} (CUDA build "
                                 f"{facts.get('cuda')}) sees no GPU")
    smi = facts.get("nvidia_smi") or {}
    seen = f"; nvidia-smi: {smi.get('error') or len(smi.get('lines', []))} GPU line(s)"
    return (f"this script needs an NVIDIA GPU ({why}{seen}); use tests/ for GPU-less "
            "checks, or --dry-run-cpu to exercise the pipeline on CPU")


# ---------------------------------------------------------------- step: env


def step_env(s: Session, step: dict[str, Any]) -> None:
    report = fresh(s.plan.work / "env.json")
    result = s.run("env", gpucheck_argv("env", report), "env")
    step.update(result, report=str(report))
    with_report(s, step, "env", report, report_summary)
    flagged = step.get("flagged") or []
    for finding in flagged:
        s.log(f"    {finding['status']} {finding['check']} [{finding.get('subject') or '-'}]: "
              f"{finding['message']}")
    step["note"] = f"verdict {step.get('verdict')}, {len(flagged)} WARN/FAIL finding(s)"
    s.summary["wall_times"]["gpucheck env"] = result["wall_s"]


# ---------------------------------------------------------------- step: comm vs bare loop


def comm_argv(plan: Plan, report: Path) -> list[str]:
    return gpucheck_argv("comm", report, "--n-gpus", str(plan.comm_ranks), "--device",
                         plan.device, "--backend", plan.backend, "--min-bytes", str(KIB),
                         "--max-bytes", str(plan.comm_max), "--iters", str(plan.comm_iters),
                         "--warmup", str(plan.comm_warmup), "--no-pairwise")


def bare_comm_busbw(data: Mapping[str, Any], collective: str) -> dict[int, float]:
    rows = need(need(data, "results", "bare comm output"), collective, "bare comm results")
    return {int(r["size_bytes"]): float(r["busbw_gbps"]) for r in rows}


def interleave(index: int, first: Callable[[], Any], second: Callable[[], Any]) -> None:
    """Run a pair's sides back to back, swapping the order on every other pair so a
    drift in machine speed (clocks, heat) does not always favour the same side."""
    for side in (first, second) if index % 2 == 0 else (second, first):
        side()


# TORCH_NCCL_BLOCKING_WAIT for (gpucheck, the bare loop) in each comm step: `comm` runs
# gpucheck as it runs by default (off: NCCL's watchdog stays, so a timeout leaves a Flight
# Recorder dump) against nccl-tests' way (off), the goal; `comm_wait` both with it on,
# what blocking wait costs each side.
COMM_WAIT = {"comm": ("0", "0"), "comm_wait": ("1", "1")}


def sampled_run(s: Session, name: str, argv: Sequence[str], kind: str,
                extra_env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """s.run with every GPU's clock-event mask and SM clock sampled meanwhile."""
    with ag.ClockSampler() as sampler:
        result = s.run(name, argv, kind, extra_env)
    return {**result, "clocks": sampler.summary()}


def comm_pair(s: Session, index: int, name: str = "comm") -> dict[str, Any]:
    """One gpucheck comm run and one bare loop run, back to back; busbw ratio per size."""
    p = s.plan
    tag = "" if index == 0 else f".{index + 1}"
    report = fresh(p.work / f"{name}_{p.backend}{tag}.json")
    bare_out = fresh(p.work / f"bare_{name}_{p.backend}{tag}.json")
    config = {"backend": p.backend, "device": p.device, "world_size": p.comm_ranks,
              "sizes": sweep_sizes(KIB, p.comm_max), "collectives": list(COLLECTIVES),
              "iters": p.comm_iters, "warmup": p.comm_warmup, "timeout_s": 120}
    ours_wait, bare_wait = COMM_WAIT[name]
    pair: dict[str, Any] = {"gpucheck": {"report": str(report), "blocking_wait": ours_wait},
                            "bare": {"output": str(bare_out), "blocking_wait": bare_wait}}
    interleave(index,
               lambda: pair["gpucheck"].update(sampled_run(
                   s, f"{name}{tag or '.1'}.gpucheck", comm_argv(p, report), "gpucheck",
                   {"TORCH_NCCL_BLOCKING_WAIT": ours_wait})),
               lambda: pair["bare"].update(s.run(
                   f"{name}{tag or '.1'}.bare", self_argv("_bare-comm", config, bare_out),
                   "bare", {"TORCH_NCCL_BLOCKING_WAIT": bare_wait})))
    ours = with_report(s, pair["gpucheck"], "comm gpucheck", report, lambda r: {
        "verdict": r.get("verdict"), "world_size": comm_world_size(r),
        "busbw": {c: comm_busbw(r, c) for c in COLLECTIVES}})
    bare = with_report(s, pair["bare"], "comm bare loop", bare_out, lambda d: {
        "busbw": {c: bare_comm_busbw(d, c) for c in COLLECTIVES}})
    if ours and bare:
        pair["rows"] = {c: pair_rows(ours["busbw"][c], bare["busbw"][c]) for c in COLLECTIVES}
    for side in ("gpucheck", "bare"):
        pair[side].pop("busbw", None)  # the rows hold both sides' figures
    return pair


def log_comm_ratios(s: Session, rows: Mapping[str, Sequence[Mapping[str, Any]]],
                    prefix: str) -> None:
    for collective in COLLECTIVES:
        by_size = {r["size_bytes"]: r for r in rows.get(collective, [])}
        parts = [f"{human_size(size)} {_cell((by_size.get(size) or {}).get('ratio'))}"
                 for size, _ in s.plan.comm_goals]
        s.log(f"  {prefix} {collective} busbw gpucheck/bare: {', '.join(parts)}")


def step_comm(s: Session, step: dict[str, Any], name: str = "comm") -> None:
    p = s.plan
    ours_wait, bare_wait = COMM_WAIT[name]
    step.update(world_size=p.comm_ranks, backend=p.backend, device=p.device,
                sizes=f"{human_size(KIB)} .. {human_size(p.comm_max)}", iters=p.comm_iters,
                warmup=p.comm_warmup, blocking_wait={"gpucheck": ours_wait, "bare": bare_wait},
                runs=[], medians={})
    runs = p.runs if name == "comm" else min(p.runs, 2)  # comm_wait: context, not a goal
    for index in range(runs):
        if s.remaining() < 30:
            s.error(f"{name}: time budget spent after {index} pair(s)")
            break
        s.log(f"{name} pair {index + 1}/{runs} "
              f"({run_label(p.backend, p.comm_ranks, p.dry_run)}; blocking wait: gpucheck "
              f"{ours_wait}, bare {bare_wait})")
        pair = comm_pair(s, index, name)
        step["runs"].append(pair)
        if "rows" in pair:
            log_comm_ratios(s, pair["rows"], f"pair {index + 1}")
        done = [r["rows"] for r in step["runs"] if "rows" in r]
        step["medians"] = {c: median_rows([rows[c] for rows in done]) for c in COLLECTIVES}
        s.save()
    statuses = [r[side].get("status", "error") for r in step["runs"] for side in ("gpucheck",
                                                                                   "bare")]
    complete = sum("rows" in r for r in step["runs"])
    step["status"] = worst_status(statuses) if complete else (
        "error" if step["runs"] else "skipped")
    step["note"] = f"{complete}/{runs} pair(s) with ratios"
    log_comm_ratios(s, step["medians"], "median")


def step_comm_wait(s: Session, step: dict[str, Any]) -> None:
    """gpucheck and the bare loop, both with blocking wait on; then the four-way table."""
    step_comm(s, step, "comm_wait")
    s.summary["blocking_wait"] = blocking_wait_table(s.summary["steps"])


def blocking_wait_table(steps: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per collective and size, from the comm and comm_wait medians: gpucheck and the
    bare loop with TORCH_NCCL_BLOCKING_WAIT on and off, and the ratios that matter."""
    def rows(name: str, collective: str) -> dict[int, Mapping[str, Any]]:
        medians = (steps.get(name) or {}).get("medians") or {}
        return {r["size_bytes"]: r for r in medians.get(collective, [])}

    table: dict[str, list[dict[str, Any]]] = {}
    for collective in COLLECTIVES:
        off, on = rows("comm", collective), rows("comm_wait", collective)
        table[collective] = []
        for size in sorted(set(off) | set(on)):
            ours_off = (off.get(size) or {}).get("gpucheck_busbw_gbps")
            bare_off = (off.get(size) or {}).get("bare_busbw_gbps")
            ours_on = (on.get(size) or {}).get("gpucheck_busbw_gbps")
            bare_on = (on.get(size) or {}).get("bare_busbw_gbps")
            table[collective].append({
                "size": human_size(size), "size_bytes": size,
                "gpucheck_wait_on": ours_on, "gpucheck_wait_off": ours_off,
                "bare_wait_off": bare_off, "bare_wait_on": bare_on,
                "gpucheck_on_over_bare_off": safe_ratio(ours_on, bare_off),
                "gpucheck_off_over_bare_off": safe_ratio(ours_off, bare_off),
                "bare_on_over_bare_off": safe_ratio(bare_on, bare_off)})
    return table


# ---------------------------------------------------------------- step: stress, clocks


def stress_figures(report: Mapping[str, Any]) -> dict[str, Any]:
    """Verdict, flagged findings, spread across GPUs, and stress's own power reach (its
    draw under the GEMM over the enforced limit, per rank) where this gpucheck has it."""
    figures = {**report_summary(report), "spread": ag.spread_figures(report)}
    try:
        power = section_data(report, "gemm").get("power under load (W)")
    except ReportError:
        power = None
    figures["power_reach"] = [r.get("reach") for r in power or []] or None
    return figures


def step_stress(s: Session, step: dict[str, Any]) -> None:
    report = fresh(s.plan.work / "stress.json")
    result = sampled_run(s, "stress", gpucheck_argv("stress", report, *s.plan.stress_args),
                         "gpucheck")
    step.update(result, report=str(report))
    with_report(s, step, "stress", report, stress_figures)
    gemm = (step.get("spread") or {}).get("gemm_tflops") or {}
    spreads = ", ".join(f"{d} min/median {_cell(v.get('min_over_median'))}"
                        for d, v in gemm.items())
    clocks = step["clocks"].get("gpus") or {}
    hw = sum(g["hw_slowdown_samples"] for g in clocks.values())
    near = sum(g["hw_slowdown_at_transition"] for g in clocks.values())
    reach = step.get("power_reach")
    spreads += f"; power reach {reach}" if reach else ""
    step["note"] = (f"verdict {step.get('verdict')}; GEMM {spreads or '-'}; 0x8 in {hw} "
                    f"sample(s), {near} at a transition" if clocks else
                    f"verdict {step.get('verdict')}; GEMM {spreads or '-'}; clocks: "
                    f"{step['clocks'].get('note')}")
    s.summary["wall_times"]["gpucheck stress"] = result["wall_s"]


# ---------------------------------------------------------------- step: p2p parked or not


def p2p_run(s: Session, index: int, mode: str, world: int) -> dict[str, Any]:
    p = s.plan
    tag = "" if index == 0 else f".{index + 1}"
    out = fresh(p.work / f"p2p_{mode}{tag}.json")
    config = {"mode": mode, "world_size": world, "device": p.device, "backend": p.backend,
              "timeout_s": 120}
    run = {**s.run(f"p2p{tag or '.1'}.{mode}", self_argv("_p2p", config, out), "bare"),
           "mode": mode, "output": str(out)}
    if run["status"] == "ok":
        try:
            run.update(read_json(out))
        except ReportError as exc:
            run["status"] = "error"
            s.error(f"p2p {mode}: {exc}")
    return run


def step_p2p(s: Session, step: dict[str, Any]) -> None:
    p = s.plan
    if not p.dry_run and p.comm_ranks < 2:
        step.update(status="skipped", note=ag.ONE_GPU_P2P)
        return
    world = 2 if p.dry_run else p.comm_ranks
    step.update(world_size=world, runs=[], comparison=None)
    for index in range(p.runs):
        if s.remaining() < 30:
            s.error(f"p2p: time budget spent after {index} pair(s)")
            break
        modes = p.p2p_modes if index % 2 == 0 else p.p2p_modes[::-1]
        step["runs"] += [p2p_run(s, index, mode, world) for mode in modes]
        step["comparison"] = ag.p2p_comparison([r for r in step["runs"] if "pairs" in r])
        s.save()
    comparison = step["comparison"] or {}
    step["status"] = worst_status(r["status"] for r in step["runs"]) if step["runs"] else (
        "skipped")
    step["note"] = (f"{world} ranks; median pair parked / not parked "
                    f"{_cell(comparison.get('median_parked_over_not'))}; longest NVML call "
                    f"(ms) {comparison.get('nvml_max_call_ms')}")


# ---------------------------------------------------------------- step: bench vs bare loop


def bench_figures(report: Mapping[str, Any]) -> dict[str, Any]:
    rates = bench_rank_rates(report)
    return {"verdict": report.get("verdict"), "setup": bench_setup(report),
            "rank_images_per_s": [round(r, 2) for r in rates],
            "per_gpu_images_per_s": median_of(rates)}


def bench_pair(s: Session, index: int, setup: dict[str, Any] | None) -> dict[str, Any]:
    """One gpucheck bench run and one bare eager loop; the first pair runs gpucheck first,
    since the bare loop copies the settings gpucheck reports (dtype, batch, iterations)."""
    p = s.plan
    tag = "" if index == 0 else f".{index + 1}"
    report = fresh(p.work / f"bench_{p.backend}{tag}.json")
    bare_out = fresh(p.work / f"bare_bench{tag}.json")
    pair: dict[str, Any] = {"gpucheck": {"report": str(report)}, "bare": {"output": str(bare_out)}}

    def ours() -> None:
        pair["gpucheck"].update(s.run(f"bench{tag or '.1'}.gpucheck",
                                      gpucheck_argv("bench", report, *p.bench_args), "gpucheck"))
        with_report(s, pair["gpucheck"], "bench gpucheck", report, bench_figures)

    def bare() -> None:
        config = {**(setup or pair["gpucheck"].get("setup") or {}), "timeout_s": 120}
        if "model" not in config:
            pair["bare"].update(status="error", message="no settings to copy (gpucheck failed)")
            return
        pair["bare"].update(s.run(f"bench{tag or '.1'}.bare",
                                  self_argv("_bare-bench", config, bare_out), "bare"))
        with_report(s, pair["bare"], "bench bare loop", bare_out, lambda d: {
            "images_per_s": float(need(d, "images_per_s", "bare bench output"))})

    interleave(index, ours, bare)
    pair["gpucheck_per_gpu_images_per_s"] = pair["gpucheck"].get("per_gpu_images_per_s")
    pair["bare_images_per_s"] = pair["bare"].get("images_per_s")
    pair["ratio"] = safe_ratio(pair["gpucheck_per_gpu_images_per_s"], pair["bare_images_per_s"])
    return pair


def step_bench(s: Session, step: dict[str, Any]) -> None:
    p = s.plan
    step.update(runs=[], medians={})
    setup: dict[str, Any] | None = None
    for index in range(p.runs):
        if s.remaining() < 45:
            s.error(f"bench: time budget spent after {index} pair(s)")
            break
        s.log(f"bench pair {index + 1}/{p.runs}")
        pair = bench_pair(s, index, setup)
        setup = setup or pair["gpucheck"].get("setup")
        step["runs"].append(pair)
        step["setup"] = setup
        step["medians"] = bench_medians(step["runs"])
        s.log(f"  pair {index + 1}: gpucheck {_cell(pair['gpucheck_per_gpu_images_per_s'], 1)} "
              f"images/s per GPU, bare {_cell(pair['bare_images_per_s'], 1)}, ratio "
              f"{_cell(pair['ratio'])}")
        s.save()
        if setup is None:
            s.error("bench: the first gpucheck run gave no settings; no more pairs")
            break
    statuses = [r[side].get("status", "error") for r in step["runs"] for side in ("gpucheck",
                                                                                   "bare")]
    medians = step["medians"]
    step["status"] = worst_status(statuses) if medians.get("pairs") else (
        "error" if step["runs"] else "skipped")
    step["note"] = (f"{medians.get('pairs', 0)}/{p.runs} pair(s), median ratio "
                    f"{_cell(medians.get('median_pair_ratio'))}")


# ---------------------------------------------------------------- step: gloo, shared GPU


def torchrun_argv(command: str, report: Path, *args: str) -> list[str]:
    """The same command with 2 ranks started by torchrun (torch's own launcher)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", "2", "-m", "gpucheck", command, *args, "--quiet", "-o",
            str(report)]


def shared_figures(report: Mapping[str, Any]) -> dict[str, Any]:
    """Who ran where and how fast: enough to see both ranks on the one GPU."""
    figures: dict[str, Any] = {**report_summary(report)}
    if report.get("command") == "comm":
        ranks = need(section_data(report, "comm"), "ranks", "section 'comm'")
        figures["rank_devices"] = [r.get("device") for r in ranks]
        busbw = comm_busbw(report, "all_reduce")
        top = max(busbw) if busbw else None
        figures["all_reduce_busbw_gbps_at_largest"] = {"size": top and human_size(top),
                                                       "busbw_gbps": busbw.get(top)}
    else:
        timing = section_data(report, "timing")
        figures["rank_images_per_s"] = [round(r, 2) for r in bench_rank_rates(report)]
        figures["rank_devices"] = [r.get("device") for r in timing.get("rank_details") or []]
    return figures


def shared_variants(p: Plan) -> list[tuple[str, str, list[str]]]:
    """(name, report file, argv): comm and bench, 2 gloo ranks, direct and under torchrun."""
    # --timeout 60: a rank that cannot start (no device for it) ends the run sooner.
    launch = ("--backend", "gloo", "--device", p.device, "--timeout", "60")
    comm = (*launch, "--max-bytes", str(p.shared_comm_max))
    bench = (*launch, *p.shared_bench_args)
    out = p.work
    return [
        ("comm", "shared_gloo_comm.json",
         gpucheck_argv("comm", out / "shared_gloo_comm.json", "--n-gpus", "2", *comm)),
        ("bench", "shared_gloo_bench.json",
         gpucheck_argv("bench", out / "shared_gloo_bench.json", "--n-gpus", "2", *bench)),
        ("comm_torchrun", "shared_gloo_comm_torchrun.json",
         torchrun_argv("comm", out / "shared_gloo_comm_torchrun.json", *comm)),
        ("bench_torchrun", "shared_gloo_bench_torchrun.json",
         torchrun_argv("bench", out / "shared_gloo_bench_torchrun.json", *bench)),
    ]


def step_shared(s: Session, step: dict[str, Any]) -> None:
    p = s.plan
    gpu = None if p.dry_run else first_visible_gpu(os.environ.get("CUDA_VISIBLE_DEVICES"))
    extra = {"CUDA_VISIBLE_DEVICES": gpu} if gpu is not None else {}
    step.update(ranks=2, backend="gloo", device=p.device,
                shared_gpu=gpu if gpu is not None else "none (CPU dry run)", variants={})
    for name, file, argv in shared_variants(p):
        if name not in p.shared_variants:
            continue
        if s.remaining() < 30:
            s.error(f"shared: time budget spent before {name}")
            break
        fresh(p.work / file)
        variant = {**s.run(f"shared.{name}", argv, "shared", extra), "report": str(p.work / file)}
        if variant["status"] in ("ok", "fail"):
            with_report(s, variant, f"shared {name}", p.work / file, shared_figures)
        elif variant["status"] == "refused":
            s.log(f"    gpucheck refused: {variant['message']}")
        step["variants"][name] = variant
        s.save()
    statuses = {name: v["status"] for name, v in step["variants"].items()}
    step["status"] = worst_status(statuses.values())
    step["note"] = ", ".join(f"{name} {status}" for name, status in statuses.items())


# ---------------------------------------------------------------- step: comm defaults


def step_comm_default(s: Session, step: dict[str, Any]) -> None:
    p = s.plan
    report = fresh(p.work / "comm_default.json")
    result = s.run("comm_default", gpucheck_argv("comm", report, *p.default_comm_args),
                   "gpucheck")
    step.update(result, report=str(report))
    with_report(s, step, "comm_default", report, lambda r: {
        **report_summary(r), "world_size": comm_world_size(r),
        "sizes": section_data(r, "comm").get("sizes")})
    step["note"] = f"verdict {step.get('verdict')}, {step.get('sizes')}"
    s.summary["wall_times"]["gpucheck comm (defaults)"] = result["wall_s"]


# ---------------------------------------------------------------- step: nvml (raw answers)


def nvml_handle(nvml: Any, facts: Mapping[str, Any]) -> Any:
    """NVML's handle of the GPU this script's children use (cuda:0), by PCI bus id."""
    bus_id = facts.get("bus_id")
    if bus_id:
        try:
            return nvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        except Exception:  # an id NVML does not know: fall back to its first GPU
            pass
    return nvml.nvmlDeviceGetHandleByIndex(0)


def step_nvml(s: Session, step: dict[str, Any]) -> None:
    """NVLink5 and bank-remap fields on every GPU; per-process utilisation of an idle and
    a busy process; power draw under the busy process's GEMM against the limit."""
    nvml, why = ap.open_nvml()
    if nvml is None:
        step.update(status="skipped", verdict="SKIP", figure=why, goal="needs NVML")
        return
    try:
        count = int(nvml.nvmlDeviceGetCount())
        step["fields"] = {str(i): ap.field_readings(nvml, nvml.nvmlDeviceGetHandleByIndex(i))
                          for i in range(count)}
        step["fields_summary"] = {i: ap.fields_summary(r) for i, r in step["fields"].items()}
        load_processes(s, step, nvml, nvml_handle(nvml, s.summary["gpu"]))
    finally:
        nvml.nvmlShutdown()
    verdict, figure = ap.process_verdict(step.get("processes") or {})
    power = step.get("power") or {}
    fields = step["fields_summary"].get("0") or {}
    step.update(status="ok" if verdict == "PASS" else "fail", verdict=verdict,
                goal="busy>0%, idle at 0%",
                figure=f"{figure}; power max {_cell(power.get('max_over_limit'))} of the "
                       f"{_cell(power.get('limit_w'), 0)} W limit; fields read "
                       f"{fields.get('read')}/{len(ap.FIELD_IDS)}")


def load_processes(s: Session, step: dict[str, Any], nvml: Any, handle: Any) -> None:
    """Start an idle and a busy process on the GPU, sample NVML while both run."""
    seconds = s.plan.load_s
    procs: dict[str, subprocess.Popen[bytes]] = {}
    ready = {m: s.plan.work / f"load_{m}.ready" for m in ("idle", "busy")}
    try:
        for mode, flag in ready.items():
            flag.unlink(missing_ok=True)
            log = open(s.logs / f"nvml.{mode}.log", "wb")  # noqa: SIM115 (the child's)
            procs[mode] = subprocess.Popen(
                self_argv("_load", {"mode": mode, "seconds": seconds + 60}, flag), cwd=ROOT,
                env=child_env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            log.close()
        deadline = time.monotonic() + max(s.timeout("probe") - seconds, 1.0)
        while not all(f.exists() for f in ready.values()) and time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs.values()):
                break
            time.sleep(0.2)
        if not all(f.exists() for f in ready.values()):
            s.error("nvml: the idle and busy processes did not start (see logs/nvml.*.log)")
            return
        samples = [ap.power_sample(nvml, handle)]
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(0.25)
            samples.append(ap.power_sample(nvml, handle))
        pids = {m: p.pid for m, p in procs.items()}
        step["processes"] = ap.process_view(nvml, handle, pids, seconds)
        step["power"] = ap.power_figures(samples)
        step["gpucheck_hang_view"] = gpucheck_process_view(pids)
    finally:
        for proc in procs.values():
            _end_group(proc)
        for flag in ready.values():
            flag.unlink(missing_ok=True)


def gpucheck_process_view(pids: Mapping[str, int]) -> dict[str, Any]:
    """What `gpucheck hang`'s NVML reader makes of the same two processes (its idle
    rank must read 0 %, not unknown: issue 22 item 2)."""
    from gpucheck.hang.gpu import per_process

    found, why = per_process(pids.values())
    return {"why": why, **{m: found.get(pid) for m, pid in pids.items()}}


# ---------------------------------------------------------------- step: flight recorder


FLIGHT_PREFIX = "planted_rank_"


def flight_env(prefix: str) -> dict[str, str]:
    """The Flight Recorder armed, and NCCL's watchdog present (blocking wait off)."""
    return {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": prefix,
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix, "TORCH_NCCL_BLOCKING_WAIT": "0"}


def step_flight(s: Session, step: dict[str, Any]) -> None:
    """A planted collective timeout; its dumps read back with `gpucheck hang --traces`."""
    p = s.plan
    folder = p.work / "flight"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    prefix = str(folder / FLIGHT_PREFIX)
    config = {"device": p.device, "timeout_s": 5 if p.device == "cuda" else 3,
              "sleep_cycles": 60_000_000_000, "prefix": prefix,
              "store": str(folder / "store")}
    planted = s.run("flight.planted", self_argv("_planted", config, folder / "planted.json"),
                    "probe", flight_env(prefix))
    (folder / "store").unlink(missing_ok=True)
    dumps = sorted(f.name for f in folder.glob(FLIGHT_PREFIX + "*"))
    step.update(planted=planted, dumps=dumps, goal="dump per rank, read")
    if not dumps:
        step.update(status="fail", verdict="FAIL", figure=f"no dump written (planted run "
                    f"{planted['status']}: {planted.get('message')})")
        return
    report = fresh(p.work / "hang_traces.json")
    step["hang"] = s.run("flight.hang", gpucheck_argv("hang", report, "--traces",
                                                      str(folder), "--prefix", FLIGHT_PREFIX),
                         "env")
    with_report(s, step["hang"], "flight hang", report, lambda r: {
        **report_summary(r), "ranks_dumped": section_data(r, "traces").get("ranks_dumped")})
    read = step["hang"].get("ranks_dumped") or []
    good = bool(read) and len(read) == len(dumps)
    named = sorted({f["subject"] for f in step["hang"].get("flagged") or [] if f["subject"]})
    step.update(status="ok" if good else "fail", verdict="PASS" if good else "FAIL",
                figure=f"{len(dumps)} dump(s) written, ranks {read} read back by gpucheck "
                       f"hang: {step['hang'].get('verdict')}, naming {named or 'no rank'}")


# ---------------------------------------------------------------- step: new collectives


def step_collectives(s: Session, step: dict[str, Any]) -> None:
    """reduce_scatter, all_to_all and broadcast timed directly with torch (the bare loop),
    and which of them `gpucheck comm` runs itself."""
    p = s.plan
    world = p.comm_ranks if not p.dry_run else 1  # the dry run: as on one GPU
    out = fresh(p.work / "collectives.json")
    config = {"backend": p.backend, "device": p.device, "world_size": world,
              "sizes": list(p.collective_sizes), "collectives": list(NEW_COLLECTIVES),
              "iters": p.comm_iters, "warmup": p.comm_warmup, "timeout_s": 60}
    step.update(s.run("collectives", self_argv("_bare-comm", config, out), "bare"),
                world_size=world)
    with_report(s, step, "collectives", out, lambda d: {"results": d["results"]})
    from gpucheck.comm import aggregate

    step["in_gpucheck_comm"] = [c for c in NEW_COLLECTIVES if c in aggregate.COLLECTIVES]
    largest = {c: max(rows, key=lambda r: r["size_bytes"])
               for c, rows in (step.get("results") or {}).items() if rows}
    step["figure"] = ", ".join(f"{c} {human_size(r['size_bytes'])} {r['busbw_gbps']:.3g} "
                               "GB/s" for c, r in largest.items()) or "-"
    step["goal"] = "figure" if world == 1 else "figure (no bar yet)"
    if step.get("status") == "ok":
        step["verdict"] = "FIGURE"


STEP_FUNCTIONS: dict[str, Callable[[Session, dict[str, Any]], None]] = {
    "env": step_env, "nvml": step_nvml, "flight": step_flight,
    "collectives": step_collectives, "comm": step_comm, "bench": step_bench, "stress": step_stress,
    "p2p": step_p2p, "comm_wait": step_comm_wait, "comm_default": step_comm_default,
    "shared": step_shared}
MIN_STEP_S = 20.0  # do not start a step with less of the budget left than this
# The dry run checks the structure in under 3 minutes on a shared 2-core VM: steps
# whose pipeline another step already runs are left out of it.
DRY_SKIP = {"comm_wait": "dry run: the comm step's pipeline with another blocking wait",
            "comm_default": "dry run: the comm step's pipeline with default sizes",
            "p2p": "dry run: needs 2+ GPUs (its ranks are tested on gloo in "
                   "tests/test_gpu_acceptance_steps.py)",
            "shared": "dry run: no GPU to share (gloo ranks on CPU share nothing)"}


def run_steps(s: Session) -> None:
    for name in STEPS:
        if name in s.plan.skip or name in s.plan.dry_skip:
            s.summary["steps"][name] = {"status": "skipped", "note": DRY_SKIP.get(
                name, "--skip") if name not in s.plan.skip else "--skip"}
            s.save()
            continue
        if s.remaining() - RESERVE_S < MIN_STEP_S:
            s.summary["steps"][name] = {"status": "skipped", "note": "time budget spent"}
            s.error(f"{name}: not run, the --budget of {s.plan.budget_s:g} s is spent")
            s.save()
            continue
        s.log(f"step {name}")
        step = s.summary["steps"][name] = {"status": "running"}
        started = time.monotonic()
        try:
            STEP_FUNCTIONS[name](s, step)
        except Exception as exc:  # a bug here must not cost the remaining steps
            step["status"] = "error"
            s.error(f"{name}: internal error {type(exc).__name__}: {exc}")
        except BaseException:  # Ctrl-C, SIGTERM: main records it and writes the summary
            step["status"] = "interrupted"
            raise
        finally:
            step["wall_s"] = round(time.monotonic() - started, 2)
            s.save()


# ---------------------------------------------------------------- bare loops (own processes)


def _time_back_to_back(op: Callable[[], Any], iters: int, warmup: int, cuda: bool) -> float:
    """Seconds per op. CUDA: event, `iters` async ops back to back, wait the last, event.
    gloo runs async ops on several threads, so on CPU each op is waited for."""
    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        op().wait()
    if not cuda:
        dist.barrier()
        began = time.perf_counter()
        for _ in range(iters):
            op().wait()
        return (time.perf_counter() - began) / iters
    torch.cuda.synchronize()
    dist.barrier(device_ids=[torch.cuda.current_device()])
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    work = None
    for _ in range(iters):
        work = op()
    work.wait()  # the current stream waits for the NCCL stream: no host sync in between
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000 / iters


def _bare_size(collective: str, size: int, config: Mapping[str, Any]) -> dict[str, Any]:
    """One size: time on this rank, then the slowest rank's time (as gpucheck reports)."""
    import torch
    import torch.distributed as dist

    world, cuda = dist.get_world_size(), config["device"] == "cuda"
    where = "cuda" if cuda else "cpu"
    count = max(size // ELEMENT_BYTES, 1)
    op = _collective_op(collective, count, world, where)
    mine = _time_back_to_back(op, int(config["iters"]), int(config["warmup"]), cuda)
    slowest = torch.tensor([mine], dtype=torch.float64, device=where)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    time_s = float(slowest.item())
    algbw, busbw = bandwidths(collective, size, world, time_s)
    return {"size_bytes": size, "time_us": round(time_s * 1e6, 2), "algbw_gbps": algbw,
            "busbw_gbps": busbw}


def _collective_op(collective: str, count: int, world: int,
                   where: str) -> Callable[[], Any]:
    """One async call of `collective` on `count` float32 elements per rank."""
    import torch
    import torch.distributed as dist

    buf = torch.zeros(count, dtype=torch.float32, device=where)
    whole = torch.zeros(count * world, dtype=torch.float32, device=where)
    if collective == "all_reduce":
        return lambda: dist.all_reduce(buf, async_op=True)
    if collective == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(whole, buf, async_op=True)  # all_gather_single: torch 2.14
    if collective == "reduce_scatter":  # reduce_scatter_single: torch 2.14's new name
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(buf, whole, async_op=True)
    if collective == "all_to_all":
        chunks = max(count // world, 1) * world
        send = torch.zeros(chunks, dtype=torch.float32, device=where)
        recv = torch.zeros(chunks, dtype=torch.float32, device=where)
        return lambda: dist.all_to_all_single(recv, send, async_op=True)
    if collective == "broadcast":
        return lambda: dist.broadcast(buf, src=0, async_op=True)
    raise ValueError(f"unknown collective {collective!r}")


def _bare_comm_rank(rank: int, config: dict[str, Any], store_path: str, out: str) -> None:
    """One rank of the bare loop: its own process group on a FileStore (no port, no
    torchrun), every size of every collective, rank 0 writes the results."""
    import torch
    import torch.distributed as dist

    world, cuda = int(config["world_size"]), config["device"] == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group(config["backend"], store=dist.FileStore(store_path, world),
                            rank=rank, world_size=world,
                            timeout=_dt.timedelta(seconds=float(config["timeout_s"])))
    try:
        results = {c: [_bare_size(c, int(size), config) for size in config["sizes"]]
                   for c in config["collectives"]}
    finally:
        dist.destroy_process_group()
    if rank == 0:
        write_json_atomic(Path(out), {**{k: config[k] for k in ("backend", "device",
                                                               "world_size", "iters",
                                                               "warmup")},
                                      "results": results})


def bare_comm_main(config: dict[str, Any], out: Path) -> None:
    import shutil

    folder = tempfile.mkdtemp(prefix="gpu-acceptance-store-")
    try:
        store_path = os.path.join(folder, "store")
        if int(config["world_size"]) == 1:
            _bare_comm_rank(0, config, store_path, str(out))
        else:
            import torch.multiprocessing as mp

            mp.spawn(_bare_comm_rank, args=(config, store_path, str(out)),
                     nprocs=int(config["world_size"]), join=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def bare_bench_main(config: dict[str, Any], out: Path) -> None:
    """The model alone: same model, dtype, memory format, batch and iterations as gpucheck
    reported, random weights and input, inference mode, a synchronise before each clock."""
    import torch
    import torchvision

    cuda = config["device"] == "cuda"
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if not cuda and config.get("threads"):
        torch.set_num_threads(int(config["threads"]))
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[
        config["dtype"]]
    fmt = torch.channels_last if config["channels_last"] else torch.contiguous_format
    torch.manual_seed(0)
    model = torchvision.models.get_model(config["model"], weights=None).eval()
    model = model.to(device=device, dtype=dtype, memory_format=fmt)
    batch = torch.randn(int(config["batch_size"]), 3, IMAGE_PX, IMAGE_PX).to(
        device=device, dtype=dtype, memory_format=fmt)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    iters = int(config["timed_iters"])
    with torch.inference_mode():
        for _ in range(int(config["warmup_iters"])):
            model(batch)
        sync()
        started = time.perf_counter()
        for _ in range(iters):
            model(batch)
        sync()
        elapsed = time.perf_counter() - started
    write_json_atomic(out, {**config, "elapsed_s": elapsed, "threads": torch.get_num_threads(),
                            "images_per_s": int(config["batch_size"]) * iters / elapsed})


INTERNAL_MODES: dict[str, Callable[[dict[str, Any], Path], None]] = {
    "_facts": facts_worker, "_bare-comm": bare_comm_main, "_bare-bench": bare_bench_main,
    "_p2p": ag.p2p_main, "_load": ap.load_main, "_planted": ap.planted_main}


# ---------------------------------------------------------------- command line


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive(kind: type) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text!r}: give a positive number")
        return value
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="folder for summary.json, the reports and logs/ (created)")
    parser.add_argument("--quick", action="store_true",
                        help="a first look: shorter bench loops")
    parser.add_argument("--runs", type=_positive(int), default=None, metavar="N",
                        help="(gpucheck, bare loop) pairs per ratio; medians are taken "
                             "(default: 1; give a longer --budget with more)")
    parser.add_argument("--skip", default=None, metavar="STEP,...",
                        help=f"steps to leave out: {', '.join(STEPS)}")
    parser.add_argument("--budget", type=_positive(float), default=DEFAULT_BUDGET_S,
                        metavar="SECONDS",
                        help="the whole run ends within this long, archive included "
                             f"(default: {DEFAULT_BUDGET_S:g}); steps that do not fit are "
                             "SKIP")
    parser.add_argument("--dry-run-cpu", action="store_true",
                        help="no GPU needed: the same pipeline on CPU with gloo, tiny sizes")
    return parser


def usage_error(message: str) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_USAGE)


class Terminated(BaseException):
    """SIGTERM: stop, end the children, keep what was measured. A BaseException, like
    KeyboardInterrupt, so a step's own `except Exception` cannot swallow it."""


def _on_sigterm(_signum: int, _frame: Any) -> None:
    raise Terminated()


def start_session(args: argparse.Namespace, started: float) -> Session:
    """Validate, collect the facts, refuse a GPU-less machine (unless --dry-run-cpu)."""
    problem = out_dir_problem(Path(args.out))
    if problem:
        usage_error(problem)
    try:
        parse_skip(args.skip)
    except ValueError as exc:
        usage_error(str(exc))
    print("collecting machine facts (nvidia-smi -L, torch)", flush=True)
    limit = DRY_TIMEOUTS["facts"] if args.dry_run_cpu else GPU_TIMEOUTS["facts"]
    facts = collect_facts(min(limit, max(args.budget - 2 * RESERVE_S, 5.0)))
    gpus = int(facts.get("count") or 0)
    if gpus == 0 and not args.dry_run_cpu:
        usage_error(no_gpu_message(facts))
    plan = make_plan(args, gpus)
    plan.out.mkdir(parents=True, exist_ok=True)
    session = Session(plan, facts)
    session.started = started
    session.summary["steps"]["facts"] = {
        "status": "error" if "error" in facts else "ok", "wall_s": facts.get("facts_wall_s"),
        "figure": facts_note(facts, gpus), "goal": "recorded"}
    session.log(session.summary["steps"]["facts"]["figure"])
    session.save()
    return session


def pack(plan: Plan) -> Path | None:
    """Everything but summary.json into one acceptance.tar.gz (written, then renamed over),
    and the work folder removed: --out holds the two files and nothing more."""
    if not plan.work.exists():
        return None
    archive = plan.out / f"{ARCHIVE}.tar.gz"
    partial = archive.with_name(f".{archive.name}.tmp")
    with tarfile.open(partial, "w:gz") as tar:
        tar.add(plan.work, arcname=ARCHIVE)
    os.replace(partial, archive)
    shutil.rmtree(plan.work, ignore_errors=True)
    return archive


def finish(s: Session) -> int:
    """Save the final summary, pack the rest, print the table last; 0 when every measured
    goal passed and no step failed, timed out or broke."""
    s.summary["complete"] = not any(e.startswith(("interrupted", "terminated"))
                                    for e in s.summary["errors"])
    s.summary["out"] = str(s.plan.out)
    s.save()
    try:
        s.summary["archive"] = str(pack(s.plan))
    except OSError as exc:  # a full disk: summary.json still says what was measured
        s.error(f"archive not written: {exc}")
    s.save()
    verdicts = [step_row(name, step)[0] for name, step in s.summary["steps"].items()]
    print("\n" + format_table(s.summary), flush=True)
    failed = any(v in ("FAIL", "TIMEOUT", "ERROR") for v in verdicts)
    return EXIT_GOALS if failed or not s.summary["complete"] else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in INTERNAL_MODES:
        INTERNAL_MODES[argv[0]](json.loads(argv[1]), Path(argv[2]))
        return EXIT_OK
    started = time.monotonic()
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    session = start_session(args, started)
    try:
        run_steps(session)
    except KeyboardInterrupt:
        session.error("interrupted (Ctrl-C); the summary holds what was measured")
    except Terminated:
        session.error("terminated (SIGTERM); the summary holds what was measured")
    return finish(session)


if __name__ == "__main__":
    sys.exit(main())
