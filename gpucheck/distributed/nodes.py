"""Ranks by node: grouping, each node's figure against the median of the nodes, and
whether each rank's CPUs sit on its GPU's NUMA node (check-in records)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck import subject as subjects
from gpucheck.devices import device_label
from gpucheck.measure import Better, Bound
from gpucheck.numa import cpulist
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


CHECK = "ranks.numa"


def numa_findings(ranks: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """A WARN per rank with no CPU on its GPU's NUMA node; one OK naming the ranks that run
    only on it; nothing when no rank can be judged (see the module's docstring)."""
    findings = [_off_node(r) for r in ranks if r.get("on_gpu_numa") is False]
    near = tuple(int(r["rank"]) for r in ranks if r.get("on_gpu_numa") is True)
    if near:
        findings.append(ok(CHECK, f"rank(s) {cpulist(near)} run only on CPUs of their GPU's "
                           "NUMA node"))
    return findings


def _off_node(rank: Mapping[str, Any]) -> Finding:
    node = rank.get("numa_node")
    message = (f"rank {rank['rank']} on {rank.get('host', 'its host')} runs on CPUs "
               f"{rank.get('cpus') or 'unknown'}, none of them on NUMA node {node} where its "
               "GPU is: its kernel launches and pinned host copies cross the socket "
               "interconnect")
    hint = (f"bind the rank to node {node}: numactl --cpunodebind={node} --membind={node} "
            "<command>, torchrun --numa-binding=node (recent torch: see torchrun --help), or "
            "srun --gpu-bind=closest under SLURM; gpucheck stress pins its ranks itself "
            f"(unless --no-numa-pin). If the job's cpuset (container, cgroup, SLURM "
            f"allocation) has no CPU on node {node}, widen it (taskset -cp <pid> shows it)")
    return warn(CHECK, message, hint, subjects.rank(int(rank["rank"]),
                f"rank {rank['rank']} ({device_label(rank)})"))
