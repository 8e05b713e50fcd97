"""The `nvidia-smi topo -m` matrix between the GPUs, read through NVML."""

from __future__ import annotations

from typing import Any

from gpucheck.probes.gpu_record import GpuRecord
from gpucheck.probes.nvml import Nvml

# NVML_TOPOLOGY_* level -> the `nvidia-smi topo -m` legend.
TOPOLOGY_LEVELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


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
    """The `nvidia-smi topo -m` matrix: X, NV#, PIX, PXB, PHB, NODE, SYS (n/a on error).

    NV# is the number of active NVLinks of the row GPU when NVML reports NVLink P2P
    between the pair (exact for NVSwitch systems and two-GPU bridges).
    """
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
