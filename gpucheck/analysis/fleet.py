"""Reports from many nodes: coverage, drift, outliers, a baseline, and the nodes to act
on, ranked by their `Reason`s; sorted throughout, so the same inputs give the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck.analysis.baseline import Baseline, baseline_findings, below_baseline
from gpucheck.analysis.loading import gpu_words
from gpucheck.analysis.nodes import Fleet, Reason, finding_reasons, identity_findings, timestamp
from gpucheck.analysis.outliers import (
    Drift,
    drift_reasons,
    drift_row,
    find_drift,
    judge_group,
    outlier_reasons,
    outlier_row,
)
from gpucheck.report import ACTIONS, Finding, Section, Status, fail, ok, skip, warn
from gpucheck.stats import significant
from gpucheck.subject import file, host, text

DEFAULT_THRESHOLD = 0.10
DEFAULT_MAD_K = 5.0
SHOWN = 8  # names listed in one message


@dataclass(frozen=True)
class FleetOptions:
    """How the fleet is judged (see `gpucheck fleet --help`)."""

    threshold: float = DEFAULT_THRESHOLD
    mad_k: float = DEFAULT_MAD_K
    expected_nodes: tuple[str, ...] = ()
    expected_count: int | None = None
    baseline: Baseline | None = None


def fleet_sections(fleet: Fleet, options: FleetOptions) -> list[Section]:
    reasons: list[Reason] = []
    coverage = _coverage_section(fleet, options, reasons)
    for node in fleet.reports:
        reasons += finding_reasons(node)
    for node in fleet.shadowed:  # a FAIL is never hidden by another file's claim
        reasons += finding_reasons(node, shadowed=True)
    inputs = _inputs_section(fleet, reasons)
    drift = _drift_section(fleet, reasons)
    outliers, metrics = _metric_sections(fleet, options, reasons)
    tail = [_baseline_section(fleet, options.baseline, reasons)] if options.baseline else []
    return [inputs, _actions_section(reasons, len(fleet.nodes)), coverage,
            drift, outliers, metrics, *tail]


def _listed(names: Sequence[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


# --- inputs ------------------------------------------------------------------------

def _inputs_section(fleet: Fleet, reasons: list[Reason]) -> Section:
    commands = {c: len(g) for c, g in fleet.groups.items()}
    data: dict[str, Any] = {
        "reports": sum(commands.values()), "nodes": len(fleet.nodes),
        "commands": ", ".join(f"{c} ({n})" for c, n in commands.items()),
        "unreadable": [{"file": u.path, "problem": u.why} for u in fleet.unreadable],
        "unused": [{"file": u.path, "why": u.why} for u in fleet.unused],
        **_span(fleet)}
    findings = [warn("fleet.unreadable", f"{u.path}: {u.why}", hint="left out; write the "
                     "node's report again (rerun gpucheck on it)", subject=file(u.path))
                for u in fleet.unreadable]
    findings += identity_findings(fleet, reasons)
    written = f", written {data['written_from']} to {data['written_to']}" \
        if data["written_from"] else ""
    findings.append(ok("fleet.inputs", f"{data['reports']} report(s) from {data['nodes']} "
                       f"node(s){written}: {data['commands']}"))
    return Section("inputs", "Reports read", data, findings)


def _span(fleet: Fleet) -> dict[str, str | None]:
    """When the reports read were written, oldest and newest (those dated ahead of now
    left out): the fleet's own time is when it ran (issue 36 item 7)."""
    future = {r.path for r in fleet.future}
    stamps = sorted((timestamp(r.report.created_at), r.report.created_at)
                    for r in fleet.reports if r.report.path not in future)
    return {"written_from": stamps[0][1] if stamps else None,
            "written_to": stamps[-1][1] if stamps else None}


# --- coverage ----------------------------------------------------------------------

def match_nodes(seen: Sequence[str], expected: Sequence[str]) -> tuple[list[str], list[str]]:
    """(expected nodes with no report, reporting nodes not expected). A report's host
    "gpu01.cluster.local" is node "gpu01": hostnames may be fully qualified, SLURM's
    node names are not. No expected nodes: nothing is missing or unexpected."""
    if not expected:
        return [], []
    seen_set, expected_set = set(seen), set(expected)
    short = {h.split(".", 1)[0] for h in seen}
    expected_short = {e.split(".", 1)[0] for e in expected}
    found = {e for e in expected if e in seen_set or e.split(".", 1)[0] in short}
    named = {h for h in seen if h in expected_set or h.split(".", 1)[0] in expected_short}
    return sorted(expected_set - found), sorted(seen_set - named)


