"""Failed ranks as report findings: which rank, where, and how it ended."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpucheck import subject as subjects
from gpucheck.distributed.checkin import SHARED_GPU_HINT
from gpucheck.distributed.launch import RankFailure
from gpucheck.escape import terminal
from gpucheck.report import Finding, Report, Section, fail, ok, skip

if TYPE_CHECKING:
    from gpucheck.distributed.job import JobFailed

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
    """One FAIL per failed rank, naming it and its exit cause (or that it went silent).

    With a `JobFailed`, pass `exc.failures`: the ranks to blame, not those that only
    failed because another rank stopped answering.
    """
    findings = []
    for f in failures:
        check, hint = _CHECKS.get(f.cause or "", ("rank_failed", ANOTHER_RANK_HINT))
        findings.append(fail(f"{command}.{check}",
                             f"rank {f.rank} (local rank {f.local_rank}) {f.how()}: {f.message}",
                             hint=hint, subject=subjects.rank(f.rank)))
    return findings


def _listed(ranks: list[Any]) -> str:
    return ", ".join(map(str, ranks))


def _ranks_subject(ranks: list[Any]) -> subjects.Subject:
    """"rank 1, 3" with the ranks as fields (a diagnosis whose rank is not a number,
    from a rank that could not tell, is in the words only)."""
    numbers = [r for r in ranks if isinstance(r, int) and not isinstance(r, bool)]
    return subjects.ranks(numbers, f"rank {_listed(ranks)}")


def flight_findings(diagnoses: list[dict[str, Any]], command: str) -> list[Finding]:
    """Where the survivors' Flight Recorder dumps went (OK), or why a rank wrote none
    (SKIP, with torch's reason): gpucheck hang --traces reads them."""
    outcomes = {d.get("rank"): d["flight_recorder"] for d in diagnoses
                if isinstance(d.get("flight_recorder"), dict)}
    check = f"{command}.flight_recorder"
    written = sorted(str(r) for r, o in outcomes.items() if o.get("path"))
    skipped: dict[str, list[Any]] = {}
    for rank, outcome in sorted(outcomes.items(), key=lambda item: str(item[0])):
        if outcome.get("skipped"):
            skipped.setdefault(str(outcome["skipped"]), []).append(rank)
    found = [skip(check, f"rank(s) {_listed(ranks)} wrote no Flight Recorder dump: {why}",
                  subject=_ranks_subject(ranks)) for why, ranks in skipped.items()]
    if written:
        path = str(next(o["path"] for o in outcomes.values() if o.get("path")))
        folder, prefix = os.path.dirname(path), os.path.basename(path).rstrip("0123456789")
        found.append(ok(check, f"rank(s) {', '.join(written)} wrote their Flight Recorder "
                        f"dumps to {folder}: `gpucheck hang --traces {folder} --prefix "
                        f"{prefix}` names the rank the others waited for"))
    return found


def failure_section(command: str, findings: list[Finding], partial: bool,
                    summary: str, diagnoses: list[dict[str, Any]] | None = None) -> Section:
    """The failure as FAIL findings; says whether the sections above are partial and
    which NCCL settings gpucheck chose for the run (distributed.deadline.BACKSTOP)."""
    chosen = next((d["nccl_settings"] for d in diagnoses or [] if d.get("nccl_settings")),
                  None)
    data = {"outcome": summary,
            "results_above": "partial: measured before the failure" if partial else "none",
            **({"nccl_set_by_gpucheck": chosen} if chosen else {})}
    return Section("failure", "Run failed", data,
                   findings or [fail(f"{command}.failed", summary, hint="see the ranks' output")])


def failed_job_report(command: str, exc: JobFailed, build: Callable[[Any], Report],
                      quiet_stdout: bool) -> Report:
    """The report of a job that failed: what rank 0 had published (`build(exc.partial)`)
    plus the failure naming the ranks to blame. On a rank that does not report: one
    line on stderr and exit 1. `quiet_stdout` (--quiet without --output): the FAIL
    still gets its line on stderr."""
    summary = "; ".join(f.describe() for f in exc.failures) or "the job failed"
    if not exc.reporter:
        print(f"gpucheck {command}: {terminal(summary)}", file=sys.stderr)
        raise SystemExit(1)
    report = build(exc.partial) if exc.partial else Report(command=command)
    findings = rank_failure_findings(exc.failures, command)
    findings += flight_findings(exc.diagnoses, command)
    report.add(failure_section(command, findings, exc.partial is not None, summary,
                               exc.diagnoses))
    if quiet_stdout:
        print(f"gpucheck {command}: FAIL: {terminal(summary)}", file=sys.stderr)
    return report
