"""Bandwidth arithmetic and verdicts for the comm sweep: pure functions, no torch.

Definitions follow nccl-tests (doc/PERFORMANCE.md, "Summary", and each test's
`GetBw` in src/*.cu), with GB = 1e9 bytes. `size_bytes` is the per-rank buffer: what
each rank passes in (all_reduce, all_gather, all_to_all, broadcast) or gets back
(reduce_scatter). The data size S that algbw = S / time counts:
- all_reduce: the buffer; busbw = algbw x 2(n-1)/n.
- all_gather: the gathered output, n x size_bytes; busbw = algbw x (n-1)/n.
- reduce_scatter: the reduced input, n x size_bytes (each rank's output is one of its
  n chunks); busbw = algbw x (n-1)/n.
- all_to_all: the buffer (n chunks, one per peer; rounded down to a multiple of n
  elements); busbw = algbw x (n-1)/n.
- broadcast (from rank 0): the buffer; busbw = algbw (all data leaves the root).
- send/recv (pairwise): bandwidth = bytes sent / time, one direction.
`time` is the slowest rank's mean time per operation: every rank's timings are
gathered and the slowest one reported, never an average that hides it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpucheck.comm.confirm import Pair, Second, Suspects, find_suspects, second_look
from gpucheck.probes.topology import path_class
from gpucheck.report import Finding, fail, ok, skip, warn

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


def bus_factor(collective: str, world_size: int) -> float:
    """busbw / algbw: how much each link must carry for the algorithm to be optimal
    (nccl-tests doc/PERFORMANCE.md, "Summary")."""
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}")
    if world_size <= 1 or collective == "broadcast":
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
    busbw_gbps: float
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
    return SizeResult(collective, size_bytes, count, round(time_s * 1e6, 2), round(algbw, 4),
                      round(algbw * bus_factor(collective, world_size), 4), int(sum(wrong)),
                      slowest, round(min(times_s) * 1e6, 2))


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
                 subject=f"{r['size_bytes']} bytes") for r in bad]


def baseline_findings(rows: Sequence[Mapping[str, Any]], baseline_gbps: float | None,
                      collective: str = "all_reduce") -> list[Finding]:
    """FAIL when the largest message's bus bandwidth is below the given baseline."""
    if baseline_gbps is None or not rows:
        return []
    top = max(rows, key=lambda r: r["size_bytes"])
    check = f"comm.{collective}.busbw_baseline"
    text = (f"busbw {top['busbw_gbps']:.3g} GB/s at {top['size_bytes']} bytes "
            f"(baseline {baseline_gbps:g} GB/s)")
    if top["busbw_gbps"] >= baseline_gbps:
        return [ok(check, text)]
    return [fail(check, text, hint="below the cluster's baseline: check NVLink/PCIe/NIC "
                 "health (nvidia-smi nvlink -s, nvidia-smi topo -m) and NCCL_* settings")]


ClassKey = tuple[int, str]  # (node rank, path class: "NV", "PXB", "SYS"; "" unknown)


def suspects_by_node(pairs: Sequence[Mapping[str, Any]],
                     threshold: float) -> dict[ClassKey, Suspects]:
    """Per node (by the sender's node rank) and path class (`path`, from
    gpucheck.probes.topology: pairs across a bridge, switch or socket are slower by
    design, so each is compared with its own kind): `gpucheck.comm.confirm.find_suspects`
    over each pair's repeated samples (one sample for rows without repeats)."""
    by_class: dict[ClassKey, dict[Pair, Sequence[float]]] = {}
    for p in pairs:
        samples = p.get("samples_gbps") or [p["bandwidth_gbps"]]
        key = (int(p["node_rank"]), path_class(p.get("path")))
        by_class.setdefault(key, {})[(int(p["src"]), int(p["dst"]))] = samples
    return {key: find_suspects(samples, threshold) for key, samples in by_class.items()}


def _pair_hint(device: str) -> str:
    """Where to look for a slow pair: the GPUs' path, or (CPU ranks) the processes."""
    if device == "cuda":
        return ("one path is slow: check `nvidia-smi topo -m` and `nvidia-smi nvlink -s` "
                "for these two GPUs, and their PCIe link width")
    return ("CPU ranks exchange through the host's memory: a slow pair means a busy, "
            "throttled or descheduled process (top, the job's CPU quota and binding), "
            "not a link")


