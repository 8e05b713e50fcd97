"""Per metric across a command's nodes: median, MAD and the nodes worse than the rest,
slot by slot (docs/fleet.md, "Outliers"); and the facts that differ between nodes
(drift).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpucheck.analysis.loading import (
    JUDGED,
    family,
    fewer_gpus,
    gpu_words,
    judged,
    metric_order,
    position,
    slot_words,
)
from gpucheck.analysis.nodes import NodeReport, Reason
from gpucheck.measure import Better, Bound, Metric
from gpucheck.peers import MAD_FLOOR, MIN_VALUES, outlier, shortfall
from gpucheck.stats import Spread, describe, significant


@dataclass(frozen=True)
class Outlier:
    """`node`'s `metric` is worse than `reference` (described by `against`)."""

    command: str
    node: str
    metric: Metric
    reference: Spread
    against: str

    @property
    def shortfall(self) -> float:
        return shortfall(self.metric.value, self.reference.median, self.metric.better)


@dataclass(frozen=True)
class Judged:
    """One command's statistics table and outliers."""

    rows: list[dict[str, Any]]
    outliers: list[Outlier]


def judge_group(command: str, group: Mapping[str, NodeReport], threshold: float,
                mad_k: float) -> Judged:
    members: dict[str, list[tuple[str, Metric]]] = {}
    by_pool: dict[str, list[float]] = {}
    for node, report in group.items():
        for key, metric in report.metrics.items():
            of_key = members.get(key)
            if of_key is None:
                members[key] = [(node, metric)]
            else:
                of_key.append((node, metric))
            if key != metric.name:  # a GPU slot's figure: its key carries the position
                by_pool.setdefault(metric.name, []).append(metric.value)
    spreads = {key: describe([m.value for _, m in members[key]])
               for key in sorted(members, key=metric_order)}
    pools = {pool: describe(values) for pool, values in by_pool.items()}
    bounds = {better: Bound.shortfall(threshold, better) for better in JUDGED}
    # No outlier is nearer the median than this fraction of it (the bound's margin, or
    # the MAD rule's floor): the values between are passed over without `outlier`.
    near = min(threshold, MAD_FLOOR) * (1 - 1e-6)
    found = []
    for key, of_key in members.items():
        # by name: one, but for a forgery; (reference, against, lowest and highest value
        # that is no outlier)
        references: dict[str, tuple[Spread | None, str, float, float]] = {}
        for node, metric in of_key:
            better = metric.better
            if better is not Better.HIGHER and better is not Better.LOWER:
                continue
            judged_by = references.get(metric.name)
            if judged_by is None:
                reference, against = _reference(key, metric, spreads, pools)
                centre = reference.median if reference is not None else 0.0
                judged_by = references[metric.name] = (
                    reference, against, centre - near * abs(centre), centre + near * abs(centre))
            reference, against, low, high = judged_by
            value = metric.value
            if reference is None or (value >= reference.median if better is Better.HIGHER
                                     else value <= reference.median):
                continue  # better than the median never is an outlier
            if value > low if better is Better.HIGHER else value < high:
                continue
            if outlier(value, reference, bounds[better], mad_k):
                found.append(Outlier(command, node, metric, reference, against))
    found.sort(key=lambda o: (o.node, o.metric.key()))
    counts = Counter(o.metric.key() for o in found)
    rows = [_stats_row(command, name, spread, members[name][0][1], counts.get(name, 0))
            for name, spread in spreads.items()]
    return Judged(rows, found)


def _reference(key: str, metric: Metric, spreads: Mapping[str, Spread],
               pools: Mapping[str, Spread]) -> tuple[Spread | None, str]:
    own, slot = spreads[key], key[len(metric.name) + 1:]
    if own.n >= MIN_VALUES:
        return own, f"{slot} of {own.n} nodes" if slot else f"{own.n} nodes"
    pool = pools.get(metric.name) if slot else None
    if pool is not None and pool.n >= MIN_VALUES:
        return pool, f"all {pool.n} GPU slots' {metric.name}"
    return None, ""


def _stats_row(command: str, name: str, spread: Spread, sample: Metric,
               outliers: int) -> dict[str, Any]:
    return {"command": command, "metric": name, "unit": sample.unit,
            "better": sample.better.value if judged(sample) else "-",
            "nodes": spread.n, "median": significant(spread.median),
            "mad": significant(spread.mad), "low": significant(spread.low),
            "high": significant(spread.high), "outliers": outliers}


