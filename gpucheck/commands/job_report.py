"""Running a rank job and turning what came of it into the command's report: the
result, a failure (with what rank 0 had measured before it), or a stop. comm and
stress share this; each passes `build`, its own result -> report function."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpucheck.commands.launch_options import LaunchPlan
from gpucheck.context import RunContext
from gpucheck.report import Report

Build = Callable[[Any], Report]


def run_reported(command: str, worker: Callable[[RunContext, Any], Any], spec: Any,
                 plan: LaunchPlan, build: Build, quiet_stdout: bool,
                 ctx: RunContext) -> Report | None:
    """Run `worker(ctx, spec)` on every rank (gpucheck.distributed.job.run_job); rank 0's
    report, or None on the other ranks under torchrun or srun. A failed job is a report
    naming the ranks to blame (`quiet_stdout`: --quiet without --output, so the FAIL
    gets a line on stderr)."""
    from gpucheck.commands.launch_options import add_launch_finding, launch_scope
    from gpucheck.distributed.failures import failed_job_report
    from gpucheck.distributed.job import JobFailed, run_job
    from gpucheck.distributed.launch import WorkersFailed

    try:
        result = run_job(worker, spec, plan.nproc, plan.master_port, ctx)
    except JobFailed as exc:  # first: it is a WorkersFailed that carries rank 0's results
        failed = exc
    except WorkersFailed as exc:  # the launcher saw ranks fail before any reported
        failed = JobFailed(exc.failures, None, [], None, reporter=True)
    else:
        return None if result is None else add_launch_finding(build(result), plan)
    report = failed_job_report(command, failed, build, quiet_stdout)
    report.scope = report.scope or launch_scope(plan)
    return report


def partial_report(build: Build, ctx: RunContext) -> Report | None:
    """After Ctrl-C or SIGTERM: what rank 0 had measured so far (gpucheck.cli adds the
    stop), or None when nothing was."""
    from gpucheck.distributed import progress

    partial = progress.local_partial(ctx)
    return build(partial) if partial is not None else None
