"""Verdicts over per-rank figures (against the node's peers, an expected figure, a PCIe
link) and over the peer-copy matrix, each WARN with its second look (docs/stress.md)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck import subject
from gpucheck import subject as subjects_
from gpucheck.devices import device_label
from gpucheck.distributed.nodes import group_by_node
from gpucheck.measure import Better, Bound, SecondLook
from gpucheck.peers import Pair, Suspects, against_median, eliminate, pair_looks, second_look
from gpucheck.probes.gpus import path_class as topology_class
from gpucheck.report import Finding, Status, looked, ok, skip, warn
from gpucheck.stats import median
from gpucheck.stress.gemm import Figure
from gpucheck.subject import Subject

NO_SECOND = "no second measurement ran"  # why a look was not measured again
RANK_NOT_AGAIN = "this rank was not in the second measurement"


@dataclass(frozen=True)
class Named:
    """A rank as findings name it: its subject and, in words, where it ran."""

    rank: int
    label: str  # "rank 3 (node 0 gpu7, cuda:3 GPU 3 (NVIDIA H200, bus ..., GPU-...))"
    subject: Subject


def subjects(ranks: Sequence[Mapping[str, Any]]) -> dict[int, Named]:
    """Each rank named with its node and the physical GPU it used (NVML index, bus id,
    UUID: `GpuIdentity.label()`), or its check-in device when it has no GPU."""
    return {int(r["rank"]): Named(
        int(r["rank"]), f"rank {r['rank']} (node {r['node_rank']} {r['host']}, "
        f"{r.get('gpu') or device_label(r)})",
        subjects_.rank(int(r["rank"]), gpu=r.get("nvml_index"), bus_id=r.get("pci_bus_id"),
                       host=str(r["host"]), node=int(r["node_rank"])))
        for r in ranks}


def bound_of(fraction: float, higher_is_better: bool = True) -> Bound:
    return Bound.fraction(fraction, Better.HIGHER if higher_is_better else Better.LOWER)


def suspect_ranks(checks: tuple[str, str | None], values: Mapping[int, float],
                  ranks: Sequence[Mapping[str, Any]], fraction: float,
                  figure_of: Callable[[str | None], Figure | None], expected_fraction: float,
                  higher_is_better: bool = True) -> list[int]:
    """The ranks the report's peer and expected findings (`checks`) will question: the
    ones to measure again before it judges them."""
    peers, expected = checks
    found = peer_findings(peers, peers, "", values, ranks, fraction, higher_is_better)
    if expected is not None:
        found += expected_findings(expected, expected, "", values, ranks, figure_of,
                                   expected_fraction)
    return crossed(found)


def crossed(findings: Sequence[Finding]) -> list[int]:
    """The ranks whose figure crossed a bound (their finding carries a look)."""
    return sorted({f.subject.rank for f in findings if f.look is not None and
                   f.subject is not None and f.subject.rank is not None})


Again = Mapping[int, float]  # a second measurement: rank -> its re-measured figure


def again_of(rows: Sequence[Mapping[str, Any]] | None, key: str,
             dtype: str | None = None) -> Again | None:
    """The second measurement's figures (of one dtype); None when there was none."""
    mine = [r for r in rows or [] if dtype is None or r.get("dtype") == dtype]
    return {int(r["rank"]): float(r[key]) for r in mine} if mine else None


