"""Who a report says it is, checked: two files claiming one node, a date ahead of now.

A report's `host` and `created_at` are claims written by the node (or by whoever
copied or edited the file). fleet keeps the newest report per node and command, so
without these checks a copy of a healthy report claiming a failing node's host would
hide its FAIL (exit 1 became exit 0), and a report dated in the future would always
win. Both files stay visible here; a FAIL in the file not judged is carried into
the node's reasons by `gpucheck.analysis.fleet`.
"""

from __future__ import annotations

from gpucheck.analysis.loading import LoadedReport
from gpucheck.analysis.nodes import Duplicate, Fleet, Reason, node_name
from gpucheck.report import Finding, fail, warn
from gpucheck.subject import host

_DUPLICATE_HINT = ("keep one report per node and command: remove the stale or copied "
                   "file, or rerun gpucheck on the node to learn which is true")
_FUTURE_HINT = ("check the node's clock (timedatectl; chrony or ntpd) or where the file "
                "came from: a date ahead of now makes it win over the node's real reports")


def _described(report: LoadedReport) -> str:
    return f"{report.path} ({report.verdict}, {report.created_at or 'no date'})"


def duplicate_finding(dup: Duplicate) -> tuple[Finding, Reason]:
    """FAIL when a file that is not judged has a FAIL (it must not vanish), else WARN."""
    judged = dup.reports[-1]
    hidden_fail = any(r.verdict == "FAIL" for r in dup.reports[:-1])
    files = "; ".join(_described(r) for r in dup.reports)
    message = (f"{len(dup.reports)} {dup.command} reports claim host {dup.node}: {files}; "
               f"only the newest ({judged.path}) is judged")
    if hidden_fail:
        finding = fail("fleet.duplicate_host", message, hint=_DUPLICATE_HINT,
                       subject=host(dup.node))
    else:
        finding = warn("fleet.duplicate_host", message, hint=_DUPLICATE_HINT,
                       subject=host(dup.node))
    return finding, Reason(dup.node, finding.status.value, finding.action or "rerun",
                           "fleet.duplicate_host", message, None, "fleet", _DUPLICATE_HINT)


def future_finding(report: LoadedReport) -> tuple[Finding, Reason]:
    node = node_name(report)
    message = (f"{report.path} is dated {report.created_at}, ahead of this machine's clock "
               f"(claims host {node})")
    finding = warn("fleet.future_report", message, hint=_FUTURE_HINT, subject=host(node))
    return finding, Reason(node, "WARN", "fix-config", "fleet.future_report", message, None,
                           "fleet", _FUTURE_HINT)


def identity_findings(fleet: Fleet, reasons: list[Reason]) -> list[Finding]:
    """A finding per duplicate claim and per future-dated file; their reasons appended."""
    found = [duplicate_finding(d) for d in fleet.duplicates]
    found += [future_finding(r) for r in fleet.future]
    reasons += [reason for _, reason in found]
    return [finding for finding, _ in found]
