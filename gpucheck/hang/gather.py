"""Every node's view in one place: alone, this node's; under srun --ntasks-per-node 1 or
torchrun with one process per node, each node's local rank 0 looks at its own ranks
and rank 0 gets them all, through the frame `gpucheck env` uses for its multi-node
comparison (gpucheck.distributed.envgather.gather_per_node)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gpucheck.hang.live import node_view

if TYPE_CHECKING:
    from gpucheck.context import RunContext

# Looking at the ranks takes the window plus a few seconds; a node that has not
# answered after this long is itself stuck.
GATHER_TIMEOUT_S = 120.0


def gather_views(pids: Sequence[int], window_s: float, nvml_timeout_s: float,
                 ctx: RunContext) -> dict[int, dict[str, Any]] | None:
    """{node_rank: node view}; None on ranks that do not report. `ctx`: the command's."""
    from gpucheck.distributed.job import launched_world
    from gpucheck.distributed.world import host_name

    world = launched_world(ctx)
    if world is None:
        return {0: node_view(pids, window_s, host_name(), 0, nvml_timeout_s)}
    from gpucheck.distributed.envgather import gather_per_node

    nodes = gather_per_node(
        lambda: node_view(pids, window_s, host_name(), world.node_rank, nvml_timeout_s),
        ctx, fault_watch=False, timeout_s=GATHER_TIMEOUT_S)
    if nodes is None:
        return None
    return {node.node_rank: view for node, view in nodes.items()}
