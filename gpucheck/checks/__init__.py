"""Every check id, declared once as a row (node.py, runs.py): what it measures, where
its docs are, what to do about a WARN or FAIL. A finding's action is
`lookup(check).action(status, cause, look, relayed)`: no rule reads a message. An id may
hold `{name}` segments (`comm.{op}.correct`) where it carries a value."""

from __future__ import annotations

from collections.abc import Mapping

from gpucheck.checks import node, runs
from gpucheck.checks.check import ACTIONS, PROBLEMS, Action, Cause, Check, Status, both, build, find

__all__ = ["ACTIONS", "CHECKS", "PROBLEMS", "Action", "Cause", "Check", "Status", "both",
           "lookup"]

CHECKS: Mapping[str, Check] = build(node.CHECKS + runs.CHECKS)


def lookup(check_id: str) -> Check:
    """The exact id, else the most specific template; KeyError naming where to declare it."""
    return find(CHECKS, check_id)
