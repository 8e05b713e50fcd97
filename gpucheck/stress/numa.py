"""Where a GPU sits: its NUMA node, the CPUs near it, and its PCIe link, from sysfs; and
pinning a stress rank to its GPU's node.

Pure file reading, with the sysfs root as a parameter so tests use a fake tree.
A GPU's PCI device directory is /sys/bus/pci/devices/<dddd:bb:dd.f> (domain four
hex digits, lower case), holding `numa_node` (-1 when the platform does not say),
`local_cpulist` ("0-15,32-47"), `current_link_speed` ("32.0 GT/s PCIe"),
`current_link_width` ("16") and their `max_` counterparts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# The general sysfs NUMA reading lives in gpucheck.numa (env and every rank's check-in use
# it too); the names stay importable from here.
from gpucheck.devices import SYSFS
from gpucheck.numa import (
    cpulist,
    parse_cpulist,
    pci_dir,
    read_local_cpus,
    read_numa_node,
    read_value,
)

__all__ = ["GENERATION", "LANE_GBPS", "SYSFS", "PcieLink", "Placement", "cpulist",
           "lane_gbps", "link_rate_gbps", "parse_cpulist", "parse_speed", "parse_width",
           "pci_dir", "place_this_rank", "plan_placement", "read_link", "read_local_cpus",
           "read_numa_node"]

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


def lane_gbps(speed_gts: float) -> float | None:
    return LANE_GBPS.get(float(speed_gts))


def link_rate_gbps(speed_gts: float | None, width: int | None) -> float | None:
    """Usable one-direction GB/s of `width` lanes at `speed_gts`; None when unknown."""
    if not speed_gts or not width:
        return None
    lane = lane_gbps(speed_gts)
    return lane * width if lane is not None else None


def parse_speed(text: str | None) -> float | None:
    """"32.0 GT/s PCIe" (or "32 GT/s") -> 32.0; "Unknown" or garbage -> None."""
    try:
        return float((text or "").split()[0])
    except (IndexError, ValueError):
        return None


def parse_width(text: str | None) -> int | None:
    try:
        width = int((text or "").strip())
    except ValueError:
        return None
    return width if width > 0 else None


def read_link(bus_id: str, root: Path = SYSFS) -> PcieLink:
    folder = pci_dir(bus_id, root)
    return PcieLink(speed_gts=parse_speed(read_value(folder / "current_link_speed")),
                    width=parse_width(read_value(folder / "current_link_width")),
                    max_speed_gts=parse_speed(read_value(folder / "max_link_speed")),
                    max_width=parse_width(read_value(folder / "max_link_width")))


def plan_placement(bus_id: str | None, allowed: tuple[int, ...], pin: bool,
                   root: Path = SYSFS) -> tuple[Placement, tuple[int, ...] | None]:
    """(the placement, the CPUs to pin to or None) for a rank allowed `allowed` CPUs.

    Pins to the allowed CPUs local to the GPU when some are and others are not.
    When the launcher allowed none of the GPU's CPUs, nothing can be done here:
    the rank stays off its GPU's node (a WARN in the report).
    """
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
            _pin_every_thread(target)
        except OSError:  # a cgroup or container may forbid it: report what is true
            on_node = bool(allowed) and set(allowed) <= set(placement.gpu_cpus)
            return Placement(placement.numa_node, placement.gpu_cpus, allowed, on_node, False)
    return placement


def _pin_every_thread(cpus: tuple[int, ...]) -> None:
    """sched_setaffinity acts on one thread: pin the threads that exist already (the
    process group's), and this one, whose new threads (OpenMP's) inherit it."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, ValueError):
            continue  # a thread that ended meanwhile
    os.sched_setaffinity(0, cpus)
