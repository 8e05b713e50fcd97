"""Bandwidth arithmetic and the pairwise verdicts of the comm sweep, as nccl-tests
defines algbw and busbw (GB = 1e9; docs/comm.md, "Columns"): pure functions, no torch.
`time` is the slowest rank's mean time per operation, never an average that hides it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpucheck import subject
from gpucheck.comm.looks import GBPS, on_cpu, rate_bound, repeats_words, slow
from gpucheck.measure import SecondLook
from gpucheck.peers import Pair, Suspects, eliminate, pair_looks, second_look
from gpucheck.probes.gpus import path_class
from gpucheck.report import Finding, fail, ok, skip
from gpucheck.stats import typical

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
GB = 1e9
ELEMENT_BYTES = 4  # float32, as gpucheck.comm.collectives
# The data size S is n x the per-rank buffer for these (the gathered output, the
# reduced input); the buffer itself for the others.
N_FOLD = ("all_gather", "reduce_scatter")


def data_bytes(collective: str, count: int, world_size: int) -> int:
    """The "size" nccl-tests divides by time, from the per-rank buffer's elements."""
    size = count * ELEMENT_BYTES
    return size * world_size if collective in N_FOLD else size


ONE_RANK_BUSBW = ("one rank: no data crosses a link, so there is no bus bandwidth "
                  "(the times are the library's own cost per call); run on 2+ GPUs")


def bus_factor(collective: str, world_size: int) -> float | None:
    """busbw / algbw (nccl-tests doc/PERFORMANCE.md); None on one rank, where nothing
    crosses a link."""
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

    collective: str
    size_bytes: int
    count: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float | None  # None on one rank (`bus_factor`)
    wrong: int
    slowest_rank: int
    fastest_time_us: float

    def row(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "collective"}


def size_result(collective: str, size_bytes: int, count: int, world_size: int,
                times_s: Sequence[float], wrong: Sequence[int]) -> SizeResult:
    """Combine every rank's time per op and wrong-element count for one size."""
    slowest = max(range(len(times_s)), key=lambda r: times_s[r])
    time_s = times_s[slowest]
    algbw = data_bytes(collective, count, world_size) / time_s / GB if time_s > 0 else 0.0
    factor = bus_factor(collective, world_size)
    busbw = None if factor is None else round(algbw * factor, 4)
    return SizeResult(collective, size_bytes, count, round(time_s * 1e6, 2), round(algbw, 4),
                      busbw, int(sum(wrong)), slowest, round(min(times_s) * 1e6, 2))


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


ClassKey = tuple[int, str]  # (node rank, path class: "NV", "PXB", "SYS"; "" unknown)
Samples = dict[Pair, list[float]]


def samples_by_node(pairs: Sequence[Mapping[str, Any]]) -> dict[ClassKey, Samples]:
    """Each pair's repeats by the sender's node and path class (pairs across a bridge,
    switch or socket are slower by design: each is compared with its own kind)."""
    by_class: dict[ClassKey, Samples] = {}
    for p in pairs:
        samples = list(p.get("samples_gbps") or [p["bandwidth_gbps"]])
        key = (int(p["node_rank"]), path_class(p.get("path")))
        by_class.setdefault(key, {})[(int(p["src"]), int(p["dst"]))] = samples
    return by_class


def suspects_by_node(pairs: Sequence[Mapping[str, Any]],
                     threshold: float) -> dict[ClassKey, Suspects]:
    """`gpucheck.peers.eliminate` at `threshold` x the median, per node and path class."""
    return {key: eliminate(samples, rate_bound(threshold))
            for key, samples in samples_by_node(pairs).items()}


def _pair_hint(device: str) -> str:
    """Where to look for a slow pair: the GPUs' path, or (CPU ranks) the processes."""
    if not on_cpu(device):
        return ("one path is slow: check `nvidia-smi topo -m` and `nvidia-smi nvlink -s` "
                "for these two GPUs, and their PCIe link width")
    return ("CPU ranks exchange through the host's memory: a slow pair means a busy, "
            "throttled or descheduled process (top, the job's CPU quota and binding), "
            "not a link")


