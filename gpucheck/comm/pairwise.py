"""Send/recv bandwidth of every ordered pair of ranks on a node, one pair at a time per
node, then the slow pairs measured again beside a known-good pair (docs/comm.md)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import Any

from gpucheck.comm.collectives import (
    Clock,
    NullClock,
    Work,
    back_to_back,
    make_clock,
    started,
    time_batch,
)
from gpucheck.comm.records import PairRow
from gpucheck.comm.verdicts import ELEMENT_BYTES, ClassKey, suspects_by_node
from gpucheck.confirm import remeasure
from gpucheck.context import RunContext
from gpucheck.distributed import progress
from gpucheck.distributed.deadline import gather_objects, synchronize
from gpucheck.distributed.nodes import group_by_node
from gpucheck.distributed.session import barrier
from gpucheck.peers import Suspects
from gpucheck.records import R


def _side_by_side(per_node: Sequence[Sequence[tuple[int, int]]]) -> list[list[tuple[int, int]]]:
    """Steps of (src, dst) pairs: step k holds every node's k-th pair."""
    steps = max((len(p) for p in per_node), default=0)
    return [[p[k] for p in per_node if k < len(p)] for k in range(steps)]


def pair_schedule(roster: Sequence[Mapping[str, Any]]) -> list[list[tuple[int, int]]]:
    """Every node's ordered pairs, nodes side by side."""
    return _side_by_side([[(a, b) for a in ranks for b in ranks if a != b]
                          for ranks in group_by_node(roster).values()])


DEFAULT_REPEATS = 3


def _side(me: int, src: int, dst: int, buf: Any, ack: Any,
          iters: int) -> list[Callable[[], Work]]:
    """This rank's launches: `iters` isends then the ack's irecv on the sender, the mirror
    image on the receiver."""
    import torch.distributed as dist

    if me == src:
        return [lambda: started(dist.isend(buf, dst))] * iters + [
            lambda: started(dist.irecv(ack, dst))]
    return [lambda: started(dist.irecv(buf, src))] * iters + [
        lambda: started(dist.isend(ack, src))]


def _align(me: int, src: int, dst: int, flag: Any) -> Callable[[], Work]:
    """The untimed op that aligns a pair's start on the device (NCCL): the receiver sends
    one element, before the batch, so NCCL matches it first."""
    import torch.distributed as dist

    if me == src:
        return lambda: started(dist.irecv(flag, dst))
    return lambda: started(dist.isend(flag, src))


