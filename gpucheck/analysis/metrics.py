"""A report's metrics, keyed as compare, fleet and baselines key them.

Every command writes its figures beside its sections as data (`Section.metrics`,
gpucheck.measure.Metric, made by `{bench,comm,stress,probes}/metrics.py`); this module
only reads them back. The key is `Metric.key()`, `<name>[.<position>]`:

    bench.images_per_s.rank0              stress.gemm.bf16.tflops.rank3
    comm.all_reduce.busbw_gbps@1048576    env.gpu.pcie_width_current.gpu5

The position (`rank3`, `gpu5`, `cuda0_to_cuda1`: `Subject.position()`) is the GPU slot,
so one slot can be compared across nodes; the name without it is the pool every slot
of a node shares, and `family` is the name without a message size. Counters already
judged by findings (ECC, XIDs, faults) are not metrics: a fleet median of zero errors
would make one corrected error an outlier. docs/fleet.md lists every name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpucheck.measure import Better, Metric
from gpucheck.report import Report
from gpucheck.subject import Subject

JUDGED = (Better.HIGHER, Better.LOWER)


def metrics_of(report: Report) -> dict[str, Metric]:
    """Every metric of `report` by key, sorted; the first of two with one key wins (a
    gathered env report names each node's GPUs alike)."""
    found: dict[str, Metric] = {}
    for section in report.sections:
        for metric in section.metrics:
            found.setdefault(metric.key(), metric)
    return {k: found[k] for k in sorted(found, key=metric_order)}


def metric_order(key: str) -> tuple[str, int, str]:
    """How metric keys are listed: by family, then message size as a number (@1024
    before @131072 before @1048576), then position."""
    name, at, rest = key.partition("@")
    digits = len(rest) - len(rest.lstrip("0123456789"))
    if not at or not digits or digits > 18:  # a size, not a forged run of digits
        return (key, -1, "")
    return (name, int(rest[:digits]), rest[digits:])


def position(metric: Metric) -> str | None:
    """The GPU slot ("rank3", "gpu5", "cuda0_to_cuda1"); None for a job-wide figure."""
    return metric.subject.position() if metric.subject is not None else None


def family(metric: Metric) -> str:
    """The name without a message size: `comm.all_reduce.busbw_gbps`."""
    return metric.name.split("@", 1)[0]


def judged(metric: Metric) -> bool:
    return metric.better in JUDGED


def section_kind(name: Any) -> str:
    """`timing` for "timing" and for a combined report's "bench.timing"."""
    return str(name or "").rsplit(".", 1)[-1]


def rows(value: Any) -> list[Mapping[str, Any]]:
    """The dict rows of a table (a list), skipping anything else."""
    # isinstance(r, dict), not Mapping: JSON gives dicts, and the ABC check is what
    # a thousand-node fleet would spend its time on.
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []


def slot_words(metric: Metric) -> str | None:
    """How a finding names the figure's slot: the GPU's words when the figure names a
    GPU ("GPU 3 (NVIDIA H200, bus ...)"), else its position ("rank1"); None for the job."""
    who = metric.subject
    if who is None:
        return None
    if who.gpu is not None or who.bus_id or who.uuid:
        return who.label
    return who.position() or who.label


def gpu_words(metric: Metric) -> str | None:
    """The GPU the figure is about, in words, when it names one (the fleet's gpu column)."""
    words = slot_words(metric)
    return words if words is not None and words != position(metric) else None


def slot_subject(metric: Metric) -> Subject | None:
    """The figure's subject, worded as `slot_words` says it (its fields kept)."""
    words = slot_words(metric)
    if metric.subject is None or words is None:
        return None
    who = metric.subject
    return Subject(who.kind, words, rank=who.rank, gpu=who.gpu, bus_id=who.bus_id,
                   uuid=who.uuid, node=who.node, host=who.host, peer=who.peer, port=who.port)
