"""The records stress's ranks send to rank 0, rank 0's reading of them back
(`read_stress`: a row that does not read is named, never judged), and the figures as
metrics (`stress_metrics`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck import subject
from gpucheck.measure import Better, Metric, rank_of, rank_subjects, whole
from gpucheck.records import Unread, as_dict, read_all, readable
from gpucheck.stats import number
from gpucheck.subject import Kind, Subject


@dataclass(frozen=True)
class GemmRecord:
    """One rank's throughput in one dtype (gpucheck.stress.gemm)."""

    rank: int
    dtype: str
    size: int  # n of the n x n x n product
    iters: int
    tflops: float  # all timed products / their total time
    tflops_p50: float  # from the median product's time: what the verdicts use
    p50_ms: float
    p99_ms: float


@dataclass(frozen=True)
class CopyRecord:
    """One rank's device copy bandwidth (gpucheck.stress.gemm)."""

    rank: int
    size_bytes: int
    iters: int
    gbps: float  # size_bytes x iters / total time: copied bytes, counted once
    gbps_p50: float  # from the median copy: what the verdicts use
    p50_ms: float
    p99_ms: float


@dataclass(frozen=True)
class BurnRecord:
    """One rank's burn-in: how long, how often its result changed, how fast."""

    rank: int
    dtype: str
    size: int
    mode: str  # "bitwise" or "tolerance"
    iters: int  # products compared with the first (not counting it)
    duration_s: float
    bad_iters: int  # products that differed from the first
    first_bad_iter: int | None
    worst_elements: int  # most elements wrong in one product (bitwise mode)
    p50_ms: float
    p99_ms: float
    digest: str  # hash of the first result's bits
    group: str  # ranks of one group should agree bit for bit


@dataclass(frozen=True)
class PowerReading:
    """One rank's power draw under the GEMM load (gpucheck.stress.gemm)."""

    rank: int
    samples: int
    draw_p90_w: float | None
    draw_max_w: float | None
    limit_w: float | None
    default_limit_w: float | None
    why: str | None  # why nothing (or not everything) was read


@dataclass(frozen=True)
class PlacementRow:
    """Where one rank runs and its kernel group, merged into its check-in at setup."""

    rank: int
    gpu: str | None  # "GPU 3 (NVIDIA H200, bus ..., GPU-...)"; None on CPU
    gpu_name: str | None
    cpus: str  # "0-27,56-83"
    numa_node: int | None
    gpu_cpus: str | None
    on_gpu_numa_node: bool | None
    pinned: bool
    threads: int
    group: str  # the kernel group (model, SMs, torch, CUDA, cuBLAS and its settings)


@dataclass(frozen=True)
class StressRank:
    """One entry of the roll of ranks as the report reads it: check-in and placement."""

    rank: int
    local_rank: int
    node_rank: int
    host: str
    gpu_name: str | None = None
    cpus: str | None = None
    numa_node: int | None = None
    gpu_cpus: str | None = None
    on_gpu_numa_node: bool | None = None
    pinned: bool | None = None


@dataclass(frozen=True)
class CopyRow:
    """One rank's pinned host copies, alone (None: not measured) and all at once, and its
    PCIe link read under load."""

    rank: int
    size_bytes: int
    h2d_alone_gbps: float | None
    d2h_alone_gbps: float | None
    h2d_together_gbps: float
    d2h_together_gbps: float
    link: str | None
    link_gbps: float | None


@dataclass(frozen=True)
class PeerPair:
    """One ordered pair of a node's GPUs in the peer-copy matrix, with its path class and
    P2P status when NVML told them."""

    src: int  # CUDA ordinals in the measuring process
    dst: int
    peer_access: bool
    gbps: float | None  # None: no peer access, not measured
    path: str | None = None
    p2p_status: str | None = None
    p2p_by_design: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row as it crosses: the path's three keys only when the path was read."""
        row = as_dict(self)
        if self.path is None:
            for key in ("path", "p2p_status", "p2p_by_design"):
                del row[key]
        return row


@dataclass(frozen=True)
class PeerNode:
    """One node's peer-copy matrix as sent, less its pairs (read apart)."""

    node_rank: int
    host: str
    skipped: str | None = None
    gpus: tuple[dict[str, Any], ...] = ()  # identity rows (gpucheck.devices), shown as sent
    paths_unread: str | None = None


@dataclass(frozen=True)
class StressRecords:
    """Every per-rank record of a stress result that read back, and the ones that did not."""

    ranks: tuple[StressRank, ...]
    entries: tuple[Mapping[str, Any], ...]  # the raw entries of `ranks` (every key kept)
    gemm: tuple[GemmRecord, ...]
    gemm_again: tuple[GemmRecord, ...]
    power: tuple[PowerReading, ...] | None  # None: not measured (a run that ended first)
    membw: tuple[CopyRecord, ...]
    membw_again: tuple[CopyRecord, ...]
    sdc: tuple[BurnRecord, ...]
    sdc_deviations: tuple[float | None, ...]  # each of `sdc`'s from the CPU reference
    sdc_again: tuple[BurnRecord, ...]
    copies: tuple[CopyRow, ...]
    copies_again: tuple[CopyRow, ...] | None  # None: not measured again
    p2p_nodes: tuple[dict[str, Any], ...]  # each node's matrix, its pairs read back
    unread: tuple[Unread, ...]


