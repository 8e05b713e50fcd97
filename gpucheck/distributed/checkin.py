"""Who is in the job and who stopped answering: the check-in before any collective and
the roll call after a failed one, both on the job's store (neither can hang on a peer)."""

from __future__ import annotations

import datetime as _dt
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpucheck.devices import SYSFS, GpuIdentity, RankInfo, device_label
from gpucheck.distributed.deadline import BACKSTOP_S, DUMP_WAIT_S, TRACEBACK_CAP_S
from gpucheck.distributed.world import World, host_name
from gpucheck.numa import allowed_cpus, rank_numa

POLL_S = 0.05
HOST_GRACE_S = 1.5
_PREFIX = "gpucheck"


class CheckInFailed(RuntimeError):
    """Some ranks never reached the check-in."""

    def __init__(self, missing: list[int], present: list[RankInfo], world: World,
                 waited_s: float) -> None:
        self.missing = missing
        self.present = present
        per_node = max(world.local_world_size, 1)  # where each should have run
        self.expected = {r: f"rank {r} (expected node {r // per_node}, local rank "
                            f"{r % per_node})" for r in missing}
        # This rank's view, for the report: set where the check-in timed out.
        self.diagnosis: dict[str, Any] | None = None
        names = ", ".join(self.expected.values())
        hint = (" (under sbatch, start the ranks with srun)" if world.launcher == "slurm" else "")
        super().__init__(
            f"{len(missing)} of {world.world_size} rank(s) never checked in within "
            f"{waited_s:g} s: {names}; {len(present)} did{hint}")


class RanksUnresponsive(RuntimeError):
    """A collective failed and these ranks did not answer the roll call afterwards."""

    def __init__(self, missing: list[int], step: str | None, cause: str) -> None:
        self.missing = missing
        self.step = step
        where = f" during {step}" if step else ""
        who = ", ".join(f"rank {r}" for r in missing) or "no rank (all answered)"
        super().__init__(f"a collective failed{where} ({cause}); did not answer: {who}")


def _key(kind: str, rank: int | str) -> str:
    """A check-in or roll-call key (in the store scoped to its command)."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"{_PREFIX}/{attempt}/{kind}/{rank}"


def this_rank(world: World, gpu: GpuIdentity | None, sysfs: Path = SYSFS) -> RankInfo:
    """This rank as it checks in: where it runs, its GPU (`gpu`), its CPUs and its GPU's
    NUMA node, read before any command moves it (stress pins after the check-in)."""
    place = rank_numa(gpu.pci_bus_id if gpu else None, allowed_cpus(), sysfs)
    where: dict[str, Any] = {"cpus": place.cpus or None, "numa_node": place.numa_node,
                             "on_gpu_numa": place.on_gpu_numa}
    if gpu is None:
        return RankInfo(world.rank, world.local_rank, world.node_rank, host_name(), "cpu",
                        os.getpid(), **where)
    return RankInfo(world.rank, world.local_rank, world.node_rank, host_name(),
                    f"cuda:{gpu.cuda_ordinal} {gpu.name or 'GPU'}", os.getpid(),
                    nvml_index=gpu.nvml_index, pci_bus_id=gpu.pci_bus_id, uuid=gpu.uuid,
                    **where)


def check_in(store: Any, world: World, me: RankInfo, timeout_s: float) -> list[RankInfo]:
    """Announce this rank (`me`) and wait for every other one; return all, ordered by rank."""
    store.set(_key("checkin", world.rank), json.dumps(asdict(me)))
    _wait_for_all(store, world, "checkin", timeout_s)
    return [_read_info(store, r) for r in range(world.world_size)]


@dataclass(frozen=True)
class View:
    """What one rank sees on CUDA before it picks its GPU: the GPUs (UUIDs in CUDA order)
    and CUDA_VISIBLE_DEVICES as its launcher set it."""

    rank: int
    host: str
    node_rank: int
    local_rank: int
    visible: list[str]
    cuda_visible_devices: str | None = None


def exchange_visible(store: Any, world: World, visible: Sequence[str],
                     timeout_s: float) -> dict[int, View]:
    """The check-in's first half on CUDA: every rank says which GPUs it sees and reads
    every other one's `View`."""
    mine = View(world.rank, host_name(), world.node_rank, world.local_rank, list(visible),
                os.environ.get("CUDA_VISIBLE_DEVICES"))
    store.set(_key("visible", world.rank), json.dumps(asdict(mine)))
    _wait_for_all(store, world, "visible", timeout_s)
    return {r: View(**json.loads(store.get(_key("visible", r))))
            for r in range(world.world_size)}


def local_views(views: Mapping[int, View], world: World) -> dict[int, list[str]]:
    """This node's ranks: local rank -> the GPUs it sees (for `device_among_peers`)."""
    me = views[world.rank]
    return {v.local_rank: v.visible for v in views.values()
            if v.host == me.host and v.node_rank == me.node_rank}


def _wait_for_all(store: Any, world: World, kind: str, timeout_s: float) -> None:
    """Count this rank in under `kind` and wait for every rank; one that never arrives
    is named (`CheckInFailed`, with its diagnosis)."""
    counter = _key(kind, "count")
    store.add(counter, 1)
    # Rank 0 may host the store: it gives up last, so the others can still read it.
    deadline = time.monotonic() + timeout_s + (HOST_GRACE_S if world.rank == 0 else 0)
    while store.add(counter, 0) < world.world_size:
        if time.monotonic() > deadline:
            present = _present(store, kind, world.world_size)
            missing = [r for r in range(world.world_size) if r not in present]
            known = _present(store, "checkin", world.world_size) if kind == "checkin" else []
            error = CheckInFailed(missing, [_read_info(store, r) for r in known], world,
                                  timeout_s)
            error.diagnosis = {"rank": world.rank, "missing": missing,
                               "expected": error.expected, "step": "check-in",
                               "cause": "never checked in", "message": str(error)}
            raise error
        time.sleep(POLL_S)


