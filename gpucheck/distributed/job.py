"""Run a worker on every rank however the job was launched (gpucheck's own ranks,
torchrun, srun); a failed job as JobFailed and as its report (docs/DESIGN.md)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, TypeVar

from gpucheck import subject as subjects
from gpucheck.context import RunContext, RunOptions
from gpucheck.devices import device_label
from gpucheck.distributed import deadline, progress
from gpucheck.distributed.checkin import (
    SHARED_GPU_HINT,
    CheckInFailed,
    RanksUnresponsive,
    SharedGpu,
)
from gpucheck.distributed.launch import RankFailure, WorkersFailed, launch_local
from gpucheck.distributed.world import World, world_of
from gpucheck.errors import UsageError
from gpucheck.escape import terminal as shown
from gpucheck.report import Finding, Report, Section, fail, ok, skip

S = TypeVar("S")


def launched_world(ctx: RunContext) -> World | None:
    """The launcher's world when it has more than one rank; None when gpucheck launches."""
    world = world_of(ctx)
    return world if world is not None and world.world_size > 1 else None


def resolve_nproc(requested: int | None, default: int, ctx: RunContext) -> int:
    """How many ranks to run; a launcher's world that disagrees is a usage error."""
    if requested is not None and requested < 1:
        raise UsageError(f"--n-gpus {requested}: give 1 or more ranks")
    world = launched_world(ctx)
    if world is None:
        return requested or default
    if requested is not None and requested != world.world_size:
        raise UsageError(
            f"--n-gpus {requested} disagrees with the launcher's WORLD_SIZE={world.world_size}; "
            "drop --n-gpus or launch one process (torchrun -m gpucheck ... --n-gpus N)"
        )
    return world.world_size


def run_job(worker: Callable[[RunContext, S], Any], spec: S, nproc: int,
            master_port: int | None, ctx: RunContext) -> Any:
    """Run `worker(ctx, spec)` on every rank: rank 0's value here (None on a rank that
    does not report). Under a launcher this process is one of the ranks; else one rank
    runs here, or several through the elastic launcher."""
    world = launched_world(ctx)
    if world is not None or nproc == 1:
        if world is None:  # under torchrun or srun, rank 0's check-in says it
            progress.say(ctx, "1 rank, in this process")
        return _run_here(worker, spec, ctx)
    progress.say(ctx, f"launching {nproc} ranks (each starts python and torch, then "
                      "they join one process group)")
    ctx.progress.ranks = {}
    with _run_dir(ctx) as folder:
        options = replace(ctx.options, run_dir=str(folder))
        try:
            return launch_local(in_context, (worker, spec, options), nproc, master_port)[0]
        except WorkersFailed as exc:
            partial, roster, diagnoses = progress.read_run_dir(folder)
            ctx.progress.ranks = progress.read_ranks(folder)
            raise JobFailed(exc.failures, partial, diagnoses, roster, reporter=True) from None
        except KeyboardInterrupt:
            ctx.progress.partial = progress.read_run_dir(folder)[0]
            ctx.progress.ranks = progress.read_ranks(folder)
            raise
        finally:
            progress.gather(folder, ctx.warnings)  # the ranks' library warnings, for the log


class JobFailed(WorkersFailed):
    """The job ended badly. `failures`: the ranks to blame (`blame`), every one that
    failed in `raw_failures`; `partial`: rank 0's published results; `diagnoses`: each
    survivor's view; `reporter`: whether this process writes the report."""

    def __init__(self, failures: list[RankFailure], partial: dict[str, Any] | None,
                 diagnoses: list[dict[str, Any]], roster: list[Any] | None,
                 reporter: bool) -> None:
        self.raw_failures = failures
        self.partial = partial
        self.diagnoses = diagnoses
        self.roster = roster or []
        self.reporter = reporter
        super().__init__(blame(failures, diagnoses, self.roster))


