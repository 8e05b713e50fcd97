"""Driver and per-GPU health through NVML (the `nvidia-smi -q` view).

Every call goes through `Nvml` (one doorway). A field the GPU does not support is
None (shown as n/a); a GPU that fails mid-query (lost, needs reset) becomes a FAIL
finding for that GPU while the others are still reported. Also here: the driver's
CUDA and the GPUs' architectures against what torch was built for.
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpucheck.devices import GpuIdentity
from gpucheck.numa import (
    SYSFS,
    cpulist,
    node_cpus,
    numa_nodes,
    read_local_cpus,
    read_numa_node,
)
from gpucheck.probes.nvml import SLOW_ADVICE, Nvml, NvmlFailure, slow_words
from gpucheck.report import Finding, Section, fail, ok, skip, warn

NVIDIA_PCI_VENDOR = "0x10de"
PCI_DISPLAY_CLASSES = ("0x0300", "0x0302")

# Clock-event (throttle) reason bits, as in nvml.h / pynvml nvmlClocksEventReason*.
CLOCK_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
    0x8: "hw_slowdown", 0x10: "sync_boost", 0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
BAD_CLOCK_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                     "hw_power_brake_slowdown")
# NVML_TOPOLOGY_* level -> the `nvidia-smi topo -m` legend.
TOPOLOGY_LEVELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# NVML_GPU_FABRIC_STATE_* (pynvml) -> the words the report uses.
FABRIC_STATES = {0: "not_supported", 1: "not_started", 2: "in_progress", 3: "completed"}
FABRIC_HINT = ("start the fabric manager: systemctl start nvidia-fabricmanager (and "
               "systemctl enable it; its version must match the driver's); see journalctl -u "
               "nvidia-fabricmanager, and nvidia-smi -q | grep -A3 Fabric")


@dataclass(frozen=True)
class DriverInfo:
    """NVML's view of the driver. `present` is False when no driver could be reached."""

    present: bool
    driver_version: str | None = None
    cuda_version: str | None = None
    gpu_count: int | None = None
    failure: NvmlFailure | None = None


