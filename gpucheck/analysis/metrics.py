"""A report as named metrics, each with its unit and the direction that is better.

The one list compare, fleet and baselines share. Names read
`<command>.<figure>[@<bytes>][.<position>]`:

    bench.images_per_s.rank0              stress.gemm.bf16.tflops.rank3
    comm.all_reduce.busbw_gbps@1048576    env.gpu.pcie_width_current.gpu5

The position (`rank3`, `gpu5`, `cuda0_to_cuda1`) is the GPU slot, so one slot can be
compared across nodes; `pool` is the name without it. Metrics are found by section
name (the last dotted part, so a combined report's sections are found too), not by
the report's command. Counters already judged by findings (ECC, XIDs, faults) are
left out: a fleet median of zero errors would make one corrected error an outlier,
a threshold the fault watcher chose not to use. docs/fleet.md lists them all.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

HIGHER = "higher"  # throughput, bandwidth, capacity
LOWER = "lower"  # times
INFO = "info"  # shown and compared, never judged (temperatures, memory in use)
DIRECTIONS = (HIGHER, LOWER, INFO)


@dataclass(frozen=True)
class Metric:
    """One figure of one report. `gpu` names the GPU (or pair) when the report says."""

    name: str
    value: float
    unit: str
    direction: str
    position: str | None = None
    gpu: str | None = None
    # How much this figure varied inside its own run, as a fraction (a rank's p99 vs its
    # median iteration, the slowest vs the fastest rank of one collective); None when
    # the report does not say. compare judges a change against it (analysis/noise.py).
    spread: float | None = None

    @property
    def pool(self) -> str:
        """The name without its GPU position: what every slot of a node shares."""
        return self.name[: -len(self.position) - 1] if self.position else self.name

    @property
    def family(self) -> str:
        """The pool without a message size: `comm.all_reduce.busbw_gbps`."""
        return self.pool.split("@", 1)[0]


Rows = list[Mapping[str, Any]]
Extractor = Callable[[Mapping[str, Any], "Context"], Iterator[Metric]]


@dataclass(frozen=True)
class Context:
    """What every extractor may need beyond its section: rank -> GPU label."""

    rank_gpus: Mapping[int, str]


def extract_metrics(report: Mapping[str, Any]) -> dict[str, Metric]:
    """Every metric of `report` (a report's JSON dict), by name, sorted by name.

    Reads defensively: a missing section, column or a non-number is no metric.
    """
    sections = [s for s in report.get("sections") or [] if isinstance(s, dict)]
    context = Context(rank_gpus(sections))
    found: dict[str, Metric] = {}
    for section in sections:
        data = section.get("data")
        if not isinstance(data, dict):
            continue
        extractor = _extractor(section_kind(section.get("name")), data)
        for metric in extractor(data, context) if extractor else ():
            found.setdefault(metric.name, metric)
    return dict(sorted(found.items()))


def section_kind(name: Any) -> str:
    """`timing` for "timing" and for a combined report's "bench.timing"."""
    return str(name or "").rsplit(".", 1)[-1]


def number(value: Any) -> float | None:
    """A finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def rows(value: Any) -> Rows:
    """The dict rows of a table (a list), skipping anything else."""
    # isinstance(r, dict), not Mapping: JSON gives dicts, and the ABC check is what
    # a thousand-node fleet would spend its time on.
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []


def _rank(row: Mapping[str, Any]) -> int | None:
    rank = row.get("rank")
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def rank_gpus(sections: list[Mapping[str, Any]]) -> dict[int, str]:
    """Rank -> the GPU it used, from any rank table (stress's `gpu` label, else the NVML
    index and bus id bench and comm keep); CPU ranks have none."""
    labels: dict[int, str] = {}
    for section in sections:
        data = section.get("data")
        for key in ("ranks", "rank_details"):
            if not isinstance(data, dict) or key not in data:
                continue
            for row in rows(data[key]):
                rank, label = _rank(row), _gpu_label(row)
                if rank is not None and label and len(label) > len(labels.get(rank, "")):
                    labels[rank] = label
    return labels


def _gpu_label(row: Mapping[str, Any]) -> str | None:
    if isinstance(row.get("gpu"), str):
        return row["gpu"]
    index = row.get("nvml_index")
    if not isinstance(index, int):
        return None
    bus = row.get("pci_bus_id")
    return f"GPU {index} (bus {bus})" if bus else f"GPU {index}"


def _per_rank(table: Any, columns: tuple[str, ...], base: str, unit: str, direction: str,
              context: Context, spread: Callable[[Mapping[str, Any]], float | None] = (
                  lambda row: None)) -> Iterator[Metric]:
    """`base.rank<N>` from the first of `columns` that holds a number in each row."""
    for row in rows(table):
        rank, value = _rank(row), None
        for column in columns:
            value = number(row.get(column))
            if value is not None:
                break
        if rank is not None and value is not None:
            yield Metric(f"{base}.rank{rank}", value, unit, direction, f"rank{rank}",
                         context.rank_gpus.get(rank), spread(row))


def relative_spread(high: Any, low: Any) -> float | None:
    """`high` over `low`, less one (0.1: ten percent apart); None without two numbers."""
    top, bottom = number(high), number(low)
    if top is None or bottom is None or bottom <= 0 or top < bottom:
        return None
    return top / bottom - 1


def _scalars(data: Mapping[str, Any], prefix: str,
             spec: Mapping[str, tuple[str, str]]) -> Iterator[Metric]:
    for key, (unit, direction) in spec.items():
        value = number(data.get(key))
        if value is not None:
            yield Metric(f"{prefix}.{key}", value, unit, direction)


# --- bench -------------------------------------------------------------------------

_BENCH_SCALARS = {"aggregate_images_per_s": ("images/s", HIGHER), "job_wall_s": ("s", LOWER),
                  "parallel_efficiency": ("ratio", HIGHER),
                  "spread_slowest_vs_median": ("ratio", LOWER)}


def _iteration_spread(row: Mapping[str, Any]) -> float | None:
    """A rank's slow iterations against its typical one (p99 vs p50)."""
    return relative_spread(row.get("p99_ms"), row.get("p50_ms"))


def _bench_timing(data: Mapping[str, Any], context: Context) -> Iterator[Metric]:
    # The job's figures vary as much as its most unsettled rank did.
    spreads = [s for s in map(_iteration_spread, rows(data.get("ranks"))) if s is not None]
    job_spread = max(spreads, default=None)
    for metric in _scalars(data, "bench", _BENCH_SCALARS):
        yield Metric(metric.name, metric.value, metric.unit, metric.direction,
                     spread=job_spread)
    yield from _per_rank(data.get("ranks"), ("images_per_s",), "bench.images_per_s",
                         "images/s", HIGHER, context, _iteration_spread)
    # The rank's own pace (device time per iteration; CPU time on CPU ranks): what it
    # computed at, apart from how much of the wall clock its host gave it.
    yield from _per_rank(data.get("ranks"), ("p50_ms",), "bench.iteration_p50_ms", "ms",
                         LOWER, context, _iteration_spread)


# --- comm --------------------------------------------------------------------------

def _is_collective(data: Mapping[str, Any]) -> bool:
    """comm's per-collective sections: a results table of sizes and busbw."""
    table = rows(data.get("results"))
    return bool(table) and all("size_bytes" in r and "busbw_gbps" in r for r in table)


def _collective(kind: str) -> Extractor:
    def extract(data: Mapping[str, Any], context: Context) -> Iterator[Metric]:
        for row in rows(data.get("results")):
            size, value = row.get("size_bytes"), number(row.get("busbw_gbps"))
            if isinstance(size, int) and value is not None:
                # The ranks timed the same operations: how far apart they ended.
                spread = relative_spread(row.get("time_us"), row.get("fastest_time_us"))
                yield Metric(f"comm.{kind}.busbw_gbps@{size}", value, "GB/s", HIGHER,
                             spread=spread)
    return extract


_RANK_CELL = re.compile(r"rank (\d+)$")
_TO_RANK = re.compile(r"to (\d+)$")


def _comm_pairwise(data: Mapping[str, Any], context: Context) -> Iterator[Metric]:
    """The send/recv matrix: rows `{"src": "rank 0", "to 1": GB/s, ...}`."""
    table = next((v for k, v in data.items() if k.startswith("bandwidth_gbps")), None)
    for row in rows(table):
        src = _RANK_CELL.match(str(row.get("src", "")))
        for column, cell in row.items():
            dst, value = _TO_RANK.match(column), number(cell)
            if src and dst and value is not None:
                s, d = int(src[1]), int(dst[1])
                yield Metric(f"comm.pairwise.gbps.rank{s}_to_rank{d}", value, "GB/s", HIGHER,
                             f"rank{s}_to_rank{d}", _pair(context.rank_gpus, s, d))


def _pair(labels: Mapping[int, str], src: int, dst: int) -> str | None:
    if src not in labels and dst not in labels:
        return None
    return f"{labels.get(src, f'rank {src}')} -> {labels.get(dst, f'rank {dst}')}"


# --- stress ------------------------------------------------------------------------

def _stress_gemm(data: Mapping[str, Any], context: Context) -> Iterator[Metric]:
    """TFLOP/s of the median product (`tflops_p50`, what stress judges), per dtype."""
    by_dtype: dict[str, Rows] = {}
    for row in rows(data.get("results")):
        by_dtype.setdefault(str(row.get("dtype")), []).append(row)
    for dtype, table in by_dtype.items():
        yield from _per_rank(table, ("tflops_p50", "tflops"), f"stress.gemm.{dtype}.tflops",
                             "TFLOP/s", HIGHER, context)


def _stress_membw(data: Mapping[str, Any], context: Context) -> Iterator[Metric]:
    """Copied bytes counted once (as nvbandwidth); reports from before 2026-11 counted
    read + write (`counted` "2 x size_bytes ..."): halved, so old and new compare."""
    scale = 0.5 if str(data.get("counted", "")).startswith("2 x") else 1.0
    for metric in _per_rank(data.get("results"), ("gbps_p50", "gbps"), "stress.membw.gbps",
                            "GB/s", HIGHER, context):
        yield replace(metric, value=metric.value * scale) if scale != 1.0 else metric


_COPY_COLUMNS = {"h2d_gbps": "h2d_alone_gbps", "d2h_gbps": "d2h_alone_gbps",
                 "h2d_together_gbps": "h2d_together_gbps",
                 "d2h_together_gbps": "d2h_together_gbps"}


def _stress_copies(data: Mapping[str, Any], context: Context) -> Iterator[Metric]:
    """Host copies per GPU: alone (`h2d_gbps`) and with every GPU at once (`_together`)."""
    for name, column in _COPY_COLUMNS.items():
        yield from _per_rank(data.get("results"), (column,), f"stress.copies.{name}", "GB/s",
                             HIGHER, context)


def _stress_sdc(data: Mapping[str, Any], context: Context) -> Iterator[Metric]:
    yield from _per_rank(data.get("results"), ("p50_ms",), "stress.sdc.p50_ms", "ms", LOWER,
                         context)


_NODE_MATRIX = re.compile(r"node (\d+) \(.*\) matrix$")
_CUDA_CELL = re.compile(r"cuda:(\d+)(?: \((GPU \d+)\))?")


def _stress_p2p(data: Mapping[str, Any], context: Context) -> Iterator[Metric]:
    """Peer copy matrices, one per node: rows `{"src": "cuda:0 (GPU 0)", "to cuda:1": x}`."""
    for key, table in data.items():
        node = _NODE_MATRIX.match(key)
        if node is None:
            continue
        base = "stress.p2p.gbps" if node[1] == "0" else f"stress.p2p.node{node[1]}.gbps"
        # The source cells name each device's GPU; the columns only say cuda:N.
        cells = [_CUDA_CELL.match(str(row.get("src", ""))) for row in rows(table)]
        names = {m[1]: m[2] for m in cells if m and m[2]}
        for row, src in zip(rows(table), cells, strict=True):
            if src is not None:
                yield from _p2p_row(row, src[1], base, names)


def _p2p_row(row: Mapping[str, Any], src: str, base: str,
             names: Mapping[str, str]) -> Iterator[Metric]:
    for column, cell in row.items():
        dst, value = _CUDA_CELL.fullmatch(column.removeprefix("to ")), number(cell)
        if dst and column.startswith("to ") and value is not None:
            pair = f"cuda{src}_to_cuda{dst[1]}"
            gpus = f"{names[src]} -> {names[dst[1]]}" if src in names and dst[1] in names \
                else None
            yield Metric(f"{base}.{pair}", value, "GB/s", HIGHER, pair, gpus)


# --- env ---------------------------------------------------------------------------

_GPU_COLUMNS = {
    "memory_total_bytes": ("bytes", HIGHER), "power_limit_w": ("W", HIGHER),
    "sm_clock_max_mhz": ("MHz", HIGHER), "pcie_width_current": ("lanes", HIGHER),
    "pcie_width_max": ("lanes", HIGHER), "pcie_gen_max": ("gen", HIGHER),
    "nvlink_active_links": ("links", HIGHER),
    # The GPU's state at the moment of the probe: compared, never judged.
    "temperature_c": ("C", INFO), "power_draw_w": ("W", INFO), "sm_clock_mhz": ("MHz", INFO),
    "memory_used_bytes": ("bytes", INFO), "utilization_gpu_pct": ("%", INFO),
    "pcie_gen_current": ("gen", INFO),
}
_SYSTEM = {"memory_total_bytes": ("bytes", HIGHER), "shm_total_bytes": ("bytes", HIGHER),
           "cpu_logical_cores": ("cores", HIGHER), "cpu_usable_cores": ("cores", HIGHER),
           "memory_available_bytes": ("bytes", INFO)}


def env_gpu_label(row: Mapping[str, Any]) -> str:
    """"GPU 3 (NVIDIA H200, bus 00000000:9A:00.0, GPU-...)", as the other sections write it."""
    details = [row.get("name"), row.get("pci_bus_id") and f"bus {row['pci_bus_id']}",
               row.get("uuid")]
    shown = ", ".join(str(d) for d in details if d)
    head = f"GPU {row.get('index')}"
    return f"{head} ({shown})" if shown else head


def _env_gpus(data: Mapping[str, Any], context: Context) -> Iterator[Metric]:
    for row in rows(data.get("gpus")):
        index = row.get("index")
        if not isinstance(index, int):
            continue
        for column, (unit, direction) in _GPU_COLUMNS.items():
            value = number(row.get(column))
            if value is not None:
                yield Metric(f"env.gpu.{column}.gpu{index}", value, unit, direction,
                             f"gpu{index}", env_gpu_label(row))


def _env_gpu_test(data: Mapping[str, Any], context: Context) -> Iterator[Metric]:
    """The quick functional test's pinned copies, per GPU (NVML index)."""
    for row in rows(data.get("results")):
        index = row.get("nvml_index")
        if not isinstance(index, int):
            continue
        for column in ("h2d_gbps", "d2h_gbps"):
            value = number(row.get(column))
            if value is not None:
                yield Metric(f"env.gpu_test.{column}.gpu{index}", value, "GB/s", HIGHER,
                             f"gpu{index}", row.get("gpu") if isinstance(row.get("gpu"), str)
                             else None)


def _env_system(data: Mapping[str, Any], context: Context) -> Iterator[Metric]:
    yield from _scalars(data, "env.system", _SYSTEM)


_BY_KIND: dict[str, Extractor] = {
    "timing": _bench_timing, "pairwise": _comm_pairwise, "gemm": _stress_gemm,
    "membw": _stress_membw, "copies": _stress_copies, "sdc": _stress_sdc,
    "p2p": _stress_p2p, "gpus": _env_gpus, "gpu_test": _env_gpu_test, "system": _env_system,
}


def _extractor(kind: str, data: Mapping[str, Any]) -> Extractor | None:
    if kind in _BY_KIND:
        return _BY_KIND[kind]
    # Any collective comm reports (all_reduce, all_gather, and ones added later).
    return _collective(kind) if _is_collective(data) else None


# Every family of names, for the docs and their test (docs/fleet.md).
FAMILIES: tuple[str, ...] = (
    *(f"bench.{k}" for k in _BENCH_SCALARS), "bench.images_per_s", "bench.iteration_p50_ms",
    "comm.<collective>.busbw_gbps", "comm.pairwise.gbps",
    "stress.gemm.<dtype>.tflops", "stress.membw.gbps",
    *(f"stress.copies.{k}" for k in _COPY_COLUMNS), "stress.sdc.p50_ms", "stress.p2p.gbps",
    *(f"env.gpu.{k}" for k in _GPU_COLUMNS), "env.gpu_test.h2d_gbps", "env.gpu_test.d2h_gbps",
    *(f"env.system.{k}" for k in _SYSTEM),
)