def outlier_row(found: Outlier) -> dict[str, Any]:
    pct = found.shortfall * 100
    metric = found.metric
    return {"command": found.command, "node": found.node, "gpu": gpu_words(metric),
            "metric": metric.key(), "value": significant(metric.value),
            "median": significant(found.reference.median), "unit": metric.unit,
            "worse_pct": round(pct, 1) if pct != float("inf") else None,
            "against": found.against}



def outlier_reasons(outliers: list[Outlier]) -> list[Reason]:
    """One WARN per node and figure (a GPU slot's, or a collective over its sizes)."""
    groups: dict[tuple[str, str, str, str], list[Outlier]] = {}
    for o in outliers:
        key = (o.node, o.command, family(o.metric), position(o.metric) or "")
        groups.setdefault(key, []).append(o)
    return [_reason(found) for _, found in sorted(groups.items())]


def _reason(found: list[Outlier]) -> Reason:
    worst = max(found, key=lambda o: o.shortfall)
    m = worst.metric
    side = "below" if m.better is Better.HIGHER else "above"
    more = f" (and {len(found) - 1} more of {family(m)})" if len(found) > 1 else ""
    gap = "infinitely" if worst.shortfall == float("inf") else f"{worst.shortfall:.0%}"
    message = (f"{m.key()} = {m.value:.4g} {m.unit}, {gap} {side} the fleet median "
               f"{worst.reference.median:.4g} ({worst.against}){more}")
    return Reason(worst.node, "WARN", "rerun", "fleet.outlier", message, slot_words(m),
                  worst.command, "run gpucheck again on this node to confirm; if it stays "
                  "behind, compare it with a healthy node (gpucheck compare) and check the "
                  "GPU's clocks, power and links (nvidia-smi -q)")


SHOWN_NODES = 8  # nodes named in one table cell; the reasons name every one


@dataclass(frozen=True)
class Drift:
    """One fact on which the nodes of one command disagree."""

    command: str
    key: str
    kind: str
    usual: str
    usual_nodes: int
    others: Mapping[str, list[str]]  # value -> nodes with it


def find_drift(command: str, group: Mapping[str, NodeReport]) -> list[Drift]:
    values: dict[str, dict[str, str]] = {}
    kinds: dict[str, str] = {}
    for node, report in group.items():
        for key, fact in report.facts.items():
            values.setdefault(key, {})[node] = fact.value
            kinds.setdefault(key, fact.kind)
    drifts = []
    for key, by_node in sorted(values.items()):
        counts = Counter(by_node.values())
        if len(counts) < 2:
            continue
        # The most common value; a tie goes to the smallest value, so the choice is stable.
        usual = min(counts, key=lambda v: (-counts[v], v))
        others: dict[str, list[str]] = {}
        for node, value in sorted(by_node.items()):
            if value != usual:
                others.setdefault(value, []).append(node)
        drifts.append(Drift(command, key, kinds[key], usual, counts[usual],
                            dict(sorted(others.items()))))
    return drifts


def drift_row(drift: Drift) -> dict[str, Any]:
    cells = []
    for value, nodes in drift.others.items():
        shown = ", ".join(nodes[:SHOWN_NODES])
        rest = f" and {len(nodes) - SHOWN_NODES} more" if len(nodes) > SHOWN_NODES else ""
        cells.append(f"{value} on {len(nodes)}: {shown}{rest}")
    return {"command": drift.command, "fact": drift.key, "kind": drift.kind,
            "most_nodes": drift.usual, "nodes": drift.usual_nodes, "differ": "; ".join(cells)}


def drift_reasons(drift: Drift) -> list[Reason]:
    reasons = []
    for value, nodes in drift.others.items():
        missing_gpus = fewer_gpus(drift.key, drift.kind, drift.usual, value)
        for node in nodes:
            message = (f"{drift.key} is {value!r}; {drift.usual_nodes} other node(s) have "
                       f"{drift.usual!r}")
            if missing_gpus:
                reasons.append(Reason(node, "FAIL", "drain-node", "fleet.drift", message,
                                      drift.key, drift.command, "fewer GPUs than the other "
                                      "nodes: check nvidia-smi -L and the kernel log (Xid 79) "
                                      "before it takes jobs sized for a full node"))
            else:
                reasons.append(Reason(node, "WARN", "fix-config", "fleet.drift", message,
                                      drift.key, drift.command, "align this node with the "
                                      "others (driver, packages, container image, launcher "
                                      "environment), or confirm the difference is intended"))
    return reasons
