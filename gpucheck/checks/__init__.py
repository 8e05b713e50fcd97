"""Every check id, declared once: what it measures, where its docs are, and what to do
about a WARN or FAIL.

A finding's action is `lookup(check).action(status, cause, look, relayed)`: the check,
plus data the measurement set (a cause key, a second look, the action of the finding a
fleet or compare row relays). No rule reads a message.

Declarations live in the area modules beside this one (run, env, gpu, faults, health,
bench, comm, stress, hang, fleet); `CHECKS` is built from them once. An id may hold
`{name}` segments (`comm.{op}.correct`) where it carries a value.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpucheck.checks import bench, comm, env, faults, fleet, gpu, hang, health, run, stress
from gpucheck.checks.check import PROBLEMS, Cause, Check, area_file, both, build, find

__all__ = ["CHECKS", "PROBLEMS", "Cause", "Check", "area_file", "both", "lookup"]

CHECKS: Mapping[str, Check] = build(
    check for area in (run, env, gpu, faults, health, bench, comm, stress, hang, fleet)
    for check in area.CHECKS)


def lookup(check_id: str) -> Check:
    """The exact id, else the most specific template; KeyError naming the file to
    declare it in."""
    return find(CHECKS, check_id)
