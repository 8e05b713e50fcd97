"""Exit codes for the three ways health checks are run (`--convention`, docs/health.md).

One mapping cannot serve all three: Nagios reads 1 as WARNING and 2 as CRITICAL,
node-problem-detector reads 1 as a problem and 2 as unknown, and SLURM knows only
zero and non-zero. So:

| verdict                                  | slurm         | npd           | nagios |
|------------------------------------------|---------------|---------------|--------|
| OK (skipped checks allowed)              | 0             | 0             | 0      |
| WARN                                     | 0 (--strict 1) | 0 (--strict 1) | 1      |
| FAIL                                     | 1             | 1             | 2      |
| unknown, nothing worse found (1)         | 0             | 2             | 3      |
| usage error (bad option)                 | 2             | 2             | 2      |

(1) a check did not finish within the budget, or every check was skipped.

Sources: slurm.conf(5) (Prolog: "If the Prolog fails (returns a non-zero exit code),
this will result in the node being set to a DRAIN state"; HealthCheckProgram must
drain the node itself, with scontrol, which docs/health/slurm-healthcheck.sh does);
node-problem-detector pkg/custompluginmonitor/types (OK 0, NonOK 1, Unknown 2); the
Nagios Plugin API (0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN). Under slurm an unknown
is 0: a node is never drained because gpucheck could not tell. A usage error exits 2
everywhere, as every gpucheck command does: npd reads it as unknown, Nagios as
CRITICAL (a check that cannot run needs a person).
"""

from __future__ import annotations

from gpucheck.report import Report, Status

CONVENTIONS = ("slurm", "npd", "nagios")
DEFAULT_CONVENTION = "slurm"


def is_unknown(report: Report) -> bool:
    """Not everything could be judged: a check did not finish, or every one was skipped.
    A problem that was found still wins (the callers test it first)."""
    health = report.section("health")
    unfinished = bool(health is not None and health.data.get("unfinished"))
    return unfinished or report.verdict() is Status.SKIP


def exit_code(report: Report, convention: str, strict: bool = False) -> int:
    verdict = report.verdict()
    if convention == "nagios":
        if verdict is Status.FAIL:
            return 2
        if verdict is Status.WARN:
            return 1
        return 3 if is_unknown(report) else 0
    if verdict is Status.FAIL or (strict and verdict is Status.WARN):
        return 1
    if convention == "npd" and is_unknown(report):
        return 2
    return 0
