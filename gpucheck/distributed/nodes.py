"""Ranks by node: grouping, each node's figure against the median node, whether each
rank's CPUs sit on its GPU's NUMA node; and `env` (and `hang`) on several nodes, each
node's local rank 0 probing and rank 0 naming the node that differs."""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck import subject as subjects
from gpucheck.context import RunContext
from gpucheck.devices import device_label
from gpucheck.envfacts import node_facts  # floor 1: analysis/ reads it without this layer
from gpucheck.measure import Better, Bound
from gpucheck.numa import cpulist
from gpucheck.peers import SLOW_NODE_FRACTION, against_median
from gpucheck.report import Finding, Report, Section, ok, warn

GATHER_TIMEOUT_S = 300.0


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
    """WARN for each node worse than `fraction` of the median node (2+ nodes; a node at
    the bound is not slow, `gpucheck.peers.against_median`)."""
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


def diff_findings(facts: Mapping[NodeId, Mapping[str, str]]) -> list[Finding]:
    """One WARN per fact and odd node; an OK when every node agrees."""
    keys = sorted({k for f in facts.values() for k in f})
    findings = []
    for key in keys:
        values = {node: f.get(key, "unset") for node, f in facts.items()}
        counts = Counter(values.values())  # the usual value: most common, ties to the lowest
        usual = next(v for n, v in sorted(values.items()) if counts[v] == max(counts.values()))
        for node in (n for n, v in sorted(values.items()) if v != usual):
            what = f"environment variable {key}" if key.startswith("$") else key
            findings.append(warn(
                "env.nodes.differ", f"{node.label}: {what} is {values[node]!r}, "
                f"the other nodes have {usual!r}",
                hint="nodes of one job should match: align drivers, containers, "
                "packages and launcher environment", subject=node.subject()))
    if not findings:
        findings.append(ok("env.nodes.differ", f"{len(facts)} nodes match on {len(keys)} "
                           "versions, GPU models/counts and environment variables"))
    return findings


def merge_node_reports(reports: Mapping[NodeId, Mapping[str, Any]]) -> Report:
    """One report: the node comparison first, then every node's own sections."""
    merged = Report(command="env")
    facts = {node: node_facts(r) for node, r in reports.items()}
    table = [{"node_rank": n.node_rank, "host": n.host, "verdict": r.get("verdict"),
              **{k: v for k, v in r.get("summary", {}).items()}} for n, r in reports.items()]
    merged.add(Section("nodes", "Nodes compared", {"nodes": table}, diff_findings(facts)))
    for node, report in reports.items():
        for raw in report.get("sections", []):
            section = Section.from_dict(raw)
            section.name = f"node{node.node_rank}.{section.name}"
            section.title = f"{node.label}: {section.title}"
            # Each finding's subject gets its node; its action is kept, not resolved again.
            section.findings = [dataclasses.replace(f, subject=f.subject.on_node(
                node.node_rank, f"{node.label} {f.subject}", node.host) if f.subject
                else node.subject()) for f in section.findings]
            merged.add(section)
    return merged


def gather_env_reports(build: Callable[[], Report], ctx: RunContext) -> Report | None:
    """Under a launcher with several ranks each node probes once and rank 0 merges (the
    others get None); without one, just `build()`."""
    from gpucheck.distributed.job import launched_world

    if launched_world(ctx) is None:
        return build()
    reports = gather_per_node(lambda: build().to_dict(), ctx)
    return None if reports is None else merge_node_reports(reports)


def gather_per_node(build: Callable[[], Any], ctx: RunContext, fault_watch: bool = True,
                    timeout_s: float = GATHER_TIMEOUT_S) -> dict[NodeId, Any] | None:
    """Under a launcher with several ranks: each node's local rank 0 runs `build()` (plain
    values), rank 0 gets them all by node; other ranks get None. Shared by env and hang."""
    import torch.distributed as dist

    from gpucheck.distributed.session import process_group
    from gpucheck.distributed.world import host_name

    with process_group("gloo", "cpu", timeout_s, fault_watch=fault_watch,
                       ctx=ctx) as world:
        mine = build() if world.local_rank == 0 else None
        record = {"node_rank": world.node_rank, "host": host_name(), "value": mine}
        every: list[Any] = [None] * world.world_size if world.rank == 0 else []
        dist.gather_object(record, every if world.rank == 0 else None, dst=0)
    if world.rank != 0:
        return None
    values = {NodeId(r["node_rank"], r["host"]): r["value"] for r in every
              if r["value"] is not None}
    return dict(sorted(values.items()))
