"""`gpucheck env`: the probes run concurrently (phase 1 on daemon threads, phase 2 joins
them) into one report; the quick functional test of every visible GPU (a matmul against
the CPU, pinned copies both ways); env's figures as metrics (docs/env.md)."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpucheck import subject as subjects
from gpucheck.devices import GpuIdentity, bus_id_of, cuda_device_count, normal_bus_id, uuid_of
from gpucheck.measure import Better, Metric, whole
from gpucheck.probes.consistency import cuda_compat_findings, probe_consistency
from gpucheck.probes.gpu_read import DriverInfo, GpuRecord
from gpucheck.probes.gpus import NvmlResult, probe_nvml
from gpucheck.probes.kernel_log import read_kernel_log
from gpucheck.probes.nvml import DEFAULT_TIMEOUT_S, Nvml
from gpucheck.probes.pyenv import TorchvisionCheck, probe_pyenv
from gpucheck.probes.system import probe_envvars, probe_system
from gpucheck.probes.torch_build import TorchInfo, cuda_available_finding, probe_torch
from gpucheck.probes.xid_section import kernel_log_section
from gpucheck.report import Finding, Report, Section, fail, ok, skip
from gpucheck.stats import number

# Long enough for a slow but healthy 8-GPU node's NVML start and attaches.
PHASE1_TIMEOUT_S = 120.0
GPU_TEST_TIMEOUT_S = 10.0
GPU_TEST_PER_GPU_S = 3.0

TITLES = {"system": "System", "python": "Python environment", "torch": "PyTorch build",
          "nvml": "NVIDIA driver", "environment": "Environment variables (allowlisted)",
          "gpu_test": "GPU functional test"}


@dataclass(frozen=True)
class Outcome:
    """A probe's return value, or the error that ended it."""

    value: Any = None
    error: str | None = None
    seconds: float = 0.0


def run_concurrently(probes: Mapping[str, Callable[[], Any]],
                     timeout_s: float) -> dict[str, Outcome]:
    """Each probe on its own daemon thread; wait at most `timeout_s` for all."""
    results: dict[str, Outcome] = {}

    def target(name: str, probe: Callable[[], Any]) -> None:
        start = time.monotonic()
        try:
            results[name] = Outcome(probe(), None, time.monotonic() - start)
        except BaseException as exc:  # a probe must never take the command down
            results[name] = Outcome(None, f"{type(exc).__name__}: {exc}",
                                    time.monotonic() - start)

    threads = [threading.Thread(target=target, args=(name, probe), daemon=True,
                                name=f"gpucheck-{name}") for name, probe in probes.items()]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    for name in probes:
        results.setdefault(name, Outcome(None, f"did not finish within {timeout_s:g} s"))
    return dict(results)


def crashed_section(name: str, error: str) -> Section:
    return Section(name, TITLES.get(name, name), {"probe_error": error},
                   [fail(f"{name}.probe", f"the {name} probe failed: {error}",
                         "run it again with --format json and report a gpucheck bug "
                         "with the output")])


def _section(outcome: Outcome, name: str) -> Section:
    return outcome.value if outcome.error is None else crashed_section(name, outcome.error)


# ---- the GPU functional test ----

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
    """cuda:<ordinal> named as NVML names it (matched on PCI bus id, else UUID), so "GPU 4"
    here is the GPU 4 of the GPU section (docs/env.md "One name per GPU")."""
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


def _verdict(subject: subjects.Subject, row: dict[str, Any]) -> Finding:
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


def _gpu_test(info: TorchInfo, enabled: bool, nvml_gpus: list[GpuRecord],
              timeout_s: float | None = None) -> Section:
    """The GPU functional test, bounded; on a hang the passed GPUs keep their rows."""
    torch = sys.modules.get("torch") if info.imported and info.cuda_available else None
    timeout = timeout_s or GPU_TEST_TIMEOUT_S + GPU_TEST_PER_GPU_S * info.device_count
    run = GpuTestRun()
    outcome = run_concurrently({"gpu_test": lambda: probe_gputest(torch, enabled, nvml_gpus,
                                                                  run)}, timeout)["gpu_test"]
    if outcome.error is None:
        section: Section = outcome.value  # probe_gputest's return
        return section
    hung = run.current
    if hung is None:  # failed before or after any GPU: the probe itself broke
        return crashed_section("gpu_test", outcome.error)
    index = "<index>" if hung.nvml_index is None else hung.nvml_index
    # A copy: the hung thread may still append to its own section later.
    kept = Section(run.section.name, run.section.title,
                   {"results": list(run.section.data["results"])}, list(run.section.findings))
    kept.findings.append(fail(
        "gpu.functional", f"the test did not finish on this GPU: {outcome.error}",
        f"the GPU may be hung: check dmesg for Xid errors and nvidia-smi; reset it "
        f"(nvidia-smi -r -i {index}) or drain the node", hung.subject()))
    return kept


# An OK with no GPU must not read as "the GPUs are fine": the headline says what it covers.
NO_GPU_SCOPE = "no NVIDIA GPU or driver found: software checks only"


