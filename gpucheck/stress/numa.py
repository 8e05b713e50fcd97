"""Where a GPU sits: its NUMA node, the CPUs near it, and its PCIe link, from sysfs.

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

from gpucheck.devices import normal_bus_id

SYSFS = Path("/sys")

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


def pci_dir(bus_id: str, root: Path = SYSFS) -> Path:
    """sysfs directory of a PCI device given NVML's or CUDA's form of its address."""
    normal = normal_bus_id(bus_id) or bus_id
    return root / "bus" / "pci" / "devices" / normal.lower()


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None


def parse_cpulist(text: str | None) -> tuple[int, ...]:
    """"0-3,8,10-11" -> (0, 1, 2, 3, 8, 10, 11); empty or malformed -> ()."""
    cpus: set[int] = set()
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        try:
            cpus.update(range(int(low), int(high or low) + 1))
        except ValueError:
            return ()
    return tuple(sorted(cpus))


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
    return PcieLink(speed_gts=parse_speed(_read(folder / "current_link_speed")),
                    width=parse_width(_read(folder / "current_link_width")),
                    max_speed_gts=parse_speed(_read(folder / "max_link_speed")),
                    max_width=parse_width(_read(folder / "max_link_width")))


def read_numa_node(bus_id: str, root: Path = SYSFS) -> int | None:
    raw = _read(pci_dir(bus_id, root) / "numa_node")
    try:
        node = int(raw) if raw is not None else -1
    except ValueError:
        return None
    return node if node >= 0 else None


def read_local_cpus(bus_id: str, root: Path = SYSFS) -> tuple[int, ...]:
    return parse_cpulist(_read(pci_dir(bus_id, root) / "local_cpulist"))


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


def cpulist(cpus: tuple[int, ...]) -> str:
    """(0, 1, 2, 3, 8) -> "0-3,8": the kernel's own short form."""
    runs: list[str] = []
    start = prev = None
    for cpu in sorted(cpus):
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            runs.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = cpu
    if start is not None:
        runs.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(runs)
