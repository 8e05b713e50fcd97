"""`gpucheck env` (and `hang`) on several nodes: each node's local rank 0 builds its
view, rank 0 gathers them over gloo and names the node that differs where it matters."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from gpucheck.context import RunContext
from gpucheck.distributed.nodes import NodeId
from gpucheck.envfacts import node_facts  # floor 1: analysis/ reads it without this layer
from gpucheck.report import Finding, Report, Section, ok, warn

GATHER_TIMEOUT_S = 300.0

def _odd_nodes(values: Mapping[NodeId, str]) -> tuple[str, list[NodeId]]:
    """(the usual value, nodes that differ): most common, ties to the lowest node's."""
    counts = Counter(values.values())
    best = max(counts.values())
    usual = next(v for n, v in sorted(values.items()) if counts[v] == best)
    return usual, [n for n, v in sorted(values.items()) if v != usual]


def diff_findings(facts: Mapping[NodeId, Mapping[str, str]]) -> list[Finding]:
    """One WARN per fact and odd node; an OK when every node agrees."""
    keys = sorted({k for f in facts.values() for k in f})
    findings = []
    for key in keys:
        values = {node: f.get(key, "unset") for node, f in facts.items()}
        usual, odd = _odd_nodes(values)
        for node in odd:
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
            section.findings = [_on_node(f, node) for f in section.findings]
            merged.add(section)
    return merged


def _on_node(finding: Finding, node: NodeId) -> Finding:
    """The finding with its node in the subject; its action (set by the probe or
    resolved at birth) is kept, not resolved again."""
    subject = (finding.subject.on_node(node.node_rank, f"{node.label} {finding.subject}",
                                       node.host) if finding.subject else node.subject())
    return dataclasses.replace(finding, subject=subject)


def gather_env_reports(build: Callable[[], Report], ctx: RunContext) -> Report | None:
    """Under a launcher with several ranks: probe once per node, rank 0 merges.

    Without one, just `build()`. Ranks other than 0 return None. `ctx`: the command's
    (its world, its namespace on the job's store).
    """
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
