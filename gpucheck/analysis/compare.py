"""Two reports of one command side by side: facts, every metric's change, findings;
B judged against A (docs/fleet.md, "gpucheck compare").
"""

from __future__ import annotations

from typing import Any

from gpucheck.analysis.loading import (
    ENVIRONMENT,
    HARDWARE,
    SETUP,
    VERSION,
    LoadedReport,
    family,
    fewer_gpus,
    judged,
    metric_order,
    slot_subject,
)
from gpucheck.analysis.noise import (
    NOISY,
    Noise,
    host_bound_finding,
    host_bound_ranks,
    host_prefixes,
    judged_threshold,
    noise_levels,
    relabel,
)
from gpucheck.measure import Metric
from gpucheck.peers import shortfall
from gpucheck.report import Finding, Section, fail, ok, skip, warn
from gpucheck.subject import Kind, text

PROBLEMS = ("WARN", "FAIL")


def compare_sections(a: LoadedReport, b: LoadedReport, threshold: float) -> list[Section]:
    return [_inputs_section(a, b), _facts_section(a, b), _metrics_section(a, b, threshold),
            _findings_section(a, b)]


def _inputs_section(a: LoadedReport, b: LoadedReport) -> Section:
    table = [{"side": name, "file": s.path, "host": s.host, "command": s.command,
              "created_at": s.created_at, "gpucheck": s.report.tool_version,
              "verdict": s.verdict}
             for name, s in (("A", a), ("B", b))]
    return Section("inputs", "Reports compared (B against A)", {"reports": table})


# --- facts -------------------------------------------------------------------------

def _facts_section(a: LoadedReport, b: LoadedReport) -> Section:
    """What differs, side by side; the facts both share only by name."""
    keys = sorted(a.facts.keys() | b.facts.keys())
    table, same, findings = [], [], []
    for key in keys:
        fa, fb = a.facts.get(key), b.facts.get(key)
        va, vb = (fa.value if fa else None), (fb.value if fb else None)
        fact = fa or fb
        assert fact is not None  # the key comes from one side or the other
        kind = fact.kind
        if va == vb:
            same.append(key)
            continue
        table.append({"fact": key, "kind": kind, "A": va, "B": vb})
        findings.append(_fact_finding(key, kind, va, vb))
    if not findings:
        findings.append(ok("compare.facts", f"A and B agree on all {len(keys)} versions, "
                           "GPU models and counts, environment variables and settings"))
    return Section("facts", "Versions, hardware and run settings that differ",
                   {"differ": table, "same": same}, findings)


def _fact_finding(key: str, kind: str, va: str | None, vb: str | None) -> Finding:
    change = f"{key}: {va if va is not None else 'absent'} (A) -> " \
             f"{vb if vb is not None else 'absent'} (B)"
    if fewer_gpus(key, kind, va, vb):
        return fail("compare.hardware", f"B has fewer GPUs: {change}",
                    hint="a GPU is missing from B: check nvidia-smi -L and the kernel log "
                    "(Xid 79: fell off the bus) on B's node", subject=text(key))
    if kind == SETUP:
        return warn("compare.setup", f"the runs differ in {change}: their figures measure "
                    "different things", hint="rerun both with the same options before "
                    "reading their metrics as a regression", subject=text(key))
    check = {HARDWARE: "compare.hardware", ENVIRONMENT: "compare.environment",
             VERSION: "compare.versions"}.get(kind, "compare.versions")
    return warn(check, change, hint="if the change was not intended, align B with A (driver, "
                "packages, container image, launcher environment)", subject=text(key))


# --- metrics -----------------------------------------------------------------------

def _verdict(ma: Metric | None, mb: Metric | None, threshold: float,
             noise: Noise | None) -> str:
    """worse / better beyond the metric's own threshold (the user's, or its runs' noise
    when that is larger); a larger change inside the noise is "within noise"."""
    if ma is None or mb is None:
        return "only in B" if ma is None else "only in A"
    if not judged(ma):
        return "info"
    if noise is not None and noise.level >= NOISY:
        return "too noisy"
    short = shortfall(mb.value, ma.value, ma.better)
    used = judged_threshold(threshold, noise)
    if abs(short) <= threshold:
        return "same"
    if abs(short) <= used:
        return "within noise"
    return "worse" if short > 0 else "better"


def change_pct(a: float, b: float) -> float | None:
    """B's change against A in percent (None from zero)."""
    if a == 0:
        return 0.0 if b == 0 else None
    return round((b - a) / abs(a) * 100, 1)


def _metric_row(name: str, ma: Metric | None, mb: Metric | None,
                threshold: float, noise: Noise | None) -> dict[str, Any]:
    any_metric = ma or mb
    assert any_metric is not None
    both = ma is not None and mb is not None and judged(ma)
    return {"metric": name, "unit": any_metric.unit,
            "better": any_metric.better.value if judged(any_metric) else "-",
            "A": ma.value if ma else None, "B": mb.value if mb else None,
            "change_pct": change_pct(ma.value, mb.value) if ma and mb else None,
            "threshold_pct": round(judged_threshold(threshold, noise) * 100, 1)
            if both else None,
            "noise": f"{noise.level:.1%} {noise.source}" if both and noise else None,
            "verdict": _verdict(ma, mb, threshold, noise)}


