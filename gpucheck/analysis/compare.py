"""Two reports of one command side by side: facts, every metric's change, findings;
B judged against A, each change against the noise its figures show and the host-bound
rule (docs/fleet.md, "gpucheck compare" and "Noise").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck.analysis.loading import (
    ENVIRONMENT,
    HARDWARE,
    SETUP,
    VERSION,
    Fact,
    LoadedReport,
    family,
    fewer_gpus,
    judged,
    metric_order,
    position,
    slot_subject,
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


# --- noise and the host-bound rule --------------------------------------------

NOISY = 0.5  # a metric that can move by half by noise alone is not judged
# Four healthy `gpucheck comm` runs back to back on CPU ranks (2-core VM, issue 36 item
# 9; tests/data/noise_pairs/README.md): a figure moved by a median 1.5-1.9x between two
# runs, 4-6x at the 90th percentile, up to 17x, while one run's own spread was 1-4%.
# Noise of 4x (a 75% drop) is beyond NOISY: compare says "too noisy", never a regression.
HOST_BOUND_RUNS = 0.75
_HOST_BOUND = (("comm.device", "cpu", "comm."),)  # (fact, value, metric prefix)


@dataclass(frozen=True)
class Noise:
    """A metric's noise as a shortfall fraction, and where it came from."""

    level: float
    source: str  # "within the runs", "others better in B", or "none measured"


def host_prefixes(*facts: Mapping[str, Fact]) -> tuple[str, ...]:
    """The metric prefixes whose figures measure the host in either run (CPU ranks)."""
    return tuple(prefix for key, value, prefix in _HOST_BOUND
                 if any(f.get(key) is not None and f[key].value == value for f in facts))


def noise_levels(a: Mapping[str, Metric], b: Mapping[str, Metric],
                 host: tuple[str, ...] = ()) -> dict[str, Noise]:
    """Every metric both runs have, with its noise; `host`: the prefixes of figures that
    measure the host (`host_prefixes`), at least HOST_BOUND_RUNS."""
    shared = sorted(a.keys() & b.keys())
    moves = {n: shortfall(b[n].value, a[n].value, a[n].better) for n in shared
             if judged(a[n])}
    levels: dict[str, Noise] = {}
    for name in moves:
        within = max(_as_shortfall(a[name].spread), _as_shortfall(b[name].spread))
        mirror = _mirror(name, a[name], moves, a)
        if host and name.startswith(host):
            levels[name] = Noise(max(within, mirror, HOST_BOUND_RUNS), "CPU ranks: runs")
        elif max(within, mirror) <= 0:
            levels[name] = Noise(0.0, "none measured")
        elif within >= mirror:
            levels[name] = Noise(within, "within the runs")
        else:
            levels[name] = Noise(mirror, "others better in B")
    return levels


def judged_threshold(threshold: float, noise: Noise | None) -> float:
    return max(threshold, noise.level if noise else 0.0)


def _as_shortfall(spread: float | None) -> float:
    """A spread of +s (values up to 1+s apart) as the drop it can fake: 1 - 1/(1+s)."""
    if spread is None or not math.isfinite(spread) or spread <= 0:
        return 0.0
    return 1 - 1 / (1 + spread)


def _mirror(name: str, metric: Metric, moves: Mapping[str, float],
            a: Mapping[str, Metric]) -> float:
    """The largest improvement in B among the metric's family, as a drop it can fake."""
    better = [-moves[other] for other in _family_members(name, metric, moves, a)
              if moves[other] < 0]
    best = max(better, default=0.0)
    if math.isinf(best):
        return 1.0
    return 1 - 1 / (1 + best)


def _family_members(name: str, metric: Metric, moves: Mapping[str, float],
                a: Mapping[str, Metric]) -> list[str]:
    """The other figures of the metric's family (the other sizes of one collective, the
    other ranks of one figure), measured in the same two runs."""
    return [n for n in moves if n != name and family(a[n]) == family(metric)]


HOST_BOUND = "host-bound"
_WALL = "bench.images_per_s"
_PACE = "bench.iteration_p50_ms"
# The job's figures that follow the slowest rank: host-bound when every worse rank is.
_JOB = ("bench.aggregate_images_per_s", "bench.job_wall_s", "bench.parallel_efficiency",
        "bench.spread_slowest_vs_median")


def host_bound_ranks(table: list[dict[str, Any]], a: Mapping[str, Metric],
                     b: Mapping[str, Metric]) -> dict[str, tuple[float, float]]:
    """Rank position -> (wall, pace) slowdown factors of B against A, for every rank
    whose wall figure is worse and whose pace explains less than half of it (in log
    terms: 6x slower on the wall clock at a 1.1x slower pace is a busy host; 1.4x at
    1.4x is a slower device). Load also costs some pace (shared caches), hence half."""
    found = {}
    for row in table:
        name = row["metric"]
        rank = _rank_of(a.get(name), _WALL)
        if rank is None or row["verdict"] != "worse":
            continue
        pace = f"{_PACE}.{rank}"
        if pace not in a or pace not in b or min(a[pace].value, b[pace].value) <= 0 \
                or b[name].value <= 0:
            continue
        wall_factor = a[name].value / b[name].value  # images/s: higher is better
        pace_factor = b[pace].value / a[pace].value  # ms per iteration: lower is better
        if math.log(max(pace_factor, 1.0)) < 0.5 * math.log(wall_factor):
            found[rank] = (wall_factor, pace_factor)
    return found


def _rank_of(metric: Metric | None, name: str) -> str | None:
    """The rank position ("rank1") of a per-rank `name` figure, else None."""
    if metric is None or metric.name != name:
        return None
    return position(metric)


def relabel(table: list[dict[str, Any]], ranks: Mapping[str, Any],
            metrics: Mapping[str, Metric]) -> list[dict[str, Any]]:
    """Mark the host-bound ranks' wall and pace rows, and the job's figures when every
    worse rank is host-bound; return the job's rows so marked (the symptoms the host-bound
    WARN explains)."""
    worse_ranks = {rank for r in table if r["verdict"] == "worse"
                   and (rank := _rank_of(metrics.get(r["metric"]), _WALL)) is not None}
    explained = []
    for row in table:
        name = row["metric"]
        if row["verdict"] != "worse":
            continue
        rank = _rank_of(metrics.get(name), _WALL) or _rank_of(metrics.get(name), _PACE)
        if rank is not None and rank in ranks:
            row["verdict"] = HOST_BOUND
        elif name in _JOB and worse_ranks and worse_ranks <= ranks.keys():
            row["verdict"] = HOST_BOUND
            explained.append(row)
    return explained


def host_bound_finding(ranks: Mapping[str, tuple[float, float]],
                       explained: Sequence[Mapping[str, Any]] = ()) -> Finding:
    """The WARN naming the cause, and the job's figures it explains (`relabel`)."""
    said = ", ".join(f"{rank}: {wall:.2f}x slower on the wall clock, pace {pace:.2f}x"
                     for rank, (wall, pace) in sorted(ranks.items()))
    also = "; ".join(f"{r['metric']} {r['A']:.4g} -> {r['B']:.4g}" for r in explained)
    return warn("compare.host_bound",
                f"B's ranks ran slower but computed at about A's pace ({said}): B's host did not "
                "run them for part of the time (other load, a CPU quota, a stopped "
                "process), so this is not a slower device"
                + (f"; the job's figures fell with them ({also})" if also else ""),
                hint="rerun B on an idle node (check top, the job's cgroup CPU quota, other "
                "jobs on the node); if it stays slow, find what shares the node's CPUs")