def pair_findings(pairs: Sequence[Mapping[str, Any]], threshold: float,
                  names: Mapping[int, str], again: Sequence[Mapping[str, Any]] | None = None,
                  device: str = "cuda") -> list[Finding]:
    """Per node: WARN for each pair resolvably slower than `threshold` x its node's
    reference, confirmed or found unstable by its second measurement (`again`);
    a note for pairs too noisy to judge (gpucheck.comm.confirm)."""
    second = {(int(p["src"]), int(p["dst"])): p["samples_gbps"] for p in again or []}

    def name(rank: int) -> str:
        return names.get(rank, f"rank {rank}")

    findings: list[Finding] = []
    classes = suspects_by_node(pairs, threshold)
    for (node, kind), suspects in sorted(classes.items()):
        looks = second_look(suspects, second, suspects.reference_gbps) if again is not None \
            else [Second(p, None, None, ()) for p in suspects.pairs]
        for look in looks:
            findings.append(_slow_pair(look, suspects, pairs, threshold, name, device, kind))
        if suspects.noisy:
            findings.append(_noisy(node, suspects, pairs, threshold, name))
    if pairs and not any(f.status.value == "WARN" for f in findings):
        kinds = sorted({k for _, k in classes if k})
        within = f" pair of their path class ({', '.join(kinds)})" if kinds else ""
        findings.insert(0, ok("comm.pairwise.slow_pair", f"{len(pairs)} pairs: none slower "
                              f"than {threshold:g} x their node's median{within} beyond the "
                              "spread of repeated timings"))
    return findings


def _figure(pairs: Sequence[Mapping[str, Any]], pair: Pair) -> Mapping[str, Any]:
    return next(p for p in pairs if (int(p["src"]), int(p["dst"])) == pair)


def _slow_pair(look: Second, suspects: Suspects, pairs: Sequence[Mapping[str, Any]],
               threshold: float, name: Any, device: str, kind: str = "") -> Finding:
    src, dst = look.pair
    row = _figure(pairs, look.pair)
    samples = row.get("samples_gbps") or [row["bandwidth_gbps"]]
    median = f"the node's median {kind} pair" if kind else "the node's median"
    text = (f"{name(src)} -> {name(dst)}: {max(samples):.3g} GB/s (best of {len(samples)}), "
            f"below {threshold:g} x {median} {suspects.reference_gbps:.3g} GB/s")
    confirmed = look.confirmed(threshold)
    subject = f"rank {src} -> rank {dst}"
    against = " and ".join(f"rank {a} -> rank {b}" for a, b in look.against) or \
        "the first measurement's median"
    if confirmed is None:
        return warn("comm.pairwise.slow_pair", text + "; not measured again (the run ended "
                    "first)", hint=_pair_hint(device), subject=subject)
    again = f"{look.again_gbps:.3g} GB/s against {against} at {look.reference_gbps:.3g} GB/s"
    if confirmed:
        return warn("comm.pairwise.slow_pair", f"{text}; confirmed: measured again at "
                    f"{again}", hint=_pair_hint(device), subject=subject)
    return warn("comm.pairwise.slow_pair", f"{text}; unstable: measured again at {again}, "
                f"within {threshold:g} x", hint="slow once, fine when measured again: "
                "contention or a transient; rerun, and look into it if it comes back",
                subject=subject, action="rerun")


def _noisy(node: int, suspects: Suspects, pairs: Sequence[Mapping[str, Any]],
           threshold: float, name: Any) -> Finding:
    """Below the threshold, but no further below the median than repeated timings of
    one pair spread: the measurement cannot tell a slow pair from noise here."""
    listed = ", ".join(f"{name(a)} -> {name(b)}" for a, b in suspects.noisy[:4])
    size = _figure(pairs, suspects.noisy[0]).get("size_bytes")
    return skip("comm.pairwise.slow_pair", f"node {node}: too noisy to judge at {size} bytes: "
                f"{listed} read below {threshold:g} x the median "
                f"({suspects.reference_gbps:.3g} GB/s), but repeated timings of healthy "
                f"pairs read as low as {suspects.floor_gbps:.3g} GB/s; a larger --pair-bytes "
                "resolves more", subject=f"node {node}")


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
