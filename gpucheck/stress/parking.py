"""Parking: ranks with nothing to measure wait on the host, off their GPUs.

The peer-copy matrix is measured by each node's local rank 0 alone, opening every GPU
of the node (`gpucheck.stress.copies.peer_matrix`). The other ranks used to go
straight into the phase's result gather, an NCCL all_gather: its kernel then spun on
their GPUs for as long as the matrix took, and rank 0's copies to and from those GPUs
queued behind another process's running kernel, so the matrix measured NCCL's spin
as much as the links. Parked ranks wait in a barrier of a gloo group instead: gloo
runs on the CPU, the waiting thread blocks in the host, and no CUDA work of theirs is
queued until their node's local rank 0 has finished. Then they enter the gather.

One gloo group per node, of that node's ranks only (`use_local_synchronization`: only
its members take part in creating it): a parked rank waits for its own node's local
rank 0, the only one touching its GPU, and gloo connects processes of one host only,
so a host whose name resolves to an address other nodes cannot reach (gloo's usual
trap, GLOO_SOCKET_IFNAME) cannot break an NCCL job here. A gloo group rather than
the job's key-value store: a gloo barrier has the process group's timeout (a local
rank 0 that hangs inside the matrix ends the wait after `--timeout`, and the usual
roll call names it), and it needs no keys of its own to clean up. On a gloo job the
world group already waits on the host and serves as it is.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HostWait:
    """A barrier that waits on the host: `group` a gloo group, None the world group
    (when the job's backend is gloo already)."""

    group: Any | None

    def wait(self) -> None:
        """Block until every rank has arrived, without touching a GPU."""
        import torch.distributed as dist

        if self.group is None:
            dist.barrier()
        else:
            dist.barrier(group=self.group)


def host_wait(backend: str, world_size: int, node_ranks: Sequence[int],
              timeout_s: float) -> HostWait | None:
    """The host-side barrier of this rank's node. On gloo the world group (every rank
    decides alike from `world_size`); on NCCL a new gloo group of `node_ranks`, this
    node's ranks (every one of them must make the call; other nodes' ranks do not).
    None where nobody is parked: one rank in the job (gloo) or on this node (NCCL)."""
    if backend == "gloo":
        return HostWait(None) if world_size > 1 else None
    if len(node_ranks) <= 1:
        return None
    import torch.distributed as dist

    return HostWait(dist.new_group(ranks=sorted(node_ranks), backend="gloo",
                                   timeout=_dt.timedelta(seconds=timeout_s),
                                   use_local_synchronization=True))
