"""`gpucheck stress` on every rank, one rank per GPU: the phases (GEMM, memory
bandwidth, the burn-in, host and peer copies), each started after a barrier and ended
with an all_gather; rank 0 publishes the results after each phase and returns them."""

from __future__ import annotations

import contextlib
import os
import platform
import secrets
from collections.abc import Callable
from typing import Any

from gpucheck.confirm import remeasure
from gpucheck.context import RunContext
from gpucheck.distributed import faultwatch, progress
from gpucheck.distributed.session import gpu_identity, process_group, roster
from gpucheck.distributed.world import World
from gpucheck.numa import cpulist
from gpucheck.records import as_dict, read_all
from gpucheck.stress import burn as sdc_burn
from gpucheck.stress.burn import BOUND_TOLERANCE, bound_excess, loaded_blas
from gpucheck.stress.copies import copies_phase, p2p_phase
from gpucheck.stress.gemm import (
    PowerSampler,
    copy_bytes,
    copy_figure,
    free_device_bytes,
    gemm_figure,
    measure_copy,
    measure_gemm,
)
from gpucheck.stress.rank import (
    Phase,
    Placement,
    RankContext,
    barrier,
    gather,
    place_this_rank,
    publish,
)
from gpucheck.stress.rank import StressSpec as StressSpec  # its home for commands/preflight
from gpucheck.stress.records import PlacementRow
from gpucheck.stress.verdicts import suspect_ranks

PHASES = ("gemm", "membw", "sdc", "copies", "p2p")


def stress_worker(run: RunContext, spec: StressSpec) -> dict[str, Any] | None:
    """Run every phase on this rank; rank 0 returns the gathered results."""
    with process_group(spec.backend, spec.device, spec.timeout_s,
                       fault_watch=spec.fault_watch, ctx=run) as world:
        ctx, result = open_phases(spec, world, run)
        # What the terminal shows during a phase: the burn-in says how long it lasts.
        texts = {"membw": "membw (device memory bandwidth)",
                 "sdc": f"sdc burn-in, {spec.duration_s:g} s of {spec.dtypes[0]} products",
                 "copies": "copies (host<->device)", "p2p": "p2p (peer copies)"}
        faults = faultwatch.of(run)
        # The measured phases are the fault watch's timed window; every rank's result is
        # gathered after them (a failed phase skips the gather: rank 0's own result
        # reaches the failure report through its partial results).
        faults.mark_start()
        with progress.bar(run, "stress", len(PHASES), "phase") as shown:
            for name in PHASES:
                progress.set_step(run, name)
                shown.describe(texts.get(name, name))
                run_phase(name, ctx, result)
                shown.advance()
                publish(ctx, result)
        faults.mark_end()
        result["faults"] = faults.gather()
        result["complete"] = True
        progress.set_step(run, None)
        publish(ctx, result)
    return result if world.is_reporter else None


def open_phases(spec: StressSpec, world: World,
                run: RunContext) -> tuple[RankContext, dict[str, Any]]:
    """This rank's context and the result its phases fill, inside `process_group`: for
    commands that compose stress's phases (`gpucheck preflight`) with `run_phase`."""
    import torch

    gpu = gpu_identity(run) if spec.device == "cuda" else None
    device = torch.device("cuda", world.cuda_index) if spec.device == "cuda" else \
        torch.device("cpu")
    ctx = RankContext(spec, world, device, gpu.pci_bus_id if gpu else None, run)
    return ctx, _initial_result(ctx)


def run_phase(name: str, ctx: RankContext, result: dict[str, Any]) -> None:
    """One phase by name ("gemm", "membw", "sdc", ...), as `stress_worker` runs it."""
    phases: dict[str, Phase] = {"gemm": _gemm, "membw": _membw, "sdc": _sdc,
                                "copies": copies_phase, "p2p": p2p_phase}
    phases[name](ctx, result)
    result["phases_done"].append(name)