@dataclass(frozen=True)
class GpuRecord:
    """One GPU, fields named after `nvidia-smi --query-gpu=...`; None is n/a."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    compute_capability: str | None = None
    persistence_mode: bool | None = None
    mig_mode: bool | None = None
    mig_mode_pending: bool | None = None
    temperature_c: int | None = None
    power_draw_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    utilization_gpu_pct: int | None = None
    utilization_memory_pct: int | None = None
    process_count: int | None = None
    pcie_gen_current: int | None = None
    pcie_gen_max: int | None = None
    pcie_width_current: int | None = None
    pcie_width_max: int | None = None
    ecc_mode: bool | None = None
    ecc_volatile_uncorrected: int | None = None
    ecc_aggregate_uncorrected: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failed: bool | None = None
    clock_event_reasons: list[str] | None = None
    nvlink_active_links: int | None = None
    fabric_state: str | None = None  # FABRIC_STATES; None: no fabric API (n/a)
    fabric_status: str | None = None  # "success" or the NVML_ERROR_* name, once completed
    numa_node: int | None = None  # sysfs; None where it reads -1 (VMs, single socket)
    cpu_affinity: str | None = None  # CPUs near the GPU, "0-27,56-83" (nvidia-smi topo -m)
    processes: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    error_kind: str | None = None
    error_hint: str | None = None

    @property
    def subject(self) -> str:
        """"GPU 3 (NVIDIA H200, bus 00000000:9A:00.0, GPU-...)", as in every other section."""
        return GpuIdentity(None, self.index, self.name, self.pci_bus_id, self.uuid).label()

    def row(self) -> dict[str, Any]:
        row = asdict(self)
        for key in ("processes", "error_kind", "error_hint"):
            row.pop(key)
        return row


def nvidia_pci_devices(root: str = "/sys/bus/pci/devices") -> int:
    """NVIDIA display/3D controllers on the PCI bus (`lspci -d 10de:`), no driver needed."""
    count = 0
    for device in glob.glob(f"{root}/*"):
        try:
            vendor = Path(device, "vendor").read_text().strip()
            klass = Path(device, "class").read_text().strip()
        except OSError:
            continue
        if vendor == NVIDIA_PCI_VENDOR and klass.startswith(PCI_DISPLAY_CLASSES):
            count += 1
    return count


def cuda_version_str(value: int | None) -> str | None:
    """NVML's 12040 -> '12.4' (as in the `CUDA Version` of nvidia-smi's header)."""
    if not value:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"


def read_driver(nvml: Nvml) -> DriverInfo:
    """`nvidia-smi --query-gpu=driver_version --format=csv` plus the CUDA the driver supports."""
    try:
        version = nvml.call("nvmlSystemGetDriverVersion")
        cuda = nvml.get("nvmlSystemGetCudaDriverVersion_v2")
        if cuda is None:
            cuda = nvml.get("nvmlSystemGetCudaDriverVersion")
        count = nvml.call("nvmlDeviceGetCount")
    except NvmlFailure as exc:
        return DriverInfo(present=False, failure=exc)
    return DriverInfo(True, str(version), cuda_version_str(cuda), int(count))


def driver_finding(info: DriverInfo, pci_gpus: int) -> Finding:
    if info.present:
        return ok("driver.nvml", f"NVIDIA driver {info.driver_version} (CUDA "
                  f"{info.cuda_version or 'n/a'}), {info.gpu_count} GPU(s)")
    failure = info.failure
    assert failure is not None
    if failure.kind == "ImportError":
        return warn("driver.nvml", f"cannot query the driver: {failure.detail}",
                    "pip install nvidia-ml-py")
    if failure.kind == "NVMLError_LibraryNotFound" and pci_gpus == 0:
        return skip("driver.nvml", "no NVIDIA driver and no NVIDIA GPU on this machine")
    message = failure.meaning
    if pci_gpus:
        message += f" ({pci_gpus} NVIDIA GPU(s) on the PCI bus)"
    return fail("driver.nvml", message, failure.hint)


def _memory(nvml: Nvml, handle: Any) -> tuple[int | None, int | None]:
    """Total/used bytes via the v2 call (`nvidia-smi --query-gpu=memory.total,memory.used`)."""
    version = getattr(nvml.module, "nvmlMemory_v2", None)
    mem = nvml.get("nvmlDeviceGetMemoryInfo", handle, version=version) if version else None
    if mem is None:
        mem = nvml.get("nvmlDeviceGetMemoryInfo", handle)
    return (None, None) if mem is None else (int(mem.total), int(mem.used))


def _enabled(value: Any) -> bool | None:
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return None if value is None else bool(value)


def _watts(milliwatts: Any) -> float | None:
    return None if milliwatts is None else round(milliwatts / 1000.0, 1)


def _clock_reasons(nvml: Nvml, handle: Any) -> list[str] | None:
    """`nvidia-smi --query-gpu=clocks_event_reasons.active`, as names."""
    mask = nvml.get("nvmlDeviceGetCurrentClocksEventReasons", handle)
    if mask is None:
        mask = nvml.get("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    if mask is None:
        return None
    return [name for bit, name in CLOCK_REASONS.items() if int(mask) & bit]


def _processes(nvml: Nvml, handle: Any) -> list[dict[str, Any]] | None:
    """Compute and graphics processes (`nvidia-smi --query-compute-apps=pid,used_memory`)."""
    seen: dict[int, dict[str, Any]] = {}
    answered = False
    for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        procs = nvml.get(fn, handle)
        if procs is None:
            continue
        answered = True
        for proc in procs:
            used = getattr(proc, "usedGpuMemory", None)
            seen.setdefault(int(proc.pid), {"pid": int(proc.pid), "used_memory_bytes": used})
    return list(seen.values()) if answered else None


def _nvlink_active(nvml: Nvml, handle: Any) -> int | None:
    """Active NVLink links (`nvidia-smi nvlink --status`); None when NVLink is absent."""
    max_links = getattr(nvml.module, "NVML_NVLINK_MAX_LINKS", 18)
    active = 0
    for link in range(max_links):
        state = nvml.get("nvmlDeviceGetNvLinkState", handle, link)
        if state is None:
            return None if link == 0 else active
        active += int(bool(state))
    return active


def _ecc(nvml: Nvml, handle: Any) -> dict[str, Any]:
    """`nvidia-smi --query-gpu=ecc.mode.current,ecc.errors.uncorrected.volatile.total,...`."""
    m = nvml.module
    unc = getattr(m, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    volatile = nvml.get("nvmlDeviceGetTotalEccErrors", handle, unc,
                        getattr(m, "NVML_VOLATILE_ECC", 0))
    aggregate = nvml.get("nvmlDeviceGetTotalEccErrors", handle, unc,
                         getattr(m, "NVML_AGGREGATE_ECC", 1))
    return {"ecc_mode": _enabled(nvml.get("nvmlDeviceGetEccMode", handle)),
            "ecc_volatile_uncorrected": volatile, "ecc_aggregate_uncorrected": aggregate}


def _retirement(nvml: Nvml, handle: Any) -> dict[str, Any]:
    """Retired pages (pre-Ampere) and remapped rows (Ampere+), `nvidia-smi -q -d ROW_REMAPPER`."""
    pending_pages = nvml.get("nvmlDeviceGetRetiredPagesPendingStatus", handle)
    rows = nvml.get("nvmlDeviceGetRemappedRows", handle)
    return {
        "retired_pages_pending": None if pending_pages is None else bool(pending_pages),
        "remapped_rows_pending": None if rows is None else bool(rows[2]),
        "remapped_rows_failed": None if rows is None else bool(rows[3]),
    }


def _pcie(nvml: Nvml, handle: Any) -> dict[str, Any]:
    """`nvidia-smi --query-gpu=pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.*`."""
    return {
        "pcie_gen_current": nvml.get("nvmlDeviceGetCurrPcieLinkGeneration", handle),
        "pcie_gen_max": nvml.get("nvmlDeviceGetMaxPcieLinkGeneration", handle),
        "pcie_width_current": nvml.get("nvmlDeviceGetCurrPcieLinkWidth", handle),
        "pcie_width_max": nvml.get("nvmlDeviceGetMaxPcieLinkWidth", handle),
    }


def _identity(nvml: Nvml, handle: Any) -> dict[str, Any]:
    pci = nvml.get("nvmlDeviceGetPciInfo", handle)
    cc = nvml.get("nvmlDeviceGetCudaComputeCapability", handle)
    return {
        "name": nvml.get("nvmlDeviceGetName", handle),
        "uuid": nvml.get("nvmlDeviceGetUUID", handle),
        "pci_bus_id": None if pci is None else _decode(pci.busId),
        "compute_capability": None if cc is None else f"{cc[0]}.{cc[1]}",
    }


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _mig(nvml: Nvml, handle: Any) -> dict[str, Any]:
    """`nvidia-smi --query-gpu=mig.mode.current,mig.mode.pending`."""
    modes = nvml.get("nvmlDeviceGetMigMode", handle)
    pending = modes[1] if isinstance(modes, (list, tuple)) and len(modes) > 1 else None
    return {"mig_mode": _enabled(modes),
            "mig_mode_pending": None if pending is None else bool(pending)}


def _return_name(module: Any, code: int) -> str:
    """An nvmlReturn_t as its pynvml constant name ("NVML_ERROR_NOT_READY (27)")."""
    names = [n for n in dir(module) if n.startswith("NVML_ERROR_")
             and getattr(module, n) == code]
    return f"{names[0]} ({code})" if names else f"NVML error {code}"


def _fabric_info(nvml: Nvml, handle: Any) -> Any:
    """The GPU's fabric struct, or None where the GPU or the driver has no fabric API.

    nvmlDeviceGetGpuFabricInfoV (c_nvmlGpuFabricInfoV_t, version set by its
    constructor) first; drivers before it only have the deprecated unversioned
    call. pynvml hands the argument to C as is, so it must be byref(struct).
    """
    m = nvml.module
    for fn, struct in (("nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfoV_t"),
                       ("nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t")):
        cls = getattr(m, struct, None)
        if cls is None:
            continue
        info = cls()
        try:
            nvml.call(fn, handle, ctypes.byref(info))
        except NvmlFailure as exc:
            if exc.kind in ("NVMLError_FunctionNotFound", "NVMLError_ArgumentVersionMismatch"):
                continue  # an older driver: try the older call
            if exc.not_available:
                return None
            raise
        return info
    return None


def _fabric(nvml: Nvml, handle: Any) -> dict[str, Any]:
    """`nvidia-smi -q` "Fabric": NVSwitch registration state and, once completed, status."""
    info = _fabric_info(nvml, handle)
    if info is None:
        return {"fabric_state": None, "fabric_status": None}
    m = nvml.module
    state = FABRIC_STATES.get(int(info.state), f"unknown ({int(info.state)})")
    status = None
    # NVML: `status` is valid only once the state is COMPLETED.
    if int(info.state) == getattr(m, "NVML_GPU_FABRIC_STATE_COMPLETED", 3):
        code = int(info.status)
        status = "success" if code == getattr(m, "NVML_SUCCESS", 0) else _return_name(m, code)
    return {"fabric_state": state, "fabric_status": status}


def _state(nvml: Nvml, handle: Any) -> dict[str, Any]:
    m = nvml.module
    util = nvml.get("nvmlDeviceGetUtilizationRates", handle)
    sm = getattr(m, "NVML_CLOCK_SM", 1)
    return {
        "persistence_mode": _enabled(nvml.get("nvmlDeviceGetPersistenceMode", handle)),
        **_mig(nvml, handle),
        "temperature_c": nvml.get("nvmlDeviceGetTemperature", handle,
                                  getattr(m, "NVML_TEMPERATURE_GPU", 0)),
        "power_draw_w": _watts(nvml.get("nvmlDeviceGetPowerUsage", handle)),
        "power_limit_w": _watts(nvml.get("nvmlDeviceGetEnforcedPowerLimit", handle)),
        "sm_clock_mhz": nvml.get("nvmlDeviceGetClockInfo", handle, sm),
        "sm_clock_max_mhz": nvml.get("nvmlDeviceGetMaxClockInfo", handle, sm),
        "utilization_gpu_pct": None if util is None else int(util.gpu),
        "utilization_memory_pct": None if util is None else int(util.memory),
    }


def _cpu_affinity(nvml: Nvml, handle: Any) -> tuple[int, ...]:
    """`nvidia-smi topo -m`'s "CPU Affinity": a bitmask in 64-bit words, CPU 64*i+b in
    word i bit b; () when NVML cannot say."""
    # Room for every CPU id (NVML leaves out those that do not fit); 1024 at least, for
    # CPU ids past the count of configured CPUs.
    words = max(os.cpu_count() or 0, 1024) // 64 + 1
    mask = nvml.get("nvmlDeviceGetCpuAffinity", handle, words)
    if mask is None:
        return ()
    return tuple(64 * i + bit for i, word in enumerate(mask) for bit in range(64)
                 if int(word) >> bit & 1)


def _numa(nvml: Nvml, handle: Any, bus_id: str | None, sysfs: Path) -> dict[str, Any]:
    """The GPU's NUMA node (`cat /sys/bus/pci/devices/<bus>/numa_node`) and the CPUs near it.

    Not nvmlDeviceGetNumaNodeId: that is the node of the GPU's own memory on platforms
    where the GPU is a NUMA node (Grace Hopper), not the node of the CPUs near it.
    """
    if bus_id is None:
        return {"numa_node": None, "cpu_affinity": None}
    cpus = _cpu_affinity(nvml, handle) or read_local_cpus(bus_id, sysfs)
    return {"numa_node": read_numa_node(bus_id, sysfs), "cpu_affinity": cpulist(cpus) or None}


def read_gpu(nvml: Nvml, index: int, sysfs: Path = SYSFS) -> GpuRecord:
    """Everything `nvidia-smi -q -i <index>` shows that matters here."""
    fields: dict[str, Any] = {}
    try:
        handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
        fields.update(_identity(nvml, handle))
        total, used = _memory(nvml, handle)
        fields.update(memory_total_bytes=total, memory_used_bytes=used)
        fields.update(_state(nvml, handle), **_pcie(nvml, handle), **_ecc(nvml, handle))
        fields.update(_retirement(nvml, handle))
        fields["clock_event_reasons"] = _clock_reasons(nvml, handle)
        procs = _processes(nvml, handle)
        fields.update(process_count=None if procs is None else len(procs),
                      processes=procs or [])
        fields["nvlink_active_links"] = _nvlink_active(nvml, handle)
        fields.update(_fabric(nvml, handle))
        fields.update(_numa(nvml, handle, fields.get("pci_bus_id"), sysfs))
    except NvmlFailure as exc:
        fields.update(error=str(exc), error_kind=exc.kind, error_hint=exc.hint)
    return GpuRecord(index=index, **fields)


def _lost_finding(gpu: GpuRecord) -> Finding:
    check = "gpu.lost" if gpu.error_kind == "NVMLError_GpuIsLost" else "gpu.query"
    return fail(check, f"query failed: {gpu.error}", gpu.error_hint or "run nvidia-smi",
                gpu.subject)


def busy_finding(gpu: GpuRecord) -> Finding:
    """WARN before a benchmark: another process is on the GPU."""
    if gpu.process_count is None:
        return skip("gpu.busy", "process list: n/a", gpu.subject)
    if gpu.process_count:
        pids = ", ".join(str(p["pid"]) for p in gpu.processes[:8])
        return warn("gpu.busy", f"{gpu.process_count} process(es) using it (pid {pids}), "
                    f"utilisation {gpu.utilization_gpu_pct}%",
                    "wait for them or pick another GPU before benchmarking "
                    "(nvidia-smi --query-compute-apps=pid,process_name --format=csv)",
                    gpu.subject)
    return ok("gpu.busy", "no processes on it", gpu.subject)


def pcie_finding(gpu: GpuRecord) -> Finding:
    """Link width below its max is a seating/riser/slot problem; a lower gen is often idle."""
    cur, top = gpu.pcie_width_current, gpu.pcie_width_max
    if cur is None or top is None:
        return skip("gpu.pcie.width", "PCIe link width: n/a", gpu.subject)
    gen = f"Gen{gpu.pcie_gen_current}/{gpu.pcie_gen_max}"
    if cur < top:
        return warn("gpu.pcie.width", f"PCIe link is x{cur} of x{top} ({gen})",
                    "reseat the GPU or check the riser/slot; a narrower link cuts host "
                    "transfer bandwidth", gpu.subject)
    note = ""
    if gpu.pcie_gen_current and gpu.pcie_gen_max and gpu.pcie_gen_current < gpu.pcie_gen_max:
        note = " (idle GPUs lower the link generation to save power; check under load)"
    return ok("gpu.pcie.width", f"PCIe link x{cur} of x{top}, {gen}{note}", gpu.subject)


def ecc_findings(gpu: GpuRecord) -> list[Finding]:
    subject = gpu.subject
    volatile, aggregate = gpu.ecc_volatile_uncorrected, gpu.ecc_aggregate_uncorrected
    if volatile is None:
        mode = "ECC disabled" if gpu.ecc_mode is False else "ECC counters n/a"
        return [skip("gpu.ecc.volatile_uncorrected", mode, subject)]
    findings = []
    if volatile > 0:
        findings.append(fail("gpu.ecc.volatile_uncorrected",
                             f"{volatile} uncorrected ECC error(s) since the last driver load",
                             "drain the node and reset the GPU (nvidia-smi -r); if they return, "
                             "replace it", subject))
    else:
        findings.append(ok("gpu.ecc.volatile_uncorrected", "no uncorrected ECC errors",
                           subject))
    if aggregate:
        findings.append(warn("gpu.ecc.aggregate_uncorrected",
                             f"{aggregate} uncorrected ECC error(s) over the GPU's lifetime",
                             "watch this GPU; repeated errors mean an RMA", subject))
    return findings


def retirement_findings(gpu: GpuRecord) -> list[Finding]:
    subject, findings = gpu.subject, []
    if gpu.retired_pages_pending:
        findings.append(fail("gpu.retired_pages.pending", "retired memory pages are pending",
                             "reset the GPU (nvidia-smi -r) or reboot to retire them", subject))
    if gpu.remapped_rows_pending:
        findings.append(fail("gpu.remapped_rows.pending", "a memory row remap is pending",
                             "reset the GPU (nvidia-smi -r) or reboot so the remap takes "
                             "effect", subject))
    if gpu.remapped_rows_failed:
        findings.append(fail("gpu.remapped_rows.failed", "a memory row remap failed",
                             "the GPU needs service: drain the node and open an RMA", subject))
    known = (gpu.retired_pages_pending, gpu.remapped_rows_pending)
    if not findings and any(v is not None for v in known):
        findings.append(ok("gpu.memory_retirement", "no pending page retirement or row remap",
                           subject))
    return findings


def clock_finding(gpu: GpuRecord) -> Finding:
    """`nvidia-smi -q -d PERFORMANCE`: thermal, power-brake and HW slowdowns are WARN."""
    reasons = gpu.clock_event_reasons
    if reasons is None:
        return skip("gpu.clocks.event_reasons", "clock event reasons: n/a", gpu.subject)
    # One sample cannot hold 0x8 against NVML's own caveat (also set at P-state and
    # clock changes): alone it is noted, not warned; docs/faults.md, gpucheck stress.
    bad = [r for r in reasons if r in BAD_CLOCK_REASONS]
    if bad and bad != ["hw_slowdown"]:
        return warn("gpu.clocks.event_reasons", f"clocks held down by {', '.join(bad)} "
                    f"(SM {gpu.sm_clock_mhz}/{gpu.sm_clock_max_mhz} MHz, "
                    f"{gpu.temperature_c} C)",
                    "check cooling, airflow and the power supply; nvidia-smi -q -d "
                    "PERFORMANCE,TEMPERATURE", gpu.subject)
    note = ("; the HW slowdown flag alone, which NVML also sets at P-state and clock "
            "changes: one sample cannot tell") if bad else ""
    return ok("gpu.clocks.event_reasons", f"no slowdown ({', '.join(reasons) or 'none'}{note})",
              gpu.subject)


def persistence_finding(gpu: GpuRecord) -> Finding:
    """Persistence mode off: every process that opens the GPU brings it up again."""
    check = "gpu.persistence_mode"
    if gpu.persistence_mode is None:
        return skip(check, "persistence mode: n/a", gpu.subject)
    if not gpu.persistence_mode:
        return warn(check, "persistence mode is off: the driver tears the GPU down whenever no "
                    "process holds it, so each job (and each NVML or CUDA start) brings it up "
                    "again, which takes seconds per GPU on H100/H200/B200 and can look like a "
                    "hang", "turn it on: sudo nvidia-smi -pm 1, or run the nvidia-persistenced "
                    "service (systemctl enable --now nvidia-persistenced)", gpu.subject)
    return ok(check, "persistence mode is on", gpu.subject)


def mig_finding(gpu: GpuRecord) -> Finding | None:
    """MIG on is a choice, not a fault: say what it means. A pending change is a WARN."""
    check = "gpu.mig_mode"
    if gpu.mig_mode_pending is not None and gpu.mig_mode is not None \
            and gpu.mig_mode_pending != gpu.mig_mode:
        now, then = ("on", "off") if gpu.mig_mode else ("off", "on")
        return warn(check, f"MIG mode is {now} but {then} is pending: the change takes effect "
                    "only after a GPU reset", f"reset the GPU (nvidia-smi -r -i {gpu.index}) "
                    "or reboot the node", gpu.subject)
    if not gpu.mig_mode:
        return None
    return ok(check, "MIG mode is on: CUDA gives each process one MIG instance (choose it with "
              "CUDA_VISIBLE_DEVICES=MIG-<uuid>), and NCCL cannot connect instances of the same "
              "GPU, so a multi-GPU job needs one instance per physical GPU", gpu.subject)


def fabric_finding(gpu: GpuRecord) -> Finding | None:
    """NVSwitch systems: CUDA will not start (error 802) until the fabric registers the GPU."""
    check, state = "gpu.fabric", gpu.fabric_state
    if state in (None, "not_supported"):
        return None  # no NVSwitch fabric on this GPU (PCIe cards, pre-Hopper)
    if state != "completed":
        wait = " (it can take a minute after boot: run again)" if state == "in_progress" else ""
        where = {"not_started": "has not started", "in_progress": "is still in progress"}
        return fail(check, f"NVSwitch fabric registration {where.get(state, f'is {state}')}: CUDA "
                    "fails to initialise on this GPU (error 802, \"system not yet "
                    f"initialized\") until the fabric manager has registered it{wait}",
                    FABRIC_HINT, gpu.subject)
    if gpu.fabric_status != "success":
        return fail(check, f"NVSwitch fabric registration failed ({gpu.fabric_status}): CUDA "
                    "fails to initialise on this GPU (error 802)", FABRIC_HINT, gpu.subject)
    return ok(check, "NVSwitch fabric registration completed", gpu.subject)


def gpu_findings(gpu: GpuRecord) -> list[Finding]:
    if gpu.error:
        return [_lost_finding(gpu)]
    optional = [f for f in (mig_finding(gpu), fabric_finding(gpu)) if f is not None]
    return [busy_finding(gpu), pcie_finding(gpu), *ecc_findings(gpu),
            *retirement_findings(gpu), clock_finding(gpu), persistence_finding(gpu),
            *optional]


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


def _version_tuple(version: str) -> tuple[int, int]:
    parts = ([*version.split("."), "0"])[:2]
    try:
        return int(parts[0]), int(parts[1])
    except ValueError:
        return 0, 0


# Which GPUs torch's kernels run on. From the CUDA C++ Programming Guide ("Binary
# Compatibility", "PTX Compatibility", and "Feature Availability" for the a/f suffixes;
# and NVIDIA's "Blackwell and CUDA 12.9 introduce family-specific architecture
# features" post):
# - SASS (a cubin, 'sm_XY') built for X.Y runs on X.Z with Z >= Y, never across majors
#   (sm_80 runs on sm_86 and sm_89, not on sm_90; sm_120 not on sm_100);
# - 'sm_90a'/'sm_100a' (architecture-specific) run only on exactly 9.0/10.0;
# - 'sm_100f' (family-specific, CUDA 12.9+) runs on 10.Z with Z >= 0, like plain SASS;
# - PTX ('compute_XY') is JIT-compiled by the driver for any GPU of X.Y or newer,
#   across majors (compute_120 PTX runs on a future sm_130), but the driver's JIT
#   understands PTX only up to its own CUDA version (cudaErrorUnsupportedPtxVersion;
#   the "Minor Version Compatibility" limits in NVIDIA's CUDA Compatibility guide).
# Tegra parts (sm_72, sm_87, ...) have no binary compatibility; not modelled here.
_ARCH = re.compile(r"(sm|compute)_(\d+)(\d)([af]?)")


def parse_arch(entry: str) -> tuple[str, int, int, str] | None:
    """'sm_90' -> ('sm', 9, 0, ''), 'sm_100a' -> ('sm', 10, 0, 'a'), 'compute_120' -> PTX."""
    match = _ARCH.fullmatch(entry.strip())
    if match is None:
        return None
    return match[1], int(match[2]), int(match[3]), match[4]


def parse_cc(cc: str | None) -> tuple[int, int] | None:
    """NVML's compute capability "9.0" -> (9, 0)."""
    try:
        major, minor = (cc or "").split(".")
        return int(major), int(minor)
    except ValueError:
        return None


