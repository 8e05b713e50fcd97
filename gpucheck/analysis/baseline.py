"""Baselines: each metric's expected value on healthy nodes and a floor under it
(`fleet --save-baseline` writes one; `--baseline` judges against it; docs/fleet.md,
"Baselines").
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpucheck import __version__
from gpucheck.analysis.loading import BASELINE_KIND, JUDGED, family, judged, position, slot_subject
from gpucheck.inputs import InputError, JsonProblem, parse_json, read_capped
from gpucheck.measure import Better, Metric
from gpucheck.peers import shortfall, trimmed
from gpucheck.report import Finding, ok, skip, warn
from gpucheck.stats import describe, number, significant

BASELINE_SCHEMA_VERSION = 1


class BaselineError(ValueError):
    """A baseline file that cannot be used: the message names the file and the problem."""


@dataclass(frozen=True)
class Expected:
    """One metric's expected value and its limit: a floor for `higher` metrics, a
    ceiling for `lower` ones (the file calls it "direction"). `nodes` values were left
    after trimming; `mad` is theirs."""

    expected: float
    limit: float
    better: Better
    unit: str
    nodes: int
    mad: float

    def beyond(self, value: float) -> bool:
        """True when `value` is worse than the limit."""
        return value < self.limit if self.better is Better.HIGHER else value > self.limit


@dataclass(frozen=True)
class Baseline:
    """Expected values by metric key (`Metric.key()`, gpucheck.analysis.loading)."""

    tolerance: float
    metrics: Mapping[str, Expected]
    created_at: str = ""
    source: Mapping[str, Any] = field(default_factory=dict)


def expected_from(values: Sequence[float], better: Better, unit: str, tolerance: float,
                  mad_k: float) -> Expected:
    """The median of `values` after iterative trimming, with its limit `tolerance` away."""
    kept = trimmed(values, tolerance, mad_k)
    spread = describe(kept)
    factor = 1 - tolerance if better is Better.HIGHER else 1 + tolerance
    return Expected(significant(spread.median), significant(spread.median * factor),
                    better, unit, spread.n, significant(spread.mad))


def build_baseline(samples: Mapping[str, Sequence[Metric]], tolerance: float, mad_k: float,
                   created_at: str = "", source: Mapping[str, Any] | None = None) -> Baseline:
    """A baseline from every healthy node's metrics, by key (info metrics left out)."""
    metrics = {}
    for name in sorted(samples):
        found = samples[name]
        if found and judged(found[0]):
            metrics[name] = expected_from([m.value for m in found], found[0].better,
                                          found[0].unit, tolerance, mad_k)
    return Baseline(tolerance, metrics, created_at, dict(source or {}))


def baseline_to_dict(baseline: Baseline) -> dict[str, Any]:
    return {
        "kind": BASELINE_KIND,
        "schema_version": BASELINE_SCHEMA_VERSION,
        "tool_version": __version__,
        "created_at": baseline.created_at,
        "source": dict(baseline.source),
        "tolerance": baseline.tolerance,
        "metrics": {name: {"expected": e.expected, "limit": e.limit,
                           "direction": e.better.value, "unit": e.unit, "nodes": e.nodes,
                           "mad": e.mad} for name, e in sorted(baseline.metrics.items())},
    }


def baseline_json(baseline: Baseline) -> str:
    return json.dumps(baseline_to_dict(baseline), indent=2) + "\n"


