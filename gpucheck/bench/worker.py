"""The per-rank benchmark: data, model under DDP, warm-up, timed loop, consistency
batch; rank 0 returns the gathered records. An inference forward runs no collective,
so each rank is timed on its own between common barriers (docs/bench.md)."""

from __future__ import annotations

import gc
import os
import platform
import time
from dataclasses import asdict, dataclass, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any

from gpucheck.bench import model as bench_model
from gpucheck.bench.consistency import software_stack
from gpucheck.bench.model import WeightsChoice
from gpucheck.bench.pace import DEFAULT_STRAGGLER_THRESHOLD, look_again
from gpucheck.bench.records import LoopTiming, RankRecord, TimedSoFar
from gpucheck.confirm import remeasure
from gpucheck.context import Console, RunContext
from gpucheck.distributed import faultwatch, progress
from gpucheck.distributed.deadline import gather_objects, synchronize
from gpucheck.distributed.session import barrier, gpu_identity, process_group, roster
from gpucheck.distributed.world import World, host_name
from gpucheck.probes.system import cpu_model
from gpucheck.timing import Marks

if TYPE_CHECKING:
    import torch

CONSISTENCY_IMAGES = 4


@dataclass(frozen=True)
class BenchSpec:
    """Everything a rank needs, settled (and checked) before any rank starts."""

    model: str
    weights: WeightsChoice
    dtype: str  # fp32, fp16 or bf16 (auto already resolved)
    channels_last: bool
    batch_size: int
    warmup: int
    iters: int | None  # None: choose from the warm-up speed to last `duration_s`
    duration_s: float | None
    device: str  # "cuda" or "cpu"
    backend: str
    timeout_s: float
    images_dir: str
    files: tuple[str, ...]
    progress: bool  # show a bar on rank 0 (stdout is a TTY and not --quiet)
    fault_watch: bool = True  # watch every rank's GPU (gpucheck.distributed.faultwatch)
    # Decides the second look (gpucheck.bench.pace.look_again) on every rank.
    straggler_threshold: float = DEFAULT_STRAGGLER_THRESHOLD


@dataclass(frozen=True)
class BenchOutcome:
    """Rank 0's result: every rank's record and its logits for the consistency batch."""

    records: tuple[RankRecord, ...]
    outputs: tuple[Any, ...]  # float32 CPU tensors, one per rank
    padding: int
    per_rank_images: int
    faults: tuple[dict[str, Any], ...] = ()  # every rank's FaultWatch result, rank order
    ranks: tuple[dict[str, Any], ...] = ()  # every rank's check-in record (CPUs, NUMA, GPU)
    rotation: str | None = None  # how CPU ranks took turns on rank 0's node's cores


def bench_worker(ctx: RunContext, spec: BenchSpec) -> BenchOutcome | None:
    """Run the benchmark on this rank; rank 0 returns everything gathered."""
    import torch.distributed as dist

    try:
        return _bench_rank(spec, ctx)
    except BaseException:
        # Leave a one-rank group, so this process can run again (tests, benchmarks); a
        # failed multi-rank group is kept (`process_group`): its peers may hang.
        if dist.is_initialized() and dist.get_world_size() == 1:
            dist.destroy_process_group()
        raise


def _bench_rank(spec: BenchSpec, ctx: RunContext) -> BenchOutcome | None:
    with process_group(spec.backend, spec.device, spec.timeout_s,
                       fault_watch=spec.fault_watch, ctx=ctx) as world:
        threads, plan = _cores(spec, world, ctx)
        share = bench_model.rank_share(len(spec.files), world.rank, world.world_size)
        progress.set_step(ctx, "model and data (DDP construction broadcasts rank 0's "
                               "weights)")
        ddp, batch, check_batch = _prepare(spec, world, share)
        record, output = _measure(spec, world, ddp, (batch, check_batch), threads, plan,
                                  ctx)
        _publish(ctx, world, rank0_record=asdict(record))  # kept if another rank fails now
        progress.set_step(ctx, "all_gather of the per-rank records")
        gathered: list[Any] = gather_objects((record, output), ctx)
        gathered = _second_look(ddp, batch, spec, world, gathered, plan, ctx)
        progress.set_step(ctx, None)
        faults = faultwatch.of(ctx).gather()
        # Free DDP while its group exists. Freed after the group was destroyed, DDP's
        # Reducer holds the group's last reference, and torch 2.11's ProcessGroupGloo
        # destructor joins its worker thread with the GIL held while that thread waits
        # for the GIL to free a finished all_gather's tensors: every rank hung at exit
        # under torchrun. gc.collect also frees a DDP kept alive by a reference cycle.
        del ddp
        gc.collect()
    if not world.is_reporter:
        return None
    return BenchOutcome(
        records=tuple(r for r, _ in gathered),
        outputs=tuple(o for _, o in gathered),
        padding=share.padding,
        per_rank_images=len(share.indices),
        faults=tuple(faults),
        ranks=tuple(asdict(info) for info in roster(ctx)),
        rotation=plan.describe() if plan else None,
    )


