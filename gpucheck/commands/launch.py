"""The launch options bench, comm, stress, all and preflight share, checked before any
rank starts; a rank job run to its report (a failed one too); `--baseline FILE`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpucheck.commands.options import Options, opt, port, positive_float, positive_int
from gpucheck.context import RunContext
from gpucheck.errors import UsageError
from gpucheck.report import Finding, Report, Section, ok, warn

DEFAULT_CPU_RANKS = 2
DEFAULT_TIMEOUT_S = 120.0
# A self-launched rank imports torch (~0.3 GB, semaphores, a port): beyond 4 per core
# (or one per GPU) a run measures the scheduler; 10**30 ranks hung the launcher.
RANKS_PER_CORE = 4
MIN_RANK_LIMIT = 8
CPU_SCOPE = "CPU ranks, no GPU: every figure measures this host's CPU cores and loopback, " \
    "not a GPU"


@dataclass(frozen=True)
class LaunchOptions(Options):
    n_gpus: int | None = opt(
        "--n-gpus", "--nproc", group="launch", type=positive_int, metavar="N",
        help=f"ranks to run on this node (default: every visible GPU; {DEFAULT_CPU_RANKS} "
        "CPU ranks when there is none)")
    device: str | None = opt("--device", group="launch", choices=("cuda", "cpu"),
                             help="where ranks compute (default: cuda when a GPU is visible)")
    backend: str | None = opt("--backend", group="launch", help="torch.distributed backend "
                              "(default: nccl on cuda, gloo on cpu)")
    master_port: int | None = opt("--master-port", group="launch", type=port, metavar="PORT",
                                  help="rendezvous port for self-launched ranks (default: a "
                                  "free port)")
    # dest differs from fleet's own --baseline, which fleet applies itself.
    load_baseline: str | None = opt("--baseline", group="launch", metavar="FILE",
                                    help="WARN for each figure beyond its limit in this "
                                    "baseline (saved by gpucheck fleet --save-baseline)")
    timeout: float = opt("--timeout", default=DEFAULT_TIMEOUT_S, group="launch",
                         type=positive_float, metavar="SECONDS",
                         help="end the run when a collective waits longer than this "
                         f"(default: {DEFAULT_TIMEOUT_S:g})")
    fault_watch: bool = opt("--no-fault-watch", default=True, group="launch",
                            action="store_false", help="do not watch the GPUs for hardware "
                            "faults (XID and ECC events, error counters, clock slowdowns) "
                            "during the run (docs/faults.md)")


@dataclass(frozen=True)
class LaunchPlan:
    """How many ranks, on what, talking how: settled before any process starts."""

    nproc: int
    device: str  # "cuda" or "cpu"
    backend: str  # "nccl", "gloo", ...
    master_port: int | None
    timeout_s: float


def _gpus_at_most(environ: Mapping[str, str]) -> int:
    """This node's NVIDIA GPUs on the PCI bus, without torch (no bound without sysfs)."""
    from gpucheck.devices import nvidia_pci_devices, sysfs_root

    root = sysfs_root(environ)
    return nvidia_pci_devices(str(root / "bus/pci/devices")) if root.is_dir() else sys.maxsize


def _visible_gpus(ctx: RunContext) -> int:
    """The GPUs CUDA gives this process (`devices.cuda_device_count`)."""
    if "torch" not in sys.modules:  # the first seconds of every load command
        from gpucheck.distributed import progress

        progress.say(ctx, "loading torch and looking for GPUs")
    from gpucheck.devices import cuda_device_count

    return cuda_device_count(import_torch())


def import_torch() -> Any:
    """torch, or one UsageError line (exit 2) however its import fails."""
    from gpucheck.errors import deferred_interrupts

    try:
        with deferred_interrupts():  # Ctrl-C inside torch's import: raised after it
            import torch
    except Exception as exc:
        said = str(exc).strip().splitlines()
        raise UsageError(f"torch cannot be imported ({type(exc).__name__}: "
                         f"{said[0] if said else 'no message'}); install it into this "
                         f"environment ({sys.executable} -m pip install torch), or run "
                         "gpucheck env to see why") from None
    return torch


def plan_launch(args: LaunchOptions | argparse.Namespace, ctx: RunContext) -> LaunchPlan:
    """The launch options against this machine and the launcher's world (UsageError)."""
    from gpucheck.distributed.job import resolve_nproc
    from gpucheck.distributed.launch import check_port_free

    _check_rank_count(args.n_gpus, _gpus_at_most(ctx.launcher_env), ctx)  # before torch
    gpus = _visible_gpus(ctx)
    device = args.device or ("cuda" if gpus else "cpu")
    if device == "cuda" and gpus == 0:
        raise UsageError("--device cuda but no GPU is visible to torch; run `gpucheck env` "
                         "to see why, or use --device cpu")
    _check_rank_count(args.n_gpus, gpus, ctx)
    nproc = resolve_nproc(args.n_gpus, gpus if device == "cuda" else DEFAULT_CPU_RANKS, ctx)
    backend = args.backend or ("nccl" if device == "cuda" else "gloo")
    import torch.distributed as dist

    available = {"nccl": dist.is_nccl_available(), "gloo": dist.is_gloo_available(),
                 "mpi": dist.is_mpi_available()}
    if backend not in available:
        raise UsageError(f"--backend {backend!r} is unknown; use nccl, gloo or mpi")
    if not available[backend]:
        raise UsageError(f"--backend {backend} is not built into this torch; use gloo")
    if backend == "nccl" and device != "cuda":
        raise UsageError("--backend nccl needs --device cuda; use gloo on cpu")
    # NCCL refuses two ranks on one GPU; gloo ranks can share GPUs (round-robin).
    if device == "cuda" and backend == "nccl" and args.n_gpus is not None and \
            args.n_gpus > gpus:
        raise UsageError(f"--n-gpus {args.n_gpus} but only {gpus} GPU(s) are visible and NCCL "
                         f"needs one GPU per rank; use --n-gpus {gpus} or fewer (check "
                         "CUDA_VISIBLE_DEVICES), or --backend gloo to share GPUs")
    if args.master_port is not None:
        check_port_free(args.master_port)
    return LaunchPlan(nproc, device, backend, args.master_port, args.timeout)


