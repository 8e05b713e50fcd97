"""Verdicts on the node-to-node rounds (`gpucheck.comm.internode`): pure functions.

A slow node is found by elimination at the fabric's cut (`gpucheck.comm.node_links`:
0.9 x the pairs without it, or their own spread when larger), a single slow node pair
at `--pair-threshold` (`gpucheck.comm.confirm`), each confirmed by a second look;
rails (2+ per node) against the median rail link, with the node most of one rail's
slow links share named.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck.comm.confirm import Pair, Second, directed, second_look
from gpucheck.comm.node_links import FABRIC_FRACTION, NodeSuspects, find_node_suspects
from gpucheck.report import Finding, ok, warn


def both_ends(links: Sequence[Mapping[str, Any]],
              sent: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each received link with what its sender timed of it (NCCL; gloo sends none).

    On NCCL a rank's sends and receives are one group, and the group's time covers
    both: a receiver's figure is held down by its own sends too, so a node that takes
    its receives in slowly made the link *into the node before it* (which sends to it)
    read slow. Each repeat's figure is therefore the faster of the receiver's and the
    sender's group time (the higher GB/s): both groups carried the link, so each time
    bounds it, and only the link's own slowness slows both. The two ends' figures stay
    in `received_gbps` and `sent_gbps`."""
    by_link = {(x["src"], x["dst"], x["round"]): x["sent_gbps"] for x in sent}
    merged = []
    for link in links:
        theirs = by_link.get((link["src"], link["dst"], link["round"]))
        mine = link.get("samples_gbps") or []
        if not theirs or len(theirs) != len(mine):
            merged.append(dict(link))
            continue
        best_of = [max(a, b) for a, b in zip(mine, theirs, strict=True)]
        merged.append(dict(link) | {"received_gbps": mine, "sent_gbps": list(theirs),
                                    "samples_gbps": best_of,
                                    "bandwidth_gbps": statistics.median(best_of)})
    return merged


def node_pair_rows(links: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per ordered node pair: the sum of its rails (they ran at once) and its slowest rail."""
    by_pair: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    for link in links:
        by_pair.setdefault((link["src_node"], link["dst_node"]), []).append(link)
    rows = []
    for (src, dst), rails in sorted(by_pair.items()):
        slowest = min(rails, key=lambda link: link["bandwidth_gbps"])
        rows.append({"src_node": src, "dst_node": dst, "round": rails[0]["round"],
                     "rails": len(rails),
                     "bandwidth_gbps": round(sum(x["bandwidth_gbps"] for x in rails), 4),
                     "slowest_rail": slowest["rail"],
                     "slowest_rail_gbps": slowest["bandwidth_gbps"]}
                    | _summed_samples(rails))
    return rows


def _summed_samples(rails: Sequence[Mapping[str, Any]]) -> dict[str, list[float]]:
    """The k-th repeat of every rail added up (the rails ran at the same time)."""
    every = [x.get("samples_gbps") for x in rails]
    if not all(every) or len({len(x) for x in every if x}) != 1:
        return {}
    return {"samples_gbps": [round(sum(k), 4) for k in zip(*every, strict=True)]}


def node_samples(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[int, int], list[float]]:
    """Each node pair's repeated figures (one for rows without repeats)."""
    return {(int(r["src_node"]), int(r["dst_node"])):
            list(r.get("samples_gbps") or [float(r["bandwidth_gbps"])]) for r in rows}


def shared_node(slow_pairs: Sequence[tuple[int, int]]) -> int | None:
    """The node in more than half of the slow pairs, and in more than any other node;
    None with fewer than two slow pairs (one pair cannot tell its two ends apart).
    Used for one rail's slow links; node pairs use elimination (`internode_findings`)."""
    if len(slow_pairs) < 2:
        return None
    counts: dict[int, int] = {}
    for pair in slow_pairs:
        for node in set(pair):
            counts[node] = counts.get(node, 0) + 1
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])
    node, count = ranked[0]
    runner_up = ranked[1][1] if len(ranked) > 1 else 0
    return node if count * 2 > len(slow_pairs) and count > runner_up else None


SLOW_LINK_HINT = ("check the NICs, cables and switch ports between these two nodes "
                  "(ibstat, ibdiagnet, ethtool) and the transport NCCL chose")
UNSTABLE_HINT = ("slow once, fine when measured again: other traffic or a transient; "
                 "rerun, and look into it if it comes back")