def _runs_on(arch: tuple[str, int, int, str], cc: tuple[int, int]) -> bool:
    kind, major, minor, suffix = arch
    if suffix == "a":  # architecture-specific: that exact GPU only
        return cc == (major, minor)
    if kind == "sm" or suffix == "f":  # SASS or family PTX: same major, minor >= Y
        return cc[0] == major and cc[1] >= minor
    return cc >= (major, minor)  # PTX: JIT for any newer GPU


def arch_coverage(cc: str | None, arch_list: Sequence[str]) -> tuple[str, str | None]:
    """How torch's kernels reach a GPU of this compute capability.

    ("sass", 'sm_80') when a cubin runs on it natively, ("ptx", 'compute_90') when
    only the driver's JIT can make its kernels, ("none", None) when nothing runs
    ("no kernel image is available for execution on the device"), ("unknown", None)
    without a compute capability.
    """
    gpu = parse_cc(cc)
    if gpu is None:
        return "unknown", None
    parsed = [(entry, parse_arch(entry)) for entry in arch_list]
    for kind in ("sm", "compute"):
        for entry, arch in parsed:
            if arch is not None and arch[0] == kind and _runs_on(arch, gpu):
                return ("sass" if kind == "sm" else "ptx"), entry
    return "none", None


def sm_name(cc: str | None) -> str:
    """"9.0" -> "sm_90" (the name torch's arch list uses)."""
    parsed = parse_cc(cc)
    return f"sm_{parsed[0]}{parsed[1]}" if parsed else f"compute capability {cc}"


