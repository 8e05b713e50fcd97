"""The comm sweep on every rank (collectives, pairs, a slow node measured again,
node-to-node rounds, the NCCL transport); rank 0 gathers the results and publishes them
after every message size, so a later failure loses nothing measured (docs/comm.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gpucheck.comm.collectives import (
    DEFAULT_MIN_BYTES,
    default_max_bytes,
    element_count,
    free_bytes,
    measure,
    sweep_sizes,
)
from gpucheck.comm.internode import run_internode
from gpucheck.comm.nccl_log import nccl_logging, rank_entry
from gpucheck.comm.pairwise import DEFAULT_REPEATS, gather_rows, measure_pairs, run_pairwise
from gpucheck.comm.records import PairRow, crossing
from gpucheck.comm.verdicts import COLLECTIVES, node_figures, plan, size_result
from gpucheck.confirm import remeasure
from gpucheck.context import RunContext
from gpucheck.distributed import faultwatch, progress
from gpucheck.distributed.deadline import gather_objects, settle
from gpucheck.distributed.nodes import group_by_node
from gpucheck.distributed.session import process_group, roster
from gpucheck.distributed.world import World
from gpucheck.peers import SLOW_NODE_FRACTION
from gpucheck.stats import human_bytes


@dataclass(frozen=True)
class CommSpec:
    """Everything a rank needs to run the sweep (picklable: it crosses to spawned ranks)."""

    device: str
    backend: str
    timeout_s: float
    collectives: tuple[str, ...] = COLLECTIVES
    min_bytes: int = DEFAULT_MIN_BYTES
    max_bytes: int | None = None  # None: from free device memory
    iters: int = 20
    warmup: int = 5
    pairwise: bool = True
    pair_bytes: int | None = None  # None: the sweep's largest size
    pair_iters: int = 10
    pair_repeats: int = DEFAULT_REPEATS  # timed batches per pair: their spread is the noise
    pair_threshold: float = 0.5  # slow pairs below this x the median are measured again
    fault_watch: bool = True  # watch every rank's GPU (gpucheck.distributed.faultwatch)
    internode: bool = True  # node-to-node rounds (gpucheck.comm.internode), 2+ nodes only


def _agreed_max_bytes(spec: CommSpec, world: World) -> int:
    """The smallest of the ranks' bounds, so every rank runs the same sizes."""
    import torch
    import torch.distributed as dist

    if spec.max_bytes is not None:
        return spec.max_bytes
    mine = default_max_bytes(spec.device, world.world_size, free_bytes(spec.device))
    value = torch.tensor([mine], dtype=torch.int64,
                         device="cuda" if spec.device == "cuda" else "cpu")
    _bounded(dist.all_reduce(value, op=dist.ReduceOp.MIN, async_op=True), spec,
             "agreeing on the largest size")
    return int(value.item())


def _bounded(work: Any, spec: CommSpec, what: str) -> None:
    """Wait for an async collective under gpucheck's deadline, then raise its error."""
    settle([work] if work is not None else [], spec.timeout_s, what)
    if work is not None:
        work.wait()


def measure_size(collective: str, size: int, spec: CommSpec, world: World,
                 ctx: RunContext) -> dict[str, Any]:
    """One collective at one size on every rank, its timings gathered: the slowest rank's
    is the row's (preflight composes it too)."""
    import torch
    import torch.distributed as dist

    progress.set_step(ctx, f"{collective} {size} bytes")
    timing = measure(collective, size, spec.iters, spec.warmup, spec.device, spec.timeout_s)
    where = "cuda" if spec.device == "cuda" else "cpu"
    mine = torch.tensor([timing.time_s, float(timing.wrong)], dtype=torch.float64, device=where)
    every = [torch.zeros_like(mine) for _ in range(world.world_size)]
    _bounded(dist.all_gather(every, mine, async_op=True), spec, "gathering timings")
    count = element_count(collective, size, world.world_size)
    return crossing(size_result(collective, size, count, world.world_size,
                                [float(t[0]) for t in every], [int(t[1]) for t in every]))


def _nodes_again(spec: CommSpec, world: World, infos: list[dict[str, Any]],
                 result: dict[str, Any], pairs: list[PairRow], largest: int,
                 ctx: RunContext) -> dict[str, Any] | None:
    """A slow node's pairs measured again beside a known-good node's (or the largest
    all_reduce), after rank 0's plan; None when no node is slow."""
    figures = node_figures(infos, pairs, result["collectives"].get("all_reduce") or [])

    def again(wanted: dict[str, Any]) -> dict[str, Any]:
        progress.set_step(ctx, "slow node: measured again")
        progress.bar_step(ctx, "a slow node: measured again beside a known-good node")
        if wanted["kind"] == "pairs":
            chosen = {*wanted["suspects"], wanted["known_good"]}
            subset = [r for r in infos if int(r["node_rank"]) in chosen]
            mine = measure_pairs(subset, spec.pair_bytes or largest, spec.pair_iters,
                                 spec.device, spec.pair_repeats, again=True, ctx=ctx)
            return wanted | {"pairs": [crossing(p) for p in gather_rows(mine, ctx)]}
        row = measure_size("all_reduce", largest, spec, world, ctx)
        return wanted | {"rank_times_us": row["rank_times_us"]}

    return remeasure(world.rank, lambda: plan(figures, SLOW_NODE_FRACTION), again,
                     ctx)[1]


