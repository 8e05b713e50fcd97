"""Module-level workers for tests/test_stress_parking.py (spawned ranks import them).

`peer_phase_on_cpu((folder, backends))` runs stress's peer phase on gloo CPU ranks once per
backend, with a fake measurement on local rank 0 that takes PEER_S and then drops a marker
file; every other rank records, at the moment it enters the phase's result gather (on a GPU
an NCCL kernel that would spin on its device), whether the marker was there yet.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from gpucheck.context import RunContext
from gpucheck.distributed.session import process_group
from gpucheck.distributed.world import World
from gpucheck.stress import copies
from gpucheck.stress.rank import RankContext, StressSpec

PEER_S = 0.5  # long enough for a rank that does not wait to reach the gather first


def _spec(backend: str) -> StressSpec:
    return StressSpec(device="cpu", backend=backend, timeout_s=30.0, dtypes=("fp32",),
                      size=8, duration_s=0.0, warmup_s=0.0, gemm_window_s=0.0,
                      membw_window_s=0.0, pin_numa=False, fault_watch=False)


def peer_phase_on_cpu(ctx: RunContext, job: tuple[str, tuple[str, ...]],
                      ) -> dict[str, Any] | None:
    """job: (folder, the backends the phase believes it runs, one pass each in folder/BACKEND:
    "gloo" parks on the world group, "nccl" creates the node's own gloo group, as on a GPU
    node; the ranks' collectives are gloo either way). Rank 0: each pass's result."""
    import torch

    folder, backends = job
    results: dict[str, Any] = {}
    with process_group("gloo", "cpu", timeout_s=30, fault_watch=False, ctx=ctx) as world:
        for backend in backends:
            results[backend] = _one_pass(ctx, world, Path(folder) / backend, backend,
                                         torch.device("cpu"))
    return results if world.rank == 0 else None


def _one_pass(ctx: RunContext, world: World, folder: Path, backend: str,
              device: Any) -> dict[str, Any] | None:
    folder.mkdir(exist_ok=True)
    marker = folder / "matrix-done"

    def measure(local_world_size: int) -> dict[str, Any]:
        time.sleep(PEER_S)
        marker.write_text("done")
        return {"pairs": [], "gpus": local_world_size}

    rank = RankContext(_spec(backend), world, device, None, ctx)
    gather = copies.gather

    def recording_gather(on: RankContext, mine: Any) -> list[Any]:
        entry = {"rank": world.rank, "matrix_done_at_entry": marker.exists()}
        (folder / f"gather-{world.rank}.json").write_text(json.dumps(entry))
        return gather(on, mine)

    copies.gather = recording_gather  # type: ignore[assignment]
    try:
        return copies.peer_phase(rank, measure, [0, 1])
    finally:
        copies.gather = gather  # type: ignore[assignment]
