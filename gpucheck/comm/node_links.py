"""Which node, and which node pair, is slow between nodes: pure functions, no torch.

A fabric's links are uniform by design: every NIC, cable and switch port between two
nodes runs at the same rate, so a node whose links read 0.65x the others' is not a
healthy variation but a NIC trained down, a bad cable or a port in trouble. The
intra-node rule (`gpucheck.peers.eliminate` at `--pair-threshold`, 0.5 x the median:
GPU pairs on one node differ by design, NVLink against PCIe) let such a node through.
Between nodes:

- **The cut** is `FABRIC_FRACTION` (0.9) x the reference, or the healthy pairs' own
  measured spread when that is larger (`spread_cut`: between the pairs, and between
  a pair's repeats; as compare judges a change against the runs' own noise, both
  within a run and between runs, gpucheck.analysis.noise).
  0.9 fits a fabric's health checks: Azure's node health checks for ND H100 v5
  (Azure/azurehpc-health-checks, conf/nd96isr_h100_v5.conf) fail a node whose 8-GPU
  all_reduce busbw falls below 460 GB/s (`check_nccl_allreduce 460.0`; about 480 is
  typical: a 4% shortfall) and a 400 Gb/s NIC (`check_hw_ib 400`) below 375 Gb/s
  GPUDirect RDMA (`check_ib_bw_gdr 375`: 6%); a 10% shortfall is past both.
- **Elimination**, as `gpucheck.peers.eliminate`: a node whose every pair in one
  direction is below the cut x the median of the pairs *without it* is the suspect
  (with 3 nodes, 4 of the 6 directed pairs involve any one node).
- **Only what the measurement resolves**: the typical (median) reading of every pair
  of the suspect direction must also lie below every reading of the pairs without it
  but `STRAY` (one: a single stray healthy repeat, a descheduled moment, does not hide
  a node slow in its readings). Typical, not best: one lucky repeat does not clear a
  link slow most of the time (issue 36 item 5); the second look tells noise apart.
- **A single node pair** of no suspect node keeps `eliminate`'s rule at
  `--pair-threshold` (0.5): one pair's figure cannot be told from the spread of the
  one or two pairs left beside it (3 nodes, one suspect: two), so a tighter cut there
  would blame whichever direction of a healthy pair reads lower.

The suspects are then measured again beside a known-good node pair (`gpucheck.peers.
pair_looks`), judged at the same cut (`gpucheck.comm.internode_verdicts`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpucheck.comm.looks import rate_bound
from gpucheck.peers import (
    Pair,
    Samples,
    Suspects,
    directed,
    eliminate,
    intermittent,
    known_good,
)
from gpucheck.stats import median, typical

FABRIC_FRACTION = 0.9
# Healthy readings a suspect node's readings may fail to be below: "below almost
# every healthy reading" (issue 21: a 0.65x node, every reading below almost every
# healthy one, was let through by "below every one").
STRAY = 1


@dataclass(frozen=True)
class NodeSuspects(Suspects):
    """`Suspects`, with the cut they were judged at (a fraction of the reference)."""

    cut: float = FABRIC_FRACTION


def spread_cut(healthy: Samples, fabric: float = FABRIC_FRACTION) -> tuple[float, float]:
    """(reference, cut): the median typical figure of `healthy`, and the fraction of it
    a slow figure is below: `fabric`, or 1 - the healthy pairs' own spread when that
    is larger. Their spread is the larger of how far the lowest pair's typical figure
    sits below the reference (between pairs) and how far a pair's lowest repeat
    falls below its own typical figure, the median over the pairs (within a pair:
    the median, so one pair's stray repeat does not set it)."""
    typicals = [typical(s) for s in healthy.values() if s]
    if not typicals:
        return 0.0, fabric
    reference = median(typicals)
    if reference <= 0:
        return reference, fabric
    between = 1 - min(typicals) / reference
    within = median(1 - min(s) / typical(s) for s in healthy.values()
                    if s and typical(s) > 0)
    return reference, max(0.0, min(fabric, 1 - max(between, within)))


def below_almost_all(mine: Sequence[float], healthy: Sequence[float], stray: int) -> bool:
    """Is every reading of `mine` below every healthy reading but the `stray` lowest?
    (Never with no more healthy readings than that: nothing would be left to judge by.)"""
    if not mine or len(healthy) <= stray:
        return False
    return max(mine) < sorted(healthy)[stray]


def _slow_direction(samples: Samples, pairs: Sequence[Pair], healthy: Samples,
                    fabric: float, stray: int) -> bool:
    """Every pair below the cut x the healthy pairs' median, and their readings below
    almost every healthy reading."""
    if not pairs or not healthy:
        return False
    reference, cut = spread_cut(healthy, fabric)
    if not all(typical(samples[p]) < cut * reference for p in pairs):
        return False
    return below_almost_all([typical(samples[p]) for p in pairs],
                            [v for s in healthy.values() for v in s], stray)


def slow_nodes(samples: Samples, fabric: float = FABRIC_FRACTION) -> dict[int, str]:
    """Nodes every one of whose pairs in one direction is slow against the pairs
    without them: "sending", "receiving" or "both" ways."""
    found: dict[int, str] = {}
    for m in sorted({m for pair in samples for m in pair}):
        without = {p: s for p, s in samples.items() if m not in p}
        sending = _slow_direction(samples, [p for p in samples if p[0] == m], without,
                                  fabric, STRAY)
        receiving = _slow_direction(samples, [p for p in samples if p[1] == m], without,
                                    fabric, STRAY)
        if sending or receiving:
            found[m] = "both" if sending and receiving else "sending" if sending else \
                "receiving"
    return found


def find_node_suspects(samples: Samples, pair_threshold: float,
                       fabric: float = FABRIC_FRACTION) -> NodeSuspects:
    """The slow nodes (at the fabric's cut) and node pairs (a pair of no suspect node:
    `eliminate` at `pair_threshold`, as before), the cut the nodes were judged
    at, and the known-good pairs to measure again beside them."""
    if not samples:
        return NodeSuspects(0.0, 0.0, cut=fabric)
    members = slow_nodes(samples, fabric)
    clean = {p: s for p, s in samples.items() if not set(p) & set(members)} or dict(samples)
    # One pair cannot be told from the spread of one or two others (3 nodes leave two
    # pairs without a suspect node): a single pair keeps the wider intra-node rule.
    single = eliminate(clean, rate_bound(pair_threshold)).pairs
    healthy = {p: s for p, s in clean.items() if p not in single} or clean
    reference, cut = spread_cut(healthy, fabric)
    slow = sorted({p for p in samples for m, way in members.items() if directed(p, m, way)}
                  | set(single))
    floor = min((v for s in healthy.values() for v in s), default=0.0)
    flapping = intermittent(samples, [p for p in slow if p not in single], reference,
                            rate_bound(cut)) + intermittent(samples, single, reference,
                                                            rate_bound(pair_threshold))
    return NodeSuspects(reference, floor, members, tuple(slow), (),
                        _references(samples, slow, members, reference),
                        tuple(sorted(flapping)), cut=cut)


def _references(samples: Samples, slow: Sequence[Pair], members: Mapping[int, str],
                reference: float) -> tuple[Pair, ...]:
    """The known-good pair nearest the reference (no suspect end) and its reverse when
    that is good too; none when nothing is slow."""
    good = sorted(p for p in samples if p not in slow and not set(p) & set(members))
    chosen = known_good({p: typical(samples[p]) for p in good}, (), reference) \
        if slow else None
    if chosen is None:
        return ()
    back = (chosen[1], chosen[0])
    return (chosen, back) if back in good else (chosen,)