def _initial_result(ctx: RankContext) -> dict[str, Any]:
    """Place the rank on its GPU's NUMA node, then the roll of ranks with placements."""
    import torch

    spec = ctx.spec
    placement = _place(ctx)
    gpu = gpu_identity(ctx.run) if spec.device == "cuda" else None
    row = PlacementRow(rank=ctx.world.rank, gpu=gpu.label() if gpu else None,
                       gpu_name=gpu.name if gpu else None, cpus=cpulist(placement.cpus),
                       numa_node=placement.numa_node,
                       gpu_cpus=cpulist(placement.gpu_cpus) or None,
                       on_gpu_numa_node=placement.on_gpu_node, pinned=placement.pinned,
                       threads=torch.get_num_threads(), group=_kernel_group(ctx))
    rows, _ = read_all(PlacementRow, gather(ctx, as_dict(row)),
                       "placement row")  # one that does not read: its check-in alone
    mine = {row.rank: as_dict(row) for row in rows}
    ranks = [as_dict(info) | mine.get(info.rank, {}) for info in roster(ctx.run)]
    return {"world_size": ctx.world.world_size, "device": spec.device, "backend": spec.backend,
            "dtypes": list(spec.dtypes), "size": spec.size, "duration_s": spec.duration_s,
            "ranks": ranks, "gemm": [], "power": None, "membw": None, "sdc": None, "copies": None,
            "p2p": None, "faults": None, "phases_planned": list(PHASES), "phases_done": [],
            "complete": False}


