"""Each rank of a load command watches its GPU for hardware faults for the life of its
process group: one NVML doorway, the timed window marked, the results gathered."""

from __future__ import annotations

import contextlib
from typing import Any

from gpucheck.context import RunContext
from gpucheck.devices import GpuIdentity
from gpucheck.distributed import deadline, progress
from gpucheck.distributed.world import World
from gpucheck.faults import FaultWatch
from gpucheck.probes.nvml import Nvml

OFF_REASON = "fault watching turned off (--no-fault-watch)"


class RankFaults:
    """One rank's fault watch for the life of its process group (`ctx.session.faults`)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx  # the rank's, for its progress (the step, the partial results)
        self.watch: FaultWatch | None = None
        self.nvml: Nvml | None = None
        self.off = False
        self.result: dict[str, Any] | None = None

    def open_nvml(self, world: World) -> Nvml | None:
        """The rank's one NVML doorway (each runs a worker thread), None without a GPU."""
        self.nvml = Nvml() if world.device_index is not None else None
        return self.nvml

    def start(self, world: World, gpu: GpuIdentity | None, enabled: bool) -> None:
        """Start watching this rank's GPU (the counters' first snapshot is taken here)."""
        self.watch, self.off, self.result = None, not enabled, None
        if not enabled:
            return
        bus_id = gpu.pci_bus_id if gpu else None
        watch = FaultWatch(bus_id, nvml=self.nvml, rank=world.rank)
        try:
            watch.start()
        except Exception as exc:  # a watcher bug must not fail the load: say so instead
            with contextlib.suppress(Exception):
                watch.stop()
            self.result = {"rank": world.rank, "status": "n/a", "bus_id": bus_id,
                           "reason": f"the fault watcher did not start ({exc!r})"}
            return
        self.watch = watch

    def mark_start(self) -> None:
        """The timed window starts now (clock-event reasons count from here)."""
        if self.watch is not None:
            self.watch.mark_start()

    def mark_end(self) -> None:
        """The timed window ended now (events are still watched until the group is left)."""
        if self.watch is not None:
            self.watch.mark_end()

    def _own_result(self) -> dict[str, Any] | None:
        """Stop the watch (the counters' second snapshot) and keep its result."""
        if self.watch is not None and self.result is None:
            self.watch.stop()
            self.result = self.watch.result()
        return self.result

    def gather(self) -> list[dict[str, Any]]:
        """Every rank's result, in rank order, on every rank. A collective: call it on the
        success path only, after the load (with the watch off: no collective)."""
        import torch.distributed as dist

        if self.off:
            return off_results(dist.get_world_size())
        mine = self._own_result()
        progress.set_step(self.ctx, "all_gather of the fault watch results")
        every: list[Any] = deadline.gather_objects(mine, self.ctx)
        progress.set_step(self.ctx, None)
        return every

    def publish_after_failure(self, world: World) -> None:
        """On the reporting rank, put its own result into the partial results, so the
        failure report shows its GPU's faults. Never raises: the failure is what matters."""
        if not world.is_reporter or (self.watch is None and not self.off
                                     and self.result is None):
            return
        with contextlib.suppress(Exception):
            faults = off_results(world.world_size) if self.off else [self._own_result()]
            partial = progress.local_partial(self.ctx) or {}
            progress.publish_partial(self.ctx, partial | {"faults": faults})

    def close(self) -> None:
        """Stop the watch (when still running) and shut the rank's doorway."""
        with contextlib.suppress(Exception):
            self._own_result()
        nvml, self.watch, self.nvml = self.nvml, None, None
        if nvml is not None:
            nvml.shutdown()


def of(ctx: RunContext) -> RankFaults:
    """The fault watch of the process group `ctx` is in (`process_group(..., ctx=ctx)`)."""
    if not isinstance(ctx.session.faults, RankFaults):
        raise RuntimeError("no fault watch: call this inside process_group(..., ctx=ctx)")
    return ctx.session.faults


def off_results(world_size: int) -> list[dict[str, Any]]:
    return [{"rank": r, "status": "n/a", "reason": OFF_REASON} for r in range(world_size)]