def _second_look(ddp: Any, batch: torch.Tensor, spec: BenchSpec, world: World,
                 gathered: list[Any], plan: bench_model.RotationPlan | None,
                 ctx: RunContext) -> list[Any]:
    """When a rank is a suspect (`look_again`), every rank's timed loop once more, its wall
    time gathered into the records: only a second loop tells a hiccup from a stall that
    recurs (gpucheck.bench.pace). CPU ranks take turns on the cores as in the first."""
    import torch

    def again(_: bool) -> list[Any]:
        progress.set_step(ctx, "the timed loop again (a second look at a rank's stall)")
        with torch.inference_mode(), bench_model.CoreRotation(plan):
            mine = _timed_loop(ddp, batch, gathered[world.rank][0].iters, spec, world,
                               None, ctx).wall_s
        return [(replace(record, again_wall_s=float(wall)), output) for (record, output),
                wall in zip(gathered, gather_objects(mine, ctx), strict=True)]

    suspect = look_again([r for r, _ in gathered], spec.straggler_threshold)
    return remeasure(world.rank, lambda: suspect, again, ctx)[1] or gathered


def _cores(spec: BenchSpec, world: World,
           ctx: RunContext) -> tuple[int, bench_model.RotationPlan | None]:
    """torch's threads (on CPU this machine's cores split between the ranks that share
    it), and how CPU ranks take turns on the cores when every rank on this node may use
    all of them (`gpucheck.bench.model`); GPU ranks never do."""
    import torch

    if spec.device != "cpu":
        return torch.get_num_threads(), None
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    torch.set_num_threads(max(1, (len(allowed) or os.cpu_count() or 1)
                              // world.local_world_size))
    plan = bench_model.plan_rotation(
        allowed, world.local_rank, world.local_world_size,
        [info.cpus for info in roster(ctx) if info.node_rank == world.node_rank]) \
        if allowed else None
    return torch.get_num_threads(), plan


def _prepare(spec: BenchSpec, world: World,
             share: bench_model.Share) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """Model under DDP on the device; the rank's batch and the fixed check batch there too."""
    import torch
    from torch.nn.parallel import DistributedDataParallel

    device = _device(spec, world)
    dtype = bench_model.torch_dtype(spec.dtype)
    fmt = torch.channels_last if spec.channels_last else torch.contiguous_format
    model = bench_model.build_model(spec.model, spec.weights)
    # Module.to takes memory_format (torch._C._nn._parse_to) but its typed overloads omit it.
    model = model.to(device=device, dtype=dtype, memory_format=fmt)  # type: ignore[call-overload]
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.index is not None
                                  else None)
    mine = bench_model.load_tensor(spec.images_dir, tuple(spec.files[i] for i in share.indices))
    common = bench_model.load_tensor(spec.images_dir, spec.files[:CONSISTENCY_IMAGES])
    batch = bench_model.fill_batch(mine, spec.batch_size)
    return (ddp, batch.to(device=device, dtype=dtype, memory_format=fmt),
            common.to(device=device, dtype=dtype, memory_format=fmt))


def _device(spec: BenchSpec, world: World) -> torch.device:
    """Its GPU among those this process sees (not its local rank)."""
    import torch

    return torch.device("cuda", world.cuda_index) if spec.device == "cuda" else (
        torch.device("cpu"))


def _measure(spec: BenchSpec, world: World, ddp: Any,
             batches: tuple[torch.Tensor, torch.Tensor], threads: int,
             plan: bench_model.RotationPlan | None,
             ctx: RunContext) -> tuple[RankRecord, torch.Tensor]:
    """Warm up, agree on the iteration count, time the loop, run the check batch."""
    import torch

    batch, check_batch = batches
    faults = faultwatch.of(ctx)
    shown = ctx.console if spec.progress and world.is_reporter else None
    with torch.inference_mode(), Progress(shown) as bar:
        progress.set_step(ctx, "warm-up")
        bar.start("warm-up", spec.warmup)
        per_iter_s = _warm_up(ddp, batch, spec.warmup, spec, bar)
        _publish(ctx, world, rank0_warmup={"iters": spec.warmup, "s_per_iter": per_iter_s})
        iters = spec.iters or _agree_iters(per_iter_s, spec, world)
        progress.set_step(ctx, "timed loop (between the start and end barriers)")
        bar.start("timed", iters)
        faults.mark_start()  # the fault watch's timed window is the timed loop
        with bench_model.CoreRotation(plan):
            timing = _timed_loop(ddp, batch, iters, spec, world, bar, ctx)
        faults.mark_end()
        progress.set_step(ctx, "consistency batch")
        output = ddp(check_batch).float().cpu()
    return _record(spec, world, iters, timing, threads, ctx), output


def _record(spec: BenchSpec, world: World, iters: int, timing: LoopTiming,
            threads: int, ctx: RunContext) -> RankRecord:
    """This rank's record, naming the physical GPU it ran on (NVML index, bus id, UUID)."""
    gpu = gpu_identity(ctx) if spec.device == "cuda" else None
    return RankRecord(
        rank=world.rank, host=host_name(), node_rank=world.node_rank,
        local_rank=world.local_rank, device=str(_device(spec, world)),
        device_name=(gpu.name or "GPU") if gpu else f"CPU {cpu_model() or platform.machine()}",
        device_uuid=gpu.uuid if gpu else None,
        images=iters * spec.batch_size, iters=iters, wall_s=timing.wall_s,
        span_s=timing.span_s, device_s=timing.device_s, iter_ms=timing.iter_ms,
        iter_end_ms=timing.iter_end_ms, iter_wall_ms=timing.iter_wall_ms,
        segments=timing.segments,
        peak_memory_bytes=_peak_memory(spec.device, world.device_index),
        threads=threads,
        stack=software_stack(world.cuda_index) if spec.device == "cuda" else None,
        nvml_index=gpu.nvml_index if gpu else None,
        pci_bus_id=gpu.pci_bus_id if gpu else None,
    )


def _publish(ctx: RunContext, world: World, **results: Any) -> None:
    """Rank 0 keeps what it has measured so far: a later failure or stop reports it."""
    if world.is_reporter:
        progress.publish_partial(ctx, (progress.local_partial(ctx) or {}) | results)


def _warm_up(ddp: Any, batch: torch.Tensor, warmup: int, spec: BenchSpec,
             bar: Progress) -> float:
    """Run `warmup` iterations; seconds per iteration, not counting the first one."""
    started = time.perf_counter()
    for i in range(warmup):
        ddp(batch)
        if i == 0:
            synchronize(spec.device, spec.timeout_s, "the warm-up's first iteration")
            started = time.perf_counter()
        bar.advance()
    synchronize(spec.device, spec.timeout_s, "the warm-up")
    timed = max(warmup - 1, 0)
    return (time.perf_counter() - started) / timed if timed else 0.0


def _agree_iters(per_iter_s: float, spec: BenchSpec, world: World) -> int:
    """Iterations for --duration from the slowest rank's warm-up speed."""
    import torch
    import torch.distributed as dist

    slowest = torch.tensor([per_iter_s], dtype=torch.float64, device=_device(spec, world))
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    per_iter = float(slowest.item())
    duration = spec.duration_s or 0.0
    return max(1, round(duration / per_iter)) if per_iter > 0 else 1


def _timed_loop(ddp: Any, batch: torch.Tensor, iters: int, spec: BenchSpec, world: World,
                bar: Progress | None, ctx: RunContext) -> LoopTiming:
    """The timed loop in segments (one on a GPU; CPU ranks re-place their tensors between
    them), each: barrier, clock, iterations (a mark after every one, read after the
    loop's one synchronisation), device sync, clock, barrier, clock. `bar` None: the
    second look, its wall time only, without marks."""
    sizes = bench_model.segment_sizes(iters, spec.device == "cpu" and world.world_size > 1)
    marks = Marks(spec.device, iters + len(sizes) if bar else 0)
    if bar is not None and spec.device == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats(world.device_index)
    so_far = TimedSoFar(marks, {"rank": world.rank, "host": host_name(),
                                "device": str(_device(spec, world)),
                                "batch_size": spec.batch_size, "iters_planned": iters,
                                "world_size": world.world_size}, ctx)
    wall_s = span_s = 0.0
    for index, size in enumerate(sizes):
        if index:
            batch = bench_model.relayout(ddp.module, batch)
        barrier(spec.timeout_s)
        started = time.perf_counter()
        if bar is not None:
            marks.begin()
        for _ in range(size):
            ddp(batch)
            if bar is not None:
                marks.mark()
                bar.advance()
                so_far.tick()  # every rank's iterations survive a stop
        synchronize(spec.device, spec.timeout_s, "the timed loop's device work")
        wall_s += time.perf_counter() - started
        barrier(spec.timeout_s)
        span_s += time.perf_counter() - started
        if bar is not None:
            so_far.publish()
    iter_ms, iter_end_ms = marks.read_ms()
    # On a GPU the events bracket the device's work; on CPU the loop's wall time is it.
    device_s = sum(iter_ms) / 1e3 if spec.device == "cuda" else wall_s
    return LoopTiming(wall_s=wall_s, span_s=span_s, device_s=device_s, iter_ms=iter_ms,
                      iter_end_ms=iter_end_ms, segments=len(sizes),
                      iter_wall_ms=marks.read_wall_ms())



def _peak_memory(device: str, index: int | None) -> int | None:
    if device == "cuda":
        import torch

        return int(torch.cuda.max_memory_allocated(index))
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux
    except (ImportError, OSError):
        return None


class Progress:
    """Rank 0's one bar, `bench: warm-up` then `bench: timed`, counting batches (stderr,
    a terminal, no --quiet); nothing without a console."""

    def __init__(self, console: Console | None) -> None:
        self._console = console  # None: no bar
        self._bar: progress.Bar | None = None

    def __enter__(self) -> Progress:
        if self._console is not None:
            self._bar = progress.Bar("bench", 0, "batch", self._console)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 trace: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.close()

    def start(self, phase: str, total: int) -> None:
        if self._bar is not None:
            self._bar.restart(phase, total)

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.advance()