def _place(ctx: RankContext) -> Placement:
    """GPU ranks: onto the GPU's NUMA node. CPU ranks: split the cores (as bench)."""
    import torch

    if ctx.spec.device == "cuda":
        placement = place_this_rank(ctx.bus_id, ctx.spec.pin_numa)
        # The CPU work (seeded inputs, the reference) shares the node's cores.
        share = (os.cpu_count() or 1) // ctx.world.local_world_size
        torch.set_num_threads(max(1, min(len(placement.cpus) or share, share)))
        return placement
    allowed = tuple(sorted(os.sched_getaffinity(0)))
    torch.set_num_threads(max(1, len(allowed) // ctx.world.local_world_size))
    return Placement(None, (), allowed, None, False)


def _kernel_group(ctx: RankContext) -> str:
    """Ranks whose products should agree bit for bit: same model and SM count, same
    libraries (the cuBLAS actually loaded) and the settings that change cuBLAS's kernel
    choice (gpucheck.stress.burn)."""
    import torch

    versions = f"torch {torch.__version__}"
    if ctx.spec.device == "cuda":
        props = torch.cuda.get_device_properties(ctx.device)
        return f"{props.name}, {props.multi_processor_count} SMs, {versions}, " \
               f"CUDA {torch.version.cuda}, {loaded_blas(torch).key()}"
    return f"{_cpu_name()}, {torch.get_num_threads()} threads, {versions}"


def _cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _gemm(ctx: RankContext, result: dict[str, Any]) -> None:
    """Every dtype's GEMM window (and its second look), with this GPU's power draw
    sampled throughout (gpucheck.stress.gemm)."""
    spec = ctx.spec
    gpu = ctx.bus_id if spec.device == "cuda" else None
    with PowerSampler(ctx.world.rank, gpu, faultwatch.of(ctx.run).nvml) as power:
        for dtype in spec.dtypes:
            _gemm_dtype(ctx, result, dtype)
    result["power"] = gather(ctx, as_dict(power.result()))


def _gemm_dtype(ctx: RankContext, result: dict[str, Any], dtype: str) -> None:
    spec = ctx.spec
    progress.set_step(ctx.run, f"gemm {dtype} {spec.size}^3")
    progress.bar_step(ctx.run, f"gemm {dtype} {spec.size}^3")
    barrier(ctx)
    record = measure_gemm(ctx.world.rank, dtype, spec.size, ctx.device, spec.device,
                          spec.warmup_s, spec.gemm_window_s)
    result["gemm"] += gather(ctx, as_dict(record))
    publish(ctx, result)
    _again(ctx, result, "gemm", result["gemm"][-ctx.world.world_size:], "tflops_p50",
           lambda m: gemm_figure(m, dtype),
           lambda: measure_gemm(ctx.world.rank, dtype, spec.size, ctx.device,
                                spec.device, spec.warmup_s, spec.gemm_window_s))


def _membw(ctx: RankContext, result: dict[str, Any]) -> None:
    spec = ctx.spec
    if spec.device == "cuda":
        import torch

        torch.cuda.empty_cache()  # the GEMM buffers would not count as free memory
    size = copy_bytes(spec.device, free_device_bytes(spec.device))
    barrier(ctx)
    record = measure_copy(ctx.world.rank, size, ctx.device, spec.device, spec.warmup_s,
                          spec.membw_window_s)
    result["membw"] = gather(ctx, as_dict(record))
    _again(ctx, result, "membw", result["membw"], "gbps_p50", copy_figure,
           lambda: measure_copy(ctx.world.rank, size, ctx.device, spec.device,
                                spec.warmup_s, spec.membw_window_s))


def _again(ctx: RankContext, result: dict[str, Any], phase: str,
           records: list[dict[str, Any]], key: str, figure_of: Callable[[str | None], Any],
           measure: Callable[[], Any], straggler: bool = False) -> None:
    """Every rank measures `phase` again at once, as in the first pass (a GPU slow only
    under a shared power or cooling budget is loaded the same way), when rank 0 finds a
    rank below the report's bounds (`verdicts.suspect_ranks`); the records go to
    result[phase + "_again"]."""
    values = {int(r["rank"]): float(r[key]) for r in records}

    def suspects() -> list[int]:
        checks = ("stress.sdc.straggler", None) if straggler else (
            f"stress.{phase}.peers", f"stress.{phase}.expected")
        return suspect_ranks(checks, values, result["ranks"], ctx.spec.peer_fraction,
                             figure_of, ctx.spec.expected_fraction, not straggler)

    def again(named: list[int]) -> list[dict[str, Any]]:
        progress.set_step(ctx.run, f"{phase}: measured again")
        barrier(ctx)
        mine = as_dict(measure())
        return [dict(r) | {"suspects": named} for r in gather(ctx, mine)]

    second = remeasure(ctx.world.rank, suspects, again, ctx.run)[1]
    if second:
        result.setdefault(f"{phase}_again", []).extend(second)
        publish(ctx, result)


def _sdc(ctx: RankContext, result: dict[str, Any]) -> None:
    """Burn in; gather digests and row checks; rank 0 compares rows drawn from every
    tile band (the whole product at CPU sizes) to an fp64 CPU reference, each element
    within its own bound."""
    import torch

    spec, dtype = ctx.spec, ctx.spec.dtypes[0]
    group = next(r["group"] for r in result["ranks"] if r["rank"] == ctx.world.rank)
    barrier(ctx)
    # its own seconds, not a frozen bar
    with progress.timed(ctx.run, "sdc burn-in", spec.duration_s):
        record, golden, checks = sdc_burn.burn(ctx.world.rank, dtype, spec.size, ctx.device,
                                               spec.device, spec.duration_s, group)
    progress.set_step(ctx.run, "sdc: comparing results across ranks")
    every = gather(ctx, (as_dict(record), checks, secrets.randbits(32)))
    seed = every[0][2]  # this run's draw of reference rows: rank 0's, the same on every rank
    rows = sdc_burn.rows_to_check(spec.size, [c for _, c, _ in every], seed)
    index = torch.tensor(rows, dtype=torch.long, device=golden.device)
    values = gather(ctx, golden[index].float().cpu())
    del golden
    deviations = None
    if ctx.world.is_reporter:
        progress.set_step(ctx.run, "sdc: CPU reference")
        reference, bound = sdc_burn.reference_and_bounds(spec.size, dtype, rows)
        deviations = [bound_excess(v, reference, bound) for v in values]
    result["sdc"] = {"dtype": dtype, "size": spec.size, "duration_s": spec.duration_s,
                     "tolerance": BOUND_TOLERANCE, "reference": "per-element bound",
                     "rows_checked": len(rows), "rows_seed": seed,
                     "coverage": sdc_burn.coverage(spec.size, rows),
                     "records": [r for r, _, _ in every], "reference_deviations": deviations}
    publish(ctx, result)
    _again(ctx, result, "sdc", result["sdc"]["records"], "p50_ms", lambda _: None,
           lambda: _short_burn(ctx, group), straggler=True)


def _short_burn(ctx: RankContext, group: str) -> Any:
    """The burn-in's product again, for the straggler's second look: its median time
    is what `stress.sdc.straggler` judges. As long as a GEMM window (at least
    `burn.MIN_REPEATS` products): the time, not the corruption check, is wanted."""
    spec = ctx.spec
    record, golden, _ = sdc_burn.burn(ctx.world.rank, spec.dtypes[0], spec.size, ctx.device,
                                      spec.device, spec.gemm_window_s, group)
    del golden
    return record