def blame(failures: list[RankFailure], diagnoses: list[dict[str, Any]],
          roster: list[dict[str, Any]]) -> list[RankFailure]:
    """Crashed ranks first, then silent ones; survivors that diagnosed are not blamed.
    Ranks refused at check-in for sharing a GPU are the only ones, once each."""
    said = next((d for d in diagnoses if d.get("shared")), None)
    if said is not None:
        local = {int(r["rank"]): int(r["local_rank"]) for r in roster if "rank" in r}
        return [RankFailure(int(r), local.get(int(r), -1), 0, None,
                            str(said.get("message", "")), cause="shares a GPU")
                for r in sorted(set(said["shared"]))]
    diagnosed = {d["rank"] for d in diagnoses}
    missing = set(_missing(diagnoses))
    # A silent rank that a survivor then SIGKILLed is blamed for its silence.
    crashed = [f for f in failures if f.rank not in diagnosed
               and not (f.rank in missing and f.signal == "SIGKILL")]
    taken = {f.rank for f in crashed}
    silent = [_silent(r, diagnoses, roster) for r in _missing(diagnoses)
              if r not in taken and r not in diagnosed]
    return crashed + silent or failures


def _missing(diagnoses: list[dict[str, Any]]) -> list[int]:
    return sorted({int(r) for d in diagnoses for r in d["missing"]})


def _silent(rank: int, diagnoses: list[dict[str, Any]],
            roster: list[dict[str, Any]]) -> RankFailure:
    seen = next(d for d in diagnoses if rank in d["missing"])
    info = next((r for r in roster if r.get("rank") == rank), None)
    if info is not None:
        where = (f"node {info['node_rank']} {info['host']}, {device_label(info)}, "
                 f"pid {info['pid']}")
        local_rank = int(info["local_rank"])
    else:
        where = (seen.get("expected") or {}).get(str(rank)) or \
            (seen.get("expected") or {}).get(rank) or "never seen"
        local_rank = -1
    if seen.get("step") == "check-in":
        return RankFailure(rank, local_rank, 0, None, f"{where}", cause="never checked in")
    step = f" during {seen['step']}" if seen.get("step") else ""
    return RankFailure(rank, local_rank, 0, None,
                       f"{where}; rank {seen['rank']} timed out{step} waiting for it "
                       f"({seen.get('cause', '')})", cause="did not answer")


@contextmanager
def _run_dir(ctx: RunContext) -> Iterator[Path]:
    """The job's run directory: the user's (kept), else a temporary one."""
    given = progress.run_dir(ctx)
    folder = given or Path(tempfile.mkdtemp(prefix="gpucheck-run-"))
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(progress.RANK_GLOB):  # a kept folder's earlier run
        stale.unlink(missing_ok=True)
    try:
        yield folder
    finally:
        if not given:
            shutil.rmtree(folder, ignore_errors=True)


def in_context(worker: Callable[[RunContext, S], Any], spec: S, options: RunOptions) -> Any:
    """How a spawned rank runs its worker: a context of its own from the pickled options
    and the variables the elastic agent set (read here, once)."""
    ctx = RunContext(options, launcher_env=dict(os.environ))
    try:
        result = worker(ctx, spec)
    except BaseException:
        if ctx.session.aborted:  # an aborted NCCL group: its diagnosis is in the run
            traceback.print_exc()  # directory for the launcher's report; no teardown
            deadline.leave_if_aborted(True, 1)
        raise
    # Stopping the ranks and writing the report take a few more seconds.
    progress.say(ctx, "measured: the ranks stop, then the report follows")
    return result


def _run_here(worker: Callable[[RunContext, S], Any], spec: S, ctx: RunContext) -> Any:
    """This process is the only rank here: its failure becomes `JobFailed`."""
    progress.reset(ctx)
    try:
        return worker(ctx, spec)
    except Exception as exc:
        if not isinstance(exc, (CheckInFailed, RanksUnresponsive, SharedGpu)):
            traceback.print_exc()
        world = world_of(ctx)
        rank, local_rank = (world.rank, world.local_rank) if world else (0, 0)
        lines = str(exc).strip().splitlines()
        failure = RankFailure(rank, local_rank, exitcode=1, signal=None,
                              message=lines[-1] if lines else type(exc).__name__)
        raise JobFailed([failure], ctx.progress.partial, list(ctx.progress.diagnoses),
                        [asdict(i) for i in ctx.session.roster], reporter=rank == 0) from exc


ANOTHER_RANK_HINT = (
    "a rank can fail because another rank stopped answering: read the earliest failure "
    "first, then that rank's own output above"
)

