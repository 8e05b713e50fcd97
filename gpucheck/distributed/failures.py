"""Failed ranks as report findings: which rank, where, and how it ended."""

from __future__ import annotations

from gpucheck.distributed.launch import RankFailure
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


_CHECKS = {"did not answer": ("rank_unresponsive", HUNG_HINT),
           "never checked in": ("checkin", NEVER_ARRIVED_HINT)}


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
                             hint=hint, subject=f"rank {f.rank}"))
    return findings
