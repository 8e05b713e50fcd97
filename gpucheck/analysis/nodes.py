"""A fleet's inputs grouped by command and node, the `Reason`s a node needs acting on,
and the findings on the files themselves (two claiming one host, one dated ahead).
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpucheck.analysis.loading import ANALYSIS_COMMANDS, Fact, LoadedReport
from gpucheck.measure import Metric
from gpucheck.report import Finding, Status, fail, warn
from gpucheck.subject import host


@dataclass(frozen=True)
class NodeReport:
    """One node's report of one command, with its metrics and facts."""

    node: str
    report: LoadedReport
    metrics: Mapping[str, Metric]
    facts: Mapping[str, Fact]

    @property
    def command(self) -> str:
        return self.report.command

    @property
    def healthy(self) -> bool:
        """Fit to set a baseline: the run finished and nothing FAILed."""
        return not self.report.run_failed and self.report.verdict != "FAIL"


@dataclass(frozen=True)
class Reason:
    """Why `node` needs acting on: a WARN or FAIL with its action, and where it came
    from (the command whose report said it, or "fleet" for what only the fleet sees)."""

    node: str
    status: str
    action: str
    check: str
    message: str
    subject: str | None = None
    source: str = "fleet"
    hint: str | None = None

    @property
    def severity(self) -> int:
        return Status(self.status).severity


@dataclass(frozen=True)
class Unused:
    """A file read but left out of the analysis, and why."""

    path: str
    why: str


@dataclass(frozen=True)
class Duplicate:
    """Several files claiming one node for one command (a host name is a claim, not a
    proof: a copied or stale file says the same). `reports`: oldest first; the last
    one is the node's judged report."""

    node: str
    command: str
    reports: tuple[LoadedReport, ...]


@dataclass(frozen=True)
class Fleet:
    """The readable reports by command, then node (newest report per node and command).

    `shadowed`: the other reports of a node and command, kept so that their FAILs
    stay visible; `duplicates` names them; `future`: reports dated ahead of now."""

    groups: Mapping[str, Mapping[str, NodeReport]]
    unreadable: Sequence[Unused]
    unused: Sequence[Unused]
    shadowed: Sequence[NodeReport] = ()
    duplicates: Sequence[Duplicate] = ()
    future: Sequence[LoadedReport] = ()

    @property
    def nodes(self) -> list[str]:
        return sorted({n for group in self.groups.values() for n in group})

    @property
    def reports(self) -> list[NodeReport]:
        return [r for _, group in sorted(self.groups.items()) for _, r in sorted(group.items())]


def node_name(report: LoadedReport) -> str:
    return report.host or Path(report.path).stem


# Clocks of a cluster agree within seconds (NTP); a quarter of an hour ahead is a
# wrong clock or an edited file, not skew.
FUTURE_SLACK_S = 15 * 60


def group_reports(loaded: Iterable[LoadedReport], unreadable: Sequence[Unused],
                  now: float | None = None) -> Fleet:
    """Group by command and node; an older report of the same node and command, and
    reports of compare and fleet themselves, are listed as unused. The older report
    is also kept as `shadowed` (its FAILs still count) and named in `duplicates`."""
    groups: dict[str, dict[str, NodeReport]] = {}
    unused: list[Unused] = []
    shadowed: list[NodeReport] = []
    claims: dict[tuple[str, str], list[LoadedReport]] = {}
    for report in sorted(loaded, key=lambda r: (timestamp(r.created_at), r.path)):
        if report.command in ANALYSIS_COMMANDS:
            unused.append(Unused(report.path, f"a gpucheck {report.command} report, not a "
                                              "node's"))
            continue
        group = groups.setdefault(report.command, {})
        node = node_name(report)
        claims.setdefault((report.command, node), []).append(report)
        if node in group:  # sorted oldest first: the newer one replaces it
            unused.append(Unused(group[node].report.path, f"an older {report.command} report "
                                                          f"of {node} (newer: {report.path})"))
            shadowed.append(group[node])
        group[node] = NodeReport(node, report, report.metrics, report.facts)
    duplicates = [Duplicate(node, command, tuple(found))
                  for (command, node), found in sorted(claims.items()) if len(found) > 1]
    limit = (time.time() if now is None else now) + FUTURE_SLACK_S
    future = sorted((r for r in loaded if timestamp(r.created_at) > limit), key=lambda r: r.path)
    return Fleet({c: dict(sorted(g.items())) for c, g in sorted(groups.items())},
                 sorted(unreadable, key=lambda u: u.path), sorted(unused, key=lambda u: u.path),
                 sorted(shadowed, key=lambda r: r.report.path), duplicates, future)


def timestamp(created_at: str) -> float:
    """created_at as seconds since the epoch (0 when it cannot be read)."""
    try:
        when = _dt.datetime.fromisoformat(created_at)
        if when.tzinfo is None:
            when = when.replace(tzinfo=_dt.timezone.utc)
        return when.timestamp()
    except (ValueError, OverflowError, OSError):  # year 9999 in a far time zone
        return 0.0


def newest_created_at(reports: Iterable[LoadedReport]) -> str:
    """The newest input's created_at: the analysis's own, so that the same inputs give
    a byte-identical report whenever and wherever it is made."""
    stamps = sorted((timestamp(r.created_at), r.created_at) for r in reports)
    return stamps[-1][1] if stamps else ""


def finding_reasons(node: NodeReport, shadowed: bool = False) -> list[Reason]:
    """The node's own WARN and FAIL findings, each with its action; of a `shadowed`
    report (another file claims the node), its FAILs only, naming the file."""
    reasons = []
    wanted = (Status.FAIL,) if shadowed else (Status.WARN, Status.FAIL)
    where = f"in {node.report.path} (not the judged report): " if shadowed else ""
    for f in node.report.findings:
        if f.status in wanted:
            reasons.append(Reason(node.node, f.status.value, str(f.action), f.check,
                                  where + f.message, None if f.subject is None else f.subject.label,
                                  node.command, f.hint))
    return reasons


_DUPLICATE_HINT = ("keep one report per node and command: remove the stale or copied "
                   "file, or rerun gpucheck on the node to learn which is true")
_FUTURE_HINT = ("check the node's clock (timedatectl; chrony or ntpd) or where the file "
                "came from: a date ahead of now makes it win over the node's real reports")


def duplicate_finding(dup: Duplicate) -> tuple[Finding, Reason]:
    """FAIL when a file that is not judged has a FAIL (it must not vanish), else WARN."""
    judged = dup.reports[-1]
    hidden_fail = any(r.verdict == "FAIL" for r in dup.reports[:-1])
    files = "; ".join(f"{r.path} ({r.verdict}, {r.created_at or 'no date'})"
                      for r in dup.reports)
    message = (f"{len(dup.reports)} {dup.command} reports claim host {dup.node}: {files}; "
               f"only the newest ({judged.path}) is judged")
    finding = (fail if hidden_fail else warn)("fleet.duplicate_host", message,
                                              hint=_DUPLICATE_HINT, subject=host(dup.node))
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
