"""Records rank 0 could not read back (gpucheck.records) as findings: the report names
each one and judges the rest, so a malformed record costs its rank's figures, never the
report. Used by comm and stress (`comm.rank_record`, `stress.rank_record`)."""

from __future__ import annotations

from collections.abc import Sequence

from gpucheck import subject
from gpucheck.records import Unread
from gpucheck.report import Finding, warn

HINT = ("the rank sent a record of another shape than rank 0 reads: run one gpucheck version "
        "on every node (pip show gpucheck on each), then run the command again")


def unread_findings(check: str, unread: Sequence[Unread]) -> list[Finding]:
    """One WARN per rank (or one for records that name no rank), nothing when all read."""
    by_rank: dict[int | None, list[Unread]] = {}
    for u in unread:
        by_rank.setdefault(u.rank, []).append(u)
    return [warn(check, f"{_whose(rank)} {len(mine)} record(s) could not be read and were "
                 f"left out of the verdicts: {'; '.join(f'{u.what} ({u.why})' for u in mine)}",
                 hint=HINT, subject=subject.rank(rank) if rank is not None else None)
            for rank, mine in sorted(by_rank.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))]


def _whose(rank: int | None) -> str:
    return f"rank {rank}:" if rank is not None else "a rank that named none:"
