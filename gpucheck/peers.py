"""Peer comparison, the one rule: a figure against a bound x a reference (the median of
its peers), elimination between members of directed pairs, the second look and the
fleet's outliers. Floor 1: imports only stats, measure and subject (docs/DESIGN.md)."""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gpucheck.measure import Better, Bound, LookState, SecondLook
from gpucheck.stats import MAD_SCALE, Spread, best, describe, median, typical
from gpucheck.subject import Subject

# A node (or a rank against its node's peers) is slow below this fraction of the median.
SLOW_NODE_FRACTION = 0.9

# The fleet's outlier rule: with two values the median cannot tell which one is off.
MIN_VALUES = 3
# A node must also be this much worse: a fleet agreeing to 0.05% makes 0.3% "5 MADs off".
MAD_FLOOR = 0.02
# A MAD from a handful of values is itself noise (benchmarks/fleet_scale.py --nodes 12).
MAD_MIN_VALUES = 20
TRIM_ROUNDS = 20

K = TypeVar("K", bound=Hashable)
Pair = tuple[int, int]
Samples = Mapping[Pair, Sequence[float]]


@dataclass(frozen=True)
class Peers(Generic[K]):
    """Members against their median: value / reference each, and those beyond the bound."""

    reference: float
    ratios: Mapping[K, float]
    worse: tuple[K, ...]


def against_median(values: Mapping[K, float], bound: Bound, min_count: int = 2) -> Peers[K]:
    """Each member against the median of all; nobody is worse below `min_count` members
    or with a median that is not positive."""
    if len(values) < max(min_count, 1):
        return Peers(median(values.values()) if values else 0.0, {}, ())
    reference = median(values.values())
    if reference <= 0:
        return Peers(reference, {}, ())
    ratios = {k: v / reference for k, v in values.items()}
    return Peers(reference, ratios, tuple(k for k, v in values.items()
                                          if bound.worse(v, reference)))


def known_good(values: Mapping[K, float], worse: Sequence[K],
               reference: float | None = None) -> K | None:
    """The member not in `worse` closest to `reference` (default: their median), to
    measure again beside the suspects; None when every member is worse."""
    good = [k for k in values if k not in worse]
    if not good:
        return None
    center = median(values[k] for k in good) if reference is None else reference
    return min(good, key=lambda k: abs(values[k] - center))


# --- elimination among the members of directed pairs (comm's pairs, peer copies) ---


