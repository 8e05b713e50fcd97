"""A fleet's inputs grouped by command and node, and the reasons a node needs acting on.

Every analysis of the fleet (coverage, drift, outliers, baseline, the node's own
findings) gives `Reason`s naming a node; `gpucheck.analysis.fleet` ranks the nodes by
them. Nodes are named by their report's `host` (the file name when it has none).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpucheck.analysis.facts import Fact, extract_facts
from gpucheck.analysis.loading import ANALYSIS_COMMANDS, LoadedReport, finding_action
from gpucheck.analysis.metrics import Metric, extract_metrics
from gpucheck.report import Status


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
class Fleet:
    """The readable reports by command, then node (newest report per node and command)."""

    groups: Mapping[str, Mapping[str, NodeReport]]
    unreadable: Sequence[Unused]
    unused: Sequence[Unused]

    @property
    def nodes(self) -> list[str]:
        return sorted({n for group in self.groups.values() for n in group})

    @property
    def reports(self) -> list[NodeReport]:
        return [r for _, group in sorted(self.groups.items()) for _, r in sorted(group.items())]


def node_name(report: LoadedReport) -> str:
    return report.host or Path(report.path).stem


def group_reports(loaded: Iterable[LoadedReport], unreadable: Sequence[Unused]) -> Fleet:
    """Group by command and node; an older report of the same node and command, and
    reports of compare and fleet themselves, are listed as unused."""
    groups: dict[str, dict[str, NodeReport]] = {}
    unused: list[Unused] = []
    for report in sorted(loaded, key=lambda r: (timestamp(r.created_at), r.path)):
        if report.command in ANALYSIS_COMMANDS:
            unused.append(Unused(report.path, f"a gpucheck {report.command} report, not a "
                                              "node's"))
            continue
        group = groups.setdefault(report.command, {})
        node = node_name(report)
        if node in group:  # sorted oldest first: the newer one replaces it
            unused.append(Unused(group[node].report.path, f"an older {report.command} report "
                                                          f"of {node} (newer: {report.path})"))
        group[node] = NodeReport(node, report, extract_metrics(report.raw),
                                 extract_facts(report.raw))
    return Fleet({c: dict(sorted(g.items())) for c, g in sorted(groups.items())},
                 sorted(unreadable, key=lambda u: u.path), sorted(unused, key=lambda u: u.path))


def timestamp(created_at: str) -> float:
    """created_at as seconds since the epoch (0 when it cannot be read)."""
    try:
        when = _dt.datetime.fromisoformat(created_at)
    except ValueError:
        return 0.0
    if when.tzinfo is None:
        when = when.replace(tzinfo=_dt.timezone.utc)
    return when.timestamp()


def newest_created_at(reports: Iterable[LoadedReport]) -> str:
    """The newest input's created_at: the analysis's own, so that the same inputs give
    a byte-identical report whenever and wherever it is made."""
    stamps = sorted((timestamp(r.created_at), r.created_at) for r in reports)
    return stamps[-1][1] if stamps else ""


def finding_reasons(node: NodeReport) -> list[Reason]:
    """The node's own WARN and FAIL findings, each with its action."""
    reasons = []
    for f in node.report.findings:
        if f["status"] in ("WARN", "FAIL"):
            hint = f.get("hint") if isinstance(f.get("hint"), str) else None
            subject = f.get("subject") if isinstance(f.get("subject"), str) else None
            reasons.append(Reason(node.node, f["status"], finding_action(f) or "rerun",
                                  f["check"], str(f.get("message", "")), subject,
                                  node.command, hint))
    return reasons
