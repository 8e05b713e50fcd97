"""Find this node's torch.distributed rank processes from their environments (RANK and
WORLD_SIZE, or SLURM_PROCID), reading only ALLOWED, bounded (docs/hang.md)."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any

import psutil

# The only variables of a target process that gpucheck reads or shows.
ALLOWED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
           "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_PROCID",
           "SLURM_LOCALID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", "SLURM_JOB_ID",
           "SLURM_STEP_ID", "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE",
           "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "CUDA_VISIBLE_DEVICES",
           # Flight Recorder arming (docs/hang.md): where the dumps of this job go.
           "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE",
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
           "TORCH_FR_DUMP_ON_TIMEOUT")
# Bounds on what another process's environment may claim (the largest jobs: ~100k ranks).
MAX_WORLD_SIZE = 1 << 20
MAX_LOCAL_WORLD_SIZE = 1024
MIN_NODE_RANKS = 64  # one node holds a rank per CPU, never fewer than this
MAX_ENVIRON_BYTES = 1 << 20  # launchers' variables come early in any environment
MAX_VALUE_CHARS = 4096  # PATH_MAX: a longer value of an allowed variable is dropped
_NUMBER = re.compile(r"\+?\d{1,9}")
# Reading /proc/PID/environ takes the target's memory-map lock, which a process stuck
# in the kernel holds: such a read is given up. One search spends at most
# ENVIRON_BUDGET_S on them, then ENVIRON_FLOOR_S each (docs/hang.md).
ENVIRON_TIMEOUT_S = 1.0
ENVIRON_BUDGET_S = 2.0
ENVIRON_FLOOR_S = 0.05


class EnvironBlocked(Exception):
    """/proc/PID/environ gave no answer within its timeout."""


class Waits:
    """The time one search spent on environments that never answered."""

    def __init__(self) -> None:
        self.spent_s = 0.0

    def timeout(self) -> float:
        return ENVIRON_TIMEOUT_S if self.spent_s < ENVIRON_BUDGET_S else ENVIRON_FLOOR_S


_WAITS: ContextVar[Waits | None] = ContextVar("gpucheck_hang_environ_waits", default=None)


@dataclass(frozen=True)
class RankProcess:
    """One rank of a job, as its launcher described it."""

    pid: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None
    job: str  # the key shared by the ranks of one job (the same on every node)
    name: str
    env: dict[str, str] = field(default_factory=dict)  # ALLOWED variables only
    user: str = ""  # the process's owner: two users' ranks are never one job
    parent: int | None = None  # the launcher (torchrun, slurmstepd) that started it

    @property
    def group(self) -> str:
        return f"{self.job} ({self.user})" if self.user else self.job


@dataclass
class Discovery:
    """What a search found: ranks grouped by job, and what could not be looked at."""

    jobs: dict[str, list[RankProcess]] = field(default_factory=dict)
    gone: list[int] = field(default_factory=list)  # PIDs given that no longer exist
    not_ranks: list[int] = field(default_factory=list)  # PIDs given that are no rank
    why_not: dict[int, str] = field(default_factory=dict)  # of not_ranks, when known
    denied: int = 0  # processes whose environment could not be read
    blocked: list[int] = field(default_factory=list)  # whose environment never answered


def allowed_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: environ[k] for k in ALLOWED
            if k in environ and len(environ[k]) <= MAX_VALUE_CHARS}


def _int(env: Mapping[str, str], *names: str) -> int | None:
    """The first of `names` that holds a plain count (at most 9 digits), else None."""
    for name in names:
        value = env.get(name, "").strip()
        if _NUMBER.fullmatch(value):
            return int(value)
    return None


def _endpoint_key(env: Mapping[str, str], parent: int | None) -> str:
    """The rendezvous, else SLURM's step, else this node's launcher process."""
    if env.get("MASTER_PORT") or env.get("TORCHELASTIC_RUN_ID"):
        return (f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}"
                f"/{env.get('TORCHELASTIC_RUN_ID', '')}")
    if env.get("SLURM_JOB_ID"):
        return f"slurm:{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '?')}"
    return f"launcher pid {parent if parent is not None else '?'}"


def rank_of(pid: int, name: str, env: Mapping[str, str],
            parent: int | None = None) -> RankProcess | None:
    """The rank a process is, from its allowlisted environment; None if it is none (or
    its numbers are out of bounds; a LOCAL_WORLD_SIZE out of bounds is unknown)."""
    env = allowed_env(env)
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        job = _endpoint_key(env, parent)
        local, local_size = _int(env, "LOCAL_RANK"), _int(env, "LOCAL_WORLD_SIZE")
    elif "SLURM_PROCID" in env and "python" in name.lower():
        rank, size = _int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS",
                                                     "SLURM_NTASKS")
        job = f"slurm:{env.get('SLURM_JOB_ID', '?')}.{env.get('SLURM_STEP_ID', '?')}"
        local, local_size = _int(env, "SLURM_LOCALID"), _slurm_local_size(env, size)
    else:
        return None
    if rank is None or size is None or not 0 <= rank < size <= MAX_WORLD_SIZE:
        return None
    local = local if local is not None else rank
    if local_size is not None and not local < local_size <= min(size, MAX_LOCAL_WORLD_SIZE):
        local_size = None
    return RankProcess(pid, rank, size, local, local_size, job, name, env, parent=parent)


def _slurm_local_size(env: Mapping[str, str], size: int | None) -> int | None:
    """This node's task count from SLURM's tasks-per-node variables, else None."""
    from gpucheck.distributed.world import local_world_size
    from gpucheck.errors import UsageError

    if size is None or not any(env.get(name) for name in
                               ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
                                "SLURM_NTASKS_PER_NODE")):
        return None
    try:
        return local_world_size(env, _int(env, "SLURM_NODEID") or 0, size)
    except (UsageError, ValueError):
        return None


def read_environ(pid: int) -> dict[str, str]:
    """The allowlisted variables of a process; raises psutil's errors."""
    try:
        raw = _read_in_time(f"/proc/{pid}/environ")
    except PermissionError:
        raise psutil.AccessDenied(pid) from None
    except (FileNotFoundError, ProcessLookupError):
        raise psutil.NoSuchProcess(pid) from None
    env: dict[str, str] = {}
    wanted = {name.encode() for name in ALLOWED}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key in wanted:
            env[key.decode()] = value.decode("utf-8", errors="replace")
    return allowed_env(env)


