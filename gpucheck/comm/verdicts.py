"""comm's verdicts on gathered figures, pure functions (no torch): nccl-tests' algbw and
busbw, the results' correctness, slow pairs on a node and slow nodes, each slow figure a
WARN carrying its second look as data (docs/comm.md, "Columns" and "Second looks")."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck import subject
from gpucheck.comm.records import PairRow
from gpucheck.confirm import Suspect, confirm
from gpucheck.distributed.nodes import NodeId, group_by_node, node_metric, slow_node_findings
from gpucheck.measure import Better, Bound, SecondLook
from gpucheck.peers import (
    Pair,
    Suspects,
    against_median,
    eliminate,
    known_good,
    pair_looks,
    second_look,
)
from gpucheck.probes.gpus import path_class
from gpucheck.report import Finding, fail, looked, ok, skip, warn
from gpucheck.stats import best, median, typical
from gpucheck.subject import Subject

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
GB = 1e9
GBPS = "GB/s"
ELEMENT_BYTES = 4  # float32
# The data size S is n x the per-rank buffer for these (the gathered output, the
# reduced input); the buffer itself for the others.
N_FOLD = ("all_gather", "reduce_scatter")
SLOW_NODE = "comm.nodes.slow_node"
CPU_RANKS = "cpu_ranks"
_CPU_NOTE = " (CPU ranks: a busy or throttled process on the node, not its hardware)"
ONE_RANK_BUSBW = ("one rank: no data crosses a link, so there is no bus bandwidth "
                  "(the times are the library's own cost per call); run on 2+ GPUs")


def data_bytes(collective: str, count: int, world_size: int) -> int:
    """The "size" nccl-tests divides by time, from the per-rank buffer's elements."""
    size = count * ELEMENT_BYTES
    return size * world_size if collective in N_FOLD else size


def bus_factor(collective: str, world_size: int) -> float | None:
    """busbw / algbw (nccl-tests doc/PERFORMANCE.md); None on one rank."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}")
    if world_size <= 1:
        return None
    if collective == "broadcast":
        return 1.0
    if collective == "all_reduce":
        return 2 * (world_size - 1) / world_size
    return (world_size - 1) / world_size


@dataclass(frozen=True)
class SizeResult:
    """One message size of one collective, as rank 0 reports it."""

    size_bytes: int
    count: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float | None  # None on one rank (`bus_factor`)
    wrong: int
    slowest_rank: int
    fastest_time_us: float
    rank_times_us: tuple[float, ...]


def size_result(collective: str, size_bytes: int, count: int, world_size: int,
                times_s: Sequence[float], wrong: Sequence[int]) -> SizeResult:
    """Every rank's time per op and wrong elements for one size: the slowest rank's time."""
    slowest = max(range(len(times_s)), key=lambda r: times_s[r])
    time_s = times_s[slowest]
    algbw = data_bytes(collective, count, world_size) / time_s / GB if time_s > 0 else 0.0
    factor = bus_factor(collective, world_size)
    busbw = None if factor is None else round(algbw * factor, 4)
    return SizeResult(size_bytes, count, round(time_s * 1e6, 2), round(algbw, 4), busbw,
                      int(sum(wrong)), slowest, round(min(times_s) * 1e6, 2),
                      tuple(round(t * 1e6, 2) for t in times_s))


def correctness_findings(collective: str, rows: Sequence[Mapping[str, Any]]) -> list[Finding]:
    bad = [r for r in rows if r["wrong"] > 0]
    if not rows:
        return []
    if not bad:
        return [ok(f"comm.{collective}.correct",
                   f"every element right at {len(rows)} sizes")]
    return [fail(f"comm.{collective}.correct",
                 f"{r['wrong']} wrong element(s) at {r['size_bytes']} bytes",
                 hint="results differ from the expected sums: suspect a faulty GPU, link or "
                 "driver; rerun with NCCL_DEBUG=INFO and check dmesg for Xid errors",
                 subject=subject.text(f"{r['size_bytes']} bytes")) for r in bad]


def baseline_findings(rows: Sequence[Mapping[str, Any]], baseline_gbps: float | None,
                      collective: str = "all_reduce") -> list[Finding]:
    """FAIL when the largest message's bus bandwidth is below the given baseline."""
    if baseline_gbps is None or not rows:
        return []
    top = max(rows, key=lambda r: r["size_bytes"])
    check = f"comm.{collective}.busbw_baseline"
    if top["busbw_gbps"] is None:
        return [skip(check, ONE_RANK_BUSBW)]
    text = (f"busbw {top['busbw_gbps']:.3g} GB/s at {top['size_bytes']} bytes "
            f"(baseline {baseline_gbps:g} GB/s)")
    if top["busbw_gbps"] >= baseline_gbps:
        return [ok(check, text)]
    return [fail(check, text, hint="below the cluster's baseline: check NVLink/PCIe/NIC "
                 "health (nvidia-smi nvlink -s, nvidia-smi topo -m) and NCCL_* settings")]


