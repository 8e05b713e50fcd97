"""What metric producers share: a whole number out of a worker's record, ranks as
subjects, and metrics attached to the section they describe. Imports only `subject`
and `measure` (a section is any object with `name` and `metrics`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from gpucheck import subject
from gpucheck.measure import Metric
from gpucheck.subject import Subject
from gpucheck.units import number


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


def rank_subjects(ranks: Iterable[Mapping[str, Any]]) -> dict[int, Subject]:
    """Each rank as a subject labelled by its GPU when it has one (stress's `gpu`
    words, else "GPU <nvml_index> (bus <pci_bus_id>)"), the GPU's index, bus id and
    host as fields; of two rows of one rank, the longer label wins."""
    found: dict[int, Subject] = {}
    for row in ranks:
        number = whole(row.get("rank"))
        if number is None:
            continue
        index, bus, host = whole(row.get("nvml_index")), row.get("pci_bus_id"), row.get("host")
        label = row["gpu"] if isinstance(row.get("gpu"), str) else None if index is None \
            else f"GPU {index} (bus {bus})" if bus else f"GPU {index}"
        made = subject.rank(number, label, gpu=index,
                            bus_id=bus if isinstance(bus, str) else None,
                            host=host if isinstance(host, str) else None,
                            node=whole(row.get("node_rank")))
        known = found.get(number)
        if known is None or len(made.label) > len(known.label):
            found[number] = made
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
