"""Confirm before condemning, the one flow of every second look: rank 0 plans what to
measure again, every rank follows its plan (`remeasure`), and each suspect's finding
carries its second look as data, its action from the check's `on_look` (`confirm`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TypeVar

from gpucheck.context import RunContext
from gpucheck.measure import Bound, SecondLook
from gpucheck.peers import second_look
from gpucheck.report import Finding, Status, looked
from gpucheck.subject import Subject

P = TypeVar("P")
R = TypeVar("R")


def remeasure(rank: int, plan: Callable[[], P | None], measure: Callable[[P], R],
              ctx: RunContext) -> tuple[P | None, R | None]:
    """Rank 0's `plan()` on every rank (a broadcast), then every rank's `measure(plan)`
    when the plan names something: every rank agrees on whether a second measurement
    happens."""
    from gpucheck.distributed.deadline import broadcast_object

    wanted = broadcast_object(plan() if rank == 0 else None, ctx)
    return wanted, measure(wanted) if wanted else None


@dataclass(frozen=True)
class Suspect:
    """A figure that crossed its bound: `again` its second figure (None: not measured
    again, `why_not` says why), judged against `reference`, measured beside `against`."""

    subject: Subject
    message: str
    first: float
    again: float | None
    reference: float | None
    against: tuple[Subject, ...] = ()
    why_not: str | None = None

    def look(self, bound: Bound, unit: str) -> SecondLook:
        return second_look(self.first, self.again, self.reference, self.against, bound,
                           unit, self.why_not)


def confirm(check: str, suspects: Iterable[Suspect], bound: Bound, unit: str, hint: str,
            *, cause: str | None = None, fail_hint: str | None = None) -> list[Finding]:
    """Each suspect's finding with its second look (`gpucheck.report.looked`: its status
    and action follow from the check's `on_look`); `fail_hint` the hint of a FAIL."""
    out = []
    for suspect in suspects:
        found = looked(check, suspect.message, hint, suspect.subject,
                       suspect.look(bound, unit), cause=cause)
        out.append(replace(found, hint=fail_hint) if fail_hint and found.status is Status.FAIL
                   else found)
    return out
