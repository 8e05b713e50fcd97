"""comm's figures as metrics, from the worker's result (not the report's tables).

`comm.<collective>.busbw_gbps@<bytes>` for the job (its spread: how far apart the ranks
ended the same operations), `comm.pairwise.gbps` per ordered pair of ranks (its spread:
how far apart its repeats read).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from gpucheck import subject
from gpucheck.measure import Better, Metric
from gpucheck.measured import number, rank_subjects, relative_spread, whole
from gpucheck.subject import Subject


def comm_metrics(result: Mapping[str, Any]) -> list[Metric]:
    """Every figure of a comm result (complete or partial)."""
    collectives = result.get("collectives")
    if not isinstance(collectives, Mapping):
        return []
    found: list[Metric] = []
    for name, rows in collectives.items():
        found += _collective(str(name), rows)
    pairs = (result.get("pairwise") or {}).get("pairs") or []
    found += _pairs(pairs, rank_subjects(result.get("ranks") or []))
    return found


def _collective(name: str, rows: Any) -> Iterator[Metric]:
    for row in rows if isinstance(rows, list) else ():
        size, value = whole(row.get("size_bytes")), number(row.get("busbw_gbps"))
        if size is not None and value is not None:
            spread = relative_spread(row.get("time_us"), row.get("fastest_time_us"))
            yield Metric(f"comm.{name}.busbw_gbps@{size}", "GB/s", Better.HIGHER, value,
                         spread=spread)


def _pairs(pairs: Any, ranks: Mapping[int, Subject]) -> Iterator[Metric]:
    for pair in pairs:
        src, dst = whole(pair.get("src")), whole(pair.get("dst"))
        value = number(pair.get("bandwidth_gbps"))
        samples = [v for v in pair.get("samples_gbps") or () if number(v) is not None]
        spread = relative_spread(max(samples), min(samples)) if samples else None
        if src is not None and dst is not None and value is not None:
            yield Metric("comm.pairwise.gbps", "GB/s", Better.HIGHER, value,
                         _pair(ranks, src, dst), spread)


def _pair(ranks: Mapping[int, Subject], src: int, dst: int) -> Subject:
    """rank src -> rank dst, labelled by their GPUs when the ranks had them."""
    def words(rank: int) -> str | None:
        known = ranks.get(rank)
        return known.label if known is not None and known.gpu is not None else None

    if words(src) is None and words(dst) is None:
        return subject.pair(src, dst)
    return subject.pair(src, dst, f"{words(src) or f'rank {src}'} -> "
                                  f"{words(dst) or f'rank {dst}'}")
