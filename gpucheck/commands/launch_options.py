"""Options and checks shared by the distributed commands (bench, comm)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from typing import Any

from gpucheck.commands.baseline_option import add_baseline_argument
from gpucheck.commands.option_types import port, positive_float, positive_int
from gpucheck.context import RunContext
from gpucheck.distributed import terminal
from gpucheck.distributed.job import launched_world, resolve_nproc
from gpucheck.distributed.launch import check_port_free
from gpucheck.errors import UsageError
from gpucheck.interrupts import deferred_interrupts
from gpucheck.report import Finding, Report, ok, warn

DEFAULT_CPU_RANKS = 2
DEFAULT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class LaunchPlan:
    """How many ranks, on what, talking how: settled before any process starts."""

    nproc: int
    device: str  # "cuda" or "cpu"
    backend: str  # "nccl", "gloo", ...
    master_port: int | None
    timeout_s: float


def add_launch_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("launch")
    group.add_argument("--n-gpus", "--nproc", dest="n_gpus", type=positive_int, default=None,
                       metavar="N", help="ranks to run on this node (default: every visible "
                       f"GPU; {DEFAULT_CPU_RANKS} CPU ranks when there is none)")
    group.add_argument("--device", choices=("cuda", "cpu"), default=None,
                       help="where ranks compute (default: cuda when a GPU is visible)")
    group.add_argument("--backend", default=None,
                       help="torch.distributed backend (default: nccl on cuda, gloo on cpu)")
    group.add_argument("--master-port", type=port, default=None, metavar="PORT",
                       help="rendezvous port for self-launched ranks (default: a free port)")
    add_baseline_argument(group)
    group.add_argument("--timeout", type=positive_float, default=DEFAULT_TIMEOUT_S,
                       metavar="SECONDS",
                       help="end the run when a collective waits longer than this "
                       f"(default: {DEFAULT_TIMEOUT_S:g})")
    group.add_argument("--no-fault-watch", dest="fault_watch", action="store_false",
                       help="do not watch the GPUs for hardware faults (XID and ECC events, "
                       "error counters, clock slowdowns) during the run (docs/faults.md)")


def _gpus_at_most(dev: str = "/dev") -> int:
    """This node's GPUs at most, without torch: its /dev/nvidiaN device files (one per
    GPU, MIG or not); unbounded when /dev cannot be listed."""
    try:
        return sum(1 for name in os.listdir(dev) if re.fullmatch(r"nvidia\d+", name))
    except OSError:
        return sys.maxsize


def _visible_gpus(ctx: RunContext) -> int:
    """The GPUs CUDA really gives this process: one rank per GPU.

    Not `torch.cuda.device_count()`, which before CUDA starts answers from NVML and
    counts every MIG instance in CUDA_VISIBLE_DEVICES, though CUDA enumerates only one.
    """
    if "torch" not in sys.modules:  # the first seconds of every load command
        terminal.say(ctx, "loading torch and looking for GPUs")
    from gpucheck.devices import cuda_device_count

    return cuda_device_count(import_torch())


def import_torch() -> Any:
    """torch, or one UsageError line (exit 2): bench, comm, stress and all end the way
    env reports it, never in an ImportError traceback. Any exception counts: a
    missing CUDA library is an OSError, a broken install anything."""
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


def plan_launch(args: argparse.Namespace, ctx: RunContext) -> LaunchPlan:
    """Check the launch options against this machine and the launcher's world (`ctx`);
    every problem is a UsageError."""
    if args.timeout <= 0:
        raise UsageError(f"--timeout {args.timeout:g}: give a positive number of seconds")
    _check_rank_count(args.n_gpus, _gpus_at_most(), ctx)  # before torch loads: at once
    gpus = _visible_gpus(ctx)
    device = args.device or ("cuda" if gpus else "cpu")
    if device == "cuda" and gpus == 0:
        raise UsageError("--device cuda but no GPU is visible to torch; run `gpucheck env` "
                         "to see why, or use --device cpu")
    _check_rank_count(args.n_gpus, gpus, ctx)
    nproc = resolve_nproc(args.n_gpus, gpus if device == "cuda" else DEFAULT_CPU_RANKS, ctx)
    backend = args.backend or ("nccl" if device == "cuda" else "gloo")
    _check_backend(backend, device)
    # NCCL refuses two ranks on one GPU ("Duplicate GPU detected"); gloo ranks can
    # share GPUs (spread round-robin by gpucheck.devices.local_device_index).
    if device == "cuda" and backend == "nccl" and args.n_gpus is not None and \
            args.n_gpus > gpus:
        raise UsageError(f"--n-gpus {args.n_gpus} but only {gpus} GPU(s) are visible and NCCL "
                         f"needs one GPU per rank; use --n-gpus {gpus} or fewer (check "
                         "CUDA_VISIBLE_DEVICES), or --backend gloo to share GPUs")
    if args.master_port is not None:
        check_port_free(args.master_port)
    return LaunchPlan(nproc, device, backend, args.master_port, args.timeout)


# Each self-launched rank is a process that imports torch (~0.3 GB, semaphores, a
# port); beyond 4 per CPU core (or one per GPU) a run measures the scheduler, and
# 10**30 ranks exhausted the semaphores and hung the launcher.
RANKS_PER_CORE = 4
MIN_RANK_LIMIT = 8


def rank_limit(gpus: int) -> int:
    """The most ranks one node may self-launch."""
    return max(MIN_RANK_LIMIT, RANKS_PER_CORE * (os.cpu_count() or 1), gpus)


def _check_rank_count(requested: int | None, gpus: int, ctx: RunContext) -> None:
    """Under torchrun or srun --n-gpus is the job's world size (many nodes): not here."""
    if requested is None or launched_world(ctx) is not None:
        return
    limit = rank_limit(gpus)
    if requested > limit:
        raise UsageError(f"--n-gpus {requested} is far beyond this node ({gpus} GPU(s), "
                         f"{os.cpu_count()} CPU core(s)): at most {limit} ranks; for more, "
                         "launch across nodes with torchrun or srun")


