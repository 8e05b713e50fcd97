"""The per-rank frame: check in, join the process group, leave; after a failed
collective dump, hold the roll call, abort NCCL and name the silent ranks (docs/hang.md,
"The rank frame")."""

from __future__ import annotations

import contextlib
import datetime as _dt
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any, NamedTuple

from gpucheck.context import RunContext
from gpucheck.devices import GpuIdentity, RankInfo
from gpucheck.distributed import deadline, faultwatch, progress
from gpucheck.distributed.checkin import (
    CheckInFailed,
    RanksUnresponsive,
    SharedGpu,
    View,
    check_in,
    exchange_visible,
    local_views,
    refuse_shared_gpus,
    roll_call,
    roll_call_window_s,
    this_rank,
)
from gpucheck.distributed.world import World, host_name, world_of

SINGLE = World(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
               master_addr="127.0.0.1", master_port=0, launcher="none")

_COMM_ERROR_WORDS = ("timed out", "timeout", "connection", "gloo", "nccl", "peer", "socket")


def roster(ctx: RunContext) -> list[RankInfo]:
    """Every rank of the current job as it checked in."""
    return list(ctx.session.roster)


def job_store(ctx: RunContext) -> Store | None:
    """The store the last `process_group` checked in on, kept after the block (preflight
    hands the job's port over to the command it starts)."""
    return ctx.session.store


def gpu_identity(ctx: RunContext) -> GpuIdentity | None:
    """The physical GPU this rank uses (None on CPU)."""
    return ctx.session.gpu


def barrier(wait_s: float, group: Any = None) -> None:
    """A barrier of the job's group (or `group`), on NCCL with the rank's device named
    and polled for at most `wait_s`. (Not `init_process_group(device_id=...)`: NCCL
    would run point-to-point ops on the world communicator, not one per pair.)"""
    import torch
    import torch.distributed as dist

    if dist.get_backend(group) == "nccl":
        work = dist.barrier(group=group, async_op=True,
                            device_ids=[torch.cuda.current_device()])
        deadline.settle([work] if work is not None else [], wait_s, "barrier")
    else:
        dist.barrier(group=group)


def is_comm_error(exc: BaseException) -> bool:
    """Did this come from a collective or the store (not from the worker's own code)?"""
    import torch.distributed as dist

    if isinstance(exc, (deadline.DeadlinePassed, getattr(dist, "DistError", ()))):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(w in text for w in _COMM_ERROR_WORDS)


if TYPE_CHECKING:
    from torch._C._distributed_c10d import HashStore, PrefixStore, Store, TCPStore


class _Stores(NamedTuple):
    tcp: type[TCPStore]
    hashed: type[HashStore]
    prefix: type[PrefixStore]


def _stores() -> _Stores:
    """torch.distributed's stores (public API that mypy --strict reads as not exported:
    the one ignore for it is here)."""
    from torch.distributed import HashStore, PrefixStore, TCPStore  # type: ignore[attr-defined]

    return _Stores(TCPStore, HashStore, PrefixStore)


def scoped_store(store: Any, scope: tuple[str, ...]) -> Any:
    """The store as one command sees it: `all` joins a group per command on one store,
    each under its own prefix, so a check-in never counts the previous group's ranks."""
    return _stores().prefix("/".join(scope), store) if scope else store


def _job_store(world: World, timeout: _dt.timedelta) -> Any:
    """The job's store: the agent's under torchrun, else one hosted by rank 0."""
    stores = _stores()
    if world.launcher == "none":
        return stores.hashed()
    addr, port = world.master_addr, world.master_port
    try:
        if world.agent_store:
            return stores.tcp(addr, port, world.world_size, is_master=False, timeout=timeout)
        return stores.tcp(addr, port, world.world_size, is_master=world.rank == 0,
                          timeout=timeout, wait_for_workers=False, multi_tenant=True)
    except Exception as exc:
        raise CheckInFailed([0], [], world, timeout.total_seconds()) if world.rank else (
            RuntimeError(f"cannot host the job's store on {addr}:{port}: {exc}; "
                         "the port may be in use: set MASTER_PORT")) from exc


