"""A quick functional test of every visible GPU, bounded to about a second each.

Allocate, check a matrix product against the CPU, and measure pinned host-to-device
and device-to-host copy bandwidth (what `nvbandwidth` / the CUDA bandwidthTest
sample report, far more briefly).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpucheck.devices import GpuIdentity, bus_id_of, cuda_device_count, normal_bus_id, uuid_of
from gpucheck.report import Finding, Section, fail, ok, skip
from gpucheck.subject import Subject

MATMUL_N = 512
COPY_BYTES = 64 * 1024 * 1024
COPY_BUDGET_S = 0.25


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
            return float(src.numel() * src.element_size() * copies / elapsed / 1e9)


def check_one_gpu(torch: Any, index: int) -> dict[str, Any]:
    """Allocate, multiply, copy both ways on cuda:<index>; returns the measured figures."""
    device = torch.device("cuda", index)
    with torch.cuda.device(index):
        start = time.perf_counter()
        error = matmul_error(torch, device)
        host = torch.empty(COPY_BYTES, dtype=torch.uint8).pin_memory()
        dev = torch.empty(COPY_BYTES, dtype=torch.uint8, device=device)
        h2d = copy_gbps(torch, host, dev)
        d2h = copy_gbps(torch, dev, host)
        del host, dev
        return {"matmul_max_abs_error": error, "h2d_gbps": round(h2d, 2),
                "d2h_gbps": round(d2h, 2), "seconds": round(time.perf_counter() - start, 3)}


@dataclass
class GpuTestRun:
    """The test's progress, readable from another thread: when the test hangs on a GPU,
    the runner keeps the rows of the GPUs that passed and names the one in `current`."""

    section: Section = field(default_factory=lambda: Section(
        "gpu_test", "GPU functional test", {"results": []}))
    current: GpuIdentity | None = None


def identify(torch: Any, ordinal: int, nvml_gpus: Sequence[Any] = ()) -> GpuIdentity:
    """cuda:<ordinal> named as NVML names it: matched on PCI bus id, else on UUID.

    CUDA ordinals follow CUDA_VISIBLE_DEVICES and CUDA's own order; NVML indices are
    PCI order. The match makes "GPU 4" here the GPU 4 of the GPU section.
    """
    try:
        props = torch.cuda.get_device_properties(ordinal)
    except Exception:
        return GpuIdentity(ordinal, None, None, None, None)
    bus_id = bus_id_of(props)
    match = next((g for g in nvml_gpus if bus_id and
                  normal_bus_id(getattr(g, "pci_bus_id", None)) == normal_bus_id(bus_id)),
                 None)
    # On a GPU in MIG mode CUDA sees a MIG instance and reports its MIG UUID.
    uuid = uuid_of(props, mig=bool(getattr(match, "mig_mode", False)))
    match = match or next((g for g in nvml_gpus if uuid and g.uuid == uuid), None)
    return GpuIdentity(cuda_ordinal=ordinal, nvml_index=None if match is None else match.index,
                       name=str(getattr(props, "name", "")) or None,
                       pci_bus_id=bus_id or getattr(match, "pci_bus_id", None),
                       uuid=uuid or getattr(match, "uuid", None))


def _verdict(subject: Subject, row: dict[str, Any]) -> Finding:
    # Entries of a 512-wide product of N(0,1) values are ~22; float32 rounding is ~1e-4.
    if not row["matmul_max_abs_error"] < 1e-2:
        return fail("gpu.functional", f"matrix product differs from the CPU by "
                    f"{row['matmul_max_abs_error']:.3g}", "the GPU computes wrong results: "
                    "drain the node, reset the GPU and run the vendor diagnostics (dcgmi diag)",
                    subject)
    return ok("gpu.functional", f"matmul matches the CPU; pinned copies H2D {row['h2d_gbps']} "
              f"GB/s, D2H {row['d2h_gbps']} GB/s", subject)


def probe_gputest(torch: Any | None, enabled: bool = True, nvml_gpus: Sequence[Any] = (),
                  run: GpuTestRun | None = None) -> Section:
    """Run the functional test on each GPU CUDA enumerates (one at a time: copies share
    PCIe). Rows and findings name each GPU by NVML index, bus id and UUID."""
    run = run or GpuTestRun()
    section = run.section
    if not enabled:
        section.findings.append(skip("gpu.functional", "skipped (--no-gpu-test)"))
        return section
    if torch is None or not torch.cuda.is_available():
        section.findings.append(skip("gpu.functional", "no CUDA GPU visible to torch"))
        return section
    for ordinal in range(cuda_device_count(torch)):
        run.current = identity = identify(torch, ordinal, nvml_gpus)
        try:
            measured = check_one_gpu(torch, ordinal)
        except Exception as exc:
            section.findings.append(fail("gpu.functional", f"{type(exc).__name__}: {exc}",
                                         "run nvidia-smi and check dmesg for Xid errors; "
                                         "reset the GPU", identity.subject()))
            continue
        row = {"gpu": identity.label(), **identity.row(), **measured}
        section.data["results"].append(row)
        section.findings.append(_verdict(identity.subject(), row))
    run.current = None
    return section
