"""comm's second looks: a slow figure's WARN carrying its look as data (`slow`), its
action from the check's `on_look`; a slow node measured again beside a known-good node
(`node_figures`, `plan`, `slow_node_verdicts`; docs/comm.md). On CPU ranks (gloo on the
host) a slow figure is a busy process, not a NIC or a GPU: cause `cpu_ranks`, a rerun.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck.confirm import Suspect, confirm
from gpucheck.distributed.nodes import NodeId, group_by_node, node_metric, slow_node_findings
from gpucheck.measure import Better, Bound, SecondLook
from gpucheck.peers import Pair, Suspects, against_median, known_good
from gpucheck.report import Finding, looked, warn
from gpucheck.stats import best, median, typical
from gpucheck.subject import Subject

CHECK = "comm.nodes.slow_node"
GBPS = "GB/s"
CPU_RANKS = "cpu_ranks"
_CPU_NOTE = " (CPU ranks: a busy or throttled process on the node, not its hardware)"


def rate_bound(fraction: float) -> Bound:
    """Slow below `fraction` x the reference, a rate. A cut of 0 (the healthy links' own
    spread swallowed the fabric's fraction) condemns no measured rate: the smallest
    positive float stands for it, as a Bound needs a positive limit."""
    return Bound(max(fraction, sys.float_info.min), Better.HIGHER) if fraction <= 0 \
        else Bound.fraction(fraction, Better.HIGHER)


def on_cpu(device: str) -> bool:  # CPU ranks' figures measure processes
    return device == "cpu"


def slow(check: str, text: str, hint: str, subject: Subject, look: SecondLook | None,
         device: str, *, cpu_hint: bool = True) -> Finding:
    """A slow figure's WARN with its look (`gpucheck.report.looked`), cause `cpu_ranks`
    on CPU ranks (a word on the hint unless `cpu_hint` is False); `look` None: a
    suspect no second figure can be taken for (one rail's links sharing a node)."""
    cpu = on_cpu(device)
    hint += _CPU_NOTE if cpu and cpu_hint else ""
    cause = CPU_RANKS if cpu else None
    if look is None:
        return warn(check, text, hint, subject, cause=cause)
    return looked(check, text, hint, subject, look, cause=cause)


def repeats_words(samples: Sequence[float], pair: Pair, suspects: Suspects) -> str:
    """"0.7 GB/s (median of 3 repeats, best 1.56)", and whether they disagree widely."""
    words = f"{typical(samples):.3g} GB/s (median of {len(samples)} repeats, best " \
            f"{best(samples):.3g})"
    if pair in suspects.intermittent:
        words += f"; intermittent: slow in most repeats, not all ({min(samples):.3g} to " \
                 f"{best(samples):.3g} GB/s)"
    return words


@dataclass(frozen=True)
class NodeFigures:
    """One figure per node, and how to read it."""

    kind: str  # "pairs" (median intra-node pair) or "all_reduce" (slowest rank's time)
    what: str
    unit: str
    values: dict[NodeId, float]
    better: Better  # HIGHER for bandwidth, LOWER for times

    def bound(self, fraction: float) -> Bound:
        return Bound.fraction(fraction, self.better)


def pair_medians(ranks: Sequence[Mapping[str, Any]],
                 pairs: Sequence[Mapping[str, Any]]) -> dict[NodeId, float]:
    """Per node: the median bandwidth over every one of its pairs (by the sender's node;
    not per rank: a rank sends to every other rank of its node)."""
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
    """The suspects and the known-good node nearest the median (node ranks) to measure
    again; None when no node is worse than the bound or none is left to compare with."""
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
    """`slow_node_findings`' verdicts, each slow node's with its second look beside the
    known-good node (`again`: what the worker measured again, None when it did not)."""
    first = slow_node_findings(figures.values, CHECK, figures.what, figures.unit,
                               figures.better is Better.HIGHER, fraction)
    worse = against_median(figures.values, figures.bound(fraction)).worse
    if not worse:
        return first
    second = again_figures(figures, ranks, again) if again else {}
    known = next((n for n in second if again and n.node_rank == int(again["known_good"])),
                 None)
    suspects = []
    for node, finding in zip(worse, first, strict=True):
        if known is None or node not in second:
            suspects.append(Suspect(node.subject(), finding.message, figures.values[node],
                                    None, None, why_not="the node was not measured again"))
        else:
            suspects.append(Suspect(node.subject(), finding.message, figures.values[node],
                                    second[node], second[known], (known.subject(),)))
    cpu = on_cpu(device)
    return confirm(CHECK, suspects, figures.bound(fraction), figures.unit,
                   (first[0].hint or "") + (_CPU_NOTE if cpu else ""),
                   cause=CPU_RANKS if cpu else None)
