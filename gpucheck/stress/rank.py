"""What every stress phase on a rank works with: the job's settings (`StressSpec`), the
rank's fixed facts (`RankContext`), the collectives the phases share, the host-side wait
of parked ranks, and where the rank's GPU sits (NUMA node, PCIe link) with pinning."""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucheck.context import RunContext
from gpucheck.devices import SYSFS
from gpucheck.distributed import progress
from gpucheck.distributed.deadline import gather_objects
from gpucheck.distributed.world import World
from gpucheck.numa import (
    pci_dir,
    read_local_cpus,
    read_numa_node,
    read_value,
)


@dataclass(frozen=True)
class StressSpec:
    """Everything a rank needs, settled before any rank starts (picklable)."""

    device: str  # "cuda" or "cpu"
    backend: str
    timeout_s: float
    dtypes: tuple[str, ...]  # GEMM dtypes; the first is the burn-in's
    size: int  # n of the n x n x n products
    duration_s: float  # the burn-in's length
    warmup_s: float  # before each timed window
    gemm_window_s: float  # timed GEMM per dtype
    membw_window_s: float
    pin_numa: bool = True
    fault_watch: bool = True  # watch every rank's GPU (gpucheck.distributed.faultwatch)
    # The report's bounds: a rank below one is measured again (gpucheck.stress.worker._again).
    peer_fraction: float = 0.9
    expected_fraction: float = 0.8
    copy_fraction: float = 0.6


@dataclass(frozen=True)
class RankContext:
    """This rank's fixed facts for the phases."""

    spec: StressSpec
    world: World
    device: Any  # torch.device
    bus_id: str | None
    run: RunContext  # the rank's run context: its progress, session and bars


Phase = Callable[[RankContext, dict[str, Any]], None]


def gather(ctx: RankContext, mine: Any) -> list[Any]:
    return gather_objects(mine, ctx.run)


def barrier(ctx: RankContext) -> None:
    """Every rank starts the next phase together. On CUDA name this rank's GPU, and
    poll the barrier under gpucheck's deadline (`distributed.deadline.settle`)."""
    import torch.distributed as dist

    from gpucheck.distributed.deadline import settle

    if ctx.spec.device == "cuda":
        work = dist.barrier(async_op=True, device_ids=[ctx.world.cuda_index])
        settle([work] if work is not None else [], ctx.spec.timeout_s, "barrier")
    else:
        dist.barrier()


def publish(ctx: RankContext, result: dict[str, Any]) -> None:
    if ctx.world.is_reporter:
        progress.publish_partial(ctx.run, result)


@dataclass(frozen=True)
class HostWait:
    """A barrier that waits on the host: a gloo group, or None for the world group."""

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
    """The host-side barrier of this rank's node: the world group on gloo, a new gloo
    group of `node_ranks` on NCCL (each of them makes the call); None where nobody is
    parked (one rank in the job, or on this node)."""
    if backend == "gloo":
        return HostWait(None) if world_size > 1 else None
    if len(node_ranks) <= 1:
        return None
    import torch.distributed as dist

    return HostWait(dist.new_group(ranks=sorted(node_ranks), backend="gloo",
                                   timeout=_dt.timedelta(seconds=timeout_s),
                                   use_local_synchronization=True))


# Usable GB/s per lane after line encoding: Gen1/2 8b/10b, Gen3-5 128b/130b, Gen6 FLIT
# mode (242 payload bytes of every 256). Packet headers cost a further few percent,
# which is why copies top out around 80-90% of these.
LANE_GBPS = {2.5: 2.5 * 8 / 10 / 8, 5.0: 5.0 * 8 / 10 / 8, 8.0: 8.0 * 128 / 130 / 8,
             16.0: 16.0 * 128 / 130 / 8, 32.0: 32.0 * 128 / 130 / 8, 64.0: 64.0 * 242 / 256 / 8}
GENERATION = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


