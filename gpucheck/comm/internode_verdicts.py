"""Verdicts between nodes, pure functions: the slow node (elimination at the fabric's
cut), node pair and rail link, each with its second look (docs/comm.md, "Between nodes")."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpucheck import subject
from gpucheck.comm.records import LinkRow, SentRow
from gpucheck.comm.verdicts import GBPS, ended_first, rate_bound, repeats_words, slow
from gpucheck.measure import LookState, SecondLook
from gpucheck.peers import (
    Pair,
    Samples,
    Suspects,
    Without,
    against_median,
    by_end,
    combined,
    directed,
    eliminate,
    intermittent,
    known_good_pairs,
    pair_looks,
    second_look,
)
from gpucheck.report import Finding, ok
from gpucheck.stats import median, typical

FABRIC_FRACTION = 0.9
# Healthy readings a suspect node's readings may fail to be below: "below almost
# every healthy reading" (issue 21: a 0.65x node, every reading below almost every
# healthy one, was let through by "below every one").
STRAY = 1


@dataclass(frozen=True)
class NodeSuspects(Suspects):
    """`Suspects`, with the cut they were judged at (a fraction of the reference)."""

    cut: float = FABRIC_FRACTION


def _figures(samples: Samples) -> tuple[Without, Without]:
    """The pairs' typical figures, and their repeats' spreads (1 - lowest / typical)."""
    typicals = {p: typical(s) for p, s in samples.items() if s}
    return Without(typicals.items()), Without((p, 1 - min(samples[p]) / t)
                                              for p, t in typicals.items() if t > 0)


def _cut_without(figures: Without, spreads: Without, m: int | None,
                 fabric: float) -> tuple[float, float]:
    """spread_cut over the pairs without node m (every pair with None)."""
    if not figures.count(m):
        return 0.0, fabric
    reference = figures.median(m)
    if reference <= 0:
        return reference, fabric
    between = 1 - figures.nth(m, 0) / reference
    return reference, max(0.0, min(fabric, 1 - max(between, spreads.median(m))))


def spread_cut(healthy: Samples, fabric: float = FABRIC_FRACTION) -> tuple[float, float]:
    """(reference, cut): the healthy pairs' median typical figure, and `fabric`, or 1 - their
    own spread (between pairs, or within a pair's repeats) when that is larger."""
    return _cut_without(*_figures(healthy), None, fabric)


def slow_nodes(samples: Samples, fabric: float = FABRIC_FRACTION) -> dict[int, str]:
    """Nodes all of whose pairs one way are below the cut x the median of the pairs without
    them, and below every reading of those but the STRAY lowest: "sending", "receiving" or
    "both"."""
    figures, spreads = _figures(samples)
    readings = Without((p, v) for p, s in samples.items() for v in s)
    ways = by_end(samples)
    found: dict[int, str] = {}
    for m in sorted(ways):
        if len(samples) == len({p for way in ways[m] for p in way}):
            continue  # no pair without m
        reference, cut = _cut_without(figures, spreads, m, fabric)
        sending, receiving = (bool(mine) and all(v < cut * reference for v in mine) and
                              readings.count(m) > STRAY and max(mine) < readings.nth(m, STRAY)
                              for mine in ([typical(samples[p]) for p in way] for way in ways[m]))
        if sending or receiving:
            found[m] = "both" if sending and receiving else "sending" if sending else \
                "receiving"
    return found


def find_node_suspects(samples: Samples, pair_threshold: float,
                       fabric: float = FABRIC_FRACTION) -> NodeSuspects:
    """The slow nodes (at the fabric's cut), the slow node pairs of no suspect node
    (`eliminate` at `pair_threshold`), and the known-good pairs to measure beside them."""
    if not samples:
        return NodeSuspects(0.0, 0.0, cut=fabric)
    members = slow_nodes(samples, fabric)
    clean = {p: s for p, s in samples.items() if not set(p) & set(members)} or dict(samples)
    # One pair cannot be told from the spread of one or two others (3 nodes leave two
    # pairs without a suspect node): a single pair keeps the wider intra-node rule.
    single = eliminate(clean, rate_bound(pair_threshold)).pairs
    lone = set(single)
    healthy = {p: s for p, s in clean.items() if p not in lone} or clean
    reference, cut = spread_cut(healthy, fabric)
    slow = sorted({p for p in samples if _suspects(p, members)} | lone)
    floor = min((v for s in healthy.values() for v in s), default=0.0)
    flapping = intermittent(samples, [p for p in slow if p not in lone], reference,
                            rate_bound(cut)) + intermittent(samples, single, reference,
                                                            rate_bound(pair_threshold))
    return NodeSuspects(reference, floor, members, tuple(slow), (),
                        known_good_pairs(samples, slow, members, reference),
                        tuple(sorted(flapping)), cut=cut)


def _suspects(pair: Pair, members: Mapping[int, str]) -> bool:
    """Is `pair` one of a suspect node's pairs in the direction it is slow in?"""
    return any(directed(pair, m, members[m]) for m in pair if m in members)


def both_ends(links: Sequence[LinkRow], sent: Sequence[SentRow]) -> list[LinkRow]:
    """Each received link with what its sender timed of it (NCCL): each repeat the faster
    of the two ends' group times, both of which carried the link."""
    by_link = {(x.src, x.dst, x.round): x.sent_gbps for x in sent}
    merged = []
    for link in links:
        theirs = by_link.get((link.src, link.dst, link.round))
        mine = link.samples_gbps or ()
        if not theirs or len(theirs) != len(mine):
            merged.append(link)
            continue
        best_of = tuple(max(a, b) for a, b in zip(mine, theirs, strict=True))
        merged.append(replace(link, received_gbps=mine, sent_gbps=theirs,
                              samples_gbps=best_of, bandwidth_gbps=statistics.median(best_of)))
    return merged


def node_pair_rows(links: Sequence[LinkRow]) -> list[dict[str, Any]]:
    """Per ordered node pair: the sum of its rails (they ran at once) and its slowest rail."""
    by_pair: dict[tuple[int, int], list[LinkRow]] = {}
    for link in links:
        by_pair.setdefault((link.src_node, link.dst_node), []).append(link)
    rows: list[dict[str, Any]] = []
    for (src, dst), rails in sorted(by_pair.items()):
        slowest = min(rails, key=lambda link: link.bandwidth_gbps)
        rows.append({"src_node": src, "dst_node": dst, "round": rails[0].round,
                     "rails": len(rails),
                     "bandwidth_gbps": round(sum(x.bandwidth_gbps for x in rails), 4),
                     "slowest_rail": slowest.rail, "slowest_rail_gbps": slowest.bandwidth_gbps})
        every = [x.samples_gbps or () for x in rails]  # the k-th repeats ran at once
        if all(every) and len({len(x) for x in every}) == 1:
            rows[-1]["samples_gbps"] = [round(sum(k), 4) for k in zip(*every, strict=True)]
    return rows


def node_samples(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[int, int], list[float]]:
    """Each node pair's repeated figures (one for rows without repeats)."""
    return {(int(r["src_node"]), int(r["dst_node"])):
            list(r.get("samples_gbps") or [float(r["bandwidth_gbps"])]) for r in rows}


def shared_node(slow_pairs: Sequence[tuple[int, int]]) -> int | None:
    """The node in more than half of the slow pairs and more than any other node."""
    if len(slow_pairs) < 2:
        return None
    ranked = Counter(node for pair in slow_pairs for node in set(pair)).most_common(2)
    node, count = ranked[0]
    runner_up = ranked[1][1] if len(ranked) > 1 else 0
    return node if count * 2 > len(slow_pairs) and count > runner_up else None


SLOW_LINK_HINT = ("check the NICs, cables and switch ports between these two nodes "
                  "(ibstat, ibdiagnet, ethtool) and the transport NCCL chose")
NODE_HINT = ("suspect this node's NICs, their PCIe links or its switch port (ibstat, "
             "ibdiagnet, the NICs' link width)")
RAIL_HINT = ("one NIC or its cable: check this rail's NIC on both nodes (ibstat, its PCIe "
             "link width, NCCL_IB_HCA's order)")


def internode_findings(rows: Sequence[Mapping[str, Any]], threshold: float,
                       labels: Mapping[int, str],
                       again: Sequence[LinkRow] | None = None,
                       device: str = "cuda") -> list[Finding]:
    """The suspect node by elimination and each slow node pair, each with its second look
    (`again`: the re-measured links; None when the run ended first)."""
    if not rows:
        return []
    first = node_samples(rows)
    suspects = find_node_suspects(first, threshold)
    if suspects.empty:
        return [ok("comm.internode.slow_pair", f"{len(rows)} node pairs: no node below "
                   f"{suspects.cut:.2g} x the median of the pairs without it (the fabric's "
                   f"{FABRIC_FRACTION:g}, or their own spread when larger) and no pair below "
                   f"{threshold:g} x the median ({suspects.reference:.3g} GB/s)")]
    # A slow pair's typical re-measured repeat against the known-good pairs measured
    # beside it, at its own cut (a suspect node's, or the pair rule's threshold).
    bounds = {p: rate_bound(_cut(p, suspects, threshold)) for p in suspects.pairs}
    if again is None:
        looks = {p: ended_first(typical(first[p]), suspects.reference, bounds[p])
                 for p in suspects.pairs}
    else:
        def name(p: Pair) -> subject.Subject:
            return subject.pair(*p, f"{labels[p[0]]} -> {labels[p[1]]}", by="node")

        second = node_samples(node_pair_rows(again))
        by_bound = {bound: pair_looks(suspects, first, second, bound, GBPS, name)
                    for bound in set(bounds.values())}
        looks = {p: by_bound[bounds[p]][p] for p in suspects.pairs}
    findings = [_node_finding(m, way, suspects, looks, labels, device)
                for m, way in sorted(suspects.members.items())]
    for pair, look in looks.items():
        text = (f"{labels[pair[0]]} -> {labels[pair[1]]}: "
                f"{repeats_words(first[pair], pair, suspects)}, below "
                f"{_cut(pair, suspects, threshold):.2g} x the median node pair without a "
                f"suspect ({suspects.reference:.3g} GB/s)")
        findings.append(slow("comm.internode.slow_pair", text, SLOW_LINK_HINT,
                             subject.pair(*pair, by="node"), look, device))
    return findings


def _cut(pair: Pair, suspects: NodeSuspects, threshold: float) -> float:
    """A suspect node's cut for its pairs; the pair rule's threshold for a lone pair."""
    return suspects.cut if _suspects(pair, suspects.members) else threshold


def _node_finding(node: int, way: str, suspects: NodeSuspects,
                  looks: Mapping[Pair, SecondLook], labels: Mapping[int, str],
                  device: str) -> Finding:
    """The suspect node, its look combined from its slow pairs'."""
    mine = [look for pair, look in looks.items() if directed(pair, node, way)]
    words = {"sending": "it sends on", "receiving": "it receives on", "both": "it is in"}[way]
    text = (f"{labels[node]}: every node pair {words} is below {suspects.cut:.2g} x the "
            f"median of the pairs without it ({suspects.reference:.3g} GB/s)")
    look = combined(mine) if mine else second_look(
        suspects.reference, None, suspects.reference, (), rate_bound(suspects.cut), GBPS,
        "none of its pairs was measured again")
    return slow("comm.internode.shared_node", text, NODE_HINT,
                subject.node(node, labels[node]), look, device)


def slow_rails(links: Sequence[LinkRow],
               threshold: float) -> tuple[float | None, list[LinkRow]]:
    """(the median rail link, the rail links below `threshold` x it); none with one rail
    per node (a rail is then its node pair)."""
    if max((link.rail for link in links), default=0) < 1:
        return None, []
    peers = against_median({i: x.bandwidth_gbps for i, x in enumerate(links)},
                           rate_bound(threshold), min_count=1)
    return peers.reference, [links[i] for i in peers.worse]


def rail_exchanges(links: Sequence[LinkRow],
                   threshold: float) -> list[tuple[int, int]]:
    """The node pairs (unordered) to measure again for the slow rails, with one known-good
    node pair when there is one."""
    _, slow = slow_rails(links, threshold)
    if not slow:
        return []
    bad = {_unordered(x) for x in slow}
    good = sorted({_unordered(x) for x in links} - bad)
    return sorted(bad | set(good[:1]))


def _unordered(link: LinkRow) -> Pair:
    a, b = link.src_node, link.dst_node
    return (a, b) if a <= b else (b, a)


def _link(link: LinkRow) -> Pair:
    return link.src, link.dst


def _rail_look(link: LinkRow, slow: Sequence[LinkRow],
               again: Sequence[LinkRow] | None, threshold: float) -> SecondLook:
    """A slow rail link's best re-measured figure against the re-measured links that were
    not slow the first time."""
    first, bound = link.bandwidth_gbps, rate_bound(threshold)
    if again is None:
        return ended_first(first, None, bound)
    bad = {_link(x) for x in slow}
    mine = [x.bandwidth_gbps for x in again if _link(x) == _link(link)]
    good = [x for x in again if _link(x) not in bad]
    reference = median(x.bandwidth_gbps for x in good) if good else None
    against = tuple(subject.pair(*_link(x)) for x in good)
    return second_look(first, max(mine) if mine else None, reference, against, bound, GBPS,
                       None if mine else "the link was not measured again")


def rail_findings(links: Sequence[LinkRow], threshold: float,
                  labels: Mapping[int, str], again: Sequence[LinkRow] | None = None,
                  device: str = "cuda") -> list[Finding]:
    """WARN each rail link below `threshold` x the median rail link, with its second look,
    and the node a rail's slow links share. Only with 2+ rails per node."""
    reference, slow_links = slow_rails(links, threshold)
    if reference is None:
        return []
    if not slow_links:
        return [ok("comm.internode.slow_rail", f"{len(links)} rail links within "
                   f"{threshold:g} x the median ({reference:.3g} GB/s)")]
    looks = [_rail_look(x, slow_links, again, threshold) for x in slow_links]
    findings = [slow("comm.internode.slow_rail",
                     f"rail {x.rail}: rank {x.src} ({labels[x.src_node]}) -> rank "
                     f"{x.dst} ({labels[x.dst_node]}): {x.bandwidth_gbps:.3g} GB/s, "
                     f"below {threshold:g} x the median rail link's {reference:.3g} GB/s",
                     RAIL_HINT, subject.pair(*_link(x)), look, device)
                for x, look in zip(slow_links, looks, strict=True)]
    return findings + _rail_nodes(slow_links, looks, labels, device)


def _rail_nodes(slow_links: Sequence[LinkRow], looks: Sequence[SecondLook],
                labels: Mapping[int, str], device: str) -> list[Finding]:
    """The node most of one rail's slow links share (its NIC on that rail): a rerun, or
    the links' looks when one was unstable."""
    findings = []
    for rail in sorted({x.rail for x in slow_links}):
        mine = [(x, look) for x, look in zip(slow_links, looks, strict=True) if x.rail == rail]
        pairs = [(x.src_node, x.dst_node) for x, _ in mine]
        suspect = shared_node(pairs)
        look = combined([look for _, look in mine])
        if suspect is not None:
            findings.append(slow(
                "comm.internode.shared_node",
                f"{labels[suspect]} is in most of the {len(pairs)} slow links of rail {rail}",
                "suspect this node's NIC on that rail (ibstat, its PCIe link, its cable and "
                "switch port)", subject.node(suspect, f"{labels[suspect]} rail {rail}"),
                look if look.state is LookState.UNSTABLE else None, device))
    return findings
