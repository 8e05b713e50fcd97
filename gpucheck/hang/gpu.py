"""Each rank's GPU as NVML sees it: which GPU, its memory, its SM utilisation.

A rank spinning in an NCCL kernel keeps its GPU busy (NCCL's kernels poll for their
peers), a rank idle in Python leaves it at 0 %: next to the Python stack this tells
"waiting on the GPU" from "stuck before launching anything". What `nvidia-smi
--query-compute-apps=pid,used_memory --format=csv` and `nvidia-smi pmon -c 1` show.

Through the one NVML doorway (gpucheck.probes.nvml). In a container with its own PID
namespace NVML reports host PIDs, which match no rank: the report then says n/a.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from gpucheck.probes.nvml import Nvml, NvmlFailure


def per_process(pids: Iterable[int], timeout_s: float = 3.0) -> tuple[dict[int, dict[str, Any]],
                                                                      str | None]:
    """({pid: {gpu, gpu_name, gpu_memory_bytes, gpu_sm_util_pct}}, why none when empty)."""
    wanted = set(pids)
    nvml = Nvml(timeout_s=timeout_s)
    try:
        count = nvml.call("nvmlDeviceGetCount")
        found: dict[int, dict[str, Any]] = {}
        for index in range(count):
            handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
            found.update(_gpu_processes(nvml, handle, index, wanted))
    except NvmlFailure as exc:
        return {}, f"NVML: {exc.meaning}"
    finally:
        nvml.shutdown()
    return found, None if found else "NVML lists none of these PIDs on any GPU"


def _gpu_processes(nvml: Nvml, handle: Any, index: int,
                   wanted: set[int]) -> dict[int, dict[str, Any]]:
    procs = nvml.get("nvmlDeviceGetComputeRunningProcesses", handle, default=[]) or []
    mine = {p.pid: p for p in procs if p.pid in wanted}
    if not mine:
        return {}
    name = nvml.get("nvmlDeviceGetName", handle)
    util = _sm_util(nvml, handle)
    return {pid: {"gpu": index, "gpu_name": name,
                  "gpu_memory_bytes": getattr(p, "usedGpuMemory", None),
                  "gpu_sm_util_pct": util.get(pid)} for pid, p in mine.items()}


def _sm_util(nvml: Nvml, handle: Any) -> dict[int, float]:
    """Mean SM utilisation per PID over NVML's sample buffer (timestamp 0: every
    sample it holds, the last few seconds). NotFound (no sample yet) gives none."""
    try:
        samples = nvml.call("nvmlDeviceGetProcessUtilization", handle, 0)
    except NvmlFailure:
        return {}
    by_pid: dict[int, list[int]] = defaultdict(list)
    for sample in samples or []:
        by_pid[sample.pid].append(sample.smUtil)
    return {pid: sum(v) / len(v) for pid, v in by_pid.items()}
