"""Which NUMA node a GPU hangs off, its CPUs, and whether a process's CPUs are among
them (`nvidia-smi topo -m`'s "CPU/NUMA Affinity"): sysfs reads (the root a parameter, for
fake trees) and pure decisions, for env's GPU table, every rank's check-in and stress."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from gpucheck.devices import SYSFS, normal_bus_id


@dataclass(frozen=True)
class RankNuma:
    """A process's CPUs against its GPU's NUMA node, as the check-in records it."""

    cpus: str  # the CPUs the process may run on, "0-27,56-83" ("" when unknown)
    numa_node: int | None  # the GPU's node; None: CPU rank, or the platform does not say
    # True: every CPU of the process is on the GPU's node; False: none is; None: nothing
    # to judge (no GPU, no NUMA info, one node, or CPUs on both sides: not pinned).
    on_gpu_numa: bool | None


def pci_dir(bus_id: str, root: Path = SYSFS) -> Path:
    """A PCI device's sysfs directory, from NVML's or CUDA's form of its address."""
    normal = normal_bus_id(bus_id) or bus_id
    return root / "bus" / "pci" / "devices" / normal.lower()


def read_value(path: Path) -> str | None:
    """A sysfs file's text, stripped; None when it is missing or unreadable."""
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


def cpulist(cpus: tuple[int, ...]) -> str:
    """(0, 1, 2, 3, 8) -> "0-3,8": the kernel's own short form."""
    runs: list[list[int]] = []  # [first, last] of each run
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{first}-{last}" if last != first else f"{first}" for first, last in runs)


def read_numa_node(bus_id: str, root: Path = SYSFS) -> int | None:
    """The device's NUMA node; None for -1 (single-socket boards, most VMs) or no file."""
    raw = read_value(pci_dir(bus_id, root) / "numa_node")
    try:
        node = int(raw) if raw is not None else -1
    except ValueError:
        return None
    return node if node >= 0 else None


def read_local_cpus(bus_id: str, root: Path = SYSFS) -> tuple[int, ...]:
    return parse_cpulist(read_value(pci_dir(bus_id, root) / "local_cpulist"))


def numa_nodes(root: Path = SYSFS) -> tuple[int, ...]:
    """The online NUMA nodes (`cat /sys/devices/system/node/online`); () when unknown."""
    folder = root / "devices" / "system" / "node"
    online = parse_cpulist(read_value(folder / "online"))
    if online:
        return online
    try:
        names = [p.name for p in folder.iterdir()]
    except OSError:
        return ()
    return tuple(sorted(int(n[4:]) for n in names if re.fullmatch(r"node\d+", n)))


def node_cpus(node: int, root: Path = SYSFS) -> tuple[int, ...]:
    """`cat /sys/devices/system/node/node<N>/cpulist`: what `numactl --cpunodebind=N` allows."""
    return parse_cpulist(read_value(root / "devices" / "system" / "node" / f"node{node}" /
                               "cpulist"))


def on_node(allowed: tuple[int, ...], local: tuple[int, ...]) -> bool | None:
    """True: all of `allowed` is in `local`; False: none is (surely misplaced); None:
    both (not pinned: no fault) or unknown."""
    if not allowed or not local:
        return None
    near = set(allowed) & set(local)
    if len(near) == len(set(allowed)):
        return True
    return False if not near else None


def rank_numa(bus_id: str | None, allowed: tuple[int, ...], root: Path = SYSFS) -> RankNuma:
    """This process's CPUs (`allowed`, from os.sched_getaffinity) against its GPU's node."""
    cpus = cpulist(allowed)
    if not bus_id:
        return RankNuma(cpus, None, None)
    node = read_numa_node(bus_id, root)
    if node is None or len(numa_nodes(root)) < 2:
        return RankNuma(cpus, node, None)  # one node: every CPU is as near as any other
    local = node_cpus(node, root) or read_local_cpus(bus_id, root)
    return RankNuma(cpus, node, on_node(allowed, local))


def allowed_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on (`taskset -cp <pid>`); () where the OS cannot say."""
    if not hasattr(os, "sched_getaffinity"):
        return ()
    return tuple(sorted(os.sched_getaffinity(0)))
