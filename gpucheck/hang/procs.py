"""Find the torch.distributed rank processes of this node (psutil).

A rank is a process whose environment holds RANK and WORLD_SIZE (torchrun, and any
launcher that follows its convention) or, for a Python process started by srun,
SLURM_PROCID with the step's task count. Only the variables in ALLOWED are ever read
out of a target's environment: a job's environment holds tokens and passwords, and a
report is pasted into tickets.

Ranks of one job share a key (the rendezvous endpoint, or SLURM's job and step), so
two jobs on one node, or gpucheck's own launcher, are never mixed up.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class RankProcess:
    """One rank of a job, as its launcher described it."""

    pid: int
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int | None
    job: str  # the key shared by the ranks of one job
    name: str
    env: dict[str, str] = field(default_factory=dict)  # ALLOWED variables only


@dataclass
class Discovery:
    """What a search found: ranks grouped by job, and what could not be looked at."""

    jobs: dict[str, list[RankProcess]] = field(default_factory=dict)
    gone: list[int] = field(default_factory=list)  # PIDs given that no longer exist
    not_ranks: list[int] = field(default_factory=list)  # PIDs given that are no rank
    denied: int = 0  # processes whose environment could not be read


def allowed_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: environ[k] for k in ALLOWED if k in environ}


def _int(env: Mapping[str, str], *names: str) -> int | None:
    for name in names:
        try:
            return int(env[name])
        except (KeyError, ValueError):
            continue
    return None


def rank_of(pid: int, name: str, env: Mapping[str, str]) -> RankProcess | None:
    """The rank a process is, from its (allowlisted) environment; None if it is none."""
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        job = (f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}"
               f"/{env.get('TORCHELASTIC_RUN_ID', '')}")
        local = _int(env, "LOCAL_RANK")
        local_size = _int(env, "LOCAL_WORLD_SIZE")
    elif "SLURM_PROCID" in env and "python" in name.lower():
        rank, size = _int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS",
                                                     "SLURM_NTASKS")
        job = f"slurm:{env.get('SLURM_JOB_ID', '?')}.{env.get('SLURM_STEP_ID', '?')}"
        local, local_size = _int(env, "SLURM_LOCALID"), _slurm_local_size(env, size)
    else:
        return None
    if rank is None or size is None or not 0 <= rank < size:
        return None
    return RankProcess(pid, rank, size, local if local is not None else rank, local_size,
                       job, name, allowed_env(env))


def _slurm_local_size(env: Mapping[str, str], size: int | None) -> int | None:
    """This node's task count from SLURM's tasks-per-node variables; None without them
    (SLURM's own fallback, the whole step, would call ranks on other nodes dead)."""
    from gpucheck.distributed import slurm
    from gpucheck.errors import UsageError

    if size is None or not any(env.get(name) for name in
                               ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
                                "SLURM_NTASKS_PER_NODE")):
        return None
    try:
        return slurm.local_world_size(env, _int(env, "SLURM_NODEID") or 0, size)
    except UsageError:
        return None


def _read(proc: psutil.Process) -> RankProcess | None:
    """The rank `proc` is; raises psutil errors (gone, denied) to the caller."""
    return rank_of(proc.pid, proc.name(), proc.environ())


def _own_job() -> str | None:
    """gpucheck's own job (under srun or torchrun), never a target."""
    mine = rank_of(os.getpid(), "python", os.environ)
    return mine.job if mine is not None else None


def discover(pids: Iterable[int] | None = None) -> Discovery:
    """Every rank process on this node (pids None), or those PIDs (a launcher such as
    torchrun stands for its workers: the ranks among its descendants)."""
    found = Discovery()
    candidates = list(psutil.process_iter()) if pids is None else _expand(list(pids), found)
    skip = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    own = _own_job()
    for proc in candidates:
        if proc.pid in skip:
            continue
        try:
            rank = _read(proc)
        except psutil.AccessDenied:
            found.denied += 1
            continue
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            if pids is not None:
                found.gone.append(proc.pid)
            continue
        if rank is None or rank.job == own:
            if pids is not None and rank is None:
                found.not_ranks.append(proc.pid)
            continue
        found.jobs.setdefault(rank.job, []).append(rank)
    for ranks in found.jobs.values():
        ranks.sort(key=lambda r: r.rank)
    return found


def _expand(pids: list[int], found: Discovery) -> list[psutil.Process]:
    """The given processes; one that is not a rank but has rank descendants (torchrun,
    srun's step daemon) is replaced by them."""
    result: list[psutil.Process] = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            rank = _read(proc)
        except psutil.AccessDenied:
            found.denied += 1
            continue
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            found.gone.append(pid)
            continue
        if rank is not None:
            result.append(proc)
            continue
        workers = _rank_descendants(proc)
        result.extend(workers if workers else [proc])
    return result


def _rank_descendants(proc: psutil.Process) -> list[psutil.Process]:
    try:
        children = proc.children(recursive=True)
    except psutil.Error:
        return []
    ranks = []
    for child in children:
        try:
            if _read(child) is not None:
                ranks.append(child)
        except psutil.Error:
            continue
    return ranks


def missing_local_ranks(ranks: list[RankProcess]) -> list[tuple[int | None, int]]:
    """(rank or None, local rank) of the local ranks the launcher started that have no
    process. Only LOCAL_WORLD_SIZE (torchrun sets it) says how many ranks this node
    has: without it a rank not found here may well run on another node, and calling it
    dead would be a false alarm."""
    sizes = {r.local_world_size for r in ranks}
    if len(sizes) != 1 or None in sizes:
        return []
    size = sizes.pop() or 0
    offsets = {r.rank - r.local_rank for r in ranks}
    offset = offsets.pop() if len(offsets) == 1 else None
    present = {r.local_rank for r in ranks}
    return [(None if offset is None else offset + local, local)
            for local in range(size) if local not in present]


def describe_env(rank: RankProcess) -> dict[str, Any]:
    """The allowlisted variables shown in the report (never anything else)."""
    return dict(sorted(rank.env.items()))
