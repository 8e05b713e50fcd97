"""`gpucheck preflight` on every rank: the checks, cheapest and most decisive first, in
the job's own process group under one agreed budget, made of the other commands' pieces
(env's NVML judges, stress's phases, comm's rounds); rank 0 judges and broadcasts the
decision, so every rank goes or none does (docs/preflight.md, "The budget").
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from typing import Any

from gpucheck.context import RunContext
from gpucheck.distributed import faultwatch, progress
from gpucheck.distributed.deadline import broadcast_object, gather_objects
from gpucheck.distributed.session import job_store, process_group, roster, store_on_rank0
from gpucheck.distributed.world import World
from gpucheck.preflight import actions
from gpucheck.report import Finding, fail, skip


class Budget:
    """Seconds left of the checks' budget, agreed by every rank."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._end = clock() + seconds

    def left_here(self) -> float:
        return max(0.0, self._end - self._clock())

    def agreed_left(self, device: str) -> float:
        """The least any rank has left (every rank calls it at the same point)."""
        import torch
        import torch.distributed as dist

        self.bound_waits(actions.GRACE_S)
        where = "cuda" if device == "cuda" else "cpu"
        value = torch.tensor([self.left_here()], dtype=torch.float64, device=where)
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        return float(value.item())

    def bound_waits(self, extra_s: float = 0.0) -> None:
        """No collective from here on waits past the budget's end (plus `extra_s`)."""
        import torch.distributed as dist

        seconds = max(1.0, self.left_here() + extra_s)
        # The group's own method: `dist.set_timeout` is newer than torch 2.11.
        group = dist.group.WORLD
        if group is None:
            raise RuntimeError("the budget bounds a process group's waits: none is open")
        group.set_timeout(_dt.timedelta(seconds=seconds))


CPU_ALLOC_BYTES = 64 << 20  # CPU ranks: a token allocation (host memory is the OS's)
# The kernel log's share of the nvml check: dmesg answers in well under a second on a
# healthy node; journalctl -k -b on a long boot can take seconds. Past this, a SKIP.
KERNEL_LOG_S = 3.0


def nvml_findings(device: str, own_pids: Collection[int] = (),
                  kernel_log_s: float = KERNEL_LOG_S, *, environ: Mapping[str, str],
                  cpu_asked: bool = False) -> list[dict[str, Any]]:
    """This node's GPUs judged by env's judges (`gpu.busy` counting only processes not
    the job's own, `own_pids`) and this boot's XIDs, as dicts."""
    if device != "cuda":  # no GPU to read, but a node whose log holds an Xid is no go
        from gpucheck.devices import expected_gpus, sysfs_root
        from gpucheck.probes.gpu_judge import cpu_ranks_finding

        expected = expected_gpus(environ, sysfs_root(environ))
        cpu = cpu_ranks_finding(expected, cpu_asked) or skip(
            "preflight.nvml", f"CPU ranks: no GPU to read through NVML, and none expected "
            f"({expected.source}: 0)")
        return [f.to_dict() for f in (cpu, *kernel_log_findings([], kernel_log_s,
                                                               environ=environ))]
    from gpucheck.probes.gpu_judge import busy_finding
    from gpucheck.probes.gpus import probe_nvml

    try:
        result = probe_nvml(environ=environ)
    except Exception as exc:  # a probe that fails is a finding, never a crash
        return [fail("preflight.nvml", f"NVML could not be read: {exc}",
                     "run gpucheck env on this node to see why").to_dict()]
    findings = [f for section in result.sections for f in section.findings
                if f.check != "gpu.busy"]
    findings += kernel_log_findings(result.gpus, kernel_log_s, environ=environ)
    for gpu in result.gpus:
        if gpu.process_count is not None and not gpu.error:
            others = [p for p in gpu.processes if p.get("pid") not in set(own_pids)]
            findings.append(busy_finding(replace(gpu, processes=others,
                                                 process_count=len(others))))
    return [f.to_dict() for f in findings]


