"""stress's figures as metrics, from the worker's result (not the report's tables).

Names as compare, fleet and baselines have always keyed them: `stress.gemm.<dtype>.tflops`
(the median product), `stress.membw.gbps`, `stress.copies.<direction>_gbps`,
`stress.sdc.p50_ms` per rank; `stress.p2p[.node<N>].gbps` per pair of local devices.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gpucheck import subject
from gpucheck.measure import Better, Metric
from gpucheck.measured import rank_of, rank_subjects, whole
from gpucheck.subject import Kind, Subject
from gpucheck.units import number

COPY_FIGURES = {"h2d_gbps": "h2d_alone_gbps", "d2h_gbps": "d2h_alone_gbps",
                "h2d_together_gbps": "h2d_together_gbps",
                "d2h_together_gbps": "d2h_together_gbps"}


def stress_metrics(result: Mapping[str, Any]) -> list[Metric]:
    """Every figure of a stress result (complete or partial)."""
    if "ranks" not in result:
        return []
    ranks = rank_subjects(result["ranks"])
    found = list(_per_rank(result.get("gemm"), "tflops_p50", "TFLOP/s", ranks, by_dtype=True))
    found += _per_rank(result.get("membw"), "gbps_p50", "GB/s", ranks, name="stress.membw.gbps")
    sdc = result.get("sdc")
    if isinstance(sdc, Mapping):
        found += _per_rank(sdc.get("records"), "p50_ms", "ms", ranks, name="stress.sdc.p50_ms",
                           better=Better.LOWER)
    found += _copies(result.get("copies"), ranks)
    found += _p2p(result.get("p2p"))
    return found


def _per_rank(rows: Any, column: str, unit: str, ranks: Mapping[int, Subject], *,
              name: str = "", by_dtype: bool = False,
              better: Better = Better.HIGHER) -> Iterator[Metric]:
    for row in rows if isinstance(rows, Sequence) else ():
        rank, value = whole(row.get("rank")), number(row.get(column))
        if rank is None or value is None:
            continue
        full = f"stress.gemm.{row.get('dtype')}.tflops" if by_dtype else name
        yield Metric(full, unit, better, value, rank_of(ranks, rank))


def _copies(copies: Any, ranks: Mapping[int, Subject]) -> Iterator[Metric]:
    if not isinstance(copies, Mapping) or "skipped" in copies:
        return
    for name, column in COPY_FIGURES.items():
        yield from _per_rank(copies.get("rows"), column, "GB/s", ranks,
                             name=f"stress.copies.{name}")


def _p2p(p2p: Any) -> Iterator[Metric]:
    """One figure per measured pair of each node's devices (cuda:src -> cuda:dst)."""
    if not isinstance(p2p, Mapping) or "skipped" in p2p:
        return
    for node in p2p.get("nodes") or []:
        index = whole(node.get("node_rank"))
        if index is None or "skipped" in node:
            continue
        name = "stress.p2p.gbps" if index == 0 else f"stress.p2p.node{index}.gbps"
        for pair in node.get("pairs") or []:
            src, dst, value = whole(pair.get("src")), whole(pair.get("dst")), \
                number(pair.get("gbps"))
            if src is not None and dst is not None and value is not None:
                yield Metric(name, "GB/s", Better.HIGHER, value, _pair(node, src, dst, index))


def _pair(node: Mapping[str, Any], src: int, dst: int, index: int) -> Subject:
    """cuda:src -> cuda:dst, labelled by their NVML indices when the node says them."""
    gpus = node.get("gpus") or []
    named = [whole(gpus[i].get("nvml_index")) if i < len(gpus) else None for i in (src, dst)]
    label = f"GPU {named[0]} -> GPU {named[1]}" if None not in named else None
    made = subject.pair(src, dst, label, by="cuda")
    host = node.get("host")
    return Subject(Kind.PAIR, made.label, gpu=src, peer=dst, node=index,
                   host=host if isinstance(host, str) else None)