def peer_findings(check: str, what: str, unit: str, values: Mapping[int, float],
                  ranks: Sequence[Mapping[str, Any]], fraction: float,
                  higher_is_better: bool = True,
                  causes: Mapping[int, str] | None = None,
                  again: Again | None = None) -> list[Finding]:
    """Per node, a WARN for each rank worse than `fraction` of the node's median, with
    what the fault watch saw slow it (`causes`) and its second look (`again`)."""
    names = subjects(ranks)
    bound = bound_of(fraction, higher_is_better)
    findings: list[Finding] = []
    compared = 0
    for node, members in group_by_node(ranks).items():
        mine = {r: values[r] for r in members if values.get(r) is not None}
        if len(mine) < 2:
            continue
        compared += len(mine)
        peers = against_median(mine, bound)
        for rank in peers.worse:
            text = (f"{names[rank].label}: {what} {mine[rank]:.4g} {unit}, "
                    f"{peers.ratios[rank]:.2f}x the median of {node.label}'s {len(mine)} "
                    f"ranks ({peers.reference:.4g} {unit})"
                    + (f"; it {causes[rank]}" if causes and rank in causes else ""))
            beside = tuple(names[m].subject for m in mine
                           if m != rank and again and m in again)
            second = [again[m] for m in mine if again and m in again]  # the node's again
            look = _again_look(mine[rank], again, rank, median(second) if second else None,
                               bound, unit, beside)
            findings.append(looked(check, text, PEER_HINT, names[rank].subject, look))
    if compared == 0:
        return [skip(check, f"{what}: one rank per node, no peers to compare with")]
    if not any(f.status is Status.WARN for f in findings):
        within = f"within {1 - fraction:.0%} of" if higher_is_better else \
            f"at most {1 / fraction - 1:.0%} slower than"
        findings.insert(0, ok(check, f"{what}: all {compared} ranks {within} their node's "
                              "median"))
    return findings


PEER_HINT = ("this GPU is slower than its peers: check its clocks, temperature, power "
             "limit and throttle reasons (nvidia-smi -q -d PERFORMANCE,CLOCK,POWER) and "
             "whether another process uses it")


def expected_findings(check: str, what: str, unit: str, values: Mapping[int, float],
                      ranks: Sequence[Mapping[str, Any]],
                      figure_of: Callable[[str | None], Figure | None],
                      fraction: float, again: Again | None = None) -> list[Finding]:
    """Each rank against its GPU model's typical figure; SKIP for models without one.
    A rank below it carries the look of its second measurement (`again`)."""
    names = subjects(ranks)
    bound = bound_of(fraction)
    findings: list[Finding] = []
    unknown: dict[str, list[int]] = {}
    passed: dict[str, tuple[Figure, list[int]]] = {}
    for row in ranks:
        rank, model = int(row["rank"]), row.get("gpu_name")
        figure = figure_of(model)
        if rank not in values:
            continue
        if figure is None:
            unknown.setdefault(model or "CPU", []).append(rank)
            continue
        if bound.worse(values[rank], figure.typical):
            look = _again_look(values[rank], again, rank, figure.typical, bound, unit)
            value = values[rank]
            findings.append(looked(
                check, f"{names[rank].label}: {what} {value:.4g} {unit}, "
                f"{value / figure.typical:.2f}x the typical {figure.typical:.4g} {unit} for "
                f"this model ({_figure_words(figure, unit)}; source: {figure.source})",
                "the GPU reaches much less than a healthy one of its model: check clocks, "
                "power limit and throttle reasons (nvidia-smi -q -d PERFORMANCE,POWER), and"
                " compare with the node's other GPUs above", names[rank].subject, look))
        else:
            passed.setdefault(model or "CPU", (figure, []))[1].append(rank)
    for model, (figure, members) in passed.items():
        findings.append(ok(check, f"{what}: {len(members)} {model} rank(s) at or above "
                           f"{fraction:g} x the typical {figure.typical:.4g} {unit} "
                           f"({_figure_words(figure, unit)})"))
    for model, members in unknown.items():
        findings.append(skip(check, f"{what}: no expected figure for {model} "
                             f"(rank(s) {', '.join(map(str, members))}); the node's peers "
                             "are the comparison"))
    return findings


def _again_look(first: float, again: Again | None, rank: int, reference: float | None,
                bound: Bound, unit: str, beside: tuple[Subject, ...] = ()) -> SecondLook:
    """The rank's second figure against `reference`: its node's re-measured median (the
    ranks measured `beside` it), or the first figure's own (the model's, the link's)."""
    if again is None or rank not in again:
        why = NO_SECOND if again is None else RANK_NOT_AGAIN
        return second_look(first, None, None, (), bound, unit, why)
    return second_look(first, again[rank], reference, beside, bound, unit)