def rank_pair(pair: Pair) -> subject.Subject:
    return subject.pair(pair[0], pair[1])


def pair_findings(pairs: Sequence[Mapping[str, Any]], threshold: float,
                  names: Mapping[int, str], again: Sequence[Mapping[str, Any]] | None = None,
                  device: str = "cuda") -> list[Finding]:
    """Per node: WARN each pair resolvably below `threshold` x its node's reference, with
    its second look (`again`; None when the run ended first); SKIP pairs too noisy to judge."""
    second = {(int(p["src"]), int(p["dst"])): list(p["samples_gbps"]) for p in again or []}

    def name(rank: int) -> str:
        return names.get(rank, f"rank {rank}")

    findings: list[Finding] = []
    classes = samples_by_node(pairs)
    for (node, kind), samples in sorted(classes.items()):
        suspects = eliminate(samples, rate_bound(threshold))
        looks = _looks(suspects, samples, second if again is not None else None, threshold)
        for pair, look in looks.items():
            findings.append(_slow_pair(pair, look, suspects, samples[pair], threshold, name,
                                       device, kind))
        if suspects.noisy:
            findings.append(_noisy(node, suspects, pairs, threshold, name))
    if pairs and not any(f.status.value == "WARN" for f in findings):
        kinds = sorted({k for _, k in classes if k})
        within = f" pair of their path class ({', '.join(kinds)})" if kinds else ""
        findings.insert(0, ok("comm.pairwise.slow_pair", f"{len(pairs)} pairs: none slower "
                              f"than {threshold:g} x their node's median{within} beyond the "
                              "spread of repeated timings"))
    return findings


def _looks(suspects: Suspects, first: Samples, again: Samples | None,
           threshold: float) -> dict[Pair, SecondLook]:
    """Each slow pair's second look (`again` None: the run ended before it)."""
    bound = rate_bound(threshold)
    if again is None:
        return {p: second_look(typical(first[p]), None, suspects.reference, (), bound, GBPS,
                               "the run ended first") for p in suspects.pairs}
    return pair_looks(suspects, first, again, bound, GBPS, rank_pair)


def _slow_pair(pair: Pair, look: SecondLook, suspects: Suspects, samples: Sequence[float],
               threshold: float, name: Callable[[int], str], device: str,
               kind: str = "") -> Finding:
    src, dst = pair
    median = f"the node's median {kind} pair" if kind else "the node's median"
    text = (f"{name(src)} -> {name(dst)}: {repeats_words(samples, pair, suspects)}, "
            f"below {threshold:g} x {median} {suspects.reference:.3g} GB/s")
    return slow("comm.pairwise.slow_pair", text, _pair_hint(device), rank_pair(pair), look,
                device, cpu_hint=False)


def _noisy(node: int, suspects: Suspects, pairs: Sequence[Mapping[str, Any]],
           threshold: float, name: Callable[[int], str]) -> Finding:
    """Below the threshold, but no further below the median than one pair's repeats spread."""
    listed = ", ".join(f"{name(a)} -> {name(b)}" for a, b in suspects.noisy[:4])
    size = next(p for p in pairs if (int(p["src"]), int(p["dst"])) == suspects.noisy[0]
                ).get("size_bytes")
    return skip("comm.pairwise.slow_pair", f"node {node}: too noisy to judge at {size} bytes: "
                f"{listed} read below {threshold:g} x the median "
                f"({suspects.reference:.3g} GB/s), but repeated timings of healthy "
                f"pairs read as low as {suspects.floor:.3g} GB/s; a larger --pair-bytes "
                "resolves more", subject=subject.node(node))


def pair_matrix(pairs: Sequence[Mapping[str, Any]], ranks: Sequence[int]) -> list[dict[str, Any]]:
    """Rows `src` with one column per destination rank (GB/s; blank on the diagonal)."""
    value = {(p["src"], p["dst"]): p["bandwidth_gbps"] for p in pairs}
    rows = []
    for src in ranks:
        row: dict[str, Any] = {"src": f"rank {src}"}
        for dst in ranks:
            row[f"to {dst}"] = value.get((src, dst))
        if any(v is not None for k, v in row.items() if k != "src"):
            rows.append(row)
    return rows
