"""Measured figures as data: which way is better, a bound (always `value / reference`
against its limit), the second look at a figure that crossed it, a named metric; and
what metric producers share (ranks as subjects, metrics onto their sections)."""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpucheck import subject
from gpucheck.stats import number
from gpucheck.subject import Subject


class Better(str, enum.Enum):
    HIGHER = "higher"
    LOWER = "lower"
    INFO = "info"  # a figure shown, never judged


@dataclass(frozen=True)
class Bound:
    """Worse than `limit` x the reference: below it (HIGHER), above it (LOWER); a ratio
    exactly at the limit is not worse."""

    limit: float
    better: Better

    def __post_init__(self) -> None:
        if self.better is Better.INFO:
            raise ValueError("an INFO figure has no bound")
        if not self.limit > 0:
            raise ValueError(f"a bound's limit is a positive ratio, not {self.limit!r}")

    @classmethod
    def fraction(cls, f: float, better: Better) -> Bound:
        """Stress, comm, nodes: below f x the reference (HIGHER), above it / f (LOWER)."""
        if not 0 < f <= 1:
            raise ValueError(f"a fraction is in (0, 1], not {f!r}")
        return cls(f if better is Better.HIGHER else 1 / f, better)

    @classmethod
    def shortfall(cls, t: float, better: Better) -> Bound:
        """Bench, fleet: more than t below (HIGHER) or above (LOWER) the reference."""
        if not 0 <= t < 1:
            raise ValueError(f"a shortfall is in [0, 1), not {t!r}")
        return cls(1 - t if better is Better.HIGHER else 1 + t, better)

    def worse(self, value: float, reference: float) -> bool:
        ratio = value / reference if reference > 0 else None
        # A tie within float rounding is a tie: 8.1 / 9 is 0.8999999999999999, and 8.1
        # against 9 at a 0.9 bound was "not worse" when the rule read value < f x median.
        if ratio is None or math.isclose(ratio, self.limit, rel_tol=1e-9):
            return False
        return ratio < self.limit if self.better is Better.HIGHER else ratio > self.limit

    def to_dict(self) -> dict[str, Any]:
        return {"limit": self.limit, "better": self.better.value}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Bound:
        return cls(_number(raw["limit"]), Better(raw["better"]))


class LookState(str, enum.Enum):
    """What a figure that crossed its bound did when measured again."""

    CONFIRMED = "confirmed"  # worse again, beside known-good peers
    UNSTABLE = "unstable"  # not worse the second time
    NOT_MEASURED = "not measured again"  # the run ended first, or nothing to measure beside


@dataclass(frozen=True)
class SecondLook:
    """A figure measured twice: `first` crossed `bound`; `again` (None: not measured
    again, `why_not` says why) judged against `reference`, measured beside `against`
    (known-good peers; (): the first reference). `parts`: a shared node's pairs."""

    first: float
    again: float | None
    reference: float | None
    against: tuple[Subject, ...]
    unit: str
    bound: Bound
    state: LookState
    why_not: str | None = None
    parts: tuple[SecondLook, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.state is LookState.NOT_MEASURED and self.again is not None:
            raise ValueError("a look not measured again has no second figure")
        if self.state is not LookState.NOT_MEASURED and self.again is None and not self.parts:
            raise ValueError(f"a {self.state.value} look needs its second figure")

    def to_dict(self) -> dict[str, Any]:
        return {"first": self.first, "again": self.again, "reference": self.reference,
                "against": [s.to_dict() for s in self.against], "unit": self.unit,
                "bound": self.bound.to_dict(), "state": self.state.value,
                "why_not": self.why_not, "parts": [p.to_dict() for p in self.parts]}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SecondLook:
        if not isinstance(raw, Mapping):
            raise TypeError(f"a look is an object, not {type(raw).__name__}")
        unit, why_not = raw.get("unit"), raw.get("why_not")
        if not isinstance(unit, str) or not (why_not is None or isinstance(why_not, str)):
            raise TypeError("a look's 'unit' or 'why_not' is not a string")
        return cls(first=_number(raw.get("first")), again=_optional(raw.get("again")),
                   reference=_optional(raw.get("reference")),
                   against=tuple(Subject.from_dict(s) for s in _list(raw.get("against"))),
                   unit=unit, bound=Bound.from_dict(raw["bound"]),
                   state=LookState(raw["state"]), why_not=why_not,
                   parts=tuple(cls.from_dict(p) for p in _list(raw.get("parts"))))


@dataclass(frozen=True)
class Metric:
    """One figure of a report ("stress.gemm.bf16.tflops") for `subject` (None: the job);
    `spread`: how much it varied inside its own run, as a fraction."""

    name: str
    unit: str
    better: Better
    value: float
    subject: Subject | None = None
    spread: float | None = None

    def key(self) -> str:
        """"stress.gemm.bf16.tflops.rank3" (the keys baselines were written with)."""
        position = self.subject.position() if self.subject is not None else None
        return f"{self.name}.{position}" if position else self.name

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "better": self.better.value,
                "value": self.value, "spread": self.spread,
                "subject": self.subject.to_dict() if self.subject is not None else None}

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> Metric:
        if type(raw) is not dict and not isinstance(raw, Mapping):
            raise TypeError(f"a metric is an object, not {type(raw).__name__}")
        name, unit, subject = raw.get("name"), raw.get("unit"), raw.get("subject")
        if not isinstance(name, str) or not isinstance(unit, str):
            raise TypeError("a metric's 'name' or 'unit' is not a string")
        better = raw.get("better")
        known = _BETTER.get(better) if isinstance(better, str) else None
        value, spread = raw.get("value"), raw.get("spread")
        metric = object.__new__(cls)  # its fields at once: a fleet reads tens of thousands
        metric.__dict__.update(
            name=name, unit=unit, better=known or Better(better),
            value=value if type(value) is float else _number(value),
            subject=Subject.from_dict(subject) if subject is not None else None,
            spread=spread if spread is None or type(spread) is float else _number(spread))
        return metric


_BETTER = {b.value: b for b in Better}  # a dict: Better(value) costs a call per metric


def _number(value: object) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _optional(value: object) -> float | None:
    return None if value is None else _number(value)


def _list(value: object) -> list[Any]:
    if not isinstance(value, (list, type(None))):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return value or []


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
