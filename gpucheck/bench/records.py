"""One rank's record of its timed loop, as bench's ranks gather it and rank 0 judges it
(gpucheck.bench.pace). Plain data, no torch."""

from __future__ import annotations

from dataclasses import dataclass

from gpucheck.devices import GpuIdentity
from gpucheck.stats import percentile


@dataclass(frozen=True)
class RankRecord:
    """What one rank measured in its timed loop."""

    rank: int
    host: str
    node_rank: int
    local_rank: int
    device: str  # "cuda:0" or "cpu"
    device_name: str
    device_uuid: str | None
    images: int
    iters: int
    wall_s: float  # start barrier exit -> own loop end (after device sync), host clock
    span_s: float  # start barrier exit -> end barrier exit, host clock
    device_s: float  # device busy time (CUDA events); on CPU the loop's wall time
    peak_memory_bytes: int | None  # CUDA: max allocated; CPU: the process's peak RSS
    threads: int
    # The physical GPU (None on CPU): `device` is the CUDA ordinal in the rank's own
    # process, which under SLURM's per-task binding is cuda:0 on every rank.
    nvml_index: int | None = None
    pci_bus_id: str | None = None
    # Every timed iteration's device time in order: CUDA events on a GPU, the process's
    # CPU time on a CPU; and when each ended, in ms from the start barrier on the rank's
    # own clock (the device's on a GPU, perf_counter on a CPU; empty: sum of iter_ms).
    iter_ms: tuple[float, ...] = ()
    iter_end_ms: tuple[float, ...] = ()
    # CPU ranks: each iteration's wall time (perf_counter), start to end; empty on a GPU,
    # whose events already run on the device's wall clock (gpucheck.bench.pace.wall_ms).
    iter_wall_ms: tuple[float, ...] = ()
    # The timed loop's segments: CPU ranks re-place their tensors in fresh memory
    # between them (gpucheck.bench.model); 1 on a GPU.
    segments: int = 1
    # GPU ranks: the GPU model and software stack (gpucheck.bench.consistency
    # .software_stack); ranks of one stack must compute bit-identical logits. None on CPU.
    stack: str | None = None
    # The second look (gpucheck.bench.pace.suspect): the same timed loop run again when
    # a rank's loop held the job back; None when it was not run.
    again_wall_s: float | None = None

    def gpu_label(self) -> str:
        """"GPU 3 (NVIDIA H200, bus 00000000:9A:00.0, GPU-...)" on CUDA; the CPU's name."""
        if not self.device.startswith("cuda"):
            return self.device_name
        ordinal = int(self.device.partition(":")[2] or 0)
        return GpuIdentity(ordinal, self.nvml_index, self.device_name, self.pci_bus_id,
                           self.device_uuid).label()

    @property
    def images_per_s(self) -> float:
        return self.images / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def p50_ms(self) -> float | None:
        """The typical iteration (nearest-rank median); None without iteration times."""
        return percentile(self.iter_ms, 50) if self.iter_ms else None

    @property
    def p99_ms(self) -> float | None:
        return percentile(self.iter_ms, 99) if self.iter_ms else None


@dataclass(frozen=True)
class LoopTiming:
    """One rank's timed loop, each interval on its own clock."""

    wall_s: float  # the segments' start barrier exit -> own loop end, added up
    span_s: float  # the segments' start barrier exit -> end barrier exit, added up
    device_s: float
    iter_ms: tuple[float, ...]  # every timed iteration's device time, in order
    iter_end_ms: tuple[float, ...]  # when each ended, from the first start barrier
    segments: int = 1  # the loop's segments (CPU ranks re-place their tensors between)
    iter_wall_ms: tuple[float, ...] = ()  # CPU: each iteration's wall time; GPU: empty
