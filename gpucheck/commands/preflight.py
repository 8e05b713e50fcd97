"""`gpucheck preflight [options] -- CMD ...`: the gate in the job's own launch: every
rank checks, then becomes CMD on a pass (exec: same PID, the launcher's environment),
or none does and the report names the node (docs/preflight.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck.commands.launch import LaunchOptions, LaunchPlan, plan_launch
from gpucheck.commands.options import opt, seconds
from gpucheck.commands.registry import outputs_of
from gpucheck.context import Console, RunContext
from gpucheck.errors import UsageError
from gpucheck.render.text import WIDTH
from gpucheck.report import Report, Section

HELP = ("the gate before a job's first step: GPU health, GEMM and silent data corruption, "
        "all_reduce, node links, under a budget; then exec the job's command")
DEFAULT_BUDGET_S = 60.0
# The environment as the launcher gave it, captured before gpucheck sets anything
# (this module is imported while the command line is parsed): CMD gets exactly it.
STARTED_ENVIRONMENT = dict(os.environ)
# The launcher's blocked signals, restored for CMD (preflight may block SIGTERM).
STARTED_MASK = signal.pthread_sigmask(signal.SIG_BLOCK, ())

# Per device: (dtype, n, warm-up s, GEMM window s, burn-in s, all_reduce bytes,
# node-link bytes, iterations). Sized so every check fits a 60 s budget on 8 GPUs
# (docs/preflight.md): an 8192^3 bf16 product takes ~1.5 ms on an H100.
DEFAULTS: dict[str, tuple[str, int, float, float, float, int, int, int]] = {
    "cuda": ("bf16", 8192, 0.3, 1.0, 2.0, 256 << 20, 64 << 20, 10),
    "cpu": ("fp32", 256, 0.1, 0.5, 0.5, 4 << 20, 1 << 20, 5),
}


@dataclass(frozen=True)
class PreflightArgs(LaunchOptions):
    budget: float = opt("--budget", default=DEFAULT_BUDGET_S, group="preflight", type=seconds,
                        metavar="SECONDS", help="bound on every check together, start-up "
                        "excluded; a check that cannot finish in time is a SKIP (--strict: a "
                        f"FAIL) (default: {DEFAULT_BUDGET_S:g})")
    exclude_file: str | None = opt("--exclude-file", group="preflight", metavar="PATH",
                                   help="write the failing nodes' host names here, one a line "
                                   "(written when empty too), for sbatch --exclude")
    drain: bool = opt("--drain", default=False, group="preflight", action="store_true",
                      help="under SLURM, drain a failing node (scontrol update ... "
                      "State=DRAIN) from its own rank 0; without it the command is printed")
    job_command: Sequence[str] | None = opt("job_command", nargs=argparse.REMAINDER,
                                            metavar="-- CMD", help="the job's command, "
                                            "started on every rank after a pass")


add_arguments = PreflightArgs.add_to


def job_command(args: argparse.Namespace) -> list[str]:
    """CMD after `--`, resolved on PATH now: a typo is exit 2 before any check runs."""
    command = list(args.job_command or [])
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        return []
    if shutil.which(command[0], path=STARTED_ENVIRONMENT.get("PATH")) is None:
        raise UsageError(f"command {command[0]!r} not found on PATH; give the job's command "
                         "after --, e.g. -- python train.py")
    return command


def _spec(args: argparse.Namespace, plan: LaunchPlan) -> Any:
    from gpucheck.preflight.worker import PreflightSpec

    dtype, size, warmup, window, burn, ar_bytes, link_bytes, iters = DEFAULTS[plan.device]
    if plan.device == "cuda":
        import torch

        dtype = dtype if torch.cuda.get_device_capability(0) >= (8, 0) else "fp16"
    costs = (("nvml", 2.0), ("gemm", 2 * (warmup + window) + 1), ("sdc", 2 * burn + 1),
             ("alloc", 1.0), ("all_reduce", 2.0), ("links", 5.0))
    return PreflightSpec(device=plan.device, backend=plan.backend, budget_s=args.budget,
                         startup_s=plan.timeout_s, strict=args.strict, dtype=dtype,
                         size=size, warmup_s=warmup, gemm_window_s=window, burn_s=burn,
                         alloc_fraction=0.8, allreduce_bytes=ar_bytes,
                         link_bytes=link_bytes, iters=iters,
                         peer_fraction=0.9 if plan.device == "cuda" else 0.5,
                         expected_fraction=0.8, link_fraction=0.5,
                         fault_watch=args.fault_watch, costs_s=costs,
                         exclude_file=args.exclude_file, outputs=tuple(outputs_of(args)),
                         command_given=bool(job_command(args)),
                         cpu_asked=args.device == "cpu")


def run(args: argparse.Namespace, ctx: RunContext) -> Report | None:
    started = time.monotonic()
    command = job_command(args)
    if args.exclude_file is not None:
        from gpucheck.output import check_writable, discard

        check_writable(args.exclude_file, "--exclude-file")
        # A run stopped before its verdict must not leave the last run's hosts behind;
        # rank 0 only (it writes the file): a late rank must not remove a new one.
        from gpucheck.distributed.world import reports

        if reports(ctx):
            discard(args.exclude_file, "--exclude-file")
    plan = plan_launch(args, ctx)
    spec = _spec(args, plan)
    from gpucheck.distributed.job import JobFailed, run_job
    from gpucheck.preflight.worker import preflight_worker

    try:
        out = run_job(preflight_worker, spec, plan.nproc, plan.master_port, ctx)
    except JobFailed as exc:  # run_job's one failure, on every launch path
        return _failed(args, exc, ctx)
    return _decided(args, spec, out, command, ctx, started)


def _decided(args: argparse.Namespace, spec: Any, out: dict[str, Any],
             command: list[str], ctx: RunContext, started: float) -> Report | None:
    """Act on the agreed decision: drain (node rank 0), report and exclude file (rank
    0), then exec CMD on a pass or exit 1 on every rank."""
    from gpucheck.distributed.world import world_of

    world = world_of(ctx)
    decision = out["decision"]
    drained = _drain(args, spec, decision, world)
    reporter = world is None or world.world_size == 1 or world.rank == 0 or \
        out.get("result") is not None
    if decision.get("unwritable") and reporter:  # rank 0's files, checked before the vote
        raise UsageError(f"{decision['unwritable']}; the command was started on no rank")
    if not reporter:
        if not decision["go"]:
            print(f"gpucheck preflight: rank {world.rank if world else 0}: no-go (rank 0 "
                  "reports why); the command is not started", file=sys.stderr)
            raise SystemExit(1)
        _exec(command)
        return None
    report = _report(decision, drained)
    _write_exclude(args, decision["failing"])
    if not decision["go"] or not command:
        return report
    _show(report, args, started, ctx.console)
    _exec(command)
    return None


def _show(report: Report, args: argparse.Namespace, started: float,
          console: Console) -> None:
    """The passing report, before this process becomes CMD (the CLI would show it only
    after `run` returns): every --output written; on stdout, unless --quiet, a brief
    (verdict, problems, seconds, where the report went), or the asked --format."""
    from gpucheck.commands.launch import baseline_section, read_baseline_option
    from gpucheck.commands.registry import emit, file_formats
    from gpucheck.render import format_for
    from gpucheck.render.text import render_brief

    baseline = read_baseline_option(args)  # gpucheck.cli adds it to a returned report
    if baseline is not None:
        report.add(baseline_section(report, baseline))
    outputs = outputs_of(args)
    fmt = format_for(args.format, outputs[0] if outputs else None)
    if outputs or args.format not in (None, "text"):
        emit(report, fmt, outputs, True, console, file_formats(args.format, outputs))
    if not args.quiet and (outputs or args.format in (None, "text")):
        console.stdout.write(render_brief(report, time.monotonic() - started, outputs,
                                          console.color,
                                          console.columns(console.stdout) or WIDTH))
        console.stdout.flush()


def _exec(command: list[str]) -> None:
    if not command:
        return
    from gpucheck.preflight.actions import exec_command

    exec_command(command, STARTED_ENVIRONMENT, STARTED_MASK)


def _drain(args: argparse.Namespace, spec: Any, decision: dict[str, Any],
           world: Any) -> dict[str, Any] | None:
    """This node's own rank 0 (local rank 0) acts for its node only."""
    from gpucheck.distributed.world import host_name, is_slurm_step
    from gpucheck.preflight.actions import drain_node, my_failing_node

    if world is not None and world.local_rank != 0:
        return None
    node = my_failing_node(decision["failing"], host_name(),
                           world.node_rank if world is not None else 0)
    # An srun task, or a job's prolog / batch step (SLURM_JOB_ID without a task rank).
    under_slurm = is_slurm_step(STARTED_ENVIRONMENT) or \
        "SLURM_JOB_ID" in STARTED_ENVIRONMENT
    done = drain_node(node, spec.device, under_slurm, args.drain)
    if done is not None:
        how = (f"ran: {done['command']} (exit {done['exit_code']})" if done["ran"] else
               f"{done['note']}: {done['command']}")
        print(f"gpucheck preflight: drain: {how}", file=sys.stderr)
    return done


