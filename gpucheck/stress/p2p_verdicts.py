"""The peer-copy matrix's verdicts (`stress.p2p`): pure functions of the matrix.

A pair is slow by `gpucheck.peers.eliminate`, the same rule as comm's send/recv
pairs: below `--copy-threshold` x the median pair of its own path class (NV#, PIX,
PXB, PHB, NODE, SYS: `gpucheck.stress.copies.class_suspects`; without a GPU whose
every pair one way is slow). A pair without peer access across CPU sockets (or whose
P2P status says the platform refuses it) is as designed, said in the OK; elsewhere
it points at ACS or an IOMMU setting (cause `no_peer_access`). Each slow pair was
measured again by the node's local rank 0 beside a known-good pair, with the node's
other ranks still parked off their GPUs (`gpucheck.stress.copies.second_look`); its
WARN carries that second look as data (confirmed, unstable, or not measured again
when the matrix has none), and its action follows from the look.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck import subject
from gpucheck.measure import Better, Bound, SecondLook
from gpucheck.peers import Pair, Suspects, pair_looks, second_look
from gpucheck.report import Finding, looked, ok, skip, warn
from gpucheck.stress.copies import class_suspects, samples_of
from gpucheck.subject import Subject


def p2p_findings(node: Mapping[str, Any], where: Subject, fraction: float) -> list[Finding]:
    """Pairs without peer access where the platform allows it; pairs slow against the
    median pair of their path class (without a GPU all of whose pairs one way are
    slow), each with its second look (`node["again"]`). `where`: the node's subject."""
    pairs = node["pairs"]
    measured = {(p["src"], p["dst"]): p["gbps"] for p in pairs if p["gbps"] is not None}
    if not measured:
        return [skip("stress.p2p", f"{where}: no GPU pair has peer access (PCIe without "
                     "P2P support, or P2P disabled): copies go through host memory",
                     subject=where)]
    findings = _blocked(pairs, len(measured), where)
    classes = class_suspects(list(pairs), fraction)
    bound = Bound.fraction(fraction, Better.HIGHER)
    for kind, suspects in classes.items():
        looks = _p2p_looks(node, pairs, suspects, bound, where)
        findings += [_slow_peer_pair(pair, look, measured, suspects.reference, where, kind)
                     for pair, look in looks.items()]
    if not any(f.status.value == "WARN" for f in findings):
        findings.append(ok("stress.p2p", f"{where}: {len(measured)} pairs, each at or above "
                           f"{fraction:g} x the median pair of its path class ("
                           f"{_class_medians(classes)}){_by_design_words(pairs)}"))
    return findings


def _blocked(pairs: Sequence[Mapping[str, Any]], measured: int,
             where: Subject) -> list[Finding]:
    """A WARN for the pairs without peer access where nothing says the platform
    refuses it (the ones across sockets are in the OK)."""
    blocked = [p for p in pairs if not p["peer_access"] and not p.get("p2p_by_design")]
    if not blocked:
        return []
    listed = ", ".join(f"cuda:{p['src']}->cuda:{p['dst']}"
                       + (f" ({p['path']})" if p.get("path") else "") for p in blocked[:8])
    return [warn("stress.p2p", f"{where}: {len(blocked)} pair(s) without peer access while "
                 f"{measured} have it ({listed})",
                 hint="check nvidia-smi topo -m and nvidia-smi topo -p2p r; ACS or an IOMMU "
                 "setting can block P2P between GPUs under one CPU socket", subject=where,
                 cause="no_peer_access")]


def _by_design_words(pairs: Sequence[Mapping[str, Any]]) -> str:
    apart = [p for p in pairs if not p["peer_access"] and p.get("p2p_by_design")]
    if not apart:
        return ""
    return (f"; {len(apart)} pair(s) without peer access across CPU sockets, as the driver "
            "does by design (copies go through host memory)")


def _class_medians(classes: Mapping[str, Suspects]) -> str:
    return ", ".join(f"{kind or 'all'}: {s.reference:.4g} GB/s"
                     for kind, s in classes.items())


def _pair_subject(where: Subject, pair: Pair) -> Subject:
    return subject.pair(pair[0], pair[1], f"{where} cuda:{pair[0]}->cuda:{pair[1]}",
                        by="cuda")


def _p2p_looks(node: Mapping[str, Any], pairs: Sequence[Mapping[str, Any]],
               suspects: Suspects, bound: Bound, where: Subject) -> dict[Pair, SecondLook]:
    """Each slow pair's second look; not measured again when the node has none."""
    first = samples_of(pairs)
    if "again" not in node:
        return {p: second_look(first[p][0], None, None, (), bound, "GB/s",
                               "the matrix has no second measurement") for p in suspects.pairs}
    again = {(p["src"], p["dst"]): [p["gbps"]] for p in node["again"] if p["gbps"]}
    return pair_looks(suspects, first, again, bound, "GB/s",
                      lambda pair: _pair_subject(where, pair))


def _slow_peer_pair(pair: Pair, look: SecondLook, measured: Mapping[Pair, float],
                    reference: float, where: Subject, kind: str) -> Finding:
    src, dst = pair
    value = measured[pair]
    median = f"the median {kind} pair" if kind else "the median pair"
    text = (f"{where}: cuda:{src}->cuda:{dst} copies at {value:.4g} GB/s, "
            f"{value / reference:.2f}x {median} ({reference:.4g} GB/s)")
    hint = ("check this pair's link: nvidia-smi nvlink -s / -e for NVLink errors, "
            "nvidia-smi topo -m for the path")
    return looked("stress.p2p", text, hint, _pair_subject(where, pair), look)