def _time_pair_samples(src: int, dst: int, size_bytes: int, iters: int, device: str,
                       repeats: int, wait_s: float) -> list[float]:
    """`repeats` timed batches after one warm-up: GB/s each on the sender, [] on the
    receiver."""
    import torch
    import torch.distributed as dist

    where = "cuda" if device == "cuda" else "cpu"
    buf = torch.zeros(max(size_bytes // ELEMENT_BYTES, 1), device=where)
    ack, flag = torch.zeros(1, device=where), torch.zeros(1, device=where)
    me = dist.get_rank()
    in_a_row = back_to_back()
    # Warm-up: the first NCCL send/recv between two ranks creates their communicator.
    time_batch(_side(me, src, dst, buf, ack, 1), NullClock(), in_a_row, wait_s)
    synchronize(device)
    samples = []
    for _ in range(repeats):
        clock: Clock = make_clock(device) if me == src else NullClock()
        align = _align(me, src, dst, flag) if in_a_row else None
        elapsed = time_batch(_side(me, src, dst, buf, ack, iters), clock, in_a_row,
                             wait_s, align)
        if me == src:
            samples.append(size_bytes * iters / elapsed / 1e9)
    return samples


def sender_paths(roster: Sequence[Mapping[str, Any]], me: int) -> dict[tuple[int, int], str]:
    """(me, peer) -> the path class (NV#, PIX, ... SYS) between this rank's GPU and each
    other GPU of its node, through NVML; {} on CPU ranks or without NVML."""
    from gpucheck.probes.gpus import paths_or_none

    mine = next((r for r in roster if int(r["rank"]) == me), None)
    if mine is None or not mine.get("pci_bus_id"):
        return {}
    peers = [r for r in roster if r["node_rank"] == mine["node_rank"] and int(r["rank"]) != me
             and r.get("pci_bus_id")]
    paths, _ = paths_or_none([mine["pci_bus_id"], *(p["pci_bus_id"] for p in peers)])
    return {(me, int(p["rank"])): paths[(0, i)].kind for i, p in enumerate(peers, start=1)
            if (0, i) in paths and paths[(0, i)].kind != "n/a"}


def _run_steps(steps: Sequence[Sequence[tuple[int, int]]], node_of: Mapping[int, int],
               size_bytes: int, iters: int, device: str, repeats: int,
               again: bool, paths: Mapping[tuple[int, int], str] | None = None,
               *, ctx: RunContext) -> list[PairRow]:
    """Each step's pairs side by side (one per node), a barrier between steps; the rows
    this rank sent."""
    import torch.distributed as dist

    me = dist.get_rank()
    mine = []
    for step in steps:
        for src, dst in step:
            if me in (src, dst):
                progress.set_step(ctx, f"send/recv rank {src} -> rank {dst}"
                                  + (" (measured again)" if again else ""))
                samples = _time_pair_samples(src, dst, size_bytes, iters, device, repeats,
                                             ctx.session.wait_s)
                if me == src:
                    mine.append(PairRow(
                        src=src, dst=dst, node_rank=node_of[src], size_bytes=size_bytes,
                        bandwidth_gbps=round(statistics.median(samples), 4),
                        samples_gbps=tuple(round(x, 4) for x in samples),
                        path=(paths or {}).get((src, dst))))
        progress.set_step(ctx, "barrier after a pair")
        barrier(ctx.session.wait_s)
    return mine


def measure_pairs(roster: Sequence[Mapping[str, Any]], size_bytes: int, iters: int,
                  device: str, repeats: int = 1, again: bool = False,
                  *, ctx: RunContext) -> list[PairRow]:
    """Run the schedule; the rows this rank sent. `again`: a second look."""
    import torch.distributed as dist

    node_of = {int(r["rank"]): int(r["node_rank"]) for r in roster}
    paths = sender_paths(roster, dist.get_rank()) if device == "cuda" else {}
    return _run_steps(pair_schedule(roster), node_of, size_bytes, iters, device, repeats,
                      again, paths, ctx=ctx)


def second_look_steps(plans: Mapping[ClassKey, Suspects]) -> list[list[tuple[int, int]]]:
    """Per node: each path class's known-good pair(s), then its slow pairs, one after the
    other; nodes side by side."""
    by_node: dict[int, list[tuple[int, int]]] = {}
    for (node, _), plan in sorted(plans.items()):
        mine = by_node.setdefault(node, [])
        mine += [p for p in (*plan.references, *plan.pairs) if p not in mine]
    return _side_by_side([by_node[n] for n in sorted(by_node)])


def run_pairwise(roster: Sequence[Mapping[str, Any]], size_bytes: int, iters: int,
                 device: str, repeats: int, threshold: float,
                 *, ctx: RunContext) -> tuple[list[PairRow], list[PairRow]]:
    """Measure every pair, gather them everywhere, then measure the slow ones again beside
    a known-good pair, following rank 0's plan (`gpucheck.confirm.remeasure`); both lists."""
    import torch.distributed as dist

    node_of = {int(r["rank"]): int(r["node_rank"]) for r in roster}
    pairs = gather_rows(measure_pairs(roster, size_bytes, iters, device, repeats,
                                      ctx=ctx), ctx)

    def planned() -> dict[ClassKey, Suspects]:
        return {n: s for n, s in suspects_by_node(pairs, threshold).items() if not s.empty}

    def again(plans: dict[ClassKey, Suspects]) -> list[PairRow]:
        return gather_rows(_run_steps(second_look_steps(plans), node_of, size_bytes, iters,
                                      device, repeats, True, ctx=ctx), ctx)

    return pairs, remeasure(dist.get_rank(), planned, again, ctx)[1] or []


def gather_rows(mine: list[R], ctx: RunContext, step: str = "gathering pairwise results",
                key: tuple[str, ...] = ("src", "dst")) -> list[R]:
    """Every rank's rows, in one list sorted by the `key` fields (pairs, or links)."""
    progress.set_step(ctx, step)
    return sorted((p for rows in gather_objects(mine, ctx) for p in rows), key=attrgetter(*key))
