"""The per-rank pieces of `gpucheck preflight` that no other command has in this form:
env's NVML judges as a list of findings, and one large allocation."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpucheck.report import Finding, fail, skip

# A GPU that cannot give most of its free memory in one piece fails the job's first
# step; leave room for the CUDA context, NCCL's buffers and fragmentation.
DEFAULT_ALLOC_FRACTION = 0.8
CPU_ALLOC_BYTES = 64 << 20  # CPU ranks: a token allocation (host memory is the OS's)
# The kernel log's share of the nvml check: dmesg answers in well under a second on a
# healthy node; journalctl -k -b on a long boot can take seconds. Past this, a SKIP.
KERNEL_LOG_S = 3.0


def _cpu_ranks(environ: Mapping[str, str] | None, asked: bool) -> Finding:
    from gpucheck.probes.gpu_judge import cpu_ranks_finding
    from gpucheck.probes.gpu_read import expected_gpus, sysfs_root

    environ = os.environ if environ is None else environ
    expected = expected_gpus(environ, sysfs_root(environ))
    return cpu_ranks_finding(expected, asked) or skip(
        "preflight.nvml", f"CPU ranks: no GPU to read through NVML, and none expected "
        f"({expected.source}: 0)")


def nvml_findings(device: str, own_pids: Collection[int] = (),
                  kernel_log_s: float = KERNEL_LOG_S,
                  environ: Mapping[str, str] | None = None,
                  cpu_asked: bool = False) -> list[dict[str, Any]]:
    """Every GPU of this node read through NVML and judged by env's judges (ECC, row
    remaps, retired pages, recovery action, fabric, clocks, lost GPUs): the findings,
    as dicts. `nvidia-smi -q` shows the same fields. The job's own ranks (`own_pids`)
    are on the GPUs by now: `gpu.busy` counts only the other processes. The XIDs of
    this boot come from the kernel log (`kernel_log_findings`)."""
    if device != "cuda":  # no GPU to read, but a node whose log holds an Xid is no go
        return [f.to_dict() for f in (_cpu_ranks(environ, cpu_asked),
                                      *kernel_log_findings([], kernel_log_s, environ=environ))]
    from gpucheck.probes.gpu_judge import busy_finding
    from gpucheck.probes.gpus import probe_nvml

    try:
        result = probe_nvml(environ=environ)
    except Exception as exc:  # a probe that fails is a finding, never a crash
        return [fail("preflight.nvml", f"NVML could not be read: {exc}",
                     "run gpucheck env on this node to see why").to_dict()]
    findings = [f for section in result.sections for f in section.findings
                if f.check != "gpu.busy"]
    findings += kernel_log_findings(result.gpus, kernel_log_s)
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


def kernel_log_findings(gpus: Sequence[Any], within_s: float = KERNEL_LOG_S,
                        runner: Callable[..., Any] | None = None,
                        clock: Callable[[], float] = time.monotonic,
                        environ: Mapping[str, str] | None = None) -> list[Finding]:
    """The XIDs since boot: this boot's kernel log read as env reads it (/dev/kmsg, else
    journalctl -k -b; never a world-writable syslog file: gpucheck.probes.kernel_log),
    or the saved log GPUCHECK_KERNEL_LOG names, judged by the XID table
    (gpucheck.probes.xid_section). Each command's own timeout is cut to `within_s` in
    all, so a slow journal is a SKIP within the budget, never a wait past it;
    unreadable is a SKIP with the reason."""
    from gpucheck.probes.kernel_log import KERNEL_LOG_VAR, read_kernel_log, run_command
    from gpucheck.probes.xid_section import kernel_log_section

    saved = (os.environ if environ is None else environ).get(KERNEL_LOG_VAR) or None

    run = runner or run_command
    end = clock() + within_s

    def capped(argv: Sequence[str], timeout_s: float) -> Any:
        return run(argv, max(0.05, min(timeout_s, end - clock())))

    try:
        log = read_kernel_log(saved, capped)
    except Exception as exc:  # a probe that fails is a finding, never a crash
        return [skip("kernel_log.read", f"the kernel log could not be read within "
                     f"{within_s:g} s: {type(exc).__name__}: {exc}")]
    return list(kernel_log_section(log, gpus).findings)
