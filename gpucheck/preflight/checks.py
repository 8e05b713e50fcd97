"""The per-rank pieces of `gpucheck preflight`: the budget every rank agrees on, env's
NVML judges as a list of findings, the kernel log's Xids, one large allocation.

The budget: each check begins with an all_reduce (MIN) of the seconds left, so every
rank runs it or SKIPs it alike, and the group's timeout is set to what is left: a rank
that stops answering ends the wait at the budget's end (docs/preflight.md).
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpucheck.report import Finding, fail, skip

# Seconds a collective may wait beyond the budget's end: ranks reach the end a little
# apart, and the final agreement (gather, decide, broadcast) needs its own moment.
GRACE_S = 5.0


class Budget:
    """Seconds left of the checks' budget, agreed by every rank."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._end = clock() + seconds

    def left_here(self) -> float:
        return max(0.0, self._end - self._clock())

    def agreed_left(self, device: str) -> float:
        """The least any rank has left (every rank calls it at the same point)."""
        import torch
        import torch.distributed as dist

        self.bound_waits(GRACE_S)
        where = "cuda" if device == "cuda" else "cpu"
        value = torch.tensor([self.left_here()], dtype=torch.float64, device=where)
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        return float(value.item())

    def bound_waits(self, extra_s: float = 0.0) -> None:
        """No collective from here on waits past the budget's end (plus `extra_s`)."""
        import torch.distributed as dist

        seconds = max(1.0, self.left_here() + extra_s)
        # The group's own method: `dist.set_timeout` is newer than torch 2.11.
        group = dist.group.WORLD
        if group is None:
            raise RuntimeError("the budget bounds a process group's waits: none is open")
        group.set_timeout(_dt.timedelta(seconds=seconds))


# A GPU that cannot give most of its free memory in one piece fails the job's first
# step; leave room for the CUDA context, NCCL's buffers and fragmentation.
DEFAULT_ALLOC_FRACTION = 0.8
CPU_ALLOC_BYTES = 64 << 20  # CPU ranks: a token allocation (host memory is the OS's)
# The kernel log's share of the nvml check: dmesg answers in well under a second on a
# healthy node; journalctl -k -b on a long boot can take seconds. Past this, a SKIP.
KERNEL_LOG_S = 3.0


def _cpu_ranks(environ: Mapping[str, str], asked: bool) -> Finding:
    from gpucheck.devices import expected_gpus, sysfs_root
    from gpucheck.probes.gpu_judge import cpu_ranks_finding

    expected = expected_gpus(environ, sysfs_root(environ))
    return cpu_ranks_finding(expected, asked) or skip(
        "preflight.nvml", f"CPU ranks: no GPU to read through NVML, and none expected "
        f"({expected.source}: 0)")


def nvml_findings(device: str, own_pids: Collection[int] = (),
                  kernel_log_s: float = KERNEL_LOG_S, *, environ: Mapping[str, str],
                  cpu_asked: bool = False) -> list[dict[str, Any]]:
    """Every GPU of this node read through NVML and judged by env's judges, and this
    boot's XIDs: the findings, as dicts (`gpu.busy` counts only processes not the
    job's own ranks, `own_pids`)."""
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
    findings += kernel_log_findings(result.gpus, kernel_log_s, environ=environ)
    for gpu in result.gpus:
        if gpu.process_count is not None and not gpu.error:
            others = [p for p in gpu.processes if p.get("pid") not in set(own_pids)]
            findings.append(busy_finding(replace(gpu, processes=others,
                                                 process_count=len(others))))
    return [f.to_dict() for f in findings]


def large_allocation(rank: int, device: str, fraction: float) -> dict[str, Any]:
    """Allocate `fraction` of the free device memory in one piece and write it:
    {rank, bytes, ok, error}."""
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
                        clock: Callable[[], float] = time.monotonic, *,
                        environ: Mapping[str, str]) -> list[Finding]:
    """This boot's XIDs, read as env reads the kernel log (or the saved log
    GPUCHECK_KERNEL_LOG names) within `within_s` in all: slow or unreadable is a SKIP."""
    from gpucheck.probes.kernel_log import KERNEL_LOG_VAR, read_kernel_log, run_command
    from gpucheck.probes.xid_section import kernel_log_section

    saved = environ.get(KERNEL_LOG_VAR) or None

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
