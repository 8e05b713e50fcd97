"""NVML's view of this node for `env` and `health`: the driver and GPU sections with
`gpu.count`, the second look at a GPU whose one clock sample showed a slowdown, and the
`nvidia-smi topo -m` matrix and path class of each GPU pair (docs/env.md)."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpucheck.devices import expected_gpus, nvidia_pci_devices, sysfs_root
from gpucheck.numa import cpulist, node_cpus, numa_nodes
from gpucheck.probes.gpu_judge import (
    count_finding,
    driver_finding,
    gpu_findings,
    hang_finding,
    numa_findings,
)
from gpucheck.probes.gpu_read import (
    BAD_CLOCK_REASONS,
    CLOCK_REASONS,
    MASK_FUNCTIONS,
    DriverInfo,
    GpuRecord,
    nvlink_active,
    read_driver,
    read_gpu,
    read_mask,
)
from gpucheck.probes.nvml import Nvml, NvmlDoor, NvmlFailure, read_fields
from gpucheck.report import Section, fail, skip

# The NVML failures gpu.topology acts on (gpucheck/checks/node.py).
_TOPOLOGY_CAUSES = ("timed_out", "no_answer")


def gpus_section(nvml: Nvml, gpus: list[GpuRecord],
                 nodes: Mapping[int, str] | None = None) -> Section:
    """The GPU table, per-GPU findings, `gpu.numa` (`nodes`: NUMA node -> its CPUs) and
    `nvidia-smi topo -m`."""
    findings = [f for gpu in gpus for f in gpu_findings(gpu)]
    findings += numa_findings(gpus, nodes or {})
    data: dict[str, Any] = {"gpus": [g.row() for g in gpus]}
    data["processes"] = [{"gpu": g.index, **p} for g in gpus for p in g.processes]
    try:
        data["topology"] = read_topology(nvml, gpus) if len(gpus) > 1 else []
    except NvmlFailure as exc:
        data["topology"] = []
        cause = exc.cause if exc.cause in _TOPOLOGY_CAUSES else None
        findings.append(fail("gpu.topology", f"topology query failed: {exc}", exc.hint,
                             cause=cause))
    return Section("gpus", "GPUs", data, findings)


@dataclass(frozen=True)
class NvmlResult:
    driver: DriverInfo
    gpus: list[GpuRecord]
    sections: list[Section]
    pci_gpus: int


def probe_nvml(nvml: Nvml | None = None, sysfs: Path | None = None,
               environ: Mapping[str, str] | None = None) -> NvmlResult:
    """Driver and every GPU, and `gpu.count` against the GPUs expected here; `sysfs`
    holds the PCI bus and NUMA nodes (GPUCHECK_SYSFS, else /sys)."""
    nvml = nvml or Nvml()
    environ = os.environ if environ is None else environ
    sysfs = sysfs or sysfs_root(environ)
    pci_gpus = nvidia_pci_devices(str(sysfs / "bus/pci/devices"))
    expected = expected_gpus(environ, sysfs)
    info = read_driver(nvml)
    sections = [Section("driver", "NVIDIA driver", {
        "driver_version": info.driver_version, "cuda_driver_version": info.cuda_version,
        "gpu_count": info.gpu_count, "nvidia_pci_devices": pci_gpus,
        "nvml_error": None if info.failure is None else str(info.failure),
    }, [driver_finding(info, pci_gpus)])]
    gpus: list[GpuRecord] = []
    if info.present:
        gpus = [read_gpu(nvml, i, sysfs) for i in range(info.gpu_count or 0)]
        gpus = second_look(nvml, gpus)  # a slowdown in one sample: is it held?
        nodes = {n: cpulist(node_cpus(n, sysfs)) for n in numa_nodes(sysfs)}
        sections.append(gpus_section(nvml, gpus, nodes))
    if info.present or expected.count:  # a node that should have GPUs: NVML must show them
        sections[0].findings.append(count_finding(info.gpu_count if info.present else None,
                                                  expected))
    else:
        sections.append(Section("gpus", "GPUs", {"gpus": []},
                                [skip("gpu.count", "no GPU can be queried without NVML")]))
    hang = hang_finding(nvml)
    if hang is not None:
        sections[0].findings.append(hang)
    nvml.shutdown()
    return NvmlResult(info, gpus, sections, pci_gpus)


# ---- the second look at a slowdown in one clock sample ----

WINDOW_S = 1.0  # how long a GPU with a slowdown in its sample is watched
TICK_S = 0.05  # between two samples of the reasons mask
HELD_SHARE = 0.5  # of the window: held, not touched
MIN_SAMPLES = 5  # fewer samples cannot tell held from touched
# Reason -> the pynvml field id of its cumulative time counter (ns, nvml.h).
SLOWDOWN_FIELDS: dict[str, str] = {
    "sw_power_cap": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
    "sw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
    "hw_thermal_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
    "hw_power_brake_slowdown": "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
}
LOOKED_AT = tuple(r for r in BAD_CLOCK_REASONS if r != "hw_slowdown")


def read_slowdown_ns(nvml: NvmlDoor, handle: Any) -> dict[str, int | None]:
    """Cumulative ns each reason held the clocks down (`nvidia-smi -q -d PERFORMANCE`
    "Clocks Event Reasons Counters"); None per field this pynvml, driver or GPU lacks."""
    values = read_fields(nvml, handle, {r: (c, 0) for r, c in SLOWDOWN_FIELDS.items()})
    return {r: None if v is None else int(v) for r, v in values.items()}


def held_s(start: Mapping[str, int | None], end: Mapping[str, int | None],
           window_s: float) -> dict[str, float | None]:
    """Per reason, the seconds its counter grew by over the window; None when n/a or
    longer than the window (a pynvml whose field ids differ from the driver's)."""
    out: dict[str, float | None] = {}
    for reason in SLOWDOWN_FIELDS:
        a, b = start.get(reason), end.get(reason)
        grown = None if a is None or b is None or b < a else (b - a) / 1e9
        out[reason] = grown if grown is not None and grown <= window_s * 1.05 else None
    return out


def _read_counters(nvml: NvmlDoor, handles: dict[int, Any],
                   ) -> dict[int, tuple[float, float, dict[str, int | None]]]:
    """Each GPU's counters with when its call began and ended: a share is taken over
    the outer bracket of its two reads, so a slow call can only make it read low."""
    read = {}
    for i, handle in handles.items():
        before = time.monotonic()
        values = read_slowdown_ns(nvml, handle)
        read[i] = (before, time.monotonic(), values)
    return read


def _watch(nvml: NvmlDoor, handles: dict[int, Any], window_s: float,
           tick_s: float) -> dict[int, dict[str, Any]]:
    """Sample every GPU's mask for `window_s`, counters at both ends."""
    start = _read_counters(nvml, handles)
    began = time.monotonic()
    functions = {i: list(MASK_FUNCTIONS) for i in handles}
    seen: dict[int, dict[str, int]] = {i: {} for i in handles}
    samples = 0
    while True:
        for i, handle in handles.items():
            mask = read_mask(nvml, handle, functions[i]) or 0
            for bit, name in CLOCK_REASONS.items():
                if mask & bit:
                    seen[i][name] = seen[i].get(name, 0) + 1
        samples += 1
        if time.monotonic() - began >= window_s:
            break
        time.sleep(tick_s)
    end = _read_counters(nvml, handles)
    elapsed = time.monotonic() - began
    looks = {}
    for i in handles:
        fractions = {r: round(n / samples, 3) for r, n in sorted(seen[i].items())}
        span = max(end[i][1] - start[i][0], 1e-6)
        grown = held_s(start[i][2], end[i][2], span)
        counted = {r: None if (g := grown[r]) is None else round(g / span, 3)
                   for r in SLOWDOWN_FIELDS if r in LOOKED_AT}
        held = [r for r in LOOKED_AT if (counted.get(r) or 0.0) >= HELD_SHARE
                or (samples >= MIN_SAMPLES and fractions.get(r, 0.0) >= HELD_SHARE)]
        looks[i] = {"window_s": round(elapsed, 3), "samples": samples,
                    "fractions": fractions, "counter_share": counted, "held": held}
    return looks


def second_look(nvml: NvmlDoor, gpus: Sequence[GpuRecord], window_s: float | None = None,
                tick_s: float | None = None) -> list[GpuRecord]:
    """`gpus` with `clock_window` filled for each whose sample showed a thermal or
    power-brake slowdown (watched together, one window); the others, and all of them
    when NVML fails during the look, unchanged (one sample: not judged)."""
    suspects = [g for g in gpus
                if set(g.clock_event_reasons or ()) & set(LOOKED_AT) and not g.error]
    if not suspects:
        return list(gpus)
    try:
        handles = {g.index: nvml.call("nvmlDeviceGetHandleByIndex", g.index) for g in suspects}
        looks = _watch(nvml, handles, WINDOW_S if window_s is None else window_s,
                       TICK_S if tick_s is None else tick_s)
    except NvmlFailure:
        return list(gpus)  # the GPU's own failures are judged elsewhere (gpu.query)
    return [dataclasses.replace(g, clock_window=looks[g.index]) if g.index in looks else g
            for g in gpus]


# ---- the topology between the GPUs ----

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