def _read_in_time(path: str) -> bytes:
    """At most MAX_ENVIRON_BYTES of `path`, read by a daemon thread left behind when it
    does not answer in time (EnvironBlocked)."""
    result: dict[str, Any] = {}

    def read() -> None:
        try:
            with open(path, "rb") as handle:
                result["raw"] = handle.read(MAX_ENVIRON_BYTES)
        except OSError as exc:
            result["error"] = exc

    reader = threading.Thread(target=read, name="gpucheck-environ", daemon=True)
    reader.start()
    waits = _WAITS.get()
    timeout = waits.timeout() if waits is not None else ENVIRON_TIMEOUT_S
    reader.join(timeout)
    if reader.is_alive():
        if waits is not None:
            waits.spent_s += timeout
        raise EnvironBlocked(path)
    if "error" in result:
        raise result["error"]
    return bytes(result.get("raw", b""))


def _read(proc: psutil.Process) -> RankProcess | None:
    env = read_environ(proc.pid)
    if not env and proc.status() == psutil.STATUS_ZOMBIE:  # its environment went with it
        raise psutil.ZombieProcess(proc.pid)
    rank = rank_of(proc.pid, proc.name(), env, proc.ppid())
    if rank is None:
        return None
    try:
        return replace(rank, user=str(proc.username()))
    except (KeyError, psutil.AccessDenied):  # a uid with no name: the number
        return replace(rank, user=str(proc.uids().real))


def _ancestors() -> set[int]:
    """gpucheck and the processes above it: never targets nor launchers of one."""
    return {os.getpid(), *(p.pid for p in psutil.Process().parents())}


def discover(pids: Iterable[int] | None = None) -> Discovery:
    """Every rank process on this node (pids None), or those PIDs (a launcher stands
    for the ranks below it)."""
    token = _WAITS.set(Waits())
    try:
        return _discover(pids)
    finally:
        _WAITS.reset(token)


