"""Send/recv bandwidth between every ordered pair of ranks on the same node.

One pair at a time per node (pairs of different nodes run side by side), a barrier
of all ranks between steps, so no two transfers on a node share the bus. The sender
times `iters` sends of one buffer plus the receiver's one-element acknowledgement,
with the same clock and batching as the collectives (`collectives.time_batch`): on
NCCL every isend/irecv is launched before the first wait, on gloo one at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpucheck.comm.collectives import (
    ELEMENT_BYTES,
    Clock,
    NullClock,
    Work,
    back_to_back,
    make_clock,
    synchronize,
    time_batch,
)
from gpucheck.distributed import progress
from gpucheck.distributed.nodes import group_by_node
from gpucheck.distributed.session import barrier


def pair_schedule(roster: Sequence[Mapping[str, Any]]) -> list[list[tuple[int, int]]]:
    """Steps of (src, dst) pairs: step k holds every node's k-th ordered pair."""
    per_node = []
    for ranks in group_by_node(roster).values():
        per_node.append([(a, b) for a in ranks for b in ranks if a != b])
    steps = max((len(p) for p in per_node), default=0)
    return [[p[k] for p in per_node if k < len(p)] for k in range(steps)]


def _side(me: int, src: int, dst: int, buf: Any, ack: Any,
          iters: int) -> list[Callable[[], Work]]:
    """This rank's launches: `iters` isends then the ack's irecv on the sender, the
    mirror image on the receiver (so the sender's last op ends after the last byte)."""
    import torch.distributed as dist

    if me == src:
        return [lambda: dist.isend(buf, dst)] * iters + [lambda: dist.irecv(ack, dst)]
    return [lambda: dist.irecv(buf, src)] * iters + [lambda: dist.isend(ack, src)]


def _time_pair(src: int, dst: int, size_bytes: int, iters: int, device: str) -> float | None:
    """Bandwidth in GB/s on the sender; None on the receiver."""
    import torch
    import torch.distributed as dist

    where = "cuda" if device == "cuda" else "cpu"
    buf = torch.zeros(max(size_bytes // ELEMENT_BYTES, 1), device=where)
    ack = torch.zeros(1, device=where)
    me = dist.get_rank()
    in_a_row = back_to_back()
    # Warm-up: the first NCCL send/recv between two ranks creates their communicator.
    time_batch(_side(me, src, dst, buf, ack, 1), NullClock(), in_a_row)
    synchronize(device)
    clock: Clock = make_clock(device) if me == src else NullClock()
    elapsed = time_batch(_side(me, src, dst, buf, ack, iters), clock, in_a_row)
    return size_bytes * iters / elapsed / 1e9 if me == src else None


def measure_pairs(roster: Sequence[Mapping[str, Any]], size_bytes: int, iters: int,
                  device: str) -> list[dict[str, Any]]:
    """Run the schedule; return the pairs this rank sent from ({src, dst, node_rank, ...})."""
    import torch.distributed as dist

    me = dist.get_rank()
    node_of = {int(r["rank"]): int(r["node_rank"]) for r in roster}
    mine = []
    for step in pair_schedule(roster):
        for src, dst in step:
            if me in (src, dst):
                progress.set_step(f"send/recv rank {src} -> rank {dst}")
                gbps = _time_pair(src, dst, size_bytes, iters, device)
                if gbps is not None:
                    mine.append({"src": src, "dst": dst, "node_rank": node_of[src],
                                 "size_bytes": size_bytes, "bandwidth_gbps": round(gbps, 4)})
        progress.set_step("barrier after a pair")
        barrier()
    return mine