def internode_findings(rows: Sequence[Mapping[str, Any]], threshold: float,
                       labels: Mapping[int, str],
                       again: Sequence[Mapping[str, Any]] | None = None) -> list[Finding]:
    """The suspect node by elimination (at the fabric's cut), and each slow node pair,
    each confirmed or found unstable by the second look (`again`: the re-measured
    links); see gpucheck.comm.node_links and gpucheck.comm.confirm for the rules."""
    if not rows:
        return []
    suspects = find_node_suspects(node_samples(rows), threshold)
    check = "comm.internode.slow_pair"
    if suspects.empty:
        return [ok(check, f"{len(rows)} node pairs: no node below {suspects.cut:.2g} x the "
                   f"median of the pairs without it (the fabric's {FABRIC_FRACTION:g}, or "
                   f"their own spread when larger) and no pair below {threshold:g} x the "
                   f"median ({suspects.reference_gbps:.3g} GB/s)")]
    second = node_samples(node_pair_rows(again)) if again is not None else None
    looks = {look.pair: look for look in (
        second_look(suspects, second, suspects.reference_gbps) if second is not None
        else [Second(p, None, None, ()) for p in suspects.pairs])}
    figure = {p: max(v) for p, v in node_samples(rows).items()}
    findings = [_node_finding(m, way, suspects, looks, labels)
                for m, way in sorted(suspects.members.items())]
    for pair, look in looks.items():
        cut = _cut(pair, suspects, threshold)
        text = (f"{labels[pair[0]]} -> {labels[pair[1]]}: {figure[pair]:.3g} GB/s (best "
                f"repeat), below {cut:.2g} x the median node pair without a suspect "
                f"({suspects.reference_gbps:.3g} GB/s)")
        findings.append(_judged(check, text, look, cut, labels, SLOW_LINK_HINT,
                                f"node {pair[0]} -> node {pair[1]}"))
    return findings


def _cut(pair: Pair, suspects: NodeSuspects, threshold: float) -> float:
    """The fraction a pair was judged at: a suspect node's cut for its pairs, the
    pair rule's threshold for a pair slow on its own."""
    mine = any(directed(pair, m, way) for m, way in suspects.members.items())
    return suspects.cut if mine else threshold


def _against(look: Second, labels: Mapping[int, str]) -> str:
    pairs = " and ".join(f"{labels[a]} -> {labels[b]}" for a, b in look.against)
    return f"{pairs or 'the first measurement'} at {look.reference_gbps:.3g} GB/s"


def _judged(check: str, text: str, look: Second, threshold: float, labels: Mapping[int, str],
            hint: str, subject: str) -> Finding:
    """One slow figure's WARN: confirmed, unstable (action rerun) or not measured again."""
    confirmed = look.confirmed(threshold)
    if confirmed is None:
        return warn(check, f"{text}; not measured again (the run ended first)", hint=hint,
                    subject=subject)
    again = f"measured again at {look.again_gbps:.3g} GB/s against {_against(look, labels)}"
    if confirmed:
        return warn(check, f"{text}; confirmed: {again}", hint=hint, subject=subject)
    return warn(check, f"{text}; unstable: {again}, within {threshold:.2g} x",
                hint=UNSTABLE_HINT, subject=subject, action="rerun")


def _node_finding(node: int, way: str, suspects: NodeSuspects, looks: Mapping[Pair, Second],
                  labels: Mapping[int, str]) -> Finding:
    """The suspect node: confirmed when every one of its slow pairs is slow again, at
    the cut it was found at."""
    mine = [look for pair, look in looks.items() if directed(pair, node, way)]
    verdicts = [look.confirmed(suspects.cut) for look in mine]
    words = {"sending": "it sends on", "receiving": "it receives on", "both": "it is in"}[way]
    text = (f"{labels[node]}: every node pair {words} is below {suspects.cut:.2g} x the "
            f"median of the pairs without it ({suspects.reference_gbps:.3g} GB/s)")
    hint = ("suspect this node's NICs, their PCIe links or its switch port (ibstat, "
            "ibdiagnet, the NICs' link width)")
    if any(v is None for v in verdicts) or not mine:
        return warn("comm.internode.shared_node", f"{text}; not measured again", hint=hint,
                    subject=labels[node])
    against = _against(mine[0], labels)
    if all(verdicts):
        partners = sorted({n for look in mine for n in look.pair if n != node})
        return warn("comm.internode.shared_node", f"{text}; confirmed: measured again with "
                    f"{', '.join(labels[n] for n in partners)} (known good), against "
                    f"{against}", hint=hint, subject=labels[node])
    return warn("comm.internode.shared_node", f"{text}; unstable: {sum(map(bool, verdicts))} "
                f"of {len(mine)} of its pairs were slow when measured again (against "
                f"{against})", hint=UNSTABLE_HINT, subject=labels[node], action="rerun")


