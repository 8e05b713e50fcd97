"""The per-rank pieces of `gpucheck preflight` that no other command has in this form:
env's NVML judges as a list of findings, and one large allocation."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace
from typing import Any

from gpucheck.report import fail, skip

# A GPU that cannot give most of its free memory in one piece fails the job's first
# step; leave room for the CUDA context, NCCL's buffers and fragmentation.
DEFAULT_ALLOC_FRACTION = 0.8
CPU_ALLOC_BYTES = 64 << 20  # CPU ranks: a token allocation (host memory is the OS's)


def nvml_findings(device: str, own_pids: Collection[int] = ()) -> list[dict[str, Any]]:
    """Every GPU of this node read through NVML and judged by env's judges (ECC, row
    remaps, retired pages, recovery action, fabric, clocks, lost GPUs): the findings,
    as dicts. `nvidia-smi -q` shows the same fields. The job's own ranks (`own_pids`)
    are on the GPUs by now: `gpu.busy` counts only the other processes."""
    if device != "cuda":
        return [skip("preflight.nvml", "CPU ranks: no GPU to read through NVML").to_dict()]
    from gpucheck.probes.gpu_judge import busy_finding
    from gpucheck.probes.gpus import probe_nvml

    try:
        result = probe_nvml()
    except Exception as exc:  # a probe that fails is a finding, never a crash
        return [fail("preflight.nvml", f"NVML could not be read: {exc}",
                     "run gpucheck env on this node to see why").to_dict()]
    findings = [f for section in result.sections for f in section.findings
                if f.check != "gpu.busy"]
    for gpu in result.gpus:
        if gpu.process_count is not None and not gpu.error:
            others = [p for p in gpu.processes if p.get("pid") not in set(own_pids)]
            findings.append(busy_finding(replace(gpu, processes=others,
                                                 process_count=len(others))))
    return [f.to_dict() for f in findings]


def large_allocation(rank: int, device: str, fraction: float) -> dict[str, Any]:
    """Allocate `fraction` of the free device memory in one piece and write it (CPU: a
    token 64 MiB): {rank, bytes, ok, error}."""
    import torch

    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
        size = int(free * fraction)
    else:
        size = CPU_ALLOC_BYTES
    try:
        block = torch.empty(size, dtype=torch.uint8, device=device)
        block.fill_(0xA5)
        if device == "cuda":
            torch.cuda.synchronize()
        del block
        if device == "cuda":
            torch.cuda.empty_cache()
    except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        return {"rank": rank, "bytes": size, "ok": False, "error": str(exc).splitlines()[0]}
    return {"rank": rank, "bytes": size, "ok": True, "error": None}
