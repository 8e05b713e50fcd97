"""`gpucheck preflight` on every rank: the checks, cheapest and most decisive first,
in the job's own process group under one budget, made of the other commands' pieces
(env's NVML judges, stress's phases, comm's rounds); rank 0 judges and broadcasts the
decision, so every rank goes or none does.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from typing import Any

from gpucheck.context import RunContext
from gpucheck.distributed import faultwatch, progress
from gpucheck.distributed.deadline import broadcast_object, gather_objects
from gpucheck.distributed.session import job_store, process_group, roster, store_on_rank0
from gpucheck.distributed.world import World
from gpucheck.preflight.checks import GRACE_S, Budget

CHECKS = ("nvml", "gemm", "sdc", "alloc", "all_reduce", "links")
# Ring shifts of the node-to-node rounds: two, whatever the node count (see links).
LINK_SHIFTS = (1, 2)


@dataclass(frozen=True)
class PreflightSpec:
    """Everything a rank needs (picklable: it crosses to self-launched ranks)."""

    device: str  # "cuda" or "cpu"
    backend: str
    budget_s: float  # the checks' budget (start-up excluded)
    startup_s: float  # how long the ranks may take to check in
    strict: bool
    dtype: str  # the GEMM's and the burn-in's
    size: int  # n of the n x n x n products
    warmup_s: float
    gemm_window_s: float
    burn_s: float
    alloc_fraction: float  # of the free device memory, in one allocation
    allreduce_bytes: int
    link_bytes: int
    iters: int
    peer_fraction: float
    expected_fraction: float
    link_fraction: float
    fault_watch: bool = True  # watch every rank's GPU during the checks (docs/faults.md)
    # Where the hang guard writes what it knows (gpucheck.preflight.actions).
    exclude_file: str | None = None
    outputs: tuple[str, ...] = ()  # rank 0's -o files, checked before the vote
    # The least seconds each check needs; fewer left: it is a SKIP (budget).
    costs_s: tuple[tuple[str, float], ...] = ()
    command_given: bool = True  # False: a check only, nothing starts after a pass
    cpu_asked: bool = False  # --device cpu: CPU ranks asked for, not a fallback


@dataclass
class Run:
    """One rank's checks: its place, its spec, the budget, what the checks found."""

    spec: PreflightSpec
    world: World
    budget: Budget
    result: dict[str, Any]
    ctx: RunContext  # the rank's run context (its progress, session)
    stress: tuple[Any, dict[str, Any]] | None = None  # (stress RankContext, result) once opened


def preflight_worker(ctx: RunContext, spec: PreflightSpec) -> dict[str, Any]:
    """Every check on this rank; the agreed decision (rank 0: also the gathered result)."""
    ctx = ctx.scoped("preflight")  # preflight's keys apart from the command's on the store
    with ExitStack() as guarded:
        # The guard spans the frame's own roll call too (process_group's exit).
        with process_group(spec.backend, spec.device, spec.startup_s,
                           fault_watch=spec.fault_watch, ctx=ctx) as world:
            faults = faultwatch.of(ctx)
            run = Run(spec, world, Budget(spec.budget_s), _initial(world, spec, ctx), ctx)
            guarded.enter_context(_hang_guard(run))
            faults.mark_start()  # XID and ECC events, counters, during the checks
            for name in CHECKS:
                _check(run, name)
            faults.mark_end()
            run.budget.bound_waits(GRACE_S)
            run.result["faults"] = faults.gather()
            decision = _decide(run)
        guarded.close()  # agreed: the hand-over has its own bound (handoff)
        on_rank0 = store_on_rank0(world)
        out = {"decision": decision, "result": run.result if world.rank == 0 else None,
               "store_on_rank0": on_rank0}
        if decision["go"]:
            from gpucheck.preflight.actions import release_store

            release_store(job_store(ctx), world, on_rank0)
    return out


def _hang_guard(run: Run) -> Any:
    """Ends this rank (exit 1) should the checks outlast every bound they have."""
    from gpucheck.preflight import actions as guard

    hosts = guard.on_hang_hosts(run.world.rank, store_on_rank0(run.world), run.result["ranks"])
    seconds = guard.guard_seconds(run.spec.budget_s, GRACE_S, run.spec.backend)
    return guard.HangGuard(seconds, run.world.rank,
                           guard.exclude_on_hang(run.spec.exclude_file, hosts))


def _initial(world: World, spec: PreflightSpec, ctx: RunContext) -> dict[str, Any]:
    return {"world_size": world.world_size, "device": spec.device, "backend": spec.backend,
            "budget_s": spec.budget_s, "ranks": [asdict(i) for i in roster(ctx)],
            "checks": {}, "strict": spec.strict, "command_given": spec.command_given,
            "fractions": {"peer": spec.peer_fraction, "expected": spec.expected_fraction,
                          "link": spec.link_fraction}}


def _check(run: Run, name: str) -> None:
    """Run check `name` when every rank has time left for it, else record the SKIP."""
    need = dict(run.spec.costs_s).get(name, 1.0)
    left = run.budget.agreed_left(run.spec.device)
    if left < need:
        run.result["checks"][name] = {"state": "unfinished",
                                      "reason": f"{left:.3g} s of the {run.spec.budget_s:g} s "
                                                f"budget left, the check needs {need:g} s"}
        return
    progress.set_step(run.ctx, f"preflight: {name}")
    progress.bar_step(run.ctx, f"preflight: {name}")
    run.budget.bound_waits()
    run.result["checks"][name] = {"state": "done"} | _CHECK_FUNCTIONS[name](run)
    progress.set_step(run.ctx, None)


