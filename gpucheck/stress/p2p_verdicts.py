"""The peer-copy matrix's verdicts (`stress.p2p`): pure functions of the matrix.

A pair is slow by `gpucheck.comm.confirm`'s rules, the same as comm's send/recv
pairs: below `--copy-threshold` x the median pair of its own path class (NV#, PIX,
PXB, PHB, NODE, SYS: `gpucheck.stress.copies.class_suspects`; without a GPU whose
every pair one way is slow). A pair without peer access across CPU sockets (or whose
P2P status says the platform refuses it) is as designed, said in the OK; elsewhere
it points at ACS or an IOMMU setting. Each slow pair was measured again by the
node's local rank 0 beside a known-good pair, with the node's other ranks still
parked off their GPUs (`gpucheck.stress.copies.second_look`): slow again is
"confirmed" and says against which pair; fine the second time is "unstable",
action `rerun`; a matrix without a second look (an older report) says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpucheck.comm.confirm import Second, Suspects, second_look
from gpucheck.report import Finding, ok, skip, warn
from gpucheck.stress.copies import class_suspects
from gpucheck.stress.verdicts import UNSTABLE_HINT


def p2p_findings(node: Mapping[str, Any], where: str, fraction: float) -> list[Finding]:
    """Pairs without peer access where the platform allows it; pairs slow against the
    median pair of their path class (without a GPU all of whose pairs one way are
    slow), each confirmed or found unstable by its second look (`node["again"]`;
    gpucheck.comm.confirm's rules)."""
    pairs = node["pairs"]
    measured = {(p["src"], p["dst"]): p["gbps"] for p in pairs if p["gbps"] is not None}
    if not measured:
        return [skip("stress.p2p", f"{where}: no GPU pair has peer access (PCIe without "
                     "P2P support, or P2P disabled): copies go through host memory",
                     subject=where)]
    findings = _blocked(pairs, len(measured), where)
    classes = class_suspects(list(pairs), fraction)
    for kind, suspects in classes.items():
        findings += [_slow_peer_pair(look, measured, suspects.reference_gbps, fraction, where,
                                     kind) for look in _p2p_looks(node, suspects)]
    if not any(f.status.value == "WARN" for f in findings):
        findings.append(ok("stress.p2p", f"{where}: {len(measured)} pairs, each at or above "
                           f"{fraction:g} x the median pair of its path class ("
                           f"{_class_medians(classes)}){_by_design_words(pairs)}"))
    return findings


def _blocked(pairs: Sequence[Mapping[str, Any]], measured: int, where: str) -> list[Finding]:
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
                 "setting can block P2P between GPUs under one CPU socket", subject=where)]


def _by_design_words(pairs: Sequence[Mapping[str, Any]]) -> str:
    apart = [p for p in pairs if not p["peer_access"] and p.get("p2p_by_design")]
    if not apart:
        return ""
    return (f"; {len(apart)} pair(s) without peer access across CPU sockets, as the driver "
            "does by design (copies go through host memory)")


def _class_medians(classes: Mapping[str, Suspects]) -> str:
    return ", ".join(f"{kind or 'all'}: {s.reference_gbps:.4g} GB/s"
                     for kind, s in classes.items())


def _p2p_looks(node: Mapping[str, Any], suspects: Suspects) -> list[Second]:
    """Each slow pair's second look; not measured again when the node has none."""
    if "again" not in node:
        return [Second(p, None, None, ()) for p in suspects.pairs]
    again = {(p["src"], p["dst"]): [p["gbps"]] for p in node["again"] if p["gbps"]}
    return second_look(suspects, again, suspects.reference_gbps)


def _slow_peer_pair(look: Second, measured: Mapping[tuple[int, int], float],
                    reference: float, fraction: float, where: str, kind: str) -> Finding:
    src, dst = look.pair
    value = measured[look.pair]
    median = f"the median {kind} pair" if kind else "the median pair"
    text = (f"{where}: cuda:{src}->cuda:{dst} copies at {value:.4g} GB/s, "
            f"{value / reference:.2f}x {median} ({reference:.4g} GB/s)")
    hint = ("check this pair's link: nvidia-smi nvlink -s / -e for NVLink errors, "
            "nvidia-smi topo -m for the path")
    subject = f"{where} cuda:{src}->cuda:{dst}"
    confirmed = look.confirmed(fraction)
    if confirmed is None:
        return warn("stress.p2p", f"{text}; not measured again", hint=hint, subject=subject)
    against = " and ".join(f"cuda:{a}->cuda:{b}" for a, b in look.against) or \
        "the first measurement's median"
    again = (f"measured again at {look.again_gbps:.4g} GB/s against {against} at "
             f"{look.reference_gbps:.4g} GB/s, with the node's other ranks parked")
    if confirmed:
        return warn("stress.p2p", f"{text}; confirmed: {again}", hint=hint, subject=subject)
    return warn("stress.p2p", f"{text}; unstable: {again}", hint=UNSTABLE_HINT,
                subject=subject, action="rerun")
