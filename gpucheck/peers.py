"""Peer comparison, the one rule: a figure worse than a bound x a reference, which way
is better, elimination between members of pairs, and the second look.

Every command judges "slower than the others" here (stress's ranks, nodes of bench
and comm, comm's pairs, stress's peer copies, the fleet's nodes), always as
`value / reference` against `Bound.limit` (`gpucheck.measure`): a ratio exactly at the
limit is not worse. Imports only stats, measure and subject (floor 1).

Confirm before condemning (as DCGM's diagnostics, Azure's HPC health checks and
Google's cluster scanner re-test a suspect against members already known good): a
figure that crossed its bound is measured again, and `second_look` says what the
second figure did: CONFIRMED (worse again), UNSTABLE (within the bound the second
time: at most a rerun) or NOT_MEASURED (and why not).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gpucheck.measure import Better, Bound, LookState, SecondLook
from gpucheck.stats import MAD_SCALE, Spread, best, describe, median, typical
from gpucheck.subject import Subject

# A node (or a rank against its node's peers) is slow below this fraction of the
# median: bench, comm and stress use it (distributed/nodes.py's slow_node_findings,
# comm --slow-node-threshold). The one definition.
SLOW_NODE_FRACTION = 0.9

# The fleet's outlier rule (`outlier`, `trimmed`). With two values the median cannot
# tell which one is off.
MIN_VALUES = 3
# The MAD rule alone would call a node 0.3% off an outlier in a fleet that agrees to
# 0.05%: no one acts on that, so a node must also be this much worse.
MAD_FLOOR = 0.02
# A MAD from a handful of values is itself noise: eleven nodes with 2% noise can
# happen to agree to 0.3%, which makes an ordinary node "5 MADs off" (seen with
# benchmarks/fleet_scale.py --nodes 12). The MAD rule waits for this many values.
MAD_MIN_VALUES = 20
TRIM_ROUNDS = 20

K = TypeVar("K", bound=Hashable)
Pair = tuple[int, int]
Samples = Mapping[Pair, Sequence[float]]


@dataclass(frozen=True)
class Peers(Generic[K]):
    """Members against their median: `ratios` value / reference for every member
    (empty when the reference is not positive or there were too few), `worse` the
    members beyond the bound, in the order of the values given."""

    reference: float
    ratios: Mapping[K, float]
    worse: tuple[K, ...]


def against_median(values: Mapping[K, float], bound: Bound, min_count: int = 2) -> Peers[K]:
    """Each member against the median of all (itself included); nobody is worse with
    fewer than `min_count` members or a median that is not positive."""
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
    """The member not in `worse` closest to `reference` (default: the median of those
    members): the one to measure again beside the suspects. Ties go to the first in
    `values`' order; None when every member is worse."""
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
    # slow pairs whose repeats disagree widely: slow typically, yet one repeat or more
    # within the bound (a flapping link, a congested uplink: issue 36 item 5)
    intermittent: tuple[Pair, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.pairs


def intermittent(samples: Samples, pairs: Sequence[Pair], reference: float,
                 bound: Bound) -> tuple[Pair, ...]:
    """The slow `pairs` whose best repeat is not worse than `bound` x `reference`."""
    return tuple(p for p in pairs if not bound.worse(best(samples[p]), reference))


def slow_members(values: Mapping[Pair, float], bound: Bound) -> dict[int, str]:
    """Members every one of whose pairs in one direction is worse than `bound` x the
    median of the pairs without them: "sending", "receiving" or "both" ways. (With 3
    nodes, 4 of the 6 directed pairs involve any one node: a median over all pairs
    would be the slow node's own.)"""
    found: dict[int, str] = {}
    for m in sorted({m for pair in values for m in pair}):
        without = [v for (a, b), v in values.items() if m not in (a, b)]
        if not without:
            continue
        reference = median(without)
        out = [bound.worse(v, reference) for (a, _), v in values.items() if a == m]
        into = [bound.worse(v, reference) for (_, b), v in values.items() if b == m]
        sending, receiving = bool(out) and all(out), bool(into) and all(into)
        if sending or receiving:
            found[m] = "both" if sending and receiving else "sending" if sending else \
                "receiving"
    return found


def directed(pair: Pair, member: int, way: str) -> bool:
    """Is `pair` one of `member`'s pairs in the direction it is slow in?"""
    return (way in ("sending", "both") and pair[0] == member) or \
        (way in ("receiving", "both") and pair[1] == member)


def eliminate(samples: Samples, bound: Bound) -> Suspects:
    """Slow members and pairs of one group (a node's ranks or GPUs, or the nodes), from
    repeated rate readings per directed pair (`bound` must be HIGHER-is-better).

    A pair is judged by its typical (median) reading, not its best: one lucky repeat
    must not clear a link slow most of the time (issue 36 item 5). It is slow when
    that is worse than the bound AND below the lowest reading of every other healthy
    pair (how far noise alone reaches down); worse than the bound but within that
    spread is `noisy`, never a WARN. The second look, not the best sample, is what
    tells noise from a slow pair. A member stays a suspect only when every pair that
    makes it one is resolvable."""
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
                    _references(samples, slow, members, reference),
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


def _references(samples: Samples, slow: Sequence[Pair], members: Mapping[int, str],
                reference: float) -> tuple[Pair, ...]:
    """The known-good pair closest to the reference (none of its ends suspect), and its
    reverse when that is good too; none when nothing is slow."""
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
    """The look at a figure that crossed `bound`: CONFIRMED when `again` is worse than
    the bound x `reference` (the second reference: known-good peers measured beside
    it, or the first one), UNSTABLE when it is not, NOT_MEASURED without a second
    figure or a positive reference to judge it by."""
    if again is None or reference is None or reference <= 0:
        why = why_not or ("not measured again" if again is None
                          else "nothing was measured beside it")
        return SecondLook(first, None, reference, against, unit, bound,
                          LookState.NOT_MEASURED, why)
    state = LookState.CONFIRMED if bound.worse(again, reference) else LookState.UNSTABLE
    return SecondLook(first, again, reference, against, unit, bound, state)


def pair_looks(suspects: Suspects, first: Samples, again: Samples, bound: Bound,
               unit: str, name: Callable[[Pair], Subject]) -> dict[Pair, SecondLook]:
    """Each slow pair's second look: its typical first reading, its typical re-measured
    one, against the typical figure of the known-good pairs measured again with it
    (`name` makes their subjects), or, with none of those, the first measurement's
    reference."""
    refs = [p for p in suspects.references if again.get(p)]
    reference = typical([typical(again[p]) for p in refs]) if refs else suspects.reference
    against = tuple(name(p) for p in refs)
    return {p: second_look(typical(first[p]), typical(again[p]) if again.get(p) else None,
                           reference, against, bound, unit,
                           None if again.get(p) else "the pair was not measured again")
            for p in suspects.pairs}


def combined(looks: Sequence[SecondLook]) -> SecondLook:
    """One look for a member made of several (a shared node: one look per slow pair):
    CONFIRMED when every part is, NOT_MEASURED when any part was not (or there are
    none), else UNSTABLE. Its first figure is the worst part's."""
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
    """How much worse `value` is than `reference`, as a fraction (negative: better; 0
    for an INFO figure). From a reference of zero any worse value is infinitely worse."""
    if better is Better.INFO:
        return 0.0
    worse = reference - value if better is Better.HIGHER else value - reference
    if reference == 0:
        return math.inf if worse > 0 else (-math.inf if worse < 0 else 0.0)
    return worse / abs(reference)


def outlier(value: float, spread: Spread, bound: Bound, mad_k: float) -> bool:
    """Worse than `bound` x the median, or (from MAD_MIN_VALUES values on) more than
    `mad_k` scaled MADs off on the worse side when that is also at least MAD_FLOOR
    worse. Better than the median is never an outlier: a fast node is not a problem.
    """
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
    """`values` without their outliers on either side (more than `t` off, or the MAD
    rule), trimmed again against the new median until nothing more goes (a baseline
    from the healthy majority)."""
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