def read_stress(result: Mapping[str, Any]) -> StressRecords:
    """Every per-rank record of `result` (complete or partial) read back."""
    unread: list[Unread] = []

    def rows(cls: type[Any], raw: object, what: str) -> tuple[Any, ...]:
        good, bad = read_all(cls, raw, what)
        unread.extend(bad)
        return tuple(good)

    sdc = result.get("sdc") or {}
    copies = result.get("copies") or {}
    power = result.get("power")
    again = copies.get("again") if isinstance(copies, Mapping) else None
    ranks = rows(StressRank, result.get("ranks"), "entry in the roll of ranks")
    burns = _burns(sdc if isinstance(sdc, Mapping) else {}, unread)
    return StressRecords(
        ranks=ranks, entries=tuple(readable(StressRank, result.get("ranks"))),
        gemm=rows(GemmRecord, result.get("gemm"), "gemm record"),
        gemm_again=rows(GemmRecord, result.get("gemm_again"), "gemm record (measured again)"),
        power=None if power is None else rows(PowerReading, power, "power reading"),
        membw=rows(CopyRecord, result.get("membw"), "membw record"),
        membw_again=rows(CopyRecord, result.get("membw_again"),
                         "membw record (measured again)"),
        sdc=tuple(r for r, _ in burns), sdc_deviations=tuple(d for _, d in burns),
        sdc_again=rows(BurnRecord, result.get("sdc_again"), "burn-in record (measured again)"),
        copies=rows(CopyRow, copies.get("rows") if isinstance(copies, Mapping) else copies,
                    "host copy row"),
        copies_again=None if again is None else rows(CopyRow, again,
                                                     "host copy row (measured again)"),
        p2p_nodes=_peer_nodes(result.get("p2p"), unread),
        unread=tuple(unread))


def _burns(sdc: Mapping[str, Any], unread: list[Unread]
           ) -> list[tuple[BurnRecord, float | None]]:
    """The burn-in records that read, each with its deviation from the CPU reference."""
    raw = sdc.get("records")
    if raw is None:
        return []
    if not isinstance(raw, (list, tuple)):
        unread.append(Unread("burn-in records", None, f"not a list but {type(raw).__name__}"))
        return []
    deviations = sdc.get("reference_deviations")
    if not (isinstance(deviations, (list, tuple)) and len(deviations) == len(raw)):
        deviations = [None] * len(raw)
    kept = []
    for row, deviation in zip(raw, deviations, strict=True):
        good, bad = read_all(BurnRecord, [row], "burn-in record")
        unread.extend(bad)
        # As rank 0 wrote it (NaN and inf included: `units.number` would drop them).
        number_ = deviation if isinstance(deviation, (int, float)) and not isinstance(
            deviation, bool) else None
        kept += [(record, number_) for record in good]
    return kept


def _peer_nodes(p2p: object, unread: list[Unread]) -> tuple[dict[str, Any], ...]:
    """Every node's peer-copy matrix that reads, its pairs (and second look) read back."""
    nodes = p2p.get("nodes") if isinstance(p2p, Mapping) else None
    if nodes is None:
        return ()
    heads, bad = read_all(PeerNode, nodes, "peer-copy matrix", ())
    unread.extend(bad)
    raw = [n for n in nodes if isinstance(n, Mapping)] if isinstance(nodes, list) else []
    by_node = {(n.get("node_rank"), n.get("host")): n for n in raw}
    return tuple(_peer_node(head, by_node[(head.node_rank, head.host)], unread)
                 for head in heads)


def _peer_node(head: PeerNode, raw: Mapping[str, Any], unread: list[Unread]) -> dict[str, Any]:
    node = dict(raw)
    if head.skipped is not None:
        return node
    where = f"peer-copy pair of node {head.node_rank}"
    if "pairs" not in raw:
        unread.append(Unread(f"peer-copy matrix of node {head.node_rank}", None,
                             "neither pairs nor why it was skipped"))
    for key in ("pairs", "again"):
        if key in raw or key == "pairs":
            good, bad = read_all(PeerPair, raw.get(key), where, ())
            unread.extend(bad)
            node[key] = [pair.to_dict() for pair in good]
    return node


COPY_FIGURES = {"h2d_gbps": "h2d_alone_gbps", "d2h_gbps": "d2h_alone_gbps",
                "h2d_together_gbps": "h2d_together_gbps",
                "d2h_together_gbps": "d2h_together_gbps"}


def stress_metrics(records: StressRecords) -> list[Metric]:
    """Every figure of the records that read, named as compare, fleet and baselines key
    them (`stress.gemm.<dtype>.tflops`: the median product's)."""
    ranks = rank_subjects(records.entries)
    rows: list[tuple[str, str, Better, Any, str]] = [
        *((f"stress.gemm.{r.dtype}.tflops", "TFLOP/s", Better.HIGHER, r, "tflops_p50")
          for r in records.gemm),
        *(("stress.membw.gbps", "GB/s", Better.HIGHER, r, "gbps_p50") for r in records.membw),
        *(("stress.sdc.p50_ms", "ms", Better.LOWER, r, "p50_ms") for r in records.sdc),
        *((f"stress.copies.{name}", "GB/s", Better.HIGHER, r, column)
          for name, column in COPY_FIGURES.items() for r in records.copies)]
    found = [Metric(name, unit, better, value, rank_of(ranks, row.rank))
             for name, unit, better, row, column in rows
             if (value := number(getattr(row, column))) is not None]
    return found + list(_p2p(records.p2p_nodes))


def _p2p(nodes: Sequence[Mapping[str, Any]]) -> Iterator[Metric]:
    for node in nodes:
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