def _metrics_section(a: LoadedReport, b: LoadedReport, threshold: float) -> Section:
    names = sorted(a.metrics.keys() | b.metrics.keys(), key=metric_order)
    noise = noise_levels(a.metrics, b.metrics, host_prefixes(a.facts, b.facts))
    table = [_metric_row(n, a.metrics.get(n), b.metrics.get(n), threshold, noise.get(n))
             for n in names]
    host_bound = host_bound_ranks(table, a.metrics, b.metrics)
    explained = relabel(table, host_bound, a.metrics)
    worse: dict[str, list[dict[str, Any]]] = {}
    for row in table:
        if row["verdict"] == "worse":
            worse.setdefault(family(a.metrics[row["metric"]]), []).append(row)
    findings = [_regression(family, found, a, b, threshold)
                for family, found in sorted(worse.items())]
    findings += _missing(table)
    findings += _noisy(table, threshold)
    if host_bound:
        findings.append(host_bound_finding(host_bound, explained))
    if not worse:
        better = sum(1 for r in table if r["verdict"] == "better")
        compared = sum(1 for r in table if r["verdict"] in ("same", "better", "within noise"))
        says = skip if not compared and any(r["verdict"] == "too noisy" for r in table) else ok
        findings.append(says("compare.metrics", f"{compared} metric(s) compared: none worse "
                             f"in B beyond its threshold ({threshold:.0%}, or its runs' noise "
                             f"when larger), {better} better"))
    data = {"threshold": threshold, "metrics": table}
    return Section("metrics", f"Metrics (B against A; worse beyond {threshold:.0%}, or the "
                   "runs' own noise when larger, fails)", data, findings)


def _noisy(table: list[dict[str, Any]], threshold: float) -> list[Finding]:
    """Say what could not be judged, and how wide the noise was: never silently."""
    inside = [r for r in table if r["verdict"] == "within noise"]
    noisy = [r["metric"] for r in table if r["verdict"] == "too noisy"]
    findings = []
    if inside:
        widest = max(r["threshold_pct"] for r in inside)
        findings.append(ok("compare.noise", f"{len(inside)} metric(s) changed by more than "
                           f"{threshold:.0%} but within their runs' own noise (thresholds up "
                           f"to {widest:g}%, column threshold_pct): not a regression"))
    if noisy:
        shown = ", ".join(noisy[:4]) + (f" and {len(noisy) - 4} more" if len(noisy) > 4
                                         else "")
        findings.append(skip("compare.noise", f"{len(noisy)} metric(s) too noisy to judge "
                             f"(their runs differ by {NOISY:.0%} or more by noise alone): "
                             f"{shown}"))
    return findings


def _regression(family: str, found: list[dict[str, Any]], a: LoadedReport, b: LoadedReport,
                threshold: float) -> Finding:
    """One FAIL per family (a GPU's figure, a collective over its sizes), naming the worst."""
    def short(row: dict[str, Any]) -> float:
        name = row["metric"]
        return shortfall(b.metrics[name].value, a.metrics[name].value, a.metrics[name].better)

    worst = max(found, key=short)
    metric = b.metrics[worst["metric"]]
    pct = "from zero" if worst["change_pct"] is None else f"{worst['change_pct']:+.1f}%"
    lead = worst["metric"] if len(found) == 1 else (
        f"{family}: {len(found)} figures worse by more than {threshold:.0%}, worst "
        f"{worst['metric']}")
    return fail("compare.regression", f"{lead}: {worst['A']:.4g} -> {worst['B']:.4g} "
                f"{metric.unit} ({pct})",
                hint="run both again to tell noise from a change; if B stays worse, look at "
                "what changed between them (the facts above, gpucheck env on B's node)",
                subject=slot_subject(metric))


def _missing(table: list[dict[str, Any]]) -> list[Finding]:
    gone = [r["metric"] for r in table if r["verdict"] == "only in A"]
    if not gone:
        return []
    shown = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
    return [warn("compare.missing", f"{len(gone)} metric(s) of A are missing from B: {shown}",
                 hint="B measured less (fewer ranks, sizes or phases, or a run that stopped "
                 "early): rerun B with A's options")]


# --- findings ----------------------------------------------------------------------

def _subject_key(finding: Finding) -> str:
    """The slot a finding is about: its subject's position ("gpu3", "rank1"), so "GPU 3"
    on two nodes is one slot whatever its bus id and UUID; else the subject's words."""
    made = finding.subject
    if made is None:
        return ""
    return (made.position() if made.kind is not Kind.TEXT else None) or made.label


def _problems(side: LoadedReport) -> dict[tuple[str, str, str], Finding]:
    found: dict[tuple[str, str, str], Finding] = {}
    for f in side.findings:
        if f.status.value in PROBLEMS:
            found.setdefault((f.check, _subject_key(f), f.status.value), f)
    return found


def _findings_section(a: LoadedReport, b: LoadedReport) -> Section:
    pa, pb = _problems(a), _problems(b)
    new = [pb[k] for k in sorted(pb.keys() - pa.keys())]
    gone = [pa[k] for k in sorted(pa.keys() - pb.keys())]
    table = [_change_row("new in B", f) for f in new] + [_change_row("gone in B", f)
                                                          for f in gone]
    findings = [Finding("compare.findings", f.status, f"new in B: {f.check}: {f.message}",
                        f.hint or "see B's report", f.subject, relayed=f.action)
                for f in new]
    if not new:
        findings.append(ok("compare.findings", "no WARN or FAIL in B that A did not have"))
    if gone:
        findings.append(ok("compare.findings", f"{len(gone)} WARN/FAIL of A gone in B"))
    return Section("findings", "Findings that appeared or went away (WARN and FAIL)",
                   {"changes": table}, findings)


def _change_row(change: str, f: Finding) -> dict[str, Any]:
    return {"change": change, "status": f.status.value, "check": f.check,
            "subject": _subject_key(f) or None, "action": f.action, "message": f.message}