HUNG_HINT = (
    "the rank is alive but stopped answering (a stopped process, a GPU that hangs, a "
    "dead link): check that host's dmesg / nvidia-smi -q and its network; the launcher "
    "has killed it"
)
NEVER_ARRIVED_HINT = (
    "the rank never started or could not reach the rendezvous store: check that its node "
    "was launched (torchrun/srun on every node) with the same --rdzv-endpoint/MASTER_ADDR"
)


_CHECKS = {"did not answer": ("rank_unresponsive", HUNG_HINT),
           "never checked in": ("checkin", NEVER_ARRIVED_HINT),
           "shares a GPU": ("shared_gpu", SHARED_GPU_HINT)}


def rank_failure_findings(failures: list[RankFailure], command: str) -> list[Finding]:
    """One FAIL per failed rank (a JobFailed's `failures`), naming how it ended."""
    findings = []
    for f in failures:
        check, hint = _CHECKS.get(f.cause or "", ("rank_failed", ANOTHER_RANK_HINT))
        findings.append(fail(f"{command}.{check}",
                             f"rank {f.rank} (local rank {f.local_rank}) {f.how()}: {f.message}",
                             hint=hint, subject=subjects.rank(f.rank)))
    return findings


def flight_findings(diagnoses: list[dict[str, Any]], command: str) -> list[Finding]:
    """Where the survivors' Flight Recorder dumps went (OK), or why a rank wrote none."""
    outcomes = {d.get("rank"): d["flight_recorder"] for d in diagnoses
                if isinstance(d.get("flight_recorder"), dict)}
    check = f"{command}.flight_recorder"
    written = sorted(str(r) for r, o in outcomes.items() if o.get("path"))
    skipped: dict[str, list[Any]] = {}
    for rank, outcome in sorted(outcomes.items(), key=lambda item: str(item[0])):
        if outcome.get("skipped"):
            skipped.setdefault(str(outcome["skipped"]), []).append(rank)
    found = []
    for why, ranks in skipped.items():
        listed = ", ".join(map(str, ranks))  # a rank that could not tell is in words only
        numbers = [r for r in ranks if isinstance(r, int) and not isinstance(r, bool)]
        found.append(skip(check, f"rank(s) {listed} wrote no Flight Recorder dump: {why}",
                          subject=subjects.ranks(numbers, f"rank {listed}")))
    if written:
        path = str(next(o["path"] for o in outcomes.values() if o.get("path")))
        folder, prefix = os.path.dirname(path), os.path.basename(path).rstrip("0123456789")
        found.append(ok(check, f"rank(s) {', '.join(written)} wrote their Flight Recorder "
                        f"dumps to {folder}: `gpucheck hang --traces {folder} --prefix "
                        f"{prefix}` names the rank the others waited for"))
    return found


def failure_section(command: str, findings: list[Finding], partial: bool,
                    summary: str, diagnoses: list[dict[str, Any]] | None = None) -> Section:
    """The failure's findings; whether the sections above are partial, and the NCCL
    settings gpucheck chose for the run."""
    chosen = next((d["nccl_settings"] for d in diagnoses or [] if d.get("nccl_settings")),
                  None)
    data = {"outcome": summary,
            "results_above": "partial: measured before the failure" if partial else "none",
            **({"nccl_set_by_gpucheck": chosen} if chosen else {})}
    return Section("failure", "Run failed", data,
                   findings or [fail(f"{command}.failed", summary, hint="see the ranks' output")])


def failed_job_report(command: str, exc: JobFailed, build: Callable[[Any], Report],
                      quiet_stdout: bool) -> Report:
    """What rank 0 had published (`build(exc.partial)`) plus the failure naming the ranks
    to blame; on another rank one line and exit 1. `quiet_stdout`: the FAIL's line on
    stderr all the same."""
    summary = "; ".join(f.describe() for f in exc.failures) or "the job failed"
    if not exc.reporter:
        print(f"gpucheck {command}: {shown(summary)}", file=sys.stderr)
        raise SystemExit(1)
    report = build(exc.partial) if exc.partial else Report(command=command)
    findings = rank_failure_findings(exc.failures, command)
    findings += flight_findings(exc.diagnoses, command)
    report.add(failure_section(command, findings, exc.partial is not None, summary,
                               exc.diagnoses))
    if quiet_stdout:
        print(f"gpucheck {command}: FAIL: {shown(summary)}", file=sys.stderr)
    return report
