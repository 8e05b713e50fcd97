"""Each command's headline figures, one short table under the verdict in every format.

A healthy run folds its sections away; this table keeps its numbers on the first
screen of a ticket: bench's images/s and efficiency, comm's peak bus bandwidth per
collective, stress's TFLOP/s per dtype and memory bandwidth, with the slowest rank
(and its GPU) named. stress's rows name the column its verdicts judge (`tflops_p50`,
`gbps_p50`: the median product's or copy's rate, not the mean `tflops`). The figures
come from the report's metrics (`Section.metrics`, keyed by `Metric.key()` as compare
and fleet key them), never from rendered cells, so a combined `all` report gathers the
same rows as its commands do alone. (render reads the report, never gpucheck.analysis.)
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from gpucheck.measure import Metric
from gpucheck.render.values import fmt_bytes, fmt_value
from gpucheck.report import Report

# Per-rank (or per-pair) families, shown as their slowest member beside the median.
_PER_RANK = {
    "bench.images_per_s": "bench images/s, slowest rank",
    "stress.membw.gbps": "stress memory gbps_p50, slowest rank",
    "comm.pairwise.gbps": "comm send/recv GB/s, slowest pair",
}
_JOB = {
    "bench.aggregate_images_per_s": "bench images/s, whole job",
    "bench.parallel_efficiency": "bench parallel efficiency",
}


def headline_rows(report: Report) -> list[dict[str, str]]:
    """Rows `{figure, value, unit, where}`: empty for a report without such figures
    (env, health, compare...)."""
    metrics: dict[str, Metric] = {}
    for section in report.sections:
        for metric in section.metrics:  # the first of one key, as compare reads them
            metrics.setdefault(metric.key(), metric)
    pools: dict[str, list[Metric]] = {}
    for _, metric in sorted(metrics.items()):  # by key, as compare lists them
        pools.setdefault(metric.name, []).append(metric)
    rows = [row for pool, members in pools.items()
            if (row := _row(pool, members)) is not None]
    rows += peak_busbw_rows(dict(sorted(metrics.items())))
    # bench, comm, stress; in each, the whole job's figures before the slowest rank's.
    return sorted(rows, key=lambda r: (_ORDER.get(r["figure"].split(" ", 1)[0], 9),
                                       "slowest" in r["figure"]))


_ORDER = {"bench": 0, "comm": 1, "stress": 2}


def _row(pool: str, members: list[Metric]) -> dict[str, str] | None:
    first = members[0]
    if pool in _JOB:
        value = f"{first.value:.1%}" if first.unit == "ratio" else fmt_value(first.value)
        return _made(_JOB[pool], value, "" if first.unit == "ratio" else first.unit, "")
    if pool in _PER_RANK or _is_gemm(pool):
        return _slowest(_figure(pool), members)
    return None


def _is_gemm(pool: str) -> bool:
    return pool.startswith("stress.gemm.") and pool.endswith(".tflops")


def _figure(pool: str) -> str:
    if _is_gemm(pool):
        dtype = pool.split(".")[2]
        return f"stress {dtype} matmul tflops_p50, slowest rank"
    return _PER_RANK[pool]


def _slowest(figure: str, members: list[Metric]) -> dict[str, str]:
    """The slowest rank's figure, where it ran, and the median of all ranks."""
    low = min(members, key=lambda m: m.value)
    where = _position(low)
    if len(members) > 1:
        median = statistics.median(m.value for m in members)
        where += f"; median {fmt_value(median)} of {len(members)}"
    return _made(figure, fmt_value(low.value), low.unit, where)


def _position(metric: Metric) -> str:
    # "rank3" reads "rank 3"; a pair "rank0_to_rank1" reads "rank 0 to rank 1"
    who = metric.subject
    if who is None:
        return ""
    head = (who.position() or "").replace("_to_", " to ").replace("rank", "rank ")
    named_gpu = who.gpu is not None or who.bus_id or who.uuid
    return f"{head} ({who.label})" if named_gpu else head


def peak_busbw_rows(metrics: Mapping[str, Metric]) -> list[dict[str, str]]:
    """comm: each collective's highest bus bandwidth over its message sizes."""
    best: dict[str, Metric] = {}
    for metric in metrics.values():
        family = metric.name.split("@", 1)[0]
        if family.startswith("comm.") and family.endswith(".busbw_gbps") and (
                family not in best or metric.value > best[family].value):
            best[family] = metric
    rows = []
    for family, metric in best.items():
        size = metric.name.split("@", 1)[1] if "@" in metric.name else ""
        where = f"at {fmt_bytes(int(size))}" if size.isdigit() else ""
        rows.append(_made(f"comm {family.split('.')[1]} busbw, peak",
                          fmt_value(metric.value), metric.unit, where))
    return rows


def _made(figure: str, value: str, unit: str, where: str) -> dict[str, str]:
    return {"figure": figure, "value": value, "unit": unit, "where": where}