def arch_finding(gpu: GpuRecord, arch_list: Sequence[str], ptx_jit_ok: bool) -> Finding | None:
    """`gpu.arch_supported`: does this torch have kernels this GPU can run?"""
    how, entry = arch_coverage(gpu.compute_capability, arch_list)
    if how == "unknown":
        return None
    check, sm = "gpu.arch_supported", sm_name(gpu.compute_capability)
    listed = ", ".join(arch_list)
    upgrade = (f"install a torch build whose arch list has {sm} (torch.cuda.get_arch_list()), "
               f"or build torch with TORCH_CUDA_ARCH_LIST={gpu.compute_capability}")
    if how == "sass":
        return ok(check, f"{sm}: torch ships native kernels for it ({entry})", gpu.subject)
    if how == "none":
        return fail(check, f"{sm} is not in torch's arch list ({listed}): the first CUDA kernel "
                    "fails with \"no kernel image is available for execution on the device\"",
                    upgrade, gpu.subject)
    message = (f"{sm} has no native kernels in torch's arch list ({listed}): it runs only by "
               f"JIT-compiling torch's {entry} PTX")
    if not ptx_jit_ok:
        return fail(check, f"{message}, and this driver is older than torch's CUDA, so its "
                    "JIT cannot compile that PTX (cudaErrorUnsupportedPtxVersion)",
                    f"upgrade the NVIDIA driver, or {upgrade}", gpu.subject)
    return warn(check, f"{message}: the first start compiles every kernel (minutes) and they "
                "may run slower than native ones", upgrade, gpu.subject)