def large_allocation(rank: int, device: str, fraction: float) -> dict[str, Any]:
    """`fraction` of the free device memory in one piece, written: {rank, bytes, ok, error}."""
    import torch

    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
        size = int(free * fraction)
    else:
        size = CPU_ALLOC_BYTES
    try:
        block = torch.empty(size, dtype=torch.uint8, device=device)
        block.fill_(0xA5)
        if device == "cuda":
            torch.cuda.synchronize()
            del block
            torch.cuda.empty_cache()
    except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        return {"rank": rank, "bytes": size, "ok": False, "error": str(exc).splitlines()[0]}
    return {"rank": rank, "bytes": size, "ok": True, "error": None}


def kernel_log_findings(gpus: Sequence[Any], within_s: float = KERNEL_LOG_S,
                        runner: Callable[..., Any] | None = None, *,
                        environ: Mapping[str, str]) -> list[Finding]:
    """This boot's XIDs, read as env reads the kernel log (or the saved log
    GPUCHECK_KERNEL_LOG names) within `within_s` in all: slow or unreadable is a SKIP."""
    from gpucheck.probes.kernel_log import KERNEL_LOG_VAR, read_kernel_log, run_command
    from gpucheck.probes.xid_section import kernel_log_section

    run, end = runner or run_command, time.monotonic() + within_s

    def capped(argv: Sequence[str], timeout_s: float) -> Any:
        return run(argv, max(0.05, min(timeout_s, end - time.monotonic())))

    try:
        log = read_kernel_log(environ.get(KERNEL_LOG_VAR) or None, capped)
    except Exception as exc:  # a probe that fails is a finding, never a crash
        return [skip("kernel_log.read", f"the kernel log could not be read within "
                     f"{within_s:g} s: {type(exc).__name__}: {exc}")]
    return list(kernel_log_section(log, gpus).findings)


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
            result: dict[str, Any] = {
                "world_size": world.world_size, "device": spec.device,
                "backend": spec.backend, "budget_s": spec.budget_s,
                "ranks": [asdict(i) for i in roster(ctx)], "checks": {},
                "strict": spec.strict, "command_given": spec.command_given,
                "fractions": {"peer": spec.peer_fraction, "link": spec.link_fraction,
                              "expected": spec.expected_fraction}}
            run = Run(spec, world, Budget(spec.budget_s), result, ctx)
            # Ends this rank (exit 1) should the checks outlast every bound they have.
            hosts = actions.on_hang_hosts(world.rank, store_on_rank0(world), result["ranks"])
            guarded.enter_context(actions.HangGuard(
                actions.guard_seconds(spec.budget_s, actions.GRACE_S, spec.backend), world.rank,
                actions.exclude_on_hang(spec.exclude_file, hosts)))
            faults.mark_start()  # XID and ECC events, counters, during the checks
            for name in CHECKS:
                _check(run, name)
            faults.mark_end()
            run.budget.bound_waits(actions.GRACE_S)
            run.result["faults"] = faults.gather()
            run.budget.bound_waits(actions.GRACE_S)  # the agreement may run past the budget a bit
            agreed = broadcast_object(_decision(run) if world.rank == 0 else None, ctx)
            decision = dict(agreed or {})
        guarded.close()  # agreed: the hand-over has its own bound (handoff)
        on_rank0 = store_on_rank0(world)
        out = {"decision": decision, "result": run.result if world.rank == 0 else None,
               "store_on_rank0": on_rank0}
        if decision["go"]:
            actions.release_store(job_store(ctx), world, on_rank0)
    return out


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
    mine = None
    if run.world.local_rank == 0:
        own = [int(r["pid"]) for r in run.result["ranks"]
               if r["node_rank"] == run.world.node_rank]
        # The kernel log's share, less when the budget has less left (a second kept).
        log_s = max(0.1, min(KERNEL_LOG_S, run.budget.left_here() - 1.0))
        mine = {"node_rank": run.world.node_rank,
                "findings": nvml_findings(run.spec.device, own, log_s,
                                          environ=run.ctx.launcher_env,
                                          cpu_asked=run.spec.cpu_asked)}
    return {"nodes": [n for n in gather_objects(mine, run.ctx) if n is not None]}


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