def load_baseline(path: str) -> Baseline:
    """The baseline in `path`, or BaselineError naming the file and what is wrong."""
    try:
        raw = parse_json(read_capped(path))  # regular files only, bounded
    except InputError as exc:
        raise BaselineError(f"{path}: {exc.strerror}") from None
    except JsonProblem as exc:
        raise BaselineError(f"{path}: is not a gpucheck baseline ({exc})") from None
    except OSError as exc:
        raise BaselineError(f"{path}: cannot be read ({exc.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise BaselineError(f"{path}: is not valid JSON, so not a gpucheck baseline") from None
    return baseline_from_dict(raw, path)


def baseline_from_dict(raw: Any, path: str = "baseline") -> Baseline:
    if not isinstance(raw, dict) or raw.get("kind") != BASELINE_KIND:
        raise BaselineError(f"{path}: is not a gpucheck baseline (no \"kind\": "
                            f"\"{BASELINE_KIND}\"; write one with gpucheck fleet "
                            "--save-baseline)")
    version = raw.get("schema_version")
    if isinstance(version, bool) or version != BASELINE_SCHEMA_VERSION:
        raise BaselineError(f"{path}: has unknown baseline schema_version {version!r} (this "
                            f"gpucheck reads {BASELINE_SCHEMA_VERSION})")
    metrics, tolerance = raw.get("metrics"), number(raw.get("tolerance"))
    if not isinstance(metrics, dict) or tolerance is None:
        raise BaselineError(f"{path}: is a damaged baseline (no \"metrics\" or \"tolerance\")")
    return Baseline(tolerance, {name: _expected(path, name, e) for name, e in metrics.items()},
                    str(raw.get("created_at") or ""),
                    source if isinstance(source := raw.get("source"), dict) else {})


def _expected(path: str, name: str, raw: Any) -> Expected:
    entry = raw if isinstance(raw, dict) else {}
    expected, limit = number(entry.get("expected")), number(entry.get("limit"))
    direction = entry.get("direction")
    if expected is None or limit is None or direction not in JUDGED:
        raise BaselineError(f"{path}: metric {name!r} needs numbers \"expected\" and "
                            "\"limit\" and a \"direction\" of higher or lower")
    nodes, mad = entry.get("nodes"), number(entry.get("mad"))
    return Expected(expected, limit, Better(direction), str(entry.get("unit") or ""),
                    nodes if isinstance(nodes, int) else 0, mad or 0.0)


def below_baseline(metrics: Mapping[str, Metric], baseline: Baseline) -> list[Metric]:
    """The metrics worse than their baseline limit, by key."""
    return [m for name, m in sorted(metrics.items())
            if name in baseline.metrics and baseline.metrics[name].beyond(m.value)]


def baseline_findings(report_metrics: Mapping[str, Metric], baseline: Baseline) -> list[Finding]:
    """WARN `baseline.metric` for each figure (a GPU's, or a collective's over its sizes)
    worse than the baseline's limit; one OK when none is; SKIP when the report and the
    baseline share no metric. `report_metrics` is `metrics_of(report)`."""
    shared = [name for name in report_metrics if name in baseline.metrics]
    if not shared:
        return [skip("baseline.metric", "no metric of this report is in the baseline (it "
                     "was saved from other commands, GPUs or message sizes)")]
    groups: dict[tuple[str, str | None], list[Metric]] = {}
    for metric in below_baseline(report_metrics, baseline):
        groups.setdefault((family(metric), position(metric)), []).append(metric)
    findings = [_below_finding(found, baseline) for _, found in sorted(groups.items(),
                                                                         key=_group_key)]
    if not findings:
        findings.append(ok("baseline.metric", f"{len(shared)} metric(s) within "
                           f"{baseline.tolerance:.0%} of their baseline (none beyond its "
                           "limit)"))
    return findings


def _group_key(item: tuple[tuple[str, str | None], list[Metric]]) -> tuple[str, str]:
    (family, position), _ = item
    return family, position or ""


def _below_finding(found: list[Metric], baseline: Baseline) -> Finding:
    worst = max(found, key=lambda m: shortfall(m.value, baseline.metrics[m.key()].expected,
                                               m.better))
    entry = baseline.metrics[worst.key()]
    side = "floor" if entry.better is Better.HIGHER else "ceiling"
    gap = shortfall(worst.value, entry.expected, worst.better)
    what = worst.key() if len(found) == 1 else (
        f"{family(worst)}: {len(found)} figures beyond the baseline, worst {worst.key()}")
    return warn("baseline.metric", f"{what} = {worst.value:.4g} {worst.unit}, beyond the "
                f"baseline {side} {entry.limit:.4g} ({gap:.0%} worse than the expected "
                f"{entry.expected:.4g})",
                hint="run again to confirm; if it repeats, compare this node's gpucheck env "
                "and stress with a healthy one (gpucheck compare)",
                subject=slot_subject(worst))