def _coverage_section(fleet: Fleet, options: FleetOptions, reasons: list[Reason]) -> Section:
    nodes = fleet.nodes
    missing, unexpected = match_nodes(nodes, options.expected_nodes)
    findings: list[Finding] = []
    if missing:
        findings.append(fail("fleet.missing", f"{len(missing)} of {len(options.expected_nodes)}"
                             f" expected node(s) sent no report: {_listed(missing)}",
                             hint=_MISSING_HINT))
        reasons += [Reason(n, "FAIL", "rerun", "fleet.missing", "no report from this node",
                           None, "fleet", _MISSING_HINT) for n in missing]
    if unexpected:
        findings.append(warn("fleet.unexpected", f"{len(unexpected)} reporting node(s) not "
                             f"in --nodes: {_listed(unexpected)}", hint="check the node list "
                             "(or old reports left in the directory)"))
    for command, group in fleet.groups.items():
        findings += _command_coverage(command, sorted(group), nodes, options, reasons)
    rows = [_command_row(c, g) for c, g in fleet.groups.items()]
    if not findings:
        findings.append(ok("fleet.coverage", f"every node ({len(nodes)}) sent a report of "
                           "every command"))
    data = {"expected": len(options.expected_nodes) or options.expected_count,
            "reporting": len(nodes), "missing": missing, "commands": rows}
    return Section("nodes", "Nodes: reports missing, failed or FAIL", data, findings)


_MISSING_HINT = ("look at this node's output from srun (it died, hung, or never ran "
                 "gpucheck), then run gpucheck on it again")


def _command_coverage(command: str, have: list[str], nodes: list[str],
                      options: FleetOptions, reasons: list[Reason]) -> list[Finding]:
    """Nodes that sent other reports but not this command's; too few for --expect-nodes."""
    lacking = sorted(set(nodes) - set(have))
    findings = []
    if lacking:
        findings.append(fail("fleet.missing", f"{command}: {len(lacking)} node(s) sent other "
                             f"reports but no {command} report: {_listed(lacking)}",
                             hint=_MISSING_HINT))
        reasons += [Reason(n, "FAIL", "rerun", "fleet.missing", f"no {command} report (it "
                           "sent others)", None, "fleet", _MISSING_HINT) for n in lacking]
    count = options.expected_count
    if count is not None and not options.expected_nodes and len(have) < count:
        findings.append(fail("fleet.missing", f"{command}: {len(have)} report(s) from "
                             f"{count} expected node(s)", hint="give the node list (--nodes "
                             "gpu[01-16]) to name the missing ones"))
    return findings


def _command_row(command: str, group: Mapping[str, Any]) -> dict[str, Any]:
    reports = list(group.values())
    return {"command": command, "nodes": len(reports),
            "FAIL": sum(r.report.verdict == "FAIL" for r in reports),
            "WARN": sum(r.report.verdict == "WARN" for r in reports),
            "run_failed": _listed(sorted(r.node for r in reports if r.report.run_failed))
            or None}


# --- drift -------------------------------------------------------------------------

def _drift_section(fleet: Fleet, reasons: list[Reason]) -> Section:
    drifts: list[Drift] = [d for c, g in fleet.groups.items() for d in find_drift(c, g)]
    findings = []
    for drift in drifts:
        found = drift_reasons(drift)
        reasons += found
        status = Status.FAIL if any(r.status == "FAIL" for r in found) else Status.WARN
        findings.append(Finding("fleet.drift", status, f"{drift.command}: {drift.key}: "
                                f"{drift_row(drift)['differ']}; most nodes "
                                f"({drift.usual_nodes}) have {drift.usual!r}",
                                found[0].hint, text(drift.key), relayed=found[0].action))
    if not drifts:
        findings.append(ok("fleet.drift", "the nodes agree on every version, GPU model and "
                           "count, environment variable and run setting their reports state"))
    return Section("drift", "Drift: versions, hardware and settings that differ",
                   {"drift": [drift_row(d) for d in drifts]}, findings)


# --- metrics and outliers ----------------------------------------------------------

def _metric_sections(fleet: Fleet, options: FleetOptions,
                     reasons: list[Reason]) -> tuple[Section, Section]:
    stats_rows, outlier_rows, findings = [], [], []
    for command, group in fleet.groups.items():
        judged = judge_group(command, group, options.threshold, options.mad_k)
        stats_rows += judged.rows
        outlier_rows += [outlier_row(o) for o in judged.outliers]
        found = outlier_reasons(judged.outliers)
        reasons += found
        findings.append(_outlier_summary(command, judged.rows, found, options))
    rule = (f"worse than the median by more than {options.threshold:.0%}, or by more than "
            f"{options.mad_k:g} MADs and at least 2%")
    data = {"rule": rule, "outliers": outlier_rows}
    return (Section("outliers", "Outliers: nodes worse than the fleet", data, findings),
            Section("metrics", "Metrics across nodes (median, MAD, range)",
                    {"metrics": stats_rows}))


