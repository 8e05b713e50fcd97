"""Which rank computed a wrong result: a majority vote over digests, the judgement
against a reference, software splits set apart from faulty GPUs (docs/stress.md,
"bitwise"). Used by stress's burn-in and bench's consistency."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only relative_deviation touches tensors, and imports torch itself
    import torch


@dataclass(frozen=True)
class Judgement:
    """Who is wrong, who cannot be told apart, and why."""

    wrong: dict[int, str] = field(default_factory=dict)  # rank -> reason
    undecided: tuple[int, ...] = ()
    # Ranks outvoted (or beyond the reference) alike: each tuple one software split.
    software: tuple[tuple[int, ...], ...] = ()

    def agreeing(self, ranks: list[int]) -> list[int]:
        split = {r for side in self.software for r in side}
        return [r for r in ranks if r not in self.wrong and r not in self.undecided
                and r not in split]


def beyond(deviation: float | None, tolerance: float) -> bool:
    """A deviation beyond tolerance; NaN and inf count (a non-finite result is wrong)."""
    return deviation is not None and not (deviation <= tolerance)


def odd_by_majority(digests: Mapping[int, str]) -> tuple[int, ...] | None:
    """Ranks whose digest differs from the one a strict majority shares; () when all
    agree; None when no digest has a strict majority (nobody can be named by vote)."""
    if not digests:
        return ()
    winner, votes = Counter(digests.values()).most_common(1)[0]
    if votes * 2 <= len(digests):
        return None
    return tuple(sorted(r for r, d in digests.items() if d != winner))


def judge(digests: Mapping[int, str], deviations: Mapping[int, float | None],
          tolerance: float, groups: Mapping[int, str] | None = None,
          nodes: Mapping[int, int] | None = None, splits: bool = False,
          measure: str = "deviates {:.3g} from the CPU reference (tolerance {:g})",
          ) -> Judgement:
    """The wrong ranks: beyond the reference first (no majority needed), then outvoted
    bitwise within their group; with `splits`, software splits set apart (bench's labels
    are not digests of exact bits, so it leaves them off)."""
    wrong = {r: measure.format(d, tolerance) for r, d in sorted(deviations.items())
             if beyond(d, tolerance)}
    undecided: list[int] = []
    by_group: dict[str, dict[int, str]] = {}
    for rank, digest in digests.items():
        if rank not in wrong:
            by_group.setdefault((groups or {}).get(rank, ""), {})[rank] = digest
    for members in by_group.values():
        odd = odd_by_majority(members)
        if odd is None:
            undecided += sorted(members)
            continue
        for rank in odd:
            wrong[rank] = (f"its result differs bitwise from the {len(members) - len(odd)} "
                           "other rank(s) of the same GPU model, which agree")
    off_reference = {r for r, d in deviations.items() if beyond(d, tolerance)}
    found = software_splits(wrong, digests, groups or {}, nodes or {},
                            off_reference) if splits else ()
    split = {r for side in found for r in side}
    return Judgement(wrong={r: w for r, w in sorted(wrong.items()) if r not in split},
                     undecided=tuple(sorted(undecided)), software=found)


def software_splits(wrong: Mapping[int, str], digests: Mapping[int, str],
                    groups: Mapping[int, str], nodes: Mapping[int, int],
                    off_reference: frozenset[int] | set[int] = frozenset(),
                    ) -> tuple[tuple[int, ...], ...]:
    """Sets of wrong ranks that are a software difference, not faulty GPUs: two or more
    with one digest in one group, or every rank of their group on whole nodes of two or
    more, within the fp64 reference (ranks that also miss it are wrong GPUs)."""
    alike: dict[tuple[str, str], list[int]] = {}
    for rank in wrong:
        alike.setdefault((groups.get(rank, ""), digests.get(rank, "")), []).append(rank)
    splits = [tuple(sorted(ranks)) for ranks in alike.values() if len(ranks) >= 2]
    taken = {r for side in splits for r in side}
    for group in dict.fromkeys(groups.get(r, "") for r in wrong):
        members = [r for r in digests if groups.get(r, "") == group]
        left = sorted(r for r in wrong if groups.get(r, "") == group and r not in taken)
        if left and not off_reference & set(left) and _whole_nodes(left, members, nodes):
            splits.append(tuple(left))
    return tuple(sorted(splits))


def _whole_nodes(ranks: list[int], members: list[int], nodes: Mapping[int, int]) -> bool:
    """`ranks` are every member of their nodes, each such node holds two or more, and
    some member of the group lies outside them."""
    if not nodes or any(r not in nodes for r in ranks):
        return False
    covered = {nodes[r] for r in ranks}
    on_them = [m for m in members if nodes.get(m) in covered]
    per_node = [sum(1 for r in ranks if nodes[r] == n) for n in covered]
    return sorted(on_them) == sorted(ranks) and min(per_node) >= 2 and \
        len(members) > len(ranks)


def relative_deviation(values: torch.Tensor, reference: torch.Tensor) -> float:
    """max |values - reference| / max |reference| (inf when `values` is not finite)."""
    import torch

    got = values.to(torch.float64)
    if not bool(torch.isfinite(got).all()):
        return math.inf
    scale = max(float(reference.abs().max()), 1e-30)
    return float((got - reference).abs().max()) / scale