def _nvml(run: Run) -> dict[str, Any]:
    """Each node's local rank 0 judges its node's GPUs through NVML; all gathered."""
    from gpucheck.preflight.checks import nvml_findings

    mine = None
    if run.world.local_rank == 0:
        own = [int(r["pid"]) for r in run.result["ranks"]
               if r["node_rank"] == run.world.node_rank]
        mine = {"node_rank": run.world.node_rank,
                "findings": nvml_findings(run.spec.device, own, _kernel_log_s(run),
                                          environ=run.ctx.launcher_env,
                                          cpu_asked=run.spec.cpu_asked)}
    return {"nodes": [n for n in gather_objects(mine, run.ctx) if n is not None]}


def _kernel_log_s(run: Run) -> float:
    """The kernel log's share, less when the budget has less left (a second kept)."""
    from gpucheck.preflight.checks import KERNEL_LOG_S

    return max(0.1, min(KERNEL_LOG_S, run.budget.left_here() - 1.0))


def _stress(run: Run) -> tuple[Any, dict[str, Any]]:
    if run.stress is None:
        from gpucheck.stress.worker import StressSpec, open_phases

        spec = run.spec
        stress_spec = StressSpec(
            device=spec.device, backend=spec.backend, timeout_s=spec.budget_s,
            dtypes=(spec.dtype,), size=spec.size, duration_s=spec.burn_s,
            warmup_s=spec.warmup_s, gemm_window_s=spec.gemm_window_s,
            membw_window_s=spec.gemm_window_s, pin_numa=False, fault_watch=False,
            peer_fraction=spec.peer_fraction, expected_fraction=spec.expected_fraction)
        run.stress = open_phases(stress_spec, run.world, run.ctx)
    return run.stress


def _stress_phase(name: str) -> Callable[[Run], dict[str, Any]]:
    def check(run: Run) -> dict[str, Any]:
        from gpucheck.stress.worker import run_phase

        ctx, result = _stress(run)
        run_phase(name, ctx, result)
        run.result["stress"] = result  # rank 0's: the one with the CPU reference
        return {}
    return check


def _alloc(run: Run) -> dict[str, Any]:
    from gpucheck.preflight.checks import large_allocation

    return {"ranks": gather_objects(large_allocation(run.world.rank, run.spec.device,
                                                     run.spec.alloc_fraction), run.ctx)}


def _all_reduce(run: Run) -> dict[str, Any]:
    from gpucheck.comm.worker import CommSpec, measure_size

    spec = run.spec
    comm = CommSpec(device=spec.device, backend=spec.backend, timeout_s=spec.budget_s,
                    collectives=("all_reduce",), iters=spec.iters, warmup=2)
    from gpucheck.preflight.node_busbw import measure_nodes

    row = measure_size("all_reduce", spec.allreduce_bytes, comm, run.world, run.ctx)
    # Then each node's own all_reduce: the per-node figure judged (node_busbw).
    return {"row": row, "nodes": measure_nodes(run.world, run.result["ranks"], spec.device,
                                               spec.allreduce_bytes, spec.iters, run.budget,
                                               run.ctx)}


def _links(run: Run) -> dict[str, Any]:
    from gpucheck.comm.internode import run_internode
    from gpucheck.distributed.nodes import group_by_node

    if len(group_by_node(run.result["ranks"])) < 2:
        return {"state": "not_applicable", "reason": "one node: nothing between nodes"}
    spec = run.spec
    return {"internode": run_internode(run.result["ranks"], spec.link_bytes, spec.iters,
                                       spec.device, spec.link_fraction, repeats=3,
                                       shifts=LINK_SHIFTS, ctx=run.ctx)}


_CHECK_FUNCTIONS: dict[str, Callable[[Run], dict[str, Any]]] = {
    "nvml": _nvml, "gemm": _stress_phase("gemm"), "sdc": _stress_phase("sdc"),
    "alloc": _alloc, "all_reduce": _all_reduce, "links": _links}


def _decide(run: Run) -> dict[str, Any]:
    """Rank 0 judges everything gathered; its decision is broadcast to every rank."""
    run.budget.bound_waits(GRACE_S)  # the agreement itself may run past the budget a bit
    decision = broadcast_object(_decision(run) if run.world.rank == 0 else None, run.ctx)
    return dict(decision or {})


def _decision(run: Run) -> dict[str, Any]:
    """Rank 0's verdict; no-go with `unwritable` when a file it must write cannot be
    (once another rank has exec'd, a failed write could no longer stop the job)."""
    from gpucheck.errors import UsageError
    from gpucheck.output import check_writable
    from gpucheck.preflight.verdict import decide

    decision = decide(run.result)
    files = [(path, "--output") for path in run.spec.outputs]
    if run.spec.exclude_file is not None:
        files.append((run.spec.exclude_file, "--exclude-file"))
    try:
        for path, option in files:
            check_writable(path, option)
    except UsageError as exc:
        return decision | {"go": False, "unwritable": str(exc)}
    return decision
