"""Expected figures per GPU model: the vendor's dense peak and a typical fraction of it.

Only models whose name, peak and memory bandwidth we are sure of are listed, each
matched by the exact name CUDA reports (`torch.cuda.get_device_properties(i).name`,
the same as nvidia-smi's). Variants with the same chip but other clocks or power
(H100 PCIe / NVL, H200 NVL, A100 PCIe) are NOT matched: their peaks differ, and a
wrong expectation would raise a false WARN. An unknown model gets no expected
comparison at all (SKIP with the reason), never a guess.

Memory figures are in the unit membw prints: copied bytes counted once, as nvbandwidth
does (`gpucheck.stress.membw`). A copy reads every byte and writes it, so it can reach
at most half the datasheet's memory bandwidth (which counts both): `copy_peak` halves
the datasheet figure and says so in the source.

Each figure says where it comes from. `typical_fraction` is what a healthy GPU of
that model reaches with plain PyTorch at gpucheck's sizes: `measured=True` when it
was read off a real run (source given), `measured=False` for an estimate, chosen low
so that a healthy GPU stays above it with room (see docs/stress.md).
"""

from __future__ import annotations

from dataclasses import dataclass

# Datasheet sources, quoted as each figure's source.
H100_SXM_DATASHEET = "NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column, dense rates)"
H200_SXM_DATASHEET = "NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column, dense rates)"
A100_DATASHEET = "NVIDIA A100 Tensor Core GPU datasheet (A100 SXM columns, dense rates)"
H200_MEASURED_GEMM = ("bf16 8192^3 torch.matmul on an H200 SXM: 769 to 798 TFLOP/s on random "
                      "data (mean of 10 products after 3 warm-ups; this workplace's device "
                      "notes, 2026-10/11; not measured by gpucheck)")
H200_MEASURED_COPY = ("device-to-device copy through PyTorch on an H200 SXM: about 2.15 TB/s "
                      "of copied bytes (4.3 GB copied in 2.0 ms; noted as 4.3 TB/s counting "
                      "bytes read and written: 8.6 GB moved; this workplace's device notes, "
                      "2026-10/11; not measured by gpucheck). Fraction: 2150 / 2400 = 0.896, "
                      "the same as 4300 / 4800 under the old read + write convention")
# What membw's `gbps` counts (the report's `counted` line).
COPY_COUNTED = ("size_bytes per copy, once, as nvbandwidth's device_local_copy prints; the "
                "memory moves 2 x that (read + write)")


@dataclass(frozen=True)
class Figure:
    """One expected figure: peak x typical_fraction is what a healthy GPU reaches."""

    peak: float  # TFLOP/s for GEMM, GB/s for memory bandwidth
    typical_fraction: float
    measured: bool  # True: the fraction was read off a run (see source); False: estimate
    source: str

    @property
    def typical(self) -> float:
        return self.peak * self.typical_fraction


@dataclass(frozen=True)
class ModelSpec:
    """The expected figures of one GPU model, keyed by dtype for GEMM."""

    gemm_tflops: dict[str, Figure]
    copy_gbps: Figure  # device memory copy, copied bytes counted once (`copy_peak`)


def copy_peak(datasheet_gbps: float, fraction: float, measured: bool, source: str) -> Figure:
    """The copy figure from a datasheet's memory bandwidth: half of it, since a copy
    reads and writes each byte and membw counts it once (as nvbandwidth)."""
    return Figure(datasheet_gbps / 2, fraction, measured,
                  f"{source}; half of the datasheet's {datasheet_gbps:g} GB/s, which counts "
                  "read + write: a copy counted once reaches at most half")


def _hopper_sxm(datasheet: str, bf16: Figure, memory: Figure) -> ModelSpec:
    """H100 SXM and H200 SXM share the compute rates (same chip, same clocks)."""
    return ModelSpec(
        gemm_tflops={
            "bf16": bf16,
            "fp16": Figure(989.5, 0.75, False, datasheet + "; fraction estimated"),
            "tf32": Figure(494.7, 0.65, False, datasheet + "; fraction estimated"),
            "fp32": Figure(66.9, 0.70, False, datasheet + "; fraction estimated"),
        },
        copy_gbps=memory,
    )


def _a100_sxm(memory_gbps: float) -> ModelSpec:
    note = A100_DATASHEET + "; fraction estimated"
    return ModelSpec(
        gemm_tflops={"bf16": Figure(312.0, 0.75, False, note),
                     "fp16": Figure(312.0, 0.75, False, note),
                     "tf32": Figure(156.0, 0.65, False, note),
                     "fp32": Figure(19.5, 0.80, False, note)},
        copy_gbps=copy_peak(memory_gbps, 0.85, False, note),
    )


MODELS: dict[str, ModelSpec] = {
    "NVIDIA H200": _hopper_sxm(
        H200_SXM_DATASHEET,
        bf16=Figure(989.5, 0.80, True, f"{H200_SXM_DATASHEET}; fraction from {H200_MEASURED_GEMM}"),
        memory=copy_peak(4800.0, 0.89, True,
                         f"{H200_SXM_DATASHEET} (4.8 TB/s HBM3e); fraction from "
                         f"{H200_MEASURED_COPY}"),
    ),
    "NVIDIA H100 80GB HBM3": _hopper_sxm(
        H100_SXM_DATASHEET,
        bf16=Figure(989.5, 0.75, False, H100_SXM_DATASHEET + "; fraction estimated"),
        memory=copy_peak(3350.0, 0.85, False,
                         H100_SXM_DATASHEET + " (3.35 TB/s HBM3); fraction estimated"),
    ),
    "NVIDIA A100-SXM4-80GB": _a100_sxm(2039.0),
    "NVIDIA A100-SXM4-40GB": _a100_sxm(1555.0),
}


def model_spec(name: str | None) -> ModelSpec | None:
    """The figures for exactly this model name; None for an unknown (or no) GPU."""
    if not name:
        return None
    return MODELS.get(name.strip())


def gemm_figure(name: str | None, dtype: str) -> Figure | None:
    spec = model_spec(name)
    return spec.gemm_tflops.get(dtype) if spec else None


def copy_figure(name: str | None) -> Figure | None:
    spec = model_spec(name)
    return spec.copy_gbps if spec else None