def cuda_compat_finding(driver: DriverInfo, torch_cuda: str | None) -> Finding:
    """The driver's newest CUDA against the CUDA torch was built with.

    FAIL when the driver's CUDA major is older than torch's (CUDA cannot start);
    OK when the major matches, with a note when the driver's minor is older:
    CUDA 11+ runs it by minor-version compatibility (what the GPUs need from torch's
    kernels is `gpu.arch_supported`'s part); OK otherwise.
    """
    check = "driver.cuda_compat"
    if torch_cuda is None:
        return skip(check, "torch has no CUDA build to compare with the driver")
    if not driver.present or driver.cuda_version is None:
        return skip(check, f"torch needs CUDA {torch_cuda}; the driver's CUDA is unknown")
    have, need = _version_tuple(driver.cuda_version), _version_tuple(torch_cuda)
    versions = f"driver {driver.driver_version} supports CUDA {driver.cuda_version}, " \
               f"torch was built with CUDA {torch_cuda}"
    if have[0] < need[0]:
        return fail(check, f"{versions}: the driver is too old for this torch",
                    "upgrade the NVIDIA driver (then reboot), or install a torch built for "
                    f"CUDA {driver.cuda_version} or older")
    if have < need:
        return ok(check, f"{versions}: runs by CUDA minor-version compatibility (the "
                  "driver cannot JIT-compile torch's newer PTX; see gpu.arch_supported)")
    return ok(check, versions)


