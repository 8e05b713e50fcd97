"""Ranks grouped by node, and the node that is slower than the others (the peer rule
of `gpucheck.peers`, with its one SLOW_NODE_FRACTION).

Shared by bench and comm. A node is (node_rank, host): under torchrun node_rank is
GROUP_RANK, under srun SLURM_NODEID; two "nodes" on one machine (tests) share a host
name, so the node rank is part of the key. Rank records are plain mappings with at
least `rank`, `node_rank` and `host` (the check-in roster, `gpucheck.distributed.session.roster()`,
gives them as `RankInfo`; `dataclasses.asdict` makes the mappings).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck import subject as subjects
from gpucheck.measure import Better, Bound
from gpucheck.peers import SLOW_NODE_FRACTION, against_median
from gpucheck.report import Finding, ok, warn

# The name comm/worker.py imports; the figure is gpucheck.peers' one definition.
DEFAULT_SLOW_NODE_FRACTION = SLOW_NODE_FRACTION


@dataclass(frozen=True, order=True)
class NodeId:
    node_rank: int
    host: str

    @property
    def label(self) -> str:
        return f"node {self.node_rank} ({self.host})"

    def subject(self) -> subjects.Subject:
        return subjects.node(self.node_rank, self.label, host=self.host)


def group_by_node(records: Iterable[Mapping[str, Any]]) -> dict[NodeId, list[int]]:
    """{node: its ranks}, nodes in node-rank order, ranks in rank order."""
    groups: dict[NodeId, list[int]] = {}
    for record in records:
        node = NodeId(int(record["node_rank"]), str(record["host"]))
        groups.setdefault(node, []).append(int(record["rank"]))
    return {node: sorted(groups[node]) for node in sorted(groups)}


def node_metric(records: Iterable[Mapping[str, Any]], metric_by_rank: Mapping[int, float],
                combine: Callable[[Sequence[float]], float] = statistics.median,
                ) -> dict[NodeId, float]:
    """One number per node from per-rank numbers (`combine=sum` for throughput)."""
    result = {}
    for node, ranks in group_by_node(records).items():
        values = [metric_by_rank[r] for r in ranks if metric_by_rank.get(r) is not None]
        if values:
            result[node] = float(combine(values))
    return result


def nodes_rows(records: Iterable[Mapping[str, Any]], metric: Mapping[NodeId, float],
               metric_name: str) -> list[dict[str, Any]]:
    """Report table: one row per node with its ranks and metric."""
    return [{"node_rank": node.node_rank, "host": node.host,
             "ranks": ",".join(map(str, ranks)), metric_name: metric.get(node)}
            for node, ranks in group_by_node(records).items()]


def slow_node_findings(metric: Mapping[NodeId, float], check: str, what: str, unit: str,
                       higher_is_better: bool = True,
                       fraction: float = SLOW_NODE_FRACTION) -> list[Finding]:
    """WARN for each node worse than `fraction` of the median node (needs 2+ nodes):
    `gpucheck.peers.against_median`, so with higher_is_better=False (times) a node is
    slow above median / fraction, and a node exactly at the bound is not slow."""
    if len(metric) < 2:
        return []
    better = Better.HIGHER if higher_is_better else Better.LOWER
    peers = against_median(metric, Bound.fraction(fraction, better))
    median = peers.reference
    findings = [warn(check, f"{node.label}: {what} {metric[node]:.3g} {unit} against the "
                     f"median node's {median:.3g} {unit}",
                     hint="compare this node's `gpucheck env` with the others' and check its "
                     "GPUs, clocks and links (nvidia-smi -q, nvidia-smi topo -m)",
                     subject=node.subject()) for node in peers.worse]
    if not findings:
        findings.append(ok(check, f"{len(metric)} nodes within {fraction:.0%} of the median "
                           f"node's {what} ({median:.3g} {unit})"))
    return findings
