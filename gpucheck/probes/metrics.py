"""env's figures as metrics, from the probes' records (NVML's per-GPU record, the quick
GPU test's copies, the system probe): each GPU's capacity and link figures (judged
when they fall short: higher is better) and its state at the probe (shown, never
judged); the machine's memory and cores."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from gpucheck import subject
from gpucheck.measure import Better, Metric
from gpucheck.measured import number, whole

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
GPU_TEST_FIGURES = ("h2d_gbps", "d2h_gbps")


def gpu_words(record: Mapping[str, Any]) -> str:
    """"GPU 3 (NVIDIA H200, bus 00000000:9A:00.0, GPU-...)", as the other sections say it."""
    details = [record.get("name"), record.get("pci_bus_id") and f"bus {record['pci_bus_id']}",
               record.get("uuid")]
    shown = ", ".join(str(d) for d in details if d)
    head = f"GPU {record.get('index')}"
    return f"{head} ({shown})" if shown else head


def gpu_metrics(records: Sequence[Mapping[str, Any]]) -> Iterator[Metric]:
    """NVML's record of each GPU (`probes.gpus`), by NVML index."""
    for record in records:
        index = whole(record.get("index"))
        if index is None:
            continue
        bus, uuid = record.get("pci_bus_id"), record.get("uuid")
        who = subject.gpu(index, gpu_words(record), bus_id=bus if isinstance(bus, str) else None,
                          uuid=uuid if isinstance(uuid, str) else None)
        for name, (unit, better) in GPU_FIGURES.items():
            value = number(record.get(name))
            if value is not None:
                yield Metric(f"env.gpu.{name}", unit, better, value, who)


def gpu_test_metrics(results: Sequence[Mapping[str, Any]]) -> Iterator[Metric]:
    """The quick functional test's pinned copies, per GPU (NVML index)."""
    for row in results:
        index = whole(row.get("nvml_index"))
        if index is None:
            continue
        label = row.get("gpu") if isinstance(row.get("gpu"), str) else None
        for name in GPU_TEST_FIGURES:
            value = number(row.get(name))
            if value is not None:
                yield Metric(f"env.gpu_test.{name}", "GB/s", Better.HIGHER, value,
                             subject.gpu(index, label))


def system_metrics(system: Mapping[str, Any]) -> Iterator[Metric]:
    for name, (unit, better) in SYSTEM_FIGURES.items():
        value = number(system.get(name))
        if value is not None:
            yield Metric(f"env.system.{name}", unit, better, value)


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
            section.metrics += system_metrics(data)


def _records(value: Any) -> list[Mapping[str, Any]]:
    return [r for r in value if isinstance(r, Mapping)] if isinstance(value, list) else []
