"""Each rank's GPU as NVML sees it: which GPU, its memory, its SM utilisation.

A rank spinning in an NCCL kernel keeps its GPU busy (NCCL's kernels poll for their
peers), a rank idle in Python leaves it at 0 %: next to the Python stack this tells
"waiting on the GPU" from "stuck before launching anything". What `nvidia-smi
--query-compute-apps=pid,used_memory --format=csv` and `nvidia-smi pmon -c 1` show.

Through the one NVML doorway (gpucheck.probes.nvml). In a container with its own PID
namespace NVML reports host PIDs, which match no rank: the report then says n/a.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from gpucheck.probes.nvml import Nvml, NvmlFailure


def per_process(pids: Iterable[int], timeout_s: float = 3.0,
                window_s: float = 2.0) -> tuple[dict[int, dict[str, Any]], str | None]:
    """({pid: {gpu, gpu_name, gpu_memory_bytes, gpu_sm_util_pct}}, why some or none are
    missing). Utilisation is over the last `window_s` seconds: call it at the end of the
    window. A GPU NVML fails on is asked once more, then left out with its reason: the
    other GPUs' ranks keep their view."""
    wanted = set(pids)
    since_us = max(0, int((time.time() - window_s) * 1e6))
    nvml = Nvml(timeout_s=timeout_s)
    found: dict[int, dict[str, Any]] = {}
    failed: list[str] = []
    try:
        for index in range(nvml.call("nvmlDeviceGetCount")):
            seen, why = _one_gpu(nvml, index, wanted, since_us)
            found.update(seen)
            failed += [f"GPU {index}: {why}"] if why else []
    except NvmlFailure as exc:
        return {}, f"NVML: {exc.meaning}"
    finally:
        nvml.shutdown()
    if failed:
        return found, "NVML: " + "; ".join(failed)
    return found, None if found else "NVML lists none of these PIDs on any GPU"


def _one_gpu(nvml: Nvml, index: int, wanted: set[int],
             since_us: int) -> tuple[dict[int, dict[str, Any]], str | None]:
    """One GPU's ranks, asked twice (as gpu_read asks a changing process list again):
    (its ranks, None), or ({}, NVML's reason)."""
    why = None
    for _ in range(2):
        try:
            handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
            return _gpu_processes(nvml, handle, index, wanted, since_us), None
        except NvmlFailure as exc:
            why = exc.meaning
    return {}, why


def _gpu_processes(nvml: Nvml, handle: Any, index: int, wanted: set[int],
                   since_us: int) -> dict[int, dict[str, Any]]:
    procs = nvml.get("nvmlDeviceGetComputeRunningProcesses", handle, default=[]) or []
    mine = {p.pid: p for p in procs if p.pid in wanted}
    if not mine:
        return {}
    name = nvml.get("nvmlDeviceGetName", handle)
    util = _sm_util(nvml, handle, since_us)
    return {pid: {"gpu": index, "gpu_name": name,
                  "gpu_memory_bytes": getattr(p, "usedGpuMemory", None),
                  # Listed on the GPU with no sample since `since_us`: NVML keeps samples
                  # only of processes with non-zero utilisation, so this one was at 0 %.
                  "gpu_sm_util_pct": None if util is None else util.get(pid, 0.0)}
            for pid, p in mine.items()}


def _sm_util(nvml: Nvml, handle: Any, since_us: int) -> dict[int, float] | None:
    """Mean SM utilisation per PID over the samples NVML took after `since_us` (CPU
    time, microseconds: lastSeenTimeStamp), so a busy phase before the hang does not
    count. NVML returns a sample only for a process with non-zero utilisation and
    raises NotFound when no process has one (every process idle): {} then. None when
    the figure is not to be had (NotSupported, NoPermission, a timeout)."""
    try:
        samples = nvml.call("nvmlDeviceGetProcessUtilization", handle, since_us)
    except NvmlFailure as exc:
        return {} if exc.kind == "NVMLError_NotFound" else None
    by_pid: dict[int, list[int]] = defaultdict(list)
    for sample in samples or []:
        if getattr(sample, "timeStamp", since_us + 1) > since_us:
            by_pid[sample.pid].append(sample.smUtil)
    return {pid: sum(v) / len(v) for pid, v in by_pid.items()}
