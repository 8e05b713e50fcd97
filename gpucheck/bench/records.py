"""One rank's record of its timed loop, as bench's ranks gather it and rank 0 judges it
(gpucheck.bench.pace); and every rank's timed iterations so far, each rank publishing its
own file while the loop runs (no collective), so a stopped or failed run still reports
them (docs/bench.md, "Stopped runs")."""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpucheck.context import RunContext
from gpucheck.devices import GpuIdentity
from gpucheck.distributed import progress
from gpucheck.report import Section
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


# --- the timed iterations so far -----------------------------------------------

PUBLISH_EVERY_S = 1.0
# A publish writes every iteration so far: 1.4 ms with 12 of them, 36 ms with 30,000
# (this 2-core VM). Waiting at least this many times the last one's duration keeps
# it under 1% of the rank's host time however long the loop.
PUBLISH_COST_FACTOR = 100


class Marks(Protocol):
    """The timed loop's marks (`gpucheck.timing.Marks`)."""

    def completed(self) -> int: ...

    def read_ms(self, points: int | None = None,
                ) -> tuple[tuple[float, ...], tuple[float, ...]]: ...


class TimedSoFar:
    """Publishes one rank's finished timed iterations while its loop runs."""

    def __init__(self, marks: Marks, about: dict[str, Any], ctx: RunContext) -> None:
        self._ctx = ctx  # the rank's: where its figures are kept
        self._marks = marks
        self._about = about  # rank, host, device, batch_size, iters_planned, world_size
        self._last = time.perf_counter()
        self._wait_s = PUBLISH_EVERY_S

    def tick(self) -> None:
        """After an iteration: publish when the wait since the last has passed."""
        if time.perf_counter() - self._last >= self._wait_s:
            self.publish()

    def publish(self) -> None:
        started = time.perf_counter()
        iter_ms, _ = self._marks.read_ms(self._marks.completed())
        progress.publish_rank(self._ctx, int(self._about["rank"]),
                              self._about | {"iters_done": len(iter_ms),
                                             "iter_ms": [round(t, 3) for t in iter_ms]})
        self._last = time.perf_counter()
        self._wait_s = max(PUBLISH_EVERY_S, PUBLISH_COST_FACTOR * (self._last - started))


def rank_row(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """One rank's published iterations as a table row; None without any."""
    iter_ms = [float(t) for t in data.get("iter_ms") or []]
    if not iter_ms:
        return None
    timed_s = sum(iter_ms) / 1e3
    images = len(iter_ms) * int(data.get("batch_size") or 0)
    return {"rank": data.get("rank"), "host": data.get("host"), "device": data.get("device"),
            "iters_done": len(iter_ms), "iters_planned": data.get("iters_planned"),
            "images": images, "timed_s": round(timed_s, 4),
            "images_per_s": round(images / timed_s, 3) if timed_s > 0 else None,
            "p50_ms": percentile(iter_ms, 50), "p99_ms": percentile(iter_ms, 99),
            "min_ms": min(iter_ms), "max_ms": max(iter_ms)}


def timed_so_far_section(ranks: Mapping[int, Mapping[str, Any]]) -> Section | None:
    """Every rank's timed iterations before a stop or a failure and their summary; None
    when no rank had finished a timed iteration. Not judged: a cut loop is no benchmark."""
    rows = [row for _, data in sorted(ranks.items()) if (row := rank_row(data))]
    if not rows:
        return None
    world = max(int(d.get("world_size") or 0) for d in ranks.values())
    p50s = [float(r["p50_ms"]) for r in rows]
    median = statistics.median(p50s)
    summary = {
        "ranks_with_iterations": f"{len(rows)} of {world or len(rows)}",
        "iters_done": f"{min(r['iters_done'] for r in rows)} to "
                      f"{max(r['iters_done'] for r in rows)} of {rows[0]['iters_planned']}",
        "total_images": sum(r["images"] for r in rows),
        "median_p50_ms": median,
        "slowest_p50_vs_median": round(max(p50s) / median, 3) if median > 0 else None,
    }
    missing = sorted(set(range(world)) - {int(r["rank"]) for r in rows})
    data: dict[str, Any] = {
        "covers": "the timed iterations each rank had finished when it last published "
                  f"them (every {PUBLISH_EVERY_S:g} s, longer when writing them takes over "
                  f"1% of that, and at each segment's end, so about {PUBLISH_EVERY_S:g} s "
                  "before the stop or failure; on a GPU those the "
                  "GPU had finished); images_per_s: images / the iterations' own time (device "
                  "time on a GPU, CPU time on CPU ranks); not judged",
        "summary": summary, "ranks": rows}
    if missing:
        data["ranks_without_iterations"] = missing
    return Section("timed_so_far", "Timed iterations before the run ended (every rank)",
                   data)