# torch.distributed's gloo backend sends and receives host tensors only: on a CUDA
# buffer its send writes from a device pointer and the pair's connection drops (seen on
# an H100, torch 2.11). Its collectives take CUDA buffers; point-to-point does not.
GLOO_CUDA_P2P = ("gloo sends and receives host memory only (torch.distributed: send/recv "
                 "take CPU tensors on gloo): run with --backend nccl to measure GPU pairs")


def p2p_unsupported(spec: CommSpec) -> str | None:
    """Why this backend and device cannot send/recv, or None when they can."""
    return GLOO_CUDA_P2P if spec.backend == "gloo" and spec.device == "cuda" else None


def _pairs_and_nodes(spec: CommSpec, world: World, infos: list[dict[str, Any]], largest: int,
                     result: dict[str, Any], ctx: RunContext) -> None:
    """Pairwise send/recv, a slow node measured again, then node-to-node rounds; no
    send/recv where the backend cannot send the device's buffers (`p2p_skipped`)."""
    result["p2p_skipped"] = skipped = p2p_unsupported(spec)
    size = spec.pair_bytes or largest
    pairs: list[PairRow] = []
    if spec.pairwise and world.world_size > 1 and not skipped:
        progress.bar_step(ctx, f"pairwise send/recv, {human_bytes(size)}")
        pairs, again = run_pairwise(infos, size, spec.pair_iters, spec.device,
                                    spec.pair_repeats, spec.pair_threshold, ctx=ctx)
        result["pairwise"] = {"size_bytes": size, "iters": spec.pair_iters,
                              "repeats": spec.pair_repeats, "pairs": [crossing(p) for p in pairs],
                              "again": [crossing(p) for p in again]}
    if len(group_by_node(infos)) > 1:  # with no pairs measured, by its all_reduce
        result["nodes_again"] = _nodes_again(spec, world, infos, result, pairs, largest, ctx)
    if spec.internode and len(group_by_node(infos)) > 1 and not skipped:
        progress.bar_step(ctx, "node-to-node rounds")
        result["internode"] = run_internode(infos, size, spec.pair_iters, spec.device,
                                            spec.pair_threshold, spec.pair_repeats, ctx=ctx)


def comm_worker(ctx: RunContext, spec: CommSpec) -> dict[str, Any] | None:
    """Run the sweep; rank 0 returns the results, the other ranks None."""
    with nccl_logging(spec.backend) as nccl_folder, \
            process_group(spec.backend, spec.device, spec.timeout_s,
                          fault_watch=spec.fault_watch, ctx=ctx) as world:
        faults = faultwatch.of(ctx)
        infos = [asdict(i) for i in roster(ctx)]
        sizes = sweep_sizes(spec.min_bytes, _agreed_max_bytes(spec, world))
        result: dict[str, Any] = {
            "world_size": world.world_size, "device": spec.device, "backend": spec.backend,
            "iters": spec.iters, "warmup": spec.warmup, "sizes_bytes": sizes,
            "ranks": infos, "collectives": {c: [] for c in spec.collectives},
            "pairwise": None, "internode": None, "complete": False,
            "nccl_set_by_gpucheck": (ctx.session.backstop or None) if spec.backend == "nccl"
            else None,
        }
        faults.mark_start()
        with progress.bar(ctx, "comm", len(spec.collectives) * len(sizes), "size") as shown:
            for collective in spec.collectives:
                for size in sizes:
                    shown.describe(f"{collective} {human_bytes(size)} "
                                   f"(up to {human_bytes(sizes[-1])})")
                    row = measure_size(collective, size, spec, world, ctx)
                    result["collectives"][collective].append(row)
                    shown.advance()
                    if world.rank == 0:
                        progress.publish_partial(ctx, result)
            _pairs_and_nodes(spec, world, infos, sizes[-1], result, ctx)
        result["transport"] = gather_objects(rank_entry(world.rank, nccl_folder), ctx) \
            if spec.backend == "nccl" else None  # every rank's NCCL transport
        faults.mark_end()
        result["faults"] = faults.gather()
        result["complete"] = True
        progress.set_step(ctx, None)
        if world.rank == 0:
            progress.publish_partial(ctx, result)
        return result if world.rank == 0 else None