@dataclass(frozen=True)
class Suspects:
    """What a first measurement of directed pairs found, and what to measure again."""

    reference: float  # median typical figure of the pairs without a suspect member
    floor: float  # the lowest reading of a healthy pair: noise reaches down to here
    members: dict[int, str] = field(default_factory=dict)  # member -> "sending", ...
    pairs: tuple[Pair, ...] = ()  # resolvably slow pairs (and a suspect's pairs)
    noisy: tuple[Pair, ...] = ()  # worse than the bound, but within the spread
    references: tuple[Pair, ...] = ()  # known-good pairs to measure beside them
    # slow pairs with a repeat within the bound (a flapping link, a congested uplink)
    intermittent: tuple[Pair, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.pairs


def intermittent(samples: Samples, pairs: Sequence[Pair], reference: float,
                 bound: Bound) -> tuple[Pair, ...]:
    """The slow `pairs` whose best repeat is not worse than `bound` x `reference`."""
    return tuple(p for p in pairs if not bound.worse(best(samples[p]), reference))


class Without:
    """Per-pair values sorted once, read with one member's pairs left out: a k-th smallest
    costs that member's pair count, so judging every member costs n log n, not n squared."""

    def __init__(self, items: Iterable[tuple[Pair, float]]) -> None:
        ordered = sorted(items, key=lambda item: item[1])
        self.values = [v for _, v in ordered]
        self.at: dict[int | None, list[int]] = {}
        for i, (pair, _) in enumerate(ordered):
            for m in set(pair):
                self.at.setdefault(m, []).append(i)

    def count(self, m: int | None) -> int:
        return len(self.values) - len(self.at.get(m, ()))

    def nth(self, m: int | None, n: int) -> float:
        """The n-th smallest (from 0) without m's values (every value with None)."""
        for i in self.at.get(m, ()):
            if i > n:
                break
            n += 1
        return self.values[n]

    def median(self, m: int | None) -> float:
        half, odd = divmod(self.count(m), 2)  # as statistics.median computes it
        return float(self.nth(m, half) if odd else
                     (self.nth(m, half - 1) + self.nth(m, half)) / 2)


def by_end(pairs: Iterable[Pair]) -> dict[int, tuple[list[Pair], list[Pair]]]:
    """Each member's pairs: (those it sends on, those it receives on)."""
    ways: dict[int, tuple[list[Pair], list[Pair]]] = {}
    for p in pairs:
        ways.setdefault(p[0], ([], []))[0].append(p)
        ways.setdefault(p[1], ([], []))[1].append(p)
    return ways


def slow_members(values: Mapping[Pair, float], bound: Bound) -> dict[int, str]:
    """Members whose every pair in one direction is worse than `bound` x the median of
    the pairs without them: "sending", "receiving" or "both"."""
    found: dict[int, str] = {}
    left, ways = Without(values.items()), by_end(values)
    for m in sorted(ways):
        if not left.count(m):
            continue
        reference = left.median(m)
        sending, receiving = (bool(way) and all(bound.worse(values[p], reference) for p in way)
                              for way in ways[m])
        if sending or receiving:
            found[m] = "both" if sending and receiving else "sending" if sending else \
                "receiving"
    return found


def directed(pair: Pair, member: int, way: str) -> bool:
    """Is `pair` one of `member`'s pairs in the direction it is slow in?"""
    return (way in ("sending", "both") and pair[0] == member) or \
        (way in ("receiving", "both") and pair[1] == member)


def eliminate(samples: Samples, bound: Bound) -> Suspects:
    """Slow members and pairs of one group from repeated rate readings per directed pair:
    a pair is slow when its typical reading is worse than the bound and below every other
    healthy pair's lowest; worse but within that spread is `noisy` (docs/DESIGN.md)."""
    if bound.better is not Better.HIGHER:
        raise ValueError("eliminate judges rates: its bound is HIGHER-is-better")
    if not samples:
        return Suspects(0.0, 0.0)
    members = slow_members({p: typical(s) for p, s in samples.items()}, bound)
    reference, floor, slow, noisy = _classify(samples, members, bound)
    kept = {m: way for m, way in members.items()
            if all(p in slow for p in samples if directed(p, m, way))}
    if kept != members:  # without the others, the pairs are judged again
        members = kept
        reference, floor, slow, noisy = _classify(samples, members, bound)
    return Suspects(reference, floor, members, tuple(slow), tuple(noisy),
                    known_good_pairs(samples, slow, members, reference),
                    intermittent(samples, slow, reference, bound))


def _classify(samples: Samples, members: Mapping[int, str], bound: Bound,
              ) -> tuple[float, float, list[Pair], list[Pair]]:
    """(reference, lowest healthy reading, slow pairs, too-noisy pairs)."""
    clean = {p: s for p, s in samples.items() if not set(p) & set(members)} or samples
    reference = median(typical(s) for s in clean.values())
    healthy = {p: min(s) for p, s in clean.items() if not bound.worse(typical(s), reference)}
    slow: list[Pair] = []
    noisy: list[Pair] = []
    for pair, values in sorted(samples.items()):
        by_member = any(directed(pair, m, way) for m, way in members.items())
        if by_member or bound.worse(typical(values), reference):
            floor = min((v for q, v in healthy.items() if q != pair), default=math.inf)
            (slow if typical(values) < floor else noisy).append(pair)
    return reference, min(healthy.values(), default=0.0), slow, noisy


def known_good_pairs(samples: Samples, slow: Sequence[Pair], members: Mapping[int, str],
                reference: float) -> tuple[Pair, ...]:
    """The known-good pair closest to the reference, and its reverse when good too."""
    if not slow:
        return ()
    good = sorted(p for p in samples if p not in slow and not set(p) & set(members))
    chosen = known_good({p: typical(samples[p]) for p in good}, (), reference)
    if chosen is None:
        return ()
    back = (chosen[1], chosen[0])
    return (chosen, back) if back in good else (chosen,)


# --- the second look ---


def second_look(first: float, again: float | None, reference: float | None,
                against: tuple[Subject, ...], bound: Bound, unit: str,
                why_not: str | None = None) -> SecondLook:
    """CONFIRMED when `again` is worse than the bound x `reference`, UNSTABLE when not,
    NOT_MEASURED without a second figure or a positive reference."""
    if again is None or reference is None or reference <= 0:
        why = why_not or ("not measured again" if again is None
                          else "nothing was measured beside it")
        return SecondLook(first, None, reference, against, unit, bound,
                          LookState.NOT_MEASURED, why)
    state = LookState.CONFIRMED if bound.worse(again, reference) else LookState.UNSTABLE
    return SecondLook(first, again, reference, against, unit, bound, state)


def pair_looks(suspects: Suspects, first: Samples, again: Samples, bound: Bound,
               unit: str, name: Callable[[Pair], Subject]) -> dict[Pair, SecondLook]:
    """Each slow pair's second look against the known-good pairs measured again with it
    (else the first reference)."""
    refs = [p for p in suspects.references if again.get(p)]
    reference = typical([typical(again[p]) for p in refs]) if refs else suspects.reference
    against = tuple(name(p) for p in refs)
    return {p: second_look(typical(first[p]), typical(again[p]) if again.get(p) else None,
                           reference, against, bound, unit,
                           None if again.get(p) else "the pair was not measured again")
            for p in suspects.pairs}


def combined(looks: Sequence[SecondLook]) -> SecondLook:
    """One look made of several: CONFIRMED when every part is, NOT_MEASURED when any
    part was not, else UNSTABLE; its first figure is the worst part's."""
    if not looks:
        raise ValueError("a combined look needs at least one part")
    bound = looks[0].bound
    pick = min if bound.better is Better.HIGHER else max
    states = {look.state for look in looks}
    state = LookState.NOT_MEASURED if LookState.NOT_MEASURED in states else \
        LookState.CONFIRMED if states == {LookState.CONFIRMED} else LookState.UNSTABLE
    against = tuple(dict.fromkeys(s for look in looks for s in look.against))
    why = next((look.why_not for look in looks if look.why_not), None) \
        if state is LookState.NOT_MEASURED else None
    return SecondLook(pick(look.first for look in looks), None, looks[0].reference,
                      against, looks[0].unit, bound, state, why, tuple(looks))


# --- the fleet's outliers ---


def shortfall(value: float, reference: float, better: Better) -> float:
    """How much worse `value` is than `reference`, as a fraction (negative: better)."""
    if better is Better.INFO:
        return 0.0
    worse = reference - value if better is Better.HIGHER else value - reference
    if reference == 0:
        return math.inf if worse > 0 else (-math.inf if worse < 0 else 0.0)
    return worse / abs(reference)


def outlier(value: float, spread: Spread, bound: Bound, mad_k: float) -> bool:
    """Worse than `bound` x the median, or (from MAD_MIN_VALUES values) more than `mad_k`
    scaled MADs and MAD_FLOOR worse; better than the median never is."""
    if spread.n < MIN_VALUES:
        return False
    short = shortfall(value, spread.median, bound.better)
    if spread.median > 0:
        beyond = bound.worse(value, spread.median)
    else:  # a ratio cannot say: by how much it is worse, against the bound's margin
        beyond = short > abs(bound.limit - 1)
    if beyond:
        return True
    return (spread.n >= MAD_MIN_VALUES and short >= MAD_FLOOR
            and abs(value - spread.median) > mad_k * MAD_SCALE * spread.mad)


def trimmed(values: Sequence[float], t: float, mad_k: float) -> list[float]:
    """`values` without their outliers either side, trimmed until nothing more goes."""
    kept = sorted(values)
    bounds = (Bound.shortfall(t, Better.HIGHER), Bound.shortfall(t, Better.LOWER))
    for _ in range(TRIM_ROUNDS):
        if len(kept) < MIN_VALUES:
            return kept
        spread = describe(kept)
        keep = [v for v in kept if not any(outlier(v, spread, b, mad_k) for b in bounds)]
        if len(keep) == len(kept) or not keep:
            return kept
        kept = keep
    return kept