def collect_env_report(gpu_test: bool = True, nvml_timeout_s: float = DEFAULT_TIMEOUT_S,
                       environ: Mapping[str, str] | None = None,
                       kernel_log: str | None = None) -> Report:
    environ = dict(os.environ if environ is None else environ)
    phase1 = run_concurrently({
        "torch": probe_torch,
        "nvml": lambda: probe_nvml(Nvml(nvml_timeout_s), environ=environ),
        "system": probe_system,
        "python": probe_pyenv,
        "environment": lambda: probe_envvars(environ),
        "kernel_log": lambda: read_kernel_log(kernel_log),
    }, PHASE1_TIMEOUT_S)
    torch_section: Section
    if (error := phase1["torch"].error) is not None:
        torch_section, info = crashed_section("torch", error), TorchInfo(error=error)
    else:
        torch_section, info = phase1["torch"].value  # probe_torch's return
    # Forked only now, with every phase-1 thread finished (no lock held mid-fork).
    torchvision = TorchvisionCheck(sys.modules.get("torch") if info.imported else None)
    nvml: NvmlResult | None = phase1["nvml"].value
    nvml_sections = nvml.sections if nvml else [crashed_section("nvml", str(phase1["nvml"].error))]
    driver = nvml.driver if nvml else DriverInfo(present=False)
    gpus = nvml.gpus if nvml else []
    gpus_present = bool((nvml and nvml.pci_gpus) or driver.gpu_count)
    torch_section.findings.append(cuda_available_finding(
        info, driver.present if nvml else None, driver.cuda_version, gpus_present, environ))
    nvml_sections[0].findings.extend(cuda_compat_findings(driver, info.cuda, gpus,
                                                          info.arch_list))
    python = _section(phase1["python"], "python")
    report = Report(command="env", scope=None if gpus_present or nvml is None else NO_GPU_SCOPE)
    for section in (_section(phase1["system"], "system"), python, torch_section,
                    *nvml_sections):
        report.add(section)
    report.add(probe_consistency(driver.gpu_count, gpus, info,
                                 environ.get("CUDA_VISIBLE_DEVICES")))
    report.add(_gpu_test(info, gpu_test, gpus))
    xids = phase1["kernel_log"]
    report.add(kernel_log_section(xids.value, gpus, xids.error))
    report.add(_section(phase1["environment"], "environment"))
    python.findings.append(torchvision.finding())
    return report


# ---- env's figures as metrics ----

GPU_FIGURES = {
    "memory_total_bytes": ("bytes", Better.HIGHER), "power_limit_w": ("W", Better.HIGHER),
    "sm_clock_max_mhz": ("MHz", Better.HIGHER), "pcie_width_current": ("lanes", Better.HIGHER),
    "pcie_width_max": ("lanes", Better.HIGHER), "pcie_gen_max": ("gen", Better.HIGHER),
    "nvlink_active_links": ("links", Better.HIGHER),
    # The GPU's state at the moment of the probe: compared, never judged.
    "temperature_c": ("C", Better.INFO), "power_draw_w": ("W", Better.INFO),
    "sm_clock_mhz": ("MHz", Better.INFO), "memory_used_bytes": ("bytes", Better.INFO),
    "utilization_gpu_pct": ("%", Better.INFO), "pcie_gen_current": ("gen", Better.INFO),
}
SYSTEM_FIGURES = {
    "memory_total_bytes": ("bytes", Better.HIGHER), "shm_total_bytes": ("bytes", Better.HIGHER),
    "cpu_logical_cores": ("cores", Better.HIGHER), "cpu_usable_cores": ("cores", Better.HIGHER),
    "memory_available_bytes": ("bytes", Better.INFO)}
GPU_TEST_FIGURES = {"h2d_gbps": ("GB/s", Better.HIGHER), "d2h_gbps": ("GB/s", Better.HIGHER)}


def _figures(row: Mapping[str, Any], figures: Mapping[str, tuple[str, Better]], prefix: str,
             subject: subjects.Subject | None = None) -> Iterator[Metric]:
    for name, (unit, better) in figures.items():
        value = number(row.get(name))
        if value is not None:
            yield Metric(f"{prefix}.{name}", unit, better, value, subject)


def gpu_metrics(records: Sequence[Mapping[str, Any]]) -> Iterator[Metric]:
    """NVML's record of each GPU (`probes.gpus`), by NVML index."""
    for record in records:
        index = whole(record.get("index"))
        if index is not None:
            name, bus, uuid = (v if isinstance(v, str) else None
                               for v in (record.get(k) for k in ("name", "pci_bus_id", "uuid")))
            who = GpuIdentity(None, index, name, bus, uuid).subject()
            yield from _figures(record, GPU_FIGURES, "env.gpu", who)


def gpu_test_metrics(results: Sequence[Mapping[str, Any]]) -> Iterator[Metric]:
    """The quick functional test's pinned copies, per GPU (NVML index)."""
    for row in results:
        index = whole(row.get("nvml_index"))
        if index is not None:
            label = row.get("gpu") if isinstance(row.get("gpu"), str) else None
            yield from _figures(row, GPU_TEST_FIGURES, "env.gpu_test",
                                subjects.gpu(index, label))


def with_env_metrics(sections: Sequence[Any]) -> None:
    """The one call commands/env.py makes: each probe section's figures onto it (a
    gathered report's `node1.gpus` too, by the last part of its name)."""
    for section in sections:
        kind, data = str(section.name).rsplit(".", 1)[-1], section.data
        if not isinstance(data, Mapping):
            continue
        if kind == "gpus":
            section.metrics += gpu_metrics(_records(data.get("gpus")))
        elif kind == "gpu_test":
            section.metrics += gpu_test_metrics(_records(data.get("results")))
        elif kind == "system":
            section.metrics += _figures(data, SYSTEM_FIGURES, "env.system")


def _records(value: Any) -> list[Mapping[str, Any]]:
    return [r for r in value if isinstance(r, Mapping)] if isinstance(value, list) else []