def slow_rails(links: Sequence[Mapping[str, Any]],
               threshold: float) -> tuple[float | None, list[Mapping[str, Any]]]:
    """(the median rail link, the rail links below `threshold` x it); none with one
    rail per node (a rail is then its node pair, judged by `internode_findings`)."""
    if max((link["rail"] for link in links), default=0) < 1:
        return None, []
    median = float(statistics.median(link["bandwidth_gbps"] for link in links))
    return median, [x for x in links if x["bandwidth_gbps"] < threshold * median]


def rail_exchanges(links: Sequence[Mapping[str, Any]],
                   threshold: float) -> list[tuple[int, int]]:
    """The node pairs to measure again for the slow rails (each once, unordered): every
    slow rail link's two nodes, and one node pair none of whose rail links was slow
    (known good), when there is one. The other rails of a slow link's node pair run
    with it (all rails at once, as in the rounds) and are known good when they were
    not slow the first time."""
    _, slow = slow_rails(links, threshold)
    if not slow:
        return []
    bad = {tuple(sorted((x["src_node"], x["dst_node"]))) for x in slow}
    pairs = {tuple(sorted((x["src_node"], x["dst_node"]))) for x in links}
    good = sorted(pairs - bad)
    return sorted(bad | set(good[:1]))  # type: ignore[arg-type]


def _rail_look(link: Mapping[str, Any], slow: Sequence[Mapping[str, Any]],
               again: Sequence[Mapping[str, Any]] | None) -> Second:
    """A slow rail link's second look: its re-measured figure against the median of
    the re-measured rail links that were not slow the first time (known good)."""
    pair = (int(link["src"]), int(link["dst"]))
    if again is None:
        return Second(pair, None, None, ())
    bad = {(int(x["src"]), int(x["dst"])) for x in slow}
    mine = [x["bandwidth_gbps"] for x in again if (int(x["src"]), int(x["dst"])) == pair]
    good = [x for x in again if (int(x["src"]), int(x["dst"])) not in bad]
    reference = float(statistics.median(x["bandwidth_gbps"] for x in good)) if good else None
    return Second(pair, max(mine) if mine else None, reference,
                  tuple((int(x["src"]), int(x["dst"])) for x in good))


def _rail_judged(text: str, look: Second, threshold: float, subject: str) -> Finding:
    """A slow rail link's WARN: confirmed, unstable (rerun) or not measured again."""
    check, hint = "comm.internode.slow_rail", ("one NIC or its cable: check this rail's "
                                               "NIC on both nodes (ibstat, its PCIe link "
                                               "width, NCCL_IB_HCA's order)")
    confirmed = look.confirmed(threshold)
    if confirmed is None:
        return warn(check, f"{text}; not measured again", hint=hint, subject=subject)
    again = (f"measured again at {look.again_gbps:.3g} GB/s against {len(look.against)} "
             f"known-good rail link(s) measured with it at {look.reference_gbps:.3g} GB/s")
    if confirmed:
        return warn(check, f"{text}; confirmed: {again}", hint=hint, subject=subject)
    return warn(check, f"{text}; unstable: {again}, within {threshold:g} x",
                hint=UNSTABLE_HINT, subject=subject, action="rerun")


def rail_findings(links: Sequence[Mapping[str, Any]], threshold: float,
                  labels: Mapping[int, str],
                  again: Sequence[Mapping[str, Any]] | None = None) -> list[Finding]:
    """WARN each rail link below `threshold` x the median rail link, judged again on its
    second look (`again`: the re-measured links), and the node a rail's slow links
    share (its NIC on that rail). Only with 2+ rails per node: with one rail, a rail
    is its node pair and `internode_findings` says it all."""
    median, slow = slow_rails(links, threshold)
    if median is None:
        return []
    check = "comm.internode.slow_rail"
    if not slow:
        return [ok(check, f"{len(links)} rail links within {threshold:g} x the median "
                   f"({median:.3g} GB/s)")]
    findings = [_rail_judged(f"rail {x['rail']}: rank {x['src']} ({labels[x['src_node']]}) "
                             f"-> rank {x['dst']} ({labels[x['dst_node']]}): "
                             f"{x['bandwidth_gbps']:.3g} GB/s, below {threshold:g} x the "
                             f"median rail link's {median:.3g} GB/s",
                             _rail_look(x, slow, again), threshold,
                             f"rank {x['src']} -> rank {x['dst']}") for x in slow]
    for rail in sorted({x["rail"] for x in slow}):
        pairs = [(x["src_node"], x["dst_node"]) for x in slow if x["rail"] == rail]
        suspect = shared_node(pairs)
        if suspect is not None:
            findings.append(warn(
                "comm.internode.shared_node",
                f"{labels[suspect]} is in most of the {len(pairs)} slow links of rail {rail}",
                hint="suspect this node's NIC on that rail (ibstat, its PCIe link, its "
                "cable and switch port)", subject=f"{labels[suspect]} rail {rail}"))
    return findings