def cuda_compat_findings(driver: DriverInfo, torch_cuda: str | None,
                         gpus: Sequence[GpuRecord] = (),
                         arch_list: Sequence[str] = ()) -> list[Finding]:
    """`driver.cuda_compat` and, for a CUDA torch, `gpu.arch_supported` per GPU."""
    findings = [cuda_compat_finding(driver, torch_cuda)]
    queried = [g for g in gpus if not g.error and g.compute_capability]
    if torch_cuda is None or not queried:
        return findings
    if not arch_list:
        return [*findings, skip("gpu.arch_supported", "torch reports no CUDA arch list "
                                "(torch.cuda.get_arch_list()); GPU architectures not checked")]
    have = _version_tuple(driver.cuda_version) if driver.cuda_version else None
    ptx_jit_ok = have is None or have >= _version_tuple(torch_cuda)
    arch = [arch_finding(g, arch_list, ptx_jit_ok) for g in queried]
    return [*findings, *(f for f in arch if f is not None)]


def driver_section(info: DriverInfo, pci_gpus: int) -> Section:
    data = {
        "driver_version": info.driver_version,
        "cuda_driver_version": info.cuda_version,
        "gpu_count": info.gpu_count,
        "nvidia_pci_devices": pci_gpus,
        "nvml_error": None if info.failure is None else str(info.failure),
    }
    return Section("driver", "NVIDIA driver", data, [driver_finding(info, pci_gpus)])


