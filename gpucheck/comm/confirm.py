"""Which directed pairs (ranks on a node, or nodes) are slow, and whether a second
measurement confirms it: pure functions of plain numbers, no torch.

Three rules, the same for send/recv pairs on a node and for node-to-node links:

1. **Only what the measurement can resolve.** Each pair holds repeated timings
   (`samples`, GB/s). A pair is slow only when even its best sample is below
   `threshold` x the reference AND below the worst sample of every other healthy
   pair: those show how far noise alone reaches down. A pair below the threshold
   but within that spread is "too noisy to judge", said in a note, never a WARN.
2. **Elimination.** The member (rank or node) whose every outgoing pair, or every
   incoming pair, is below `threshold` x the median of the pairs WITHOUT it is the
   suspect: with 3 nodes, 4 of the 6 directed pairs involve any one node, so a
   median over all pairs would be the slow node's own. The reference for single
   pairs is then the median of the pairs without any suspect.
3. **Confirm before condemning.** Every slow pair, and every suspect's pairs with a
   known-good member, is measured again beside a known-good reference pair (as
   DCGM, Azure's HPC health checks and Google's cluster scanner re-test a suspect
   against nodes already known good). Slow again: confirmed. Fine the second time:
   "unstable", at most a WARN with action `rerun`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

Pair = tuple[int, int]
Samples = Mapping[Pair, Sequence[float]]


def best(samples: Sequence[float]) -> float:
    """The fastest reading: noise (a descheduled process, other traffic) only slows."""
    return max(samples)


def typical(samples: Sequence[float]) -> float:
    return float(statistics.median(samples))


@dataclass(frozen=True)
class Suspects:
    """What the first measurement found, and what to measure again."""

    reference_gbps: float  # median typical figure of the pairs without a suspect member
    floor_gbps: float  # the lowest reading of a healthy pair: noise reaches down to here
    members: dict[int, str] = field(default_factory=dict)  # member -> "sending", ...
    pairs: tuple[Pair, ...] = ()  # resolvably slow pairs (and a suspect's pairs)
    noisy: tuple[Pair, ...] = ()  # below the threshold, but within the spread
    references: tuple[Pair, ...] = ()  # known-good pairs to measure beside them

    @property
    def empty(self) -> bool:
        return not self.pairs


def slow_members(values: Mapping[Pair, float], threshold: float) -> dict[int, str]:
    """Members every one of whose pairs in one direction is below `threshold` x the
    median of the pairs without them: "sending", "receiving" or "both" ways."""
    members = sorted({m for pair in values for m in pair})
    found: dict[int, str] = {}
    for m in members:
        without = [v for (a, b), v in values.items() if m not in (a, b)]
        if not without:
            continue
        bound = threshold * float(statistics.median(without))
        out = [v < bound for (a, _), v in values.items() if a == m]
        into = [v < bound for (_, b), v in values.items() if b == m]
        sending, receiving = bool(out) and all(out), bool(into) and all(into)
        if sending or receiving:
            found[m] = "both" if sending and receiving else "sending" if sending else \
                "receiving"
    return found


def directed(pair: Pair, member: int, way: str) -> bool:
    """Is `pair` one of `member`'s pairs in the direction it is slow in?"""
    return (way in ("sending", "both") and pair[0] == member) or \
        (way in ("receiving", "both") and pair[1] == member)


def find_suspects(samples: Samples, threshold: float) -> Suspects:
    """Slow members and pairs of one group (a node's ranks, or the nodes)."""
    if not samples:
        return Suspects(0.0, 0.0)
    members = slow_members({p: best(s) for p, s in samples.items()}, threshold)
    reference, floor, slow, noisy = _classify(samples, members, threshold)
    # A member stays a suspect only when every pair that makes it one is resolvable;
    # without the others, the pairs are judged again.
    kept = {m: way for m, way in members.items()
            if all(p in slow for p in samples if directed(p, m, way))}
    if kept != members:
        members = kept
        reference, floor, slow, noisy = _classify(samples, members, threshold)
    return Suspects(reference, floor, members, tuple(slow), tuple(noisy),
                    _references(samples, slow, members, reference))


def _classify(samples: Samples, members: Mapping[int, str], threshold: float,
              ) -> tuple[float, float, list[Pair], list[Pair]]:
    """(reference, lowest healthy reading, slow pairs, too-noisy pairs)."""
    clean = {p: s for p, s in samples.items() if not set(p) & set(members)} or samples
    reference = float(statistics.median(typical(s) for s in clean.values()))
    healthy = {p: min(s) for p, s in clean.items() if best(s) >= threshold * reference}
    slow, noisy = [], []
    for pair, values in sorted(samples.items()):
        by_member = any(directed(pair, m, way) for m, way in members.items())
        if by_member or best(values) < threshold * reference:
            # Resolvable: even its best reading is below every reading of every other
            # healthy pair (their worst repeats show how far noise alone reaches down).
            floor = min((v for q, v in healthy.items() if q != pair), default=float("inf"))
            (slow if best(values) < floor else noisy).append(pair)
    return reference, min(healthy.values(), default=0.0), slow, noisy


def _references(samples: Samples, slow: Sequence[Pair], members: Mapping[int, str],
                reference: float) -> tuple[Pair, ...]:
    """The known-good pair closest to the reference (none of its ends suspect), and its
    reverse when that is good too, to be measured again beside the suspects; none
    when nothing is slow."""
    if not slow:
        return ()
    good = [p for p in samples if p not in slow and not set(p) & set(members)]
    if not good:
        return ()
    chosen = min(good, key=lambda p: (abs(typical(samples[p]) - reference), p))
    back = (chosen[1], chosen[0])
    return (chosen, back) if back in good else (chosen,)


@dataclass(frozen=True)
class Second:
    """A slow pair measured again: confirmed or not, and against what."""

    pair: Pair
    again_gbps: float | None  # the best re-measured sample; None: not measured again
    reference_gbps: float | None  # the known-good pairs' re-measured typical figure
    against: tuple[Pair, ...]  # the known-good pairs re-measured beside it

    def confirmed(self, threshold: float) -> bool | None:
        """True: slow again; False: fine the second time; None: not measured again."""
        if self.again_gbps is None or not self.reference_gbps:
            return None
        return self.again_gbps < threshold * self.reference_gbps


def second_look(suspects: Suspects, again: Samples, first_reference: float) -> list[Second]:
    """Each slow pair's second measurement against the known-good pairs measured with
    it (or, with none to measure, the first measurement's reference)."""
    refs = [p for p in suspects.references if again.get(p)]
    reference = typical([typical(again[p]) for p in refs]) if refs else first_reference
    return [Second(p, best(again[p]) if again.get(p) else None, reference, tuple(refs))
            for p in suspects.pairs]
