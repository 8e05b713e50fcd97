"""Rank 0's reading of the ranks' timed loops: the job's figures, each rank's pace
against the other ranks' at the same moments, and whether it held the job back (docs/bench.md,
"Stragglers"). Pure functions over the ranks' records, no torch."""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpucheck.bench.records import RankRecord
from gpucheck.distributed.nodes import group_by_node
from gpucheck.measure import Better, Bound
from gpucheck.stats import percentile

# The two kinds of straggler (straggler_kind).
SLOW_DEVICE = "device"  # its device (or CPU) time was slow too: it computed slower
HOST_STALL = "host"  # only its wall time was slow: its host did not run it


@dataclass(frozen=True)
class RankPace:
    """One rank's iterations against the other ranks' iterations at the same moments."""

    rank: int
    p50_ms: float
    p99_ms: float
    others_p50_ms: float  # the median over the other ranks of their p50_ms
    # Device time against the other ranks' iterations at the same moments: the median
    # ratio and the share above 1; then the same in wall time.
    vs_others: float
    slower_share: float
    wall_vs_others: float
    wall_slower_share: float
    # Loop over the other ranks' median loop: less its longest stall (hold_back), stalls
    # and all (whole), the second loop (again) and both loops (both; None: run once).
    hold_back: float = 1.0
    waited_ms: float = 0.0  # the other ranks' median wait at the end barriers
    whole: float = 1.0
    again: float | None = None
    both: float | None = None
    others_spread: float = 0.0  # the healthy spread in this run (_others_spread)


# The other ranks' own spread raises the hold-back bar on a noisy job: 3 median absolute
# deviations (about 2 standard deviations of a normal spread) of their whole loops.
HEALTHY_SPREAD_FACTOR = 3.0
MIN_SPREAD_RANKS = 3


@dataclass(frozen=True)
class _Against:
    """One clock's comparison: the median ratio to the others, the share above 1."""

    median: float
    share: float


def wall_ms(record: RankRecord) -> Sequence[float]:
    """Each iteration's wall time: measured on CPU ranks; on a GPU the device time
    (CUDA events run on the device's wall clock)."""
    if len(record.iter_wall_ms) == len(record.iter_ms):
        return record.iter_wall_ms
    return record.iter_ms


def rank_paces(records: Sequence[RankRecord]) -> tuple[RankPace, ...]:
    """Each rank's iterations against what the other ranks' took at the same time, in
    device time and in wall time."""
    device = _against_others(records, lambda r: r.iter_ms)
    wall = _against_others(records, wall_ms)
    p50 = {r.rank: percentile(r.iter_ms, 50) for r in records}
    held = {r.rank: _hold_back(records, r) for r in records}
    return tuple(RankPace(
        rank=r.rank, p50_ms=p50[r.rank], p99_ms=percentile(r.iter_ms, 99),
        others_p50_ms=statistics.median(v for k, v in p50.items() if k != r.rank),
        vs_others=device[r.rank].median, slower_share=device[r.rank].share,
        wall_vs_others=wall[r.rank].median, wall_slower_share=wall[r.rank].share,
        hold_back=held[r.rank][0], waited_ms=held[r.rank][1], whole=held[r.rank][2],
        again=_against_median(records, r, lambda x: x.again_wall_s),
        both=_against_median(records, r, lambda x: None if x.again_wall_s is None
                             else x.wall_s + x.again_wall_s),
        others_spread=_others_spread(records, r.rank),
    ) for r in records)


def _against_median(records: Sequence[RankRecord], record: RankRecord,
                    seconds: Callable[[RankRecord], float | None]) -> float | None:
    """`seconds` of this rank over the other ranks' median of it; None when any rank
    lacks it."""
    every = {r.rank: seconds(r) for r in records}
    mine = every[record.rank]
    others = [v for rank, v in every.items() if rank != record.rank]
    if mine is None or any(v is None for v in others):
        return None
    return _ratio(mine, statistics.median(v for v in others if v is not None))


def _others_spread(records: Sequence[RankRecord], rank: int) -> float:
    """HEALTHY_SPREAD_FACTOR median absolute deviations of the other ranks' whole loops
    over their median (0 with fewer than MIN_SPREAD_RANKS of them)."""
    walls = [r.wall_s for r in records if r.rank != rank]
    if len(walls) < MIN_SPREAD_RANKS:
        return 0.0
    middle = statistics.median(walls)
    deviation = statistics.median(abs(w - middle) for w in walls)
    return HEALTHY_SPREAD_FACTOR * _ratio(deviation, middle)