def numa_findings(gpus: Sequence[GpuRecord], nodes: Mapping[int, str]) -> list[Finding]:
    """`gpu.numa`: an OK per NUMA node naming its GPUs and CPUs (`nvidia-smi topo -m`), on
    machines with more than one node (`nodes`: node -> its cpulist). Never a WARN: where a
    GPU sits is the board's design; what costs is a rank running on another node's CPUs,
    which bench, comm and stress judge (`ranks.numa`)."""
    if len(nodes) < 2:
        return []  # one node, or no NUMA information: nothing to say
    by_node: dict[int, list[int]] = {}
    for gpu in gpus:
        if gpu.numa_node is not None:
            by_node.setdefault(gpu.numa_node, []).append(gpu.index)
    return [ok("gpu.numa", f"GPU {cpulist(tuple(indices))} on NUMA node {node}"
               + (f" (CPUs {nodes[node]})" if nodes.get(node) else ""), f"NUMA node {node}")
            for node, indices in sorted(by_node.items())]


def gpus_section(nvml: Nvml, gpus: list[GpuRecord],
                 nodes: Mapping[int, str] | None = None) -> Section:
    """The GPU table, per-GPU findings, `gpu.numa` (`nodes`: NUMA node -> its CPUs) and
    the topology matrix."""
    findings = [f for gpu in gpus for f in gpu_findings(gpu)]
    findings += numa_findings(gpus, nodes or {})
    data: dict[str, Any] = {"gpus": [g.row() for g in gpus]}
    data["processes"] = [{"gpu": g.index, **p} for g in gpus for p in g.processes]
    try:
        data["topology"] = read_topology(nvml, gpus) if len(gpus) > 1 else []
    except NvmlFailure as exc:
        data["topology"] = []
        findings.append(fail("gpu.topology", f"topology query failed: {exc}", exc.hint))
    return Section("gpus", "GPUs", data, findings)