def _present(store: Any, kind: str, world_size: int) -> list[int]:
    return [r for r in range(world_size) if store.check([_key(kind, r)])]


def _read_info(store: Any, rank: int) -> RankInfo:
    return RankInfo(**json.loads(store.get(_key("checkin", rank))))


SHARED_GPU_HINT = (
    "give every rank its own GPU: under srun use --gpus-per-task=1 or --gpu-bind=closest "
    "with gpucheck's per-socket placement (or drop --gpu-bind), under torchrun one process "
    "per GPU with every GPU visible; check CUDA_VISIBLE_DEVICES per task")


class SharedGpu(RuntimeError):
    """Two or more ranks picked one physical GPU (same UUID): refused at check-in."""

    def __init__(self, groups: list[list[RankInfo]], views: Mapping[int, View],
                 launcher: str) -> None:
        self.ranks = sorted(i.rank for group in groups for i in group)
        self.diagnosis: dict[str, Any] | None = None  # set by refuse_shared_gpus
        self.groups = [[i.rank for i in group] for group in groups]
        setting = ("srun's GPU binding (--gpu-bind / --gpus-per-task) gave" if
                   launcher == "slurm" else "the launch gave")

        def launched(rank: int) -> str:
            view = views.get(rank)
            return f"CUDA_VISIBLE_DEVICES={view.cuda_visible_devices if view else None!r}"

        said = "; ".join(f"ranks {', '.join(str(i.rank) for i in group)} on "
                         f"{device_label(asdict(group[0]))}, "
                         + ", ".join(launched(i.rank) for i in group) for group in groups)
        super().__init__(f"{len(self.ranks)} ranks share a GPU: {said}; {setting} them "
                         "overlapping GPUs")


def shared_gpu_groups(infos: Sequence[RankInfo], views: Mapping[int, View],
                      backend: str) -> list[list[RankInfo]]:
    """Ranks on one GPU that must not be: always on NCCL; on gloo only while a GPU the
    node's ranks see is left idle (more ranks than GPUs is a deliberate share)."""
    by_gpu: dict[tuple[str, str], list[RankInfo]] = {}
    for info in infos:
        if info.uuid:
            by_gpu.setdefault((info.host, info.uuid), []).append(info)
    shared = [group for group in by_gpu.values() if len(group) > 1]
    if backend == "nccl":
        return shared
    return [group for group in shared if _idle_gpu_on(group[0].host, infos, views)]


def _idle_gpu_on(host: str, infos: Sequence[RankInfo], views: Mapping[int, View]) -> bool:
    here = [i for i in infos if i.host == host]
    seen = {name for i in here for name in getattr(views.get(i.rank), "visible", [])}
    return bool(seen - {i.uuid for i in here})


def refuse_shared_gpus(infos: Sequence[RankInfo], views: Mapping[int, View], world: World,
                       backend: str) -> None:
    """Raise `SharedGpu` (on every rank alike) when ranks share a GPU they should not."""
    groups = shared_gpu_groups(infos, views, backend)
    if not groups:
        return
    error = SharedGpu(groups, views, world.launcher)
    error.diagnosis = {"rank": world.rank, "missing": [], "shared": error.ranks,
                       "step": "check-in", "cause": "shares a GPU", "message": str(error)}
    raise error


def roll_call(store: Any, rank: int, world_size: int, window_s: float, host: bool = False,
              clock: Callable[[], float] = time.monotonic,
              sleep: Callable[[float], object] = time.sleep) -> list[int]:
    """Answer, wait up to `window_s` for the others, return the ranks that never did.
    The store's `host` then stays until every rank that answered has read the call (at
    most another window): gone sooner, it would look silent to them."""
    store.set_timeout(_dt.timedelta(seconds=window_s))
    store.set(_key("alive", rank), "1")
    alive = [_key("alive", r) for r in range(world_size)]
    _until(lambda: bool(store.check(alive)), window_s, clock, sleep)
    answered = [r for r in range(world_size) if store.check([alive[r]])]
    store.set(_key("read", rank), "1")
    if host:
        _until(lambda: bool(store.check([_key("read", r) for r in answered])), window_s,
               clock, sleep)
    return [r for r in range(world_size) if not store.check([alive[r]])]


def _until(done: Callable[[], bool], window_s: float, clock: Callable[[], float],
           sleep: Callable[[float], object]) -> None:
    deadline = clock() + window_s
    while not done() and clock() < deadline:
        sleep(POLL_S)


def roll_call_window_s(timeout_s: float, backend: str) -> float:
    """How long survivors can take to reach the roll call after the first, plus their
    dump: on gloo their timeouts fire a little apart; on NCCL a rank whose wait escaped
    the deadline arrives once the watchdog aborts (the backstop, the traceback, then
    4 x the dump wait, as set or NCCL's default 15 s)."""
    if backend != "nccl":
        return min(5.0, max(1.0, timeout_s / 4)) + DUMP_WAIT_S
    dump_ms = os.environ.get("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "")
    dump_s = int(dump_ms) / 1000 if dump_ms.isdigit() else 15.0
    return BACKSTOP_S + TRACEBACK_CAP_S + 4 * dump_s + DUMP_WAIT_S
