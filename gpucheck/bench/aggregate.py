"""Per-rank timing records and their aggregation: pure functions, no torch.

The clocks. Ranks may sit on different hosts whose clocks are not synchronised,
so no raw timestamp is ever compared across ranks. Every rank measures two
intervals on its own monotonic clock, both starting when it leaves the common
start barrier:
- `wall_s`: until its own timed loop ended (after a device synchronisation);
- `span_s`: until it left the common end barrier, which no rank can leave
  before the last rank has finished its loop.
The job wall time is the longest interval any rank saw, `max(wall_s, span_s)`
over ranks: it runs from the common start to the last rank's end, is at least
every rank's own time, and over-counts at most the barrier's exit skew. When the
loop runs in segments (CPU ranks, `gpucheck.bench.layout`), each segment has its
own start and end barriers and both intervals add up the segments' windows, so
the untimed work between segments counts in neither.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from gpucheck.bench.pace import RankPace, is_straggler, rank_paces, slower, suspect
from gpucheck.bench.records import RankRecord
from gpucheck.distributed.nodes import group_by_node

# RankRecord lives in gpucheck.bench.records (pace reads it too: no import circle);
# rank_paces in gpucheck.bench.pace. Both stay importable from here.
__all__ = ["DEFAULT_STRAGGLER_THRESHOLD", "MIN_JUDGED_ITERS", "BenchSummary", "NodeSummary",
           "RankPace", "RankRecord", "aggregate", "job_wall_s", "look_again", "node_summaries",
           "rank_paces", "unjudged_reason"]

DEFAULT_STRAGGLER_THRESHOLD = 0.10
# A straggler is judged on its typical iteration (docs/bench.md, "Stragglers"):
# fewer iterations than this give a median that one or two hiccups can move.
MIN_JUDGED_ITERS = 5


@dataclass(frozen=True)
class NodeSummary:
    """The ranks of one node (same node_rank and host), for multi-node runs."""

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
    """Common start to the last rank's end, measured without comparing host clocks."""
    return max(max(r.wall_s, r.span_s) for r in records)


def aggregate(records: Sequence[RankRecord],
              threshold: float = DEFAULT_STRAGGLER_THRESHOLD) -> BenchSummary:
    """Combine every rank's record (in any order) into the job's numbers."""
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
        stragglers=tuple(p.rank for p in paces if is_straggler(p, threshold)),
        threshold=threshold,
        nodes=node_summaries(ordered, threshold),
        paces=paces,
        judged=judged,
    )


def look_again(records: Sequence[RankRecord], threshold: float) -> bool:
    """Whether the ranks run their timed loop a second time: some rank's loop held
    the job back (gpucheck.bench.pace.suspect). Every rank decides from the same
    gathered records, so all decide alike without another message."""
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
    """Group ranks by node; a node whose median rank is `threshold` slower is slow."""
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


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0