@dataclass(frozen=True)
class NvmlResult:
    driver: DriverInfo
    gpus: list[GpuRecord]
    sections: list[Section]
    pci_gpus: int


def probe_nvml(nvml: Nvml | None = None, sysfs: Path = SYSFS) -> NvmlResult:
    """Driver and every GPU (`nvidia-smi -q` and `nvidia-smi topo -m`); `sysfs` is where
    the GPUs' NUMA nodes are read (a fake tree in tests)."""
    nvml = nvml or Nvml()
    pci_gpus = nvidia_pci_devices()
    info = read_driver(nvml)
    sections = [driver_section(info, pci_gpus)]
    gpus: list[GpuRecord] = []
    if info.present:
        gpus = [read_gpu(nvml, i, sysfs) for i in range(info.gpu_count or 0)]
        nodes = {n: cpulist(node_cpus(n, sysfs)) for n in numa_nodes(sysfs)}
        sections.append(gpus_section(nvml, gpus, nodes))
    else:
        sections.append(Section("gpus", "GPUs", {"gpus": []},
                                [skip("gpu.count", "no GPU can be queried without NVML")]))
    if nvml.hung is not None:
        sections[0].findings.append(fail("driver.nvml_hang", str(nvml.hung),
                                         "check dmesg for Xid errors; the driver may need a "
                                         "reset or the node a reboot"))
    elif nvml.slow_calls:  # late but answered: not a hang (gpucheck/probes/nvml.py)
        sections[0].findings.append(warn("driver.nvml_slow", slow_words(nvml.slow_calls),
                                         SLOW_ADVICE))
    nvml.shutdown()
    return NvmlResult(info, gpus, sections, pci_gpus)
