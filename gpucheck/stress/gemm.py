"""The device loads timed on each rank (GEMM throughput, device memory copy bandwidth),
the figures a healthy GPU of each model reaches with them, and the board power drawn
under the GEMM load (DCGM's targeted power: `stress.power.reach`, `stress.power.limit`;
docs/stress.md has the thresholds)."""

from __future__ import annotations

import contextlib
import statistics
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpucheck import subject as subjects
from gpucheck.distributed.nodes import group_by_node
from gpucheck.probes.nvml import NvmlDoor, NvmlFailure
from gpucheck.report import Finding, ok, skip, warn
from gpucheck.stress.records import CopyRecord as CopyRecord  # its home: records.py
from gpucheck.stress.records import GemmRecord as GemmRecord  # its home: records.py
from gpucheck.stress.records import PowerReading
from gpucheck.timing import summarise, timed_window

if TYPE_CHECKING:
    import torch


THROUGHPUT_SEED = 1234


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32,
            "fp32": torch.float32}[name]


@contextlib.contextmanager
def matmul_precision(dtype: str) -> Iterator[None]:
    """tf32 and fp32 are both float32 tensors: the matmul precision setting picks
    TF32 tensor cores ("high") or IEEE fp32 ("highest") for the block."""
    import torch

    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def seeded_pair(n: int, seed: int, device: Any, dtype: str,
                on_cpu: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Two n x n standard-normal matrices. With `on_cpu` they are drawn on the CPU and
    then moved, so every rank (and the CPU reference) gets bit-identical inputs
    whatever its device; otherwise drawn on `device` (faster, same per model)."""
    import torch

    where = torch.device("cpu") if on_cpu else torch.device(device)
    generator = torch.Generator(device=where).manual_seed(seed)
    pair = [torch.randn(n, n, generator=generator, device=where, dtype=torch.float32)
            for _ in range(2)]
    return (pair[0].to(device=device, dtype=torch_dtype(dtype)),
            pair[1].to(device=device, dtype=torch_dtype(dtype)))


def measure_gemm(rank: int, dtype: str, n: int, device: Any, kind: str,
                 warmup_s: float, window_s: float) -> GemmRecord:
    """Warm up, then time back-to-back products into a preallocated output."""
    import torch

    with torch.inference_mode(), matmul_precision(dtype):
        a, b = seeded_pair(n, THROUGHPUT_SEED, device, dtype)
        out = torch.empty_like(a)

        def step(i: int) -> None:
            torch.matmul(a, b, out=out)

        stats = summarise(timed_window(step, kind, warmup_s, window_s))
    flops = 2.0 * n**3
    return GemmRecord(rank=rank, dtype=dtype, size=n, iters=stats.iters,
                      tflops=flops * stats.iters / stats.total_s / 1e12,
                      tflops_p50=flops / stats.p50_s / 1e12,
                      p50_ms=stats.p50_s * 1e3, p99_ms=stats.p99_s * 1e3)


GPU_COPY_BYTES = 2 << 30
CPU_COPY_BYTES = 64 << 20


def copy_bytes(kind: str, free_bytes: int | None) -> int:
    """The buffer: 2 GiB on a GPU (at most a quarter of free memory: source and
    destination must fit beside the other phases' leftovers), 64 MiB on CPU."""
    if kind != "cuda":
        return CPU_COPY_BYTES
    if free_bytes is None:
        return GPU_COPY_BYTES
    return max(64 << 20, min(GPU_COPY_BYTES, (free_bytes // 4) >> 20 << 20))


def free_device_bytes(kind: str) -> int | None:
    if kind != "cuda":
        return None
    import torch

    return int(torch.cuda.mem_get_info()[0])


def measure_copy(rank: int, size: int, device: Any, kind: str, warmup_s: float,
                 window_s: float) -> CopyRecord:
    import torch

    src = torch.ones(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)

    def step(i: int) -> None:
        dst.copy_(src)

    stats = summarise(timed_window(step, kind, warmup_s, window_s))
    moved = float(size)  # counted once, as nvbandwidth (see the module docstring)
    return CopyRecord(rank=rank, size_bytes=size, iters=stats.iters,
                      gbps=moved * stats.iters / stats.total_s / 1e9,
                      gbps_p50=moved / stats.p50_s / 1e9,
                      p50_ms=stats.p50_s * 1e3, p99_ms=stats.p99_s * 1e3)


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


def gemm_figure(name: str | None, dtype: str) -> Figure | None:
    spec = MODELS.get(name.strip()) if name else None
    return spec.gemm_tflops.get(dtype) if spec else None


def copy_figure(name: str | None) -> Figure | None:
    spec = MODELS.get(name.strip()) if name else None
    return spec.copy_gbps if spec else None


# -- power under the GEMM load ----------------------------------------------------------

SAMPLE_S = 0.1
REACH_FRACTION = 0.75  # DCGM targeted_power's target_power_min_ratio
LIMIT_SLACK = 0.98  # limits are set in whole watts; below 98 % of the default is a cap
CPU_REASON = "CPU ranks: no GPU power to read"


def _watts(milliwatts: Any) -> float | None:
    return None if milliwatts is None else round(float(milliwatts) / 1000.0, 1)


class PowerSampler:
    """Sample one GPU's power draw on a thread while the load runs, through the rank's
    NVML doorway; never raises into the load (without a bus id or NVML, or a call
    failing, `why` says why)."""

    def __init__(self, rank: int, bus_id: str | None, nvml: NvmlDoor | None = None,
                 every_s: float = SAMPLE_S) -> None:
        self.rank, self.bus_id, self.every_s = rank, bus_id, every_s
        self._nvml = nvml
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples_w: list[float] = []
        self.limit_w: float | None = None
        self.default_limit_w: float | None = None
        self.why = CPU_REASON if bus_id is None else None if nvml else "no NVML on this rank"

    def __enter__(self) -> PowerSampler:
        if self.bus_id is None or self._nvml is None:
            return self
        try:
            handle = self._nvml.call("nvmlDeviceGetHandleByPciBusId", self.bus_id)
            self.limit_w = _watts(self._nvml.get("nvmlDeviceGetEnforcedPowerLimit", handle))
            self.default_limit_w = _watts(
                self._nvml.get("nvmlDeviceGetPowerManagementDefaultLimit", handle))
        except NvmlFailure as exc:
            self.why = f"power not read ({exc})"
            return self
        self._thread = threading.Thread(target=self._run, args=(self._nvml, handle),
                                        daemon=True, name="gpucheck-power")
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10 * self.every_s + 60)

    def _run(self, nvml: NvmlDoor, handle: Any) -> None:
        while not self._stop.is_set():
            try:
                draw = nvml.call("nvmlDeviceGetPowerUsage", handle)
            except NvmlFailure as exc:
                self.why = f"power draw not read ({exc})"
                return
            if draw is not None:
                self.samples_w.append(float(draw) / 1000.0)
            self._stop.wait(self.every_s)

    def result(self) -> PowerReading:
        samples = sorted(self.samples_w)
        p90 = samples[min(len(samples) - 1, int(0.9 * len(samples)))] if samples else None
        return PowerReading(rank=self.rank, samples=len(samples),
                            draw_p90_w=None if p90 is None else round(p90, 1),
                            draw_max_w=round(samples[-1], 1) if samples else None,
                            limit_w=self.limit_w, default_limit_w=self.default_limit_w,
                            why=self.why if not samples or self.why else None)


def reach(row: PowerReading) -> float | None:
    """Sustained draw / enforced limit, or None when either is unknown."""
    if row.draw_p90_w is None or not row.limit_w:
        return None
    return row.draw_p90_w / row.limit_w


def power_findings(rows: Sequence[PowerReading], ranks: Sequence[Mapping[str, Any]],
                   names: Mapping[int, str]) -> list[Finding]:
    """`stress.power.reach` and `stress.power.limit` over every rank's readings."""
    read = [r for r in rows if reach(r) is not None]
    if not read:
        whys = sorted({r.why for r in rows if r.why}) or [CPU_REASON]
        return [skip("stress.power.reach", f"no power reading under load: {whys[0]}")]
    return _reach_findings(read, ranks, names) + _limit_findings(read, names)


def _reach_findings(rows: Sequence[PowerReading], ranks: Sequence[Mapping[str, Any]],
                    names: Mapping[int, str]) -> list[Finding]:
    """Per node and model: a GPU below REACH_FRACTION of its limit while the median of
    its peers reaches it; nothing to judge where the peers do not reach it either."""
    by_rank = {r.rank: r for r in rows}
    model = {int(r["rank"]): r.get("gpu_name") for r in ranks}
    findings, judged, short = [], 0, 0
    for members in group_by_node(ranks).values():
        for name in dict.fromkeys(model.get(m) for m in members):
            mine = [m for m in members if model.get(m) == name and m in by_rank]
            for m in mine:
                peers = [reach(by_rank[p]) or 0.0 for p in mine if p != m]
                if not peers:
                    continue
                judged += 1
                peer_reach, own = statistics.median(peers), reach(by_rank[m]) or 0.0
                if peer_reach < REACH_FRACTION:
                    short += 1
                elif own < REACH_FRACTION:
                    row = by_rank[m]
                    findings.append(warn(
                        "stress.power.reach", f"{names.get(m, f'rank {m}')} drew "
                        f"{row.draw_p90_w:g} W under the GEMM load, {own:.0%} of its "
                        f"{row.limit_w:g} W limit, while its peers reached {peer_reach:.0%} "
                        f"of theirs (at least {REACH_FRACTION:.0%} expected, as DCGM's "
                        "targeted power)",
                        hint="a GPU that cannot draw its power under full load is held back "
                        "by something else: run dcgmi diag -r targeted_power, check "
                        "nvidia-smi -q -d PERFORMANCE,POWER (slowdown reasons), its power "
                        "cables and the PSU", subject=subjects.rank(m)))
    if findings:
        return findings
    if not judged:
        return [ok("stress.power.reach", f"{len(rows)} GPU(s) read under load; no peer of the "
                   "same model on its node to compare with (median reach "
                   f"{statistics.median(reach(r) or 0.0 for r in rows):.0%} of the limit)")]
    words = (f"; {short} judged against peers that did not reach {REACH_FRACTION:.0%} "
             "either (the load did not bring them to their limit)") if short else ""
    return [ok("stress.power.reach", f"{judged} GPU(s) drew at least {REACH_FRACTION:.0%} of "
               f"their enforced power limit under the GEMM load, as their peers{words}")]


def _limit_findings(rows: Sequence[PowerReading],
                    names: Mapping[int, str]) -> list[Finding]:
    capped = [r for r in rows if r.default_limit_w and r.limit_w
              and r.limit_w < LIMIT_SLACK * r.default_limit_w]
    findings = [warn("stress.power.limit",
                     f"{names.get(r.rank, f'rank {r.rank}')}: power limit "
                     f"{r.limit_w:g} W, below its default {r.default_limit_w:g} W",
                     hint="someone capped this GPU's power (nvidia-smi -pl, a DCGM or site "
                     "policy): it runs slower than its peers by setting; restore it with "
                     "nvidia-smi -i N -pl <default> if the cap was not meant",
                     subject=subjects.rank(r.rank)) for r in capped]
    known = [r for r in rows if r.default_limit_w]
    if not findings and known:
        findings.append(ok("stress.power.limit", f"{len(known)} GPU(s) at their default "
                           "power limit"))
    if not known:
        findings.append(skip("stress.power.limit", "the default power limit was not "
                             "readable (nvmlDeviceGetPowerManagementDefaultLimit)"))
    return findings