@dataclass(frozen=True)
class PcieLink:
    """A link as trained now and as it could be."""

    speed_gts: float | None
    width: int | None
    max_speed_gts: float | None
    max_width: int | None

    @property
    def rate_gbps(self) -> float | None:
        """One direction's usable GB/s of the link as trained now (None: unknown)."""
        return link_rate_gbps(self.speed_gts, self.width)

    def label(self) -> str:
        gen = GENERATION.get(self.speed_gts or 0.0)
        now = f"Gen{gen} x{self.width}" if gen and self.width else "unknown"
        top = GENERATION.get(self.max_speed_gts or 0.0)
        if top and self.max_width and (top, self.max_width) != (gen, self.width):
            return f"{now} (capable of Gen{top} x{self.max_width})"
        return now


@dataclass(frozen=True)
class Placement:
    """This rank's CPUs against its GPU's NUMA node."""

    numa_node: int | None  # the GPU's node; None when unknown
    gpu_cpus: tuple[int, ...]  # CPUs local to the GPU (empty: unknown)
    cpus: tuple[int, ...]  # the CPUs this rank may run on
    on_gpu_node: bool | None  # every CPU of the rank is local to the GPU; None: unknown
    pinned: bool  # gpucheck narrowed the rank's CPUs to the GPU's node


def link_rate_gbps(speed_gts: float | None, width: int | None) -> float | None:
    """Usable one-direction GB/s of `width` lanes at `speed_gts`; None when unknown."""
    if not speed_gts or not width:
        return None
    lane = LANE_GBPS.get(float(speed_gts))
    return lane * width if lane is not None else None


def parse_speed(text: str | None) -> float | None:
    """"32.0 GT/s PCIe" (or "32 GT/s") -> 32.0; "Unknown" or garbage -> None."""
    try:
        return float((text or "").split()[0])
    except (IndexError, ValueError):
        return None


def read_link(bus_id: str, root: Path = SYSFS) -> PcieLink:
    folder = pci_dir(bus_id, root)
    widths = []
    for name in ("current_link_width", "max_link_width"):
        text = (read_value(folder / name) or "").strip()
        widths.append(int(text) if text.isdigit() and int(text) > 0 else None)
    return PcieLink(speed_gts=parse_speed(read_value(folder / "current_link_speed")),
                    width=widths[0],
                    max_speed_gts=parse_speed(read_value(folder / "max_link_speed")),
                    max_width=widths[1])


def plan_placement(bus_id: str | None, allowed: tuple[int, ...], pin: bool,
                   root: Path = SYSFS) -> tuple[Placement, tuple[int, ...] | None]:
    """(the placement, the CPUs to pin to or None): the allowed CPUs local to the GPU
    when some are and others are not; none of them allowed: the rank stays off (a WARN)."""
    if not bus_id:
        return Placement(None, (), allowed, None, False), None
    node = read_numa_node(bus_id, root)
    local = read_local_cpus(bus_id, root)
    if not local:
        return Placement(node, (), allowed, None, False), None
    near = tuple(c for c in allowed if c in set(local))
    if pin and near and near != allowed:
        return Placement(node, local, near, True, True), near
    on_node = bool(allowed) and set(allowed) <= set(local)
    return Placement(node, local, allowed, on_node, False), None


def place_this_rank(bus_id: str | None, pin: bool, root: Path = SYSFS) -> Placement:
    """Read the GPU's node, pin this process to its CPUs when asked and possible."""
    allowed = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") \
        else ()
    placement, target = plan_placement(bus_id, allowed, pin, root)
    if target is not None:
        try:
            # Every thread that exists already, and this one, whose new threads inherit it.
            for tid in os.listdir("/proc/self/task"):
                with contextlib.suppress(ProcessLookupError, ValueError):  # a thread ended
                    os.sched_setaffinity(int(tid), target)
            os.sched_setaffinity(0, target)
        except OSError:  # a cgroup or container may forbid it: report what is true
            on_node = bool(allowed) and set(allowed) <= set(placement.gpu_cpus)
            return Placement(placement.numa_node, placement.gpu_cpus, allowed, on_node, False)
    return placement