def store_on_rank0(world: World) -> bool:
    """Is the job's store hosted by rank 0's process (srun, a hand-made env:// start),
    not by torchrun's agent nor in-process (a rank alone)?"""
    return world.launcher != "none" and world.world_size > 1 and not world.agent_store


def bind_device(device: str, world: World,
                peers: Callable[[list[str]], dict[int, list[str]]] | None = None,
                torch: Any = None) -> World:
    """Choose and set this rank's GPU: the world with its `device_index`, the one place
    a local rank becomes a device index (torchrun: cuda:<local rank>; srun
    --gpus-per-task=1: cuda:0; --gpu-bind=closest: its place among the local ranks that
    see the same GPUs, from `peers`)."""
    if device != "cuda":
        return world
    if torch is None:
        import torch

    from gpucheck.devices import (
        cuda_device_count,
        device_among_peers,
        local_device_index,
        visible_gpu_names,
    )

    count = cuda_device_count(torch)
    visible = visible_gpu_names(torch, count)
    if peers is None or not visible:
        index = local_device_index(world.local_rank, count)
    else:
        index = device_among_peers(world.local_rank, visible, peers(visible))
    torch.cuda.set_device(index)
    return replace(world, device_index=index)


@contextmanager
def process_group(backend: str, device: str, timeout_s: float, fault_watch: bool = True,
                  *, ctx: RunContext) -> Iterator[World]:
    """Check in and join the job's process group for the block (a private one for a rank
    alone). `timeout_s` bounds the check-in and every collective; a failed one leaves as
    `RanksUnresponsive`. With `fault_watch` the rank's GPU is watched meanwhile."""
    import torch.distributed as dist

    world = world_of(ctx) or SINGLE
    progress.set_step(ctx, "check-in")
    if world.world_size > 1:
        progress.say(ctx, f"rank 0 started: waiting for {world.world_size} ranks to check in")
    faults = ctx.session.faults = faultwatch.RankFaults(ctx)
    try:
        world, store = _check_in(backend, device, timeout_s, world, faults.open_nvml, ctx)
    except (CheckInFailed, SharedGpu) as exc:
        if exc.diagnosis is not None:
            progress.record_diagnosis(ctx, exc.diagnosis)
        raise
    if backend == "nccl":  # before the group exists: torch reads them when it is made
        ctx.session.backstop |= deadline.nccl_backstop()  # `all`: the first group sets
    ctx.session.wait_s = timeout_s
    dist.init_process_group(backend, store=_stores().prefix("gpucheck/pg", store),
                            rank=world.rank, world_size=world.world_size,
                            timeout=_dt.timedelta(seconds=deadline.group_timeout_s(
                                backend, timeout_s)))
    if backend == "nccl" and world.world_size > 1:  # objects cross on gloo, under the deadline
        objects = dist.new_group(backend="gloo", timeout=_dt.timedelta(seconds=timeout_s))
        ctx.session.objects = objects if isinstance(objects, dist.ProcessGroup) else None
    progress.set_step(ctx, None)
    progress.say(ctx, f"{world.world_size} rank(s) joined the process group ({backend}, "
                      f"{device})")
    try:
        faults.start(world, ctx.session.gpu, fault_watch)
        # library warnings into the report, not stderr
        with progress.caught(world.rank, ctx.warnings, progress.run_dir(ctx)):
            yield world
    except BaseException as exc:
        faults.publish_after_failure(world)  # before the roll call, which can take long
        if isinstance(exc, Exception) and is_comm_error(exc):
            named = _after_failure(ctx, store, world, timeout_s, exc, backend)
            if named is not None:  # never kept in a local: the frame would hold it
                raise named.pop() from exc
        raise
    else:
        dist.destroy_process_group()
    finally:
        ctx.session.objects = None
        faults.close()
        # Leave a failed group where that cannot hang (gloo, one rank), so this process
        # can run again; an aborted or multi-rank NCCL group is left to process exit.
        if dist.is_initialized() and not ctx.session.aborted and (
                world.world_size == 1 or backend == "gloo"):
            with contextlib.suppress(Exception):  # it may be broken; the failure is said
                dist.destroy_process_group()


