"""stress's copy phases on a rank: pinned host<->device copies (each GPU alone, then all at
once, measured again when a rank is a suspect) and the peer-copy matrix of each node.
CPU ranks skip both: there is no host<->device or peer link to measure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpucheck.confirm import remeasure
from gpucheck.distributed import progress
from gpucheck.distributed.session import roster
from gpucheck.distributed.world import host_name
from gpucheck.records import as_dict
from gpucheck.stress.copies import copy_buffers, host_copies, peer_matrix
from gpucheck.stress.numa import read_link
from gpucheck.stress.parking import host_wait
from gpucheck.stress.rank import RankContext, barrier, gather, publish
from gpucheck.stress.records import CopyRow
from gpucheck.stress.verdicts import copy_suspects

CPU_SKIP = "CPU ranks: there is no host<->device or peer link to measure"


def copies_phase(ctx: RankContext, result: dict[str, Any]) -> None:
    """Pinned host copies: each GPU alone (local ranks take turns), then all at once."""
    if ctx.spec.device != "cuda":
        result["copies"] = {"skipped": CPU_SKIP}
        return
    rows = gather(ctx, copy_row(ctx, result))
    result["copies"] = {"rows": rows}
    spec = ctx.spec

    def again(_: Any) -> list[Any]:  # confirm before condemning: every rank copies again
        publish(ctx, result)
        progress.set_step(ctx.run, "copies: measured again")
        return gather(ctx, copy_row(ctx, result))

    _, second = remeasure(ctx.world.rank, lambda: copy_suspects(
        rows, result["ranks"], spec.copy_fraction, spec.peer_fraction), again, ctx.run)
    if second is not None:
        result["copies"]["again"] = second


def copy_row(ctx: RankContext, result: dict[str, Any]) -> dict[str, Any]:
    """This rank's copies alone (local ranks take turns) and all at once."""
    import torch

    world = ctx.world
    host, dev = copy_buffers(ctx.device)
    alone = None
    # As many turns as the largest node has ranks: every rank passes every barrier.
    turns = 1 + max(int(r["local_rank"]) for r in result["ranks"])
    for turn in range(turns):
        barrier(ctx)
        if world.local_rank == turn:
            alone = host_copies(world.rank, "alone", host, dev)
    barrier(ctx)
    together = host_copies(world.rank, "together", host, dev)
    # Read under load: an idle GPU's link may have dropped its speed to save power.
    link = read_link(ctx.bus_id) if ctx.bus_id else None
    del host, dev
    torch.cuda.empty_cache()
    return as_dict(CopyRow(
        rank=world.rank, size_bytes=together.size_bytes,
        h2d_alone_gbps=alone.h2d_gbps if alone else None,
        d2h_alone_gbps=alone.d2h_gbps if alone else None,
        h2d_together_gbps=together.h2d_gbps, d2h_together_gbps=together.d2h_gbps,
        link=link.label() if link else None, link_gbps=link.rate_gbps if link else None))


def p2p_phase(ctx: RankContext, result: dict[str, Any]) -> None:
    if ctx.spec.device != "cuda":
        result["p2p"] = {"skipped": CPU_SKIP}
        return
    node_ranks = [r.rank for r in roster(ctx.run) if r.node_rank == ctx.world.node_rank]
    result["p2p"] = peer_phase(ctx, lambda n: peer_matrix(n, ctx.spec.copy_fraction),
                               node_ranks)


def peer_phase(ctx: RankContext, measure: Callable[[int], dict[str, Any]],
               node_ranks: list[int]) -> dict[str, Any]:
    """Each node's local rank 0 measures the peer matrix; the other ranks of its node
    (`node_ranks`) are parked on the host (`gpucheck.stress.parking`), not in the
    gather's NCCL kernel."""
    world, spec = ctx.world, ctx.spec
    parking = host_wait(spec.backend, world.world_size, node_ranks, spec.timeout_s)
    barrier(ctx)
    mine = None
    if world.local_rank == 0:
        mine = {"node_rank": world.node_rank, "host": host_name(),
                **measure(world.local_world_size)}
    if parking is not None:
        parking.wait()
    return {"nodes": [m for m in gather(ctx, mine) if m is not None]}