def _check_rank_count(requested: int | None, gpus: int, ctx: RunContext) -> None:
    """The most ranks one node may self-launch (under a launcher --n-gpus is the job's
    world size, not checked here)."""
    from gpucheck.distributed.job import launched_world

    if requested is None or launched_world(ctx) is not None:
        return
    limit = max(MIN_RANK_LIMIT, RANKS_PER_CORE * (os.cpu_count() or 1), gpus)
    if requested > limit:
        raise UsageError(f"--n-gpus {requested} is far beyond this node ({gpus} GPU(s), "
                         f"{os.cpu_count()} CPU core(s)): at most {limit} ranks; for more, "
                         "launch across nodes with torchrun or srun")


def cpu_ranks_finding(plan: LaunchPlan, cores: int | None = None) -> Finding | None:
    """More CPU ranks than usable cores time-share them: every figure measures the
    contention (a GPU rank mostly waits on its device: not judged)."""
    if plan.device != "cpu":
        return None
    if cores is None:
        try:
            cores = len(os.sched_getaffinity(0))  # a cgroup or taskset narrows them
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
    said = f"{plan.nproc} CPU rank(s) on {cores} usable core(s)"
    if plan.nproc <= cores:
        return ok("launch.cpu_ranks", said)
    return warn("launch.cpu_ranks",
                f"{said}: the ranks take turns on the cores, so their timings measure the "
                "contention, not the ranks",
                f"use --n-gpus {cores} or fewer on this machine, or run on GPUs "
                "(gpucheck env says why none is visible)")


def add_launch_finding(report: Report, plan: LaunchPlan) -> Report:
    """The launch's own verdict in the report's first section, and its scope."""
    finding = cpu_ranks_finding(plan)
    if finding is not None and report.sections:
        report.sections[0].findings.append(finding)
    report.scope = report.scope or (CPU_SCOPE if plan.device == "cpu" else None)
    return report


# --- running a rank job to its report (bench, comm, stress) --------------------

Build = Callable[[Any], Report]


def run_reported(command: str, worker: Callable[[RunContext, Any], Any], spec: Any,
                 plan: LaunchPlan, build: Build, quiet_stdout: bool,
                 ctx: RunContext) -> Report | None:
    """Run `worker(ctx, spec)` on every rank: rank 0's report (None on the others); a
    failed job is a report naming the ranks to blame (`quiet_stdout`: --quiet without
    --output, so the FAIL gets a line on stderr)."""
    from gpucheck.distributed.job import JobFailed, failed_job_report, run_job

    try:
        result = run_job(worker, spec, plan.nproc, plan.master_port, ctx)
    except JobFailed as exc:
        report = failed_job_report(command, exc, build, quiet_stdout)
        report.scope = report.scope or (CPU_SCOPE if plan.device == "cpu" else None)
        return report
    return None if result is None else add_launch_finding(build(result), plan)


def partial_report(build: Build, ctx: RunContext) -> Report | None:
    """After Ctrl-C or SIGTERM: what rank 0 had measured so far, or None."""
    partial = ctx.progress.partial
    return build(partial) if partial is not None else None


# --- --baseline FILE ----------------------------------------------------------

def read_baseline_option(args: argparse.Namespace) -> Any:
    """The Baseline given with --baseline, read before any rank starts; None without."""
    path = getattr(args, "load_baseline", None)
    if path is None:
        return None
    from gpucheck.analysis.baseline import BaselineError, load_baseline

    try:
        return load_baseline(path)
    except BaselineError as exc:
        raise UsageError(f"--baseline {exc}") from None


def baseline_section(report: Report, baseline: Any) -> Section:
    """This report's figures against the baseline's limits: a WARN for each beyond."""
    from gpucheck.analysis.baseline import baseline_findings
    from gpucheck.analysis.loading import metrics_of

    metrics = metrics_of(report)
    shared = [name for name in metrics if name in baseline.metrics]
    data = {"tolerance": baseline.tolerance, "baseline_metrics": len(baseline.metrics),
            "report_metrics": len(metrics), "shared_metrics": len(shared),
            # What the WARNs judged, and the floor the HTML charts draw.
            "limits": [{"metric": name, "value": metrics[name].value,
                        "expected": baseline.metrics[name].expected,
                        "limit": baseline.metrics[name].limit,
                        "beyond": baseline.metrics[name].beyond(metrics[name].value)}
                       for name in shared]}
    return Section("baseline", "Against the baseline", data,
                   baseline_findings(metrics, baseline))