def _check_backend(backend: str, device: str) -> None:
    import torch.distributed as dist

    available = {"nccl": dist.is_nccl_available(), "gloo": dist.is_gloo_available(),
                 "mpi": dist.is_mpi_available()}
    if backend not in available:
        raise UsageError(f"--backend {backend!r} is unknown; use nccl, gloo or mpi")
    if not available[backend]:
        raise UsageError(f"--backend {backend} is not built into this torch; use gloo")
    if backend == "nccl" and device != "cuda":
        raise UsageError("--backend nccl needs --device cuda; use gloo on cpu")


def usable_cores() -> int:
    """The cores this process may run on (a cgroup or taskset narrows them)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_ranks_finding(plan: LaunchPlan, cores: int | None = None) -> Finding | None:
    """CPU ranks against the cores they share: more ranks than cores time-share them,
    so every figure measures the contention, not the ranks (a GPU rank mostly waits on
    its device, so GPU runs are not judged here)."""
    if plan.device != "cpu":
        return None
    cores = usable_cores() if cores is None else cores
    said = f"{plan.nproc} CPU rank(s) on {cores} usable core(s)"
    if plan.nproc <= cores:
        return ok("launch.cpu_ranks", said)
    return warn("launch.cpu_ranks",
                f"{said}: the ranks take turns on the cores, so their timings measure the "
                "contention, not the ranks",
                f"use --n-gpus {cores} or fewer on this machine, or run on GPUs "
                "(gpucheck env says why none is visible)")


CPU_SCOPE = "CPU ranks, no GPU: every figure measures this host's CPU cores and loopback, " \
    "not a GPU"


def launch_scope(plan: LaunchPlan) -> str | None:
    """What a launched command's figures measure, said first in every format."""
    return CPU_SCOPE if plan.device == "cpu" else None


def add_launch_finding(report: Report, plan: LaunchPlan) -> Report:
    """The launch's own verdict in the report's first section (its setup), and its scope."""
    finding = cpu_ranks_finding(plan)
    if finding is not None and report.sections:
        report.sections[0].findings.append(finding)
    report.scope = report.scope or launch_scope(plan)
    return report
