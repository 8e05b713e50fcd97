"""Failed ranks as report findings: which rank, where, and how it ended."""

from __future__ import annotations

from gpucheck.dist.launch import RankFailure
from gpucheck.report import Finding, fail

ANOTHER_RANK_HINT = (
    "a rank can fail because another rank stopped answering: read the earliest failure "
    "first, then that rank's own output above"
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
