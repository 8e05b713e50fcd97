"""`comm.nodes.slow_node`, confirmed before condemning: pure functions, no torch.

A node's figure is the median of its ranks' intra-node send/recv pairs (nodes with
2+ ranks), or, when fewer than two nodes have pairs (one rank per node), the slowest
all_reduce time of its ranks at the largest size. A node worse than
`SLOW_NODE_FRACTION` x the median node is a suspect (`gpucheck.peers.against_median`,
as `gpucheck.distributed.nodes.slow_node_findings`, shared with bench). Before it is
condemned it is measured again (the worker's `_nodes_again`, every rank following rank
0's broadcast plan): its pairs beside the pairs of a known-good node, the non-suspect
node nearest the median, side by side as in the first pass (pairs of different nodes
run at once); or the largest all_reduce again, every rank at once. The WARN carries
that second look as data (`gpucheck.comm.looks`): confirmed when slow again against the
known-good node, unstable when fine the second time (docs/comm.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck import subject
from gpucheck.comm.looks import slow
from gpucheck.distributed.nodes import NodeId, group_by_node, node_metric, slow_node_findings
from gpucheck.measure import Better, Bound
from gpucheck.peers import against_median, known_good, second_look
from gpucheck.report import Finding, Status
from gpucheck.stats import median

CHECK = "comm.nodes.slow_node"


@dataclass(frozen=True)
class NodeFigures:
    """One figure per node, and how to read it."""

    kind: str  # "pairs" (median intra-node pair) or "all_reduce" (slowest rank's time)
    what: str
    unit: str
    values: dict[NodeId, float]
    better: Better  # HIGHER for bandwidth, LOWER for times

    def bound(self, fraction: float) -> Bound:
        """Worse than `fraction` x the reference: below it for bandwidth, above the
        reference / `fraction` for times."""
        return Bound.fraction(fraction, self.better)


def pair_medians(ranks: Sequence[Mapping[str, Any]],
                 pairs: Sequence[Mapping[str, Any]]) -> dict[NodeId, float]:
    """Per node: the median bandwidth over every one of its pairs (by the sender's node).

    Not a per-rank metric: a rank sends to every other rank of its node, and keeping
    one pair per sender would drop the others from the median.
    """
    node_of = {rank: node for node, members in group_by_node(ranks).items()
               for rank in members}
    by_node: dict[NodeId, list[float]] = {}
    for pair in pairs:
        node = node_of.get(int(pair["src"]))
        if node is not None and pair.get("bandwidth_gbps") is not None:
            by_node.setdefault(node, []).append(float(pair["bandwidth_gbps"]))
    return {node: median(values) for node, values in sorted(by_node.items())}


def node_figures(ranks: Sequence[Mapping[str, Any]], pairs: Sequence[Mapping[str, Any]],
                 all_reduce: Sequence[Mapping[str, Any]]) -> NodeFigures:
    """The pairs' medians when 2+ nodes have pairs, else the largest all_reduce's time."""
    medians = pair_medians(ranks, pairs)
    if len(medians) >= 2:
        return NodeFigures("pairs", "median pair bandwidth", "GB/s", medians, Better.HIGHER)
    times = dict(enumerate(all_reduce[-1]["rank_times_us"])) if all_reduce else {}
    return NodeFigures("all_reduce", "largest all_reduce time", "us",
                       node_metric(ranks, times, combine=max), Better.LOWER)


def again_figures(first: NodeFigures, ranks: Sequence[Mapping[str, Any]],
                  again: Mapping[str, Any]) -> dict[NodeId, float]:
    """The second look's figure per re-measured node, read as the first pass's."""
    if first.kind == "pairs":
        return pair_medians(ranks, again.get("pairs") or [])
    times = dict(enumerate(again.get("rank_times_us") or []))
    return node_metric(ranks, times, combine=max) if times else {}


def plan(figures: NodeFigures, fraction: float) -> dict[str, Any] | None:
    """What to measure again: the suspects and the known-good node, the one nearest the
    median of all (node ranks); None when no node is worse than the bound or none is
    left to compare with."""
    peers = against_median(figures.values, figures.bound(fraction))
    known = known_good(figures.values, peers.worse, peers.reference)
    if not peers.worse or known is None:
        return None
    return {"kind": figures.kind, "suspects": [n.node_rank for n in peers.worse],
            "known_good": known.node_rank}


def slow_node_verdicts(figures: NodeFigures, fraction: float,
                       again: Mapping[str, Any] | None,
                       ranks: Sequence[Mapping[str, Any]],
                       device: str = "cuda") -> list[Finding]:
    """`slow_node_findings`' verdicts, each WARN with its second look (`again`: what
    the worker measured again, None when it did not)."""
    first = slow_node_findings(figures.values, CHECK, figures.what, figures.unit,
                               figures.better is Better.HIGHER, fraction)
    second = again_figures(figures, ranks, again) if again else {}
    by_rank = {n.node_rank: n for n in figures.values}
    known = by_rank.get(int(again["known_good"])) if again else None
    nodes = {n.label: n for n in figures.values}
    return [_with_look(f, nodes[str(f.subject)], known, second, figures, fraction, device)
            if f.status == Status.WARN and str(f.subject) in nodes else f for f in first]


def _with_look(finding: Finding, node: NodeId, known: NodeId | None,
               second: Mapping[NodeId, float], figures: NodeFigures, fraction: float,
               device: str) -> Finding:
    """The slow node's WARN, its look against the known-good node measured with it."""
    bound = figures.bound(fraction)
    first = figures.values[node]
    if known is None or node not in second or known not in second:
        look = second_look(first, None, None, (), bound, figures.unit,
                           "the node was not measured again")
    else:
        look = second_look(first, second[node], second[known], (_node(known),), bound,
                           figures.unit)
    return slow(CHECK, finding.message, finding.hint or "", _node(node), look, device)


def _node(node: NodeId) -> subject.Subject:
    return subject.node(node.node_rank, node.label, host=node.host)