def _figure_words(figure: Figure, unit: str) -> str:
    how = "measured" if figure.measured else "estimated"
    return f"peak {figure.peak:.4g} {unit} x {figure.typical_fraction:g} {how}"


def link_findings(check: str, rows: Sequence[Mapping[str, Any]],
                  ranks: Sequence[Mapping[str, Any]], fraction: float,
                  again: Again | None = None) -> list[Finding]:
    """Host copies of each rank measured alone against its link's one-direction rate;
    `again`: each rank's slower direction alone, measured a second time."""
    names = subjects(ranks)
    bound = bound_of(fraction)
    findings: list[Finding] = []
    unknown = []
    for row in rows:
        rank, rate = int(row["rank"]), row.get("link_gbps")
        if not rate:
            unknown.append(rank)
            continue
        worst = min(row["h2d_gbps"], row["d2h_gbps"])
        if bound.worse(worst, rate):
            findings.append(looked(
                check, f"{names[rank].label}: host copies alone {row['h2d_gbps']:.3g} GB/s "
                f"H2D, {row['d2h_gbps']:.3g} GB/s D2H, below {fraction:g} x its link's "
                f"{rate:.3g} GB/s ({row.get('link')})",
                "check the link (nvidia-smi -q -d PCIE; lspci -vv for its width and "
                "speed), the slot and riser, and that the rank runs on its GPU's NUMA node",
                names[rank].subject, _again_look(worst, again, rank, rate, bound, "GB/s")))
    if unknown:
        findings.append(skip(check, "PCIe link rate unknown (sysfs has no link speed/width) "
                             f"for rank(s) {', '.join(map(str, unknown))}"))
    checked = len(rows) - len(unknown)
    if checked and not any(f.status.value == "WARN" for f in findings):
        findings.append(ok(check, f"{checked} rank(s) copy at or above {fraction:g} x their "
                           "PCIe link's rate"))
    return findings


def copies_again(rows: Sequence[Mapping[str, Any]] | None, setting: str) -> Again | None:
    """The second copies' slower direction per rank, "alone" or "together"."""
    if not rows:
        return None
    return {int(r["rank"]): min(r[f"h2d_{setting}_gbps"], r[f"d2h_{setting}_gbps"])
            for r in rows if r.get(f"h2d_{setting}_gbps") is not None}


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
        medians = ", ".join(f"{kind or 'all'}: {s.reference:.4g} GB/s"
                            for kind, s in classes.items())
        apart = [p for p in pairs if not p["peer_access"] and p.get("p2p_by_design")]
        findings.append(ok("stress.p2p", f"{where}: {len(measured)} pairs, each at or above "
                           f"{fraction:g} x the median pair of its path class ({medians})" + (
                               f"; {len(apart)} pair(s) without peer access across CPU "
                               "sockets, as the driver does by design (copies go through "
                               "host memory)" if apart else "")))
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


def class_suspects(pairs: list[dict[str, Any]], fraction: float) -> dict[str, Suspects]:
    """Per path class (NV# as one; "" when not read), the slow pairs and a GPU whose
    every pair one way is slow (`peers.eliminate`, as comm's pairs)."""
    by_class: dict[str, list[dict[str, Any]]] = {}
    for p in pairs:
        if p["gbps"] is not None:  # a pair without peer access has nothing to compare
            by_class.setdefault(topology_class(p.get("path")), []).append(p)
    return {kind: eliminate(samples_of(members), Bound.fraction(fraction, Better.HIGHER))
            for kind, members in sorted(by_class.items())}


def samples_of(pairs: Sequence[Mapping[str, Any]]) -> dict[tuple[int, int], list[float]]:
    """Each measured pair's reading (one per pair: the median copy's rate)."""
    return {(p["src"], p["dst"]): [p["gbps"]] for p in pairs if p["gbps"] is not None}