# --- slow figures and their second looks ----------------------------------------------

def rate_bound(fraction: float) -> Bound:
    """Slow below `fraction` x the reference, a rate. A cut of 0 (the healthy links'
    spread swallowed the fabric's fraction) condemns nothing: a Bound needs a positive
    limit, so the smallest positive float stands for it."""
    return Bound(max(fraction, sys.float_info.min), Better.HIGHER) if fraction <= 0 \
        else Bound.fraction(fraction, Better.HIGHER)


def on_cpu(device: str) -> bool:  # CPU ranks' figures measure processes
    return device == "cpu"


def ended_first(first: float, reference: float | None, bound: Bound) -> SecondLook:
    """The look of a slow figure whose run ended before its second look."""
    return second_look(first, None, reference, (), bound, GBPS, "the run ended first")


def slow(check: str, text: str, hint: str, subject: Subject, look: SecondLook | None,
         device: str, *, cpu_hint: bool = True) -> Finding:
    """A slow figure's WARN with its look (`report.looked`), cause `cpu_ranks` on CPU ranks
    (a word on the hint unless `cpu_hint` is False); `look` None: no second figure."""
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


# --- pairs on a node -------------------------------------------------------------------

ClassKey = tuple[int, str]  # (node rank, path class: "NV", "PXB", "SYS"; "" unknown)
Samples = dict[Pair, list[float]]


def _samples(pair: PairRow) -> list[float]:
    return list(pair.samples_gbps or [pair.bandwidth_gbps])


def samples_by_node(pairs: Sequence[PairRow]) -> dict[ClassKey, Samples]:
    """Each pair's repeats by the sender's node and path class (pairs across a bridge,
    switch or socket are slower by design: each is compared with its own kind)."""
    by_class: dict[ClassKey, Samples] = {}
    for p in pairs:
        by_class.setdefault((p.node_rank, path_class(p.path)), {})[(p.src, p.dst)] = \
            _samples(p)
    return by_class


def suspects_by_node(pairs: Sequence[PairRow],
                     threshold: float) -> dict[ClassKey, Suspects]:
    """`gpucheck.peers.eliminate` at `threshold` x the median, per node and path class."""
    return {key: eliminate(samples, rate_bound(threshold))
            for key, samples in samples_by_node(pairs).items()}


def rank_pair(pair: Pair) -> subject.Subject:
    return subject.pair(pair[0], pair[1])


def pair_findings(pairs: Sequence[PairRow], threshold: float,
                  names: Mapping[int, str], again: Sequence[PairRow] | None = None,
                  device: str = "cuda") -> list[Finding]:
    """Per node and path class: WARN each pair resolvably below `threshold` x the
    reference, with its second look (`again` None: the run ended first); SKIP pairs too
    noisy to judge."""
    second = {(p.src, p.dst): _samples(p) for p in again or []}

    def name(rank: int) -> str:
        return names.get(rank, f"rank {rank}")

    findings: list[Finding] = []
    classes = samples_by_node(pairs)
    bound = rate_bound(threshold)
    hint = ("one path is slow: check `nvidia-smi topo -m` and `nvidia-smi nvlink -s` for "
            "these two GPUs, and their PCIe link width") if not on_cpu(device) else (
        "CPU ranks exchange through the host's memory: a slow pair means a busy, throttled "
        "or descheduled process (top, the job's CPU quota and binding), not a link")
    for (node, kind), samples in sorted(classes.items()):
        suspects = eliminate(samples, bound)
        looks = pair_looks(suspects, samples, second, bound, GBPS, rank_pair) \
            if again is not None else {p: ended_first(typical(samples[p]), suspects.reference,
                                                      bound) for p in suspects.pairs}
        median_words = f"the node's median {kind} pair" if kind else "the node's median"
        for (src, dst), look in looks.items():
            text = (f"{name(src)} -> {name(dst)}: "
                    f"{repeats_words(samples[(src, dst)], (src, dst), suspects)}, below "
                    f"{threshold:g} x {median_words} {suspects.reference:.3g} GB/s")
            findings.append(slow("comm.pairwise.slow_pair", text, hint, rank_pair((src, dst)),
                                 look, device, cpu_hint=False))
        if suspects.noisy:
            findings.append(_noisy(node, suspects, pairs, threshold, name))
    if pairs and not any(f.status.value == "WARN" for f in findings):
        kinds = sorted({k for _, k in classes if k})
        within = f" pair of their path class ({', '.join(kinds)})" if kinds else ""
        findings.insert(0, ok("comm.pairwise.slow_pair", f"{len(pairs)} pairs: none slower "
                              f"than {threshold:g} x their node's median{within} beyond the "
                              "spread of repeated timings"))
    return findings