def _check_in(backend: str, device: str, timeout_s: float, world: World,
              open_nvml: Callable[[World], Any], ctx: RunContext) -> tuple[World, Any]:
    """Open the job's store, pick this rank's GPU, check in, refuse shared GPUs: the world
    with its device index, and the store. `open_nvml(world)`: the rank's NVML doorway."""
    timeout = _dt.timedelta(seconds=timeout_s)
    store = ctx.session.store = scoped_store(_job_store(world, timeout), ctx.scope)
    views: dict[int, View] = {}

    def peers(seen: list[str], launched: World = world) -> dict[int, list[str]]:
        views.update(exchange_visible(store, launched, seen, timeout_s))
        return local_views(views, launched)

    world = bind_device(device, world, peers if world.launcher != "none" and
                        world.world_size > 1 else None)
    # Named before the check-in, so a slow NVML attach does not eat its window.
    nvml = open_nvml(world)
    if world.device_index is not None:
        import torch

        from gpucheck.probes.nvml import cuda_identity

        ctx.session.gpu = cuda_identity(torch, world.device_index, nvml)
    else:
        ctx.session.gpu = None
    me = this_rank(world, ctx.session.gpu)
    infos = [me] if world.launcher == "none" else check_in(store, world, me, timeout_s)
    ctx.session.roster = infos
    if world.rank == 0:
        progress.publish_roster(ctx, [asdict(i) for i in infos])
    refuse_shared_gpus(infos, views, world, backend)
    return world, store


def _say(ctx: RunContext, rank: int, text: str) -> None:
    print(f"gpucheck rank {rank}: {text}", file=ctx.console.stderr, flush=True)


def _after_failure(ctx: RunContext, store: Any, world: World, timeout_s: float,
                   exc: Exception, backend: str) -> list[RanksUnresponsive] | None:
    """In this order: dump this rank's buffer (while the stuck op still reads started),
    answer the roll call, abort a failed NCCL group, record what this rank saw. The
    error to raise instead (in a list the caller empties), None for a rank alone."""
    dumped = deadline.dump_after_failure(world.rank, backend)
    if dumped is not None:  # said either way: a dump not written is never passed over
        done = f"written to {dumped.path}" if dumped.path else f"SKIP: {dumped.skipped}"
        _say(ctx, world.rank, f"Flight Recorder dump {done}")
    missing, cause = [], first_line(str(exc))
    if world.world_size > 1:
        try:
            missing = roll_call(store, world.rank, world.world_size,
                                roll_call_window_s(timeout_s, backend),
                                host=world.rank == 0 and store_on_rank0(world))
        except Exception as store_exc:  # the store's host may be the one that hangs
            missing = [0] if world.rank else []
            cause += f"; the job's store did not answer either ({first_line(str(store_exc))})"
    aborted = None
    if backend == "nccl":  # from now on this process leaves through os._exit
        import torch.distributed as dist

        why_not = deadline.abort_groups(dist)
        ctx.session.aborted = True
        aborted = "done" if why_not is None else f"SKIP: {why_not}"
        if why_not is not None:
            _say(ctx, world.rank, aborted)
    if world.world_size == 1:
        return None
    _end_silent_siblings(ctx, missing)
    step = ctx.progress.step
    error = RanksUnresponsive(missing, step, cause)
    progress.record_diagnosis(ctx, {
        "rank": world.rank, "missing": missing, "step": step, "cause": cause,
        "message": str(error), "flight_recorder": dumped.as_dict() if dumped else None,
        "nccl_abort": aborted,
        "nccl_settings": dict(ctx.session.backstop) if aborted else None})
    return [error]


def _end_silent_siblings(ctx: RunContext, missing: list[int]) -> None:
    """SIGKILL silent ranks of this rank's agent (same parent): a hung rank ignores the
    agent's SIGTERM and cannot be saved. Other nodes' ranks are left to their own."""
    import psutil

    me = psutil.Process()
    for info in roster(ctx):
        if info.rank not in missing or info.host != host_name() or info.pid == me.pid:
            continue
        try:
            peer = psutil.Process(info.pid)
            if peer.ppid() == me.ppid():
                peer.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass


def first_line(text: str) -> str:
    """The first non-empty line, at most 300 characters."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else "no message"
