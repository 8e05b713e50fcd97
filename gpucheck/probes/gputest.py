"""A quick functional test of every visible GPU, bounded to about a second each.

Allocate, check a matrix product against the CPU, and measure pinned host-to-device
and device-to-host copy bandwidth (what `nvbandwidth` / the CUDA bandwidthTest
sample report, far more briefly).
"""

from __future__ import annotations

import time
from typing import Any

from gpucheck.report import Finding, Section, fail, ok, skip

MATMUL_N = 512
COPY_BYTES = 64 * 1024 * 1024
COPY_BUDGET_S = 0.25


def _subject(torch: Any, index: int) -> str:
    try:
        return f"GPU {index} ({torch.cuda.get_device_name(index)})"
    except Exception:
        return f"GPU {index}"


def matmul_error(torch: Any, device: Any) -> float:
    """Largest |GPU - CPU| of a float32 matrix product (TF32 off)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(MATMUL_N, MATMUL_N, generator=gen)
    b = torch.randn(MATMUL_N, MATMUL_N, generator=gen)
    expected = a @ b
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        got = (a.to(device) @ b.to(device)).cpu()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    return float((got - expected).abs().max())


def copy_gbps(torch: Any, src: Any, dst: Any) -> float:
    """GB/s of repeated `dst.copy_(src)` for about COPY_BUDGET_S, synchronised."""
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    copies, start = 0, time.perf_counter()
    while True:
        dst.copy_(src, non_blocking=True)
        copies += 1
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if elapsed >= COPY_BUDGET_S or copies >= 100:
            return src.numel() * src.element_size() * copies / elapsed / 1e9


def check_one_gpu(torch: Any, index: int) -> dict[str, Any]:
    """Allocate, multiply, copy both ways on cuda:<index>; returns a table row."""
    device = torch.device("cuda", index)
    with torch.cuda.device(index):
        start = time.perf_counter()
        error = matmul_error(torch, device)
        host = torch.empty(COPY_BYTES, dtype=torch.uint8).pin_memory()
        dev = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
        h2d = copy_gbps(torch, host, dev)
        d2h = copy_gbps(torch, dev, host)
        del host, dev
        return {"gpu": index, "matmul_max_abs_error": error, "h2d_gbps": round(h2d, 2),
                "d2h_gbps": round(d2h, 2), "seconds": round(time.perf_counter() - start, 3)}


def _verdict(index: int, subject: str, row: dict[str, Any]) -> Finding:
    # Entries of a 512-wide product of N(0,1) values are ~22; float32 rounding is ~1e-4.
    if not row["matmul_max_abs_error"] < 1e-2:
        return fail("gpu.functional", f"matrix product differs from the CPU by "
                    f"{row['matmul_max_abs_error']:.3g}", "the GPU computes wrong results: "
                    "drain the node, reset the GPU and run the vendor diagnostics (dcgmi diag)",
                    subject)
    return ok("gpu.functional", f"matmul matches the CPU; pinned copies H2D {row['h2d_gbps']} "
              f"GB/s, D2H {row['d2h_gbps']} GB/s", subject)


def probe_gputest(torch: Any | None, enabled: bool = True) -> Section:
    """Run the functional test on each GPU torch can see (sequentially: copies share PCIe)."""
    section = Section("gpu_test", "GPU functional test", {"results": []})
    if not enabled:
        section.findings.append(skip("gpu.functional", "skipped (--no-gpu-test)"))
        return section
    if torch is None or not torch.cuda.is_available():
        section.findings.append(skip("gpu.functional", "no CUDA GPU visible to torch"))
        return section
    for index in range(torch.cuda.device_count()):
        subject = _subject(torch, index)
        try:
            row = check_one_gpu(torch, index)
        except Exception as exc:
            section.findings.append(fail("gpu.functional", f"{type(exc).__name__}: {exc}",
                                         "run nvidia-smi and check dmesg for Xid errors; "
                                         "reset the GPU", subject))
            continue
        section.data["results"].append(row)
        section.findings.append(_verdict(index, subject, row))
    return section