def _against_others(records: Sequence[RankRecord],
                    times_of: Callable[[RankRecord], Sequence[float]]) -> dict[int, _Against]:
    """Each iteration on the rank's own clock from the common start barrier, against the
    median of the other ranks' iterations running at its midpoint (the other ranks'
    median iteration once they had all finished)."""
    timelines = {r.rank: (_ends(r), times_of(r)) for r in records}
    p50 = {r.rank: percentile(times_of(r), 50) for r in records}
    result = {}
    for r in records:
        others_p50 = statistics.median(v for k, v in p50.items() if k != r.rank)
        took = list(times_of(r))
        refs = []
        ends = _ends(r)
        starts = [0.0, *ends[:-1]]
        for middle in [(start + end) / 2 for start, end in zip(starts, ends, strict=True)]:
            others = [t for k, line in timelines.items() if k != r.rank
                      if (t := _running_at(line, middle)) is not None]
            refs.append(statistics.median(others) if others else others_p50)
        ratios = [_ratio(t, ref) for t, ref in zip(took, refs, strict=True)]
        result[r.rank] = _Against(statistics.median(ratios),
                                  sum(1 for x in ratios if x > 1) / len(ratios))
    return result


def _hold_back(records: Sequence[RankRecord],
               record: RankRecord) -> tuple[float, float, float]:
    """(hold-back, waited ms, whole): its loop over the other ranks' median loop, the
    smaller of with and without each loop's longest stall; the other ranks' median wait
    at the end barriers; the loop ratio with its stalls."""
    others = [r for r in records if r.rank != record.rank]
    whole = _ratio(record.wall_s, statistics.median(r.wall_s for r in others))
    steady = _ratio(_steady_loop_s(record), statistics.median(map(_steady_loop_s, others)))
    waited = statistics.median(max(0.0, r.span_s - r.wall_s) for r in others)
    # The smaller of the two: without the hiccups a rank held the job back only when it
    # did with them too (taking one healthy rank's slow first iteration out, and not
    # the other's, must not make a straggler of the other).
    return min(whole, steady), waited * 1e3, whole


def _steady_loop_s(record: RankRecord) -> float:
    """The loop's wall time less its longest iteration's excess over the median one."""
    walls = wall_ms(record)
    return record.wall_s - max(0.0, max(walls) - percentile(walls, 50)) / 1e3


def _ends(record: RankRecord) -> list[float]:
    """When each iteration ended, in ms from the start barrier on the rank's clock."""
    if len(record.iter_end_ms) == len(record.iter_ms):
        return list(record.iter_end_ms)
    return list(itertools.accumulate(record.iter_ms))


def _running_at(line: tuple[list[float], Sequence[float]], moment_ms: float) -> float | None:
    """The time of the iteration running at `moment_ms`; None once the loop was over."""
    ends, times = line
    index = bisect.bisect_left(ends, moment_ms)
    return times[index] if index < len(times) else None


def straggler_kind(pace: RankPace, threshold: float) -> str | None:
    """None unless the rank held the job back; then SLOW_DEVICE when its median
    device-time ratio is above 1 + `threshold` and explains at least half of its
    hold-back, else HOST_STALL."""
    if not held_back(pace, threshold):
        return None
    if slower(threshold).worse(pace.vs_others, 1.0) and _device_explains(pace):
        return SLOW_DEVICE
    return HOST_STALL


def slower(threshold: float) -> Bound:
    """More than `threshold` slower, built directly: --straggler-threshold may be 1 or
    more, which a shortfall of a higher-is-better figure cannot be."""
    return Bound(1 + threshold, Better.LOWER)


def _device_explains(pace: RankPace) -> bool:
    """Its slower device time explains at least half of its hold-back, in log terms
    (compare's host-bound rule, gpucheck.analysis.compare)."""
    held = max(pace.hold_back, pace.wall_vs_others, 1.0)
    return math.log(max(pace.vs_others, 1.0)) >= 0.5 * math.log(held)


def hold_back_bar(pace: RankPace, threshold: float) -> float:
    """1 + the threshold, or + the other ranks' own spread when that is larger."""
    return 1 + max(threshold, pace.others_spread)


def held_back(pace: RankPace, threshold: float) -> bool:
    """A suspect `confirmed` over both loops; with one loop, that loop without its
    longest stall past the bar."""
    if not suspect(pace, threshold):
        return False
    if pace.both is not None:
        return confirmed(pace, threshold)
    return Bound(hold_back_bar(pace, threshold), Better.LOWER).worse(pace.hold_back, 1.0)


def suspect(pace: RankPace, threshold: float) -> bool:
    """Its whole loop, stalls and all, past the bar: the loop is run again (`look_again`)."""
    return Bound(hold_back_bar(pace, threshold), Better.LOWER).worse(pace.whole, 1.0)


def confirmed(pace: RankPace, threshold: float) -> bool:
    bar = Bound(hold_back_bar(pace, threshold), Better.LOWER)
    return (pace.both is not None and suspect(pace, threshold)
            and bar.worse(pace.both, 1.0))


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0


DEFAULT_STRAGGLER_THRESHOLD = 0.10
# A straggler is judged on its typical iteration (docs/bench.md, "Stragglers"):
# fewer iterations than this give a median that one or two hiccups can move.
MIN_JUDGED_ITERS = 5


