"""Failed ranks as report findings: which rank, where, and how it ended."""

from __future__ import annotations

from typing import Any

from gpucheck.dist.job import JobFailed
from gpucheck.dist.launch import RankFailure, WorkersFailed
from gpucheck.report import Finding, fail

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


def rank_failure_findings(failures: list[RankFailure], command: str) -> list[Finding]:
    """One FAIL per failed rank, naming it and its exit cause."""
    return [
        fail(
            f"{command}.rank_failed",
            f"rank {f.rank} (local rank {f.local_rank}) "
            + (f"was killed by {f.signal}" if f.signal else f"exited with code {f.exitcode}")
            + f": {f.message}",
            hint=ANOTHER_RANK_HINT,
            subject=f"rank {f.rank}",
        )
        for f in failures
    ]


def _who(rank: int, roster: list[dict[str, Any]], expected: dict[str, str]) -> str:
    info = next((r for r in roster if r.get("rank") == rank), None)
    if info is None:
        return expected.get(str(rank), f"rank {rank}")
    return (f"rank {rank} (node {info['node_rank']} {info['host']}, local rank "
            f"{info['local_rank']}, {info['device']}, pid {info['pid']})")


def _silent_findings(exc: JobFailed, command: str) -> list[Finding]:
    expected = {str(k): v for d in exc.diagnoses for k, v in (d.get("expected") or {}).items()}
    steps = {r: d.get("step") for d in exc.diagnoses for r in d["missing"]}
    findings = []
    for rank in exc.unresponsive:
        step = steps.get(rank)
        if step == "check-in":
            message = f"{_who(rank, exc.roster, expected)} never checked in"
            check, hint = f"{command}.checkin", NEVER_ARRIVED_HINT
        else:
            message = (f"{_who(rank, exc.roster, expected)} did not answer"
                       + (f" during {step}" if step else "")
                       + "; the other ranks timed out waiting for it")
            check, hint = f"{command}.rank_unresponsive", HUNG_HINT
        findings.append(fail(check, message, hint=hint, subject=f"rank {rank}"))
    return findings


def job_failure_findings(exc: WorkersFailed, command: str) -> list[Finding]:
    """FAILs for a failed job: crashed ranks with their exit cause, then silent ranks.

    A rank that only failed because another stopped answering (it wrote a roll-call
    diagnosis) is not blamed; the ranks it found silent are.
    """
    if not isinstance(exc, JobFailed):
        return rank_failure_findings(exc.failures, command)
    diagnosed = {d["rank"] for d in exc.diagnoses}
    silent = set(exc.unresponsive)
    crashed = [f for f in exc.failures if f.rank not in diagnosed]
    findings = rank_failure_findings(crashed, command)
    crashed_ranks = {f.rank for f in crashed}
    if silent - crashed_ranks:
        findings += [f for f in _silent_findings(exc, command)
                     if int(str(f.subject).split()[-1]) not in crashed_ranks]
    if not findings:  # nothing better known: report what the ranks said
        findings = rank_failure_findings(exc.failures, command)
    return findings