def _write_exclude(args: argparse.Namespace, failing: list[dict[str, Any]]) -> None:
    if args.exclude_file is not None:
        from gpucheck.preflight.actions import write_exclude_file

        write_exclude_file(args.exclude_file, failing)


def _report(decision: dict[str, Any], drained: dict[str, Any] | None) -> Report:
    sections = [Section.from_dict(s) for s in decision["sections"]]
    if drained is not None and sections:
        sections[0].data["drain"] = drained
    return Report(command="preflight", sections=sections)


def _failed(args: argparse.Namespace, exc: Any, ctx: RunContext) -> Report | None:
    """A rank crashed or went silent: no-go; the report names it, the exclude file its
    host; other ranks exit 1 with one line."""
    from gpucheck.distributed.job import failed_job_report
    from gpucheck.distributed.world import world_of
    from gpucheck.preflight.actions import failing_hosts, hold_sigterm, speaks_for_failed_job

    # A rank's end points at its node when it went silent, never arrived, or was killed
    # by a signal other than a stop request (a rank that raised is software).
    failing = [{"host": r.get("host"), "node_rank": r.get("node_rank")}
               for f in exc.failures if f.cause in ("did not answer", "never checked in")
               or f.signal not in (None, "SIGTERM", "SIGINT", "SIGHUP")
               for r in exc.roster if r.get("rank") == f.rank]
    world = world_of(ctx)  # rank 0 silent: each node's lowest live rank speaks
    if not exc.reporter and speaks_for_failed_job([f.rank for f in exc.failures], exc.roster,
                                                  world.rank if world else None, False):
        hold_sigterm()
        exc.reporter = True
    # On a rank that does not report: one line on stderr and exit 1.
    report = failed_job_report("preflight", exc, lambda partial: Report(command="preflight"),
                               args.quiet and args.output is None)
    _write_exclude(args, failing)
    if report is not None and failing:
        report.sections[-1].data["exclude"] = failing_hosts(failing)
    return report


def exit_code(report: Report, args: argparse.Namespace) -> int:
    """1 on a no-go (the command did not start), else the report's own code."""
    head = report.section("preflight")
    if head is not None and head.data.get("go") is False:
        return 1
    return report.exit_code(strict=args.strict)