@dataclass(frozen=True)
class NodeSummary:
    """The ranks of one node (same node_rank and host)."""

    node_rank: int
    host: str
    ranks: tuple[int, ...]
    images: int
    median_wall_s: float
    slowest_wall_s: float
    images_per_s: float  # the node's images / its slowest rank's wall time
    vs_median: float  # the node's median wall / the median over nodes
    slow: bool


@dataclass(frozen=True)
class BenchSummary:
    """Rank 0's view of the whole job."""

    n_ranks: int
    job_wall_s: float
    summed_device_s: float
    total_images: int
    aggregate_images_per_s: float  # all images / job wall time
    median_wall_s: float
    spread: float  # slowest rank's wall / median wall
    parallel_efficiency: float  # summed device busy time / (N x job wall)
    vs_median: tuple[float, ...]  # per rank, wall / median wall
    stragglers: tuple[int, ...]  # ranks `threshold` slower in device or wall time (pace.py)
    threshold: float
    nodes: tuple[NodeSummary, ...]
    paces: tuple[RankPace, ...] = ()  # per rank; empty when not judged (see `judged`)
    judged: str = "yes"  # "yes", or why stragglers were not judged


def job_wall_s(records: Sequence[RankRecord]) -> float:
    """Common start to the last rank's end, without comparing host clocks."""
    return max(max(r.wall_s, r.span_s) for r in records)


def aggregate(records: Sequence[RankRecord],
              threshold: float = DEFAULT_STRAGGLER_THRESHOLD) -> BenchSummary:
    """Every rank's record (in any order) combined into the job's figures."""
    if not records:
        raise ValueError("no rank records to aggregate")
    ordered = sorted(records, key=lambda r: r.rank)
    wall = job_wall_s(ordered)
    median = statistics.median(r.wall_s for r in ordered)
    vs_median = tuple(_ratio(r.wall_s, median) for r in ordered)
    summed_device = sum(r.device_s for r in ordered)
    images = sum(r.images for r in ordered)
    judged = unjudged_reason(ordered)
    paces = rank_paces(ordered) if judged == "yes" else ()
    return BenchSummary(
        n_ranks=len(ordered),
        job_wall_s=wall,
        summed_device_s=summed_device,
        total_images=images,
        aggregate_images_per_s=_ratio(images, wall),
        median_wall_s=median,
        spread=max(vs_median),
        parallel_efficiency=_ratio(summed_device, len(ordered) * wall),
        vs_median=vs_median,
        stragglers=tuple(p.rank for p in paces if straggler_kind(p, threshold) is not None),
        threshold=threshold,
        nodes=node_summaries(ordered, threshold),
        paces=paces,
        judged=judged,
    )


def look_again(records: Sequence[RankRecord], threshold: float) -> bool:
    """Whether the ranks run their timed loop again: some rank is a `suspect`. Every
    rank decides alike from the same gathered records."""
    if unjudged_reason(records) != "yes" or any(r.again_wall_s is not None for r in records):
        return False
    return any(suspect(p, threshold) for p in rank_paces(records))


def unjudged_reason(records: Sequence[RankRecord]) -> str:
    """"yes" when stragglers can be judged, else why not."""
    if len(records) < 2:
        return "one rank, no other rank to compare with"
    fewest = min(len(r.iter_ms) for r in records)
    if fewest < MIN_JUDGED_ITERS:
        return (f"{fewest} timed iteration(s) per rank, fewer than the {MIN_JUDGED_ITERS} "
                "a typical iteration needs")
    return "yes"


def node_summaries(records: Sequence[RankRecord], threshold: float) -> tuple[NodeSummary, ...]:
    """Ranks grouped by node; a node whose median rank is `threshold` slower is slow."""
    by_rank = {r.rank: r for r in records}
    rank_nodes = [{"rank": r.rank, "node_rank": r.node_rank, "host": r.host} for r in records]
    groups = {node: [by_rank[rank] for rank in ranks]
              for node, ranks in group_by_node(rank_nodes).items()}
    medians = {node: statistics.median(r.wall_s for r in group) for node, group in groups.items()}
    overall = statistics.median(medians.values())
    nodes = []
    for node, group in groups.items():
        slowest = max(r.wall_s for r in group)
        vs_median = _ratio(medians[node], overall)
        nodes.append(NodeSummary(
            node_rank=node.node_rank,
            host=node.host,
            ranks=tuple(r.rank for r in group),
            images=sum(r.images for r in group),
            median_wall_s=medians[node],
            slowest_wall_s=slowest,
            images_per_s=_ratio(sum(r.images for r in group), slowest),
            vs_median=vs_median,
            slow=len(groups) > 1 and slower(threshold).worse(medians[node], overall),
        ))
    return tuple(nodes)
