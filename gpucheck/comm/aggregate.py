"""Bandwidth arithmetic and verdicts for the comm sweep: pure functions, no torch.

Definitions follow nccl-tests (doc/PERFORMANCE.md), with GB = 1e9 bytes and
`size_bytes` the buffer each rank passes in:
- all_reduce: algbw = size_bytes / time; busbw = algbw x 2(n-1)/n.
- all_gather: the data size is the gathered output, n x size_bytes, so
  algbw = n x size_bytes / time; busbw = algbw x (n-1)/n.
- send/recv (pairwise): bandwidth = bytes sent / time, one direction.
`time` is the slowest rank's mean time per operation: every rank's timings are
gathered and the slowest one reported, never an average that hides it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpucheck.report import Finding, fail, ok, warn

COLLECTIVES = ("all_reduce", "all_gather")
GB = 1e9


def data_bytes(collective: str, size_bytes: int, world_size: int) -> int:
    """The "size" nccl-tests divides by time: the output for all_gather, else the buffer."""
    return size_bytes * world_size if collective == "all_gather" else size_bytes


def bus_factor(collective: str, world_size: int) -> float:
    """busbw / algbw: how much each link must carry for the algorithm to be optimal."""
    if world_size <= 1:
        return 1.0
    if collective == "all_reduce":
        return 2 * (world_size - 1) / world_size
    if collective == "all_gather":
        return (world_size - 1) / world_size
    raise ValueError(f"unknown collective {collective!r}")


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
    algbw = data_bytes(collective, size_bytes, world_size) / time_s / GB if time_s > 0 else 0.0
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


def pair_findings(pairs: Sequence[Mapping[str, Any]], threshold: float,
                  names: Mapping[int, str]) -> list[Finding]:
    """WARN for each pair slower than `threshold` x its node's median pair bandwidth."""
    findings: list[Finding] = []
    by_node: dict[int, list[Mapping[str, Any]]] = {}
    for pair in pairs:
        by_node.setdefault(pair["node_rank"], []).append(pair)
    for node_pairs in by_node.values():
        median = statistics.median(p["bandwidth_gbps"] for p in node_pairs)
        for p in node_pairs:
            if p["bandwidth_gbps"] < threshold * median:
                src, dst = names.get(p["src"], f"rank {p['src']}"), names.get(p["dst"])
                findings.append(warn(
                    "comm.pairwise.slow_pair",
                    f"{src} -> {dst or 'rank ' + str(p['dst'])}: {p['bandwidth_gbps']:.3g} "
                    f"GB/s, below {threshold:g} x the node's median {median:.3g} GB/s",
                    hint="one path is slow: check `nvidia-smi topo -m` and "
                    "`nvidia-smi nvlink -s` for these two GPUs, and their PCIe link width",
                    subject=f"rank {p['src']} -> rank {p['dst']}"))
    if pairs and not findings:
        findings.append(ok("comm.pairwise.slow_pair",
                           f"{len(pairs)} pairs within {threshold:g} x their node's median"))
    return findings


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
