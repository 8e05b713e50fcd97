"""The `nvidia-smi topo -m` matrix between the GPUs, read through NVML, and the path
class of each GPU pair (what a pair's bandwidth is compared with)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpucheck.probes.gpu_read import nvlink_active
from gpucheck.probes.gpu_record import GpuRecord
from gpucheck.probes.nvml import Nvml, NvmlFailure

# NVML_TOPOLOGY_* level -> the `nvidia-smi topo -m` legend.
TOPOLOGY_LEVELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# nvmlDeviceGetP2PStatus's answers (nvmlGpuP2PStatus_t), as `nvidia-smi topo -p2p r`.
P2P_STATUS = {0: "OK", 1: "chipset not supported", 2: "GPU not supported",
              3: "IOH topology not supported", 4: "disabled by regkey", 5: "not supported",
              6: "unknown"}
# The platform refuses P2P here by design: the driver does not enable peer access
# across CPU sockets (IOH topology) or on chipsets it does not support; ACS or an
# IOMMU setting shows as plain "not supported" on a pair that shares a switch.
BY_DESIGN = (1, 3)
# NVML_P2P_CAPS_INDEX_READ is 0; pynvml spells it `= 0,` (a tuple), so it is not used.
P2P_READ = 0


def path_class(path: str | None) -> str:
    """The class a pair's bandwidth is compared within: its `nvidia-smi topo -m` path,
    every NV# as one "NV" (a GPU that lost links must not sit in a class of its own)."""
    path = str(path or "")
    return "NV" if path.startswith("NV") and path[2:].isdigit() else path


@dataclass(frozen=True)
class PairPath:
    """One GPU pair's path: its `nvidia-smi topo -m` class and NVML's P2P read status."""

    kind: str  # "NV12", "PIX", "PXB", "PHB", "NODE", "SYS"; "n/a" when NVML could not tell
    p2p: int | None  # NVML_P2P_STATUS_* for reads; None when not read

    @property
    def without_p2p_by_design(self) -> bool:
        """Across CPU sockets (SYS), or a status that says the platform refuses it."""
        return self.kind == "SYS" or self.p2p in BY_DESIGN

    def row(self) -> dict[str, Any]:
        return {"path": self.kind,
                "p2p_status": None if self.p2p is None else P2P_STATUS.get(self.p2p,
                                                                            str(self.p2p)),
                "p2p_by_design": self.without_p2p_by_design}


def _link(nvml: Nvml, a: Any, b: Any, links: int | None) -> str:
    m = nvml.module
    if links:
        status = nvml.get("nvmlDeviceGetP2PStatus", a, b,
                          getattr(m, "NVML_P2P_CAPS_INDEX_NVLINK", 2))
        if status == getattr(m, "NVML_P2P_STATUS_OK", 0):
            return f"NV{links}"
    level = nvml.get("nvmlDeviceGetTopologyCommonAncestor", a, b)
    return "n/a" if level is None else TOPOLOGY_LEVELS.get(int(level), str(level))


def read_topology(nvml: Nvml, gpus: list[GpuRecord]) -> list[dict[str, Any]]:
    """The `nvidia-smi topo -m` matrix (NV#: the row GPU's active NVLinks)."""
    healthy = [g for g in gpus if not g.error]
    handles = {g.index: nvml.call("nvmlDeviceGetHandleByIndex", g.index) for g in healthy}
    rows = []
    for a in healthy:
        row: dict[str, Any] = {"gpu": f"GPU{a.index}"}
        for b in healthy:
            row[f"GPU{b.index}"] = "X" if a.index == b.index else _link(
                nvml, handles[a.index], handles[b.index], a.nvlink_active_links)
        rows.append(row)
    return rows


def pair_paths(nvml: Nvml, bus_ids: Sequence[str | None],
               ) -> dict[tuple[int, int], PairPath]:
    """(i, j) -> the path between the GPUs at bus_ids[i] and bus_ids[j] (`nvidia-smi topo
    -m`, `-p2p r`); "n/a" for a GPU NVML cannot find; NvmlFailure without NVML."""
    nvml.start()  # no NVML at all raises here; one GPU it cannot find is "n/a" below
    handles: dict[int, Any] = {}
    for i, bus in enumerate(bus_ids):
        try:
            handles[i] = nvml.call("nvmlDeviceGetHandleByPciBusId", bus) if bus else None
        except NvmlFailure:
            handles[i] = None
    links = {i: nvlink_active(nvml, h) if h is not None else None for i, h in handles.items()}
    paths = {}
    for i, a in handles.items():
        for j, b in handles.items():
            if i == j:
                continue
            if a is None or b is None:
                paths[(i, j)] = PairPath("n/a", None)
                continue
            paths[(i, j)] = PairPath(_link(nvml, a, b, links[i]),
                                     nvml.get("nvmlDeviceGetP2PStatus", a, b, P2P_READ))
    return paths


def paths_or_none(bus_ids: Sequence[str | None]) -> tuple[dict[tuple[int, int], PairPath],
                                                           str | None]:
    """`pair_paths` in an NVML session of its own, or ({}, why) when NVML cannot answer."""
    nvml = Nvml()
    try:
        return pair_paths(nvml, bus_ids), None
    except NvmlFailure as exc:
        return {}, f"path classes not read ({exc.function}: {exc.meaning})"
    finally:
        nvml.shutdown()