def _outlier_summary(command: str, rows: list[dict[str, Any]], found: list[Reason],
                     options: FleetOptions) -> Finding:
    judged = sum(1 for r in rows if r["better"] != "-")
    if not found:
        return ok("fleet.outlier", f"{command}: no node worse than the fleet on any of "
                  f"{judged} judged metric(s)")
    nodes = sorted({r.node for r in found})
    return warn("fleet.outlier", f"{command}: {len(nodes)} node(s) worse than the fleet: "
                f"{_listed(nodes)}", hint="see the outliers table and each node's reasons")


# --- baseline ----------------------------------------------------------------------

def _baseline_section(fleet: Fleet, baseline: Baseline, reasons: list[Reason]) -> Section:
    rows, shared = [], 0
    for node in fleet.reports:
        shared += sum(1 for name in node.metrics if name in baseline.metrics)
        for metric in below_baseline(node.metrics, baseline):
            entry = baseline.metrics[metric.key()]
            rows.append({"command": node.command, "node": node.node, "gpu": gpu_words(metric),
                         "metric": metric.key(), "value": significant(metric.value),
                         "limit": entry.limit, "expected": entry.expected,
                         "unit": metric.unit})
        if any(name in baseline.metrics for name in node.metrics):
            reasons += [Reason(node.node, f.status.value, f.action or "rerun", f.check,
                               f.message, None if f.subject is None else str(f.subject),
                               node.command, f.hint)
                        for f in baseline_findings(node.metrics, baseline)
                        if f.status in (Status.WARN, Status.FAIL)]
    data = {"tolerance": baseline.tolerance, "baseline_from": baseline.created_at,
            "beyond": rows}
    return Section("baseline", "Against the baseline", data, [_baseline_summary(rows, shared)])


def _baseline_summary(rows: list[dict[str, Any]], shared: int) -> Finding:
    if not shared:
        return skip("fleet.baseline", "no metric of these reports is in the baseline (saved "
                    "from other commands, GPUs or message sizes)")
    if not rows:
        return ok("fleet.baseline", f"all {shared} figure(s) the baseline knows are within "
                  "its limits")
    nodes = sorted({r["node"] for r in rows})
    return warn("fleet.baseline", f"{len(nodes)} node(s) beyond the baseline on {len(rows)} "
                f"figure(s): {_listed(nodes)}", hint="see each node's reasons")


# --- the nodes to act on -----------------------------------------------------------

def _action_rank(action: str) -> int:
    return ACTIONS.index(action) if action in ACTIONS else len(ACTIONS)


def _reason_order(r: Reason) -> tuple[int, int, str, str, str, str]:
    return (-r.severity, -_action_rank(r.action), r.source, r.check, r.subject or "",
            r.message)


def rank_nodes(reasons: Sequence[Reason]) -> list[tuple[str, list[Reason]]]:
    """Nodes with their reasons, worst first (FAIL before WARN, then the more disruptive
    action); the node whose first reason is worst comes first, then the one with more
    reasons, then by name. A node's status and action are its first reason's."""
    by_node: dict[str, list[Reason]] = {}
    for reason in reasons:
        by_node.setdefault(reason.node, []).append(reason)
    ranked = [(node, sorted(found, key=_reason_order)) for node, found in by_node.items()]
    return sorted(ranked, key=lambda item: (_reason_order(item[1][0])[:2], -len(item[1]),
                                            item[0]))


def _all_actions(found: list[Reason]) -> str:
    """Every action the node's reasons call for, the most disruptive first."""
    return ", ".join(sorted({r.action for r in found}, key=lambda a: -_action_rank(a)))


def _actions_section(reasons: Sequence[Reason], nodes: int) -> Section:
    ranked = rank_nodes(reasons)
    table, details, findings = [], [], []
    for place, (node, found) in enumerate(ranked, start=1):
        top = found[0]
        table.append({"rank": place, "node": node, "status": top.status, "action": top.action,
                      "problems": len(found), "reason": f"{top.check}: {top.message}",
                      "all_actions": _all_actions(found)})
        details += [{"node": node, "status": r.status, "action": r.action, "from": r.source,
                     "check": r.check, "subject": r.subject, "message": r.message}
                    for r in found]
        others = f" (+{len(found) - 1} more; actions of all {len(found)}: " \
            f"{_all_actions(found)})" if len(found) > 1 else ""
        findings.append(Finding("fleet.node", Status(top.status), f"{top.check}: "
                                f"{top.message}{others}", top.hint or "see the reasons table",
                                host(node), relayed=top.action))
    if not ranked:
        findings.append(ok("fleet.node", f"no node to act on among {nodes}"))
    return Section("actions", "Nodes to act on, most urgent first",
                   {"nodes": table, "reasons": details}, findings)