def _discover(pids: Iterable[int] | None) -> Discovery:
    found = Discovery()
    candidates = list(psutil.process_iter()) if pids is None else _expand(list(pids), found)
    mine = rank_of(os.getpid(), "python", os.environ, os.getppid())
    skip, own = _ancestors(), (mine.job if mine is not None else None)  # never a target
    for proc in candidates:
        if proc.pid in skip:
            continue
        read, rank = _read_noted(proc, found, pids is not None)
        if read and (rank is None or rank.job == own):
            if pids is not None and rank is None:
                found.not_ranks.append(proc.pid)
        elif rank is not None:
            found.jobs.setdefault(rank.group, []).append(rank)
    found.jobs = split_duplicates(found.jobs)
    return found


def _read_noted(proc: psutil.Process, found: Discovery,
                given: bool) -> tuple[bool, RankProcess | None]:
    """(whether it was read, the rank it is); one not read is noted in `found`."""
    try:
        return True, _read(proc)
    except EnvironBlocked:
        found.blocked.append(proc.pid)
    except psutil.AccessDenied:
        found.denied += 1
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        if given:
            found.gone.append(proc.pid)
    return False, None


def split_duplicates(jobs: dict[str, list[RankProcess]]) -> dict[str, list[RankProcess]]:
    """Two processes claiming one rank of a job are two jobs behind one key: their
    launchers tell them apart, else each stands alone."""
    result: dict[str, list[RankProcess]] = {}
    for key, ranks in jobs.items():
        if _unique(ranks):
            result[key] = ranks
            continue
        by_parent: dict[str, list[RankProcess]] = {}
        for rank in ranks:
            by_parent.setdefault(f"{key} launcher pid {rank.parent}", []).append(rank)
        for sub_key, sub in by_parent.items():
            if _unique(sub):
                result[sub_key] = sub
            else:
                result.update({f"{key} process {r.pid}": [r] for r in sub})
    for ranks in result.values():
        ranks.sort(key=lambda r: r.rank)
    return result


def _unique(ranks: list[RankProcess]) -> bool:
    return len({r.rank for r in ranks}) == len(ranks)


def _expand(pids: list[int], found: Discovery) -> list[psutil.Process]:
    """The given processes, a launcher of one job's ranks replaced by them."""
    result: list[psutil.Process] = []
    ancestors = _ancestors()
    for pid in pids:
        try:
            proc = psutil.Process(pid)
        except psutil.Error:
            found.gone.append(pid)
            continue
        if pid == 1 or pid in ancestors:
            _not_a_rank(found, pid, "it is init or gpucheck's own parent, such as your "
                        "shell, above every job")
            continue
        read, rank = _read_noted(proc, found, True)
        if rank is not None:
            result.append(proc)
        elif read:
            result.extend(_launched(proc, found))
    return result


def _launched(proc: psutil.Process, found: Discovery) -> list[psutil.Process]:
    """The rank processes below a launcher: those of one job, else none."""
    workers: list[tuple[psutil.Process, RankProcess]] = []
    try:
        children = proc.children(recursive=True)
    except psutil.Error:
        children = []
    for child in children:
        try:
            rank = _read(child)
        except (psutil.Error, EnvironBlocked):
            continue
        if rank is not None:
            workers.append((child, rank))
    groups = {rank.group for _, rank in workers}
    if len(groups) > 1:
        _not_a_rank(found, proc.pid, f"the ranks below it belong to {len(groups)} jobs: "
                    "give the launcher of one job (torchrun) or the ranks' PIDs")
        return []
    return [p for p, _ in workers] or [proc]


def _not_a_rank(found: Discovery, pid: int, why: str) -> None:
    found.not_ranks.append(pid)
    found.why_not[pid] = why


def missing_local_ranks(ranks: list[RankProcess]) -> list[tuple[int | None, int]]:
    """(rank or None, local rank) of the local ranks the launcher started that have no
    process; none without LOCAL_WORLD_SIZE (such a rank may run on another node)."""
    sizes = {r.local_world_size for r in ranks}
    if len(sizes) != 1 or None in sizes:
        return []
    size = sizes.pop() or 0
    offsets = {r.rank - r.local_rank for r in ranks}
    offset = offsets.pop() if len(offsets) == 1 else None
    present = {r.local_rank for r in ranks}
    return [(None if offset is None else offset + local, local)
            for local in range(size) if local not in present]


def node_capacity() -> int:
    """How many ranks this machine can hold: environments are believed up to it."""
    return max(os.cpu_count() or 1, MIN_NODE_RANKS)