def _noisy(node: int, suspects: Suspects, pairs: Sequence[PairRow],
           threshold: float, name: Callable[[int], str]) -> Finding:
    """Below the threshold, but no further below the median than one pair's repeats spread."""
    listed = ", ".join(f"{name(a)} -> {name(b)}" for a, b in suspects.noisy[:4])
    size = next(p.size_bytes for p in pairs if (p.src, p.dst) == suspects.noisy[0])
    return skip("comm.pairwise.slow_pair", f"node {node}: too noisy to judge at {size} bytes: "
                f"{listed} read below {threshold:g} x the median "
                f"({suspects.reference:.3g} GB/s), but repeated timings of healthy "
                f"pairs read as low as {suspects.floor:.3g} GB/s; a larger --pair-bytes "
                "resolves more", subject=subject.node(node))


def pair_matrix(pairs: Sequence[PairRow], ranks: Sequence[int]) -> list[dict[str, Any]]:
    """Rows `src` with one column per destination rank (GB/s; blank on the diagonal)."""
    value = {(p.src, p.dst): p.bandwidth_gbps for p in pairs}
    rows = []
    for src in ranks:
        row: dict[str, Any] = {"src": f"rank {src}"}
        for dst in ranks:
            row[f"to {dst}"] = value.get((src, dst))
        if any(v is not None for k, v in row.items() if k != "src"):
            rows.append(row)
    return rows


# --- slow nodes, measured again beside a known-good node -------------------------------

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
                 pairs: Sequence[PairRow]) -> dict[NodeId, float]:
    """Per node: the median bandwidth over every one of its pairs (by the sender's node;
    not per rank: a rank sends to every other rank of its node)."""
    node_of = {rank: node for node, members in group_by_node(ranks).items()
               for rank in members}
    by_node: dict[NodeId, list[float]] = {}
    for pair in pairs:
        if (node := node_of.get(pair.src)) is not None:
            by_node.setdefault(node, []).append(pair.bandwidth_gbps)
    return {node: median(values) for node, values in sorted(by_node.items())}


def node_figures(ranks: Sequence[Mapping[str, Any]], pairs: Sequence[PairRow],
                 all_reduce: Sequence[Mapping[str, Any]]) -> NodeFigures:
    """The pairs' medians when 2+ nodes have pairs, else the largest all_reduce's time."""
    medians = pair_medians(ranks, pairs)
    if len(medians) >= 2:
        return NodeFigures("pairs", "median pair bandwidth", "GB/s", medians, Better.HIGHER)
    times = dict(enumerate(all_reduce[-1]["rank_times_us"])) if all_reduce else {}
    return NodeFigures("all_reduce", "largest all_reduce time", "us",
                       node_metric(ranks, times, combine=max), Better.LOWER)


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
                       again: Mapping[str, Any] | None, again_pairs: Sequence[PairRow],
                       ranks: Sequence[Mapping[str, Any]],
                       device: str = "cuda") -> list[Finding]:
    """`slow_node_findings`' verdicts, each slow node's with its second look beside the
    known-good node (`again`: what the worker measured again, None when it did not; its
    pairs, read back, `again_pairs`)."""
    first = slow_node_findings(figures.values, SLOW_NODE, figures.what, figures.unit,
                               figures.better is Better.HIGHER, fraction)
    worse = against_median(figures.values, figures.bound(fraction)).worse
    if not worse:
        return first
    second: dict[NodeId, float] = {}
    if again and figures.kind == "pairs":  # read as the first pass was
        second = pair_medians(ranks, again_pairs)
    elif again and again.get("rank_times_us"):
        second = node_metric(ranks, dict(enumerate(again["rank_times_us"])), combine=max)
    known = next((n for n in second if again and n.node_rank == int(again["known_good"])),
                 None)
    suspects = [Suspect(node.subject(), finding.message, figures.values[node], second[node],
                        second[known], (known.subject(),))
                if known is not None and node in second else
                Suspect(node.subject(), finding.message, figures.values[node], None, None,
                        why_not="the node was not measured again")
                for node, finding in zip(worse, first, strict=True)]
    cpu = on_cpu(device)
    return confirm(SLOW_NODE, suspects, figures.bound(fraction), figures.unit,
                   (first[0].hint or "") + (_CPU_NOTE if cpu else ""),
                   cause=CPU_RANKS if cpu else None)
