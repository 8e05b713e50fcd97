"""Options and checks shared by the distributed commands (bench, comm)."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from gpucheck.commands.baseline_option import add_baseline_argument
from gpucheck.distributed import terminal
from gpucheck.distributed.job import resolve_nproc
from gpucheck.distributed.launch import check_port_free
from gpucheck.errors import UsageError
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
    group.add_argument("--n-gpus", "--nproc", dest="n_gpus", type=int, default=None,
                       metavar="N", help="ranks to run on this node (default: every visible "
                       f"GPU; {DEFAULT_CPU_RANKS} CPU ranks when there is none)")
    group.add_argument("--device", choices=("cuda", "cpu"), default=None,
                       help="where ranks compute (default: cuda when a GPU is visible)")
    group.add_argument("--backend", default=None,
                       help="torch.distributed backend (default: nccl on cuda, gloo on cpu)")
    group.add_argument("--master-port", type=int, default=None, metavar="PORT",
                       help="rendezvous port for self-launched ranks (default: a free port)")
    add_baseline_argument(group)
    group.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                       help="end the run when a collective waits longer than this "
                       f"(default: {DEFAULT_TIMEOUT_S:g})")
    group.add_argument("--no-fault-watch", dest="fault_watch", action="store_false",
                       help="do not watch the GPUs for hardware faults (XID and ECC events, "
                       "error counters, clock slowdowns) during the run (docs/faults.md)")


def _visible_gpus() -> int:
    """The GPUs CUDA really gives this process: one rank per GPU.

    Not `torch.cuda.device_count()`, which before CUDA starts answers from NVML and
    counts every MIG instance in CUDA_VISIBLE_DEVICES, though CUDA enumerates only one.
    """
    if "torch" not in sys.modules:  # the first seconds of every load command
        terminal.say("loading torch and looking for GPUs")
    import torch

    from gpucheck.devices import cuda_device_count

    return cuda_device_count(torch)


def plan_launch(args: argparse.Namespace) -> LaunchPlan:
    """Check the launch options against this machine; every problem is a UsageError."""
    if args.timeout <= 0:
        raise UsageError(f"--timeout {args.timeout:g}: give a positive number of seconds")
    gpus = _visible_gpus()
    device = args.device or ("cuda" if gpus else "cpu")
    if device == "cuda" and gpus == 0:
        raise UsageError("--device cuda but no GPU is visible to torch; run `gpucheck env` "
                         "to see why, or use --device cpu")
    nproc = resolve_nproc(args.n_gpus, default=gpus if device == "cuda" else DEFAULT_CPU_RANKS)
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


def add_launch_finding(report: Report, plan: LaunchPlan) -> Report:
    """The launch's own verdict in the report's first section (its setup)."""
    finding = cpu_ranks_finding(plan)
    if finding is not None and report.sections:
        report.sections[0].findings.append(finding)
    return report
