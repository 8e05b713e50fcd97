"""What the metric producers (`{bench,comm,stress,probes}/metrics.py`) share: reading a
number out of a worker's record, a spread from two figures, a rank as a subject, and
attaching metrics to the section they describe.

Floor 1 beside `measure` and `subject`: imports only those two (the sections are any
object with `name` and `metrics`, so `report` stays above it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from gpucheck import subject
from gpucheck.measure import Metric
from gpucheck.subject import Subject
from gpucheck.units import number as number  # comm/metrics.py imports it from here until it goes


class HasMetrics(Protocol):
    name: str
    metrics: list[Metric]


def whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def relative_spread(high: Any, low: Any) -> float | None:
    """`high` over `low`, less one (0.1: ten percent apart); None without two numbers."""
    top, bottom = number(high), number(low)
    if top is None or bottom is None or bottom <= 0 or top < bottom:
        return None
    return top / bottom - 1


def gpu_words(row: Mapping[str, Any]) -> str | None:
    """The GPU a rank used, as its record says it: stress's `gpu` label, else the NVML
    index and bus id bench and comm keep; None for a CPU rank."""
    if isinstance(row.get("gpu"), str):
        return str(row["gpu"])
    index = whole(row.get("nvml_index"))
    if index is None:
        return None
    bus = row.get("pci_bus_id")
    return f"GPU {index} (bus {bus})" if bus else f"GPU {index}"


def rank_subjects(ranks: Iterable[Mapping[str, Any]]) -> dict[int, Subject]:
    """Each rank as a subject: labelled by its GPU when it has one (the words compare
    and fleet name a slot by), with the GPU's index, bus id and host as fields."""
    found: dict[int, Subject] = {}
    for row in ranks:
        number_ = whole(row.get("rank"))
        if number_ is None:
            continue
        label = gpu_words(row)
        bus = row.get("pci_bus_id")
        host = row.get("host")
        made = subject.rank(number_, label, gpu=whole(row.get("nvml_index")),
                            bus_id=bus if isinstance(bus, str) else None,
                            host=host if isinstance(host, str) else None,
                            node=whole(row.get("node_rank")))
        known = found.get(number_)
        if known is None or len(made.label) > len(known.label):
            found[number_] = made
    return found


def rank_of(subjects: Mapping[int, Subject], rank: int) -> Subject:
    return subjects.get(rank) or subject.rank(rank)


def attach(sections: Sequence[HasMetrics], metrics: Iterable[Metric],
           section_of: Mapping[str, str]) -> None:
    """Each metric onto the section named by `section_of[<the name's second part>]`
    (`stress.gemm.bf16.tflops` -> "gemm"), or by that part itself; a metric whose
    section is not in `sections` is dropped (the phase did not run)."""
    by_name = {s.name: s for s in sections}
    for metric in metrics:
        part = metric.name.split(".")[1].split("@")[0]
        section = by_name.get(section_of.get(part, part))
        if section is not None:
            section.metrics.append(metric)
