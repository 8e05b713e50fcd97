"""Where this process stands in a distributed job, read from its launcher's variables."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpucheck.distributed import slurm
from gpucheck.errors import UsageError

if TYPE_CHECKING:
    from gpucheck.context import RunContext

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class World:
    """This process's place in the job (the variables torchrun sets for every worker)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    launcher: str  # "torchrun" (or the elastic agent gpucheck starts), "slurm", "none"
    # The CUDA ordinal this rank computes on, among the GPUs this process can see; set
    # by `process_group` on CUDA (None on CPU). Not the local rank: under
    # `srun --gpus-per-task=1` every task sees one GPU, its cuda:0.
    device_index: int | None = None
    # Does the elastic agent serve the job's store at master_addr:master_port? torchrun
    # says so in TORCHELASTIC_USE_AGENT_STORE; then every rank is a client of it.
    agent_store: bool = False

    @property
    def cuda_index(self) -> int:
        """`device_index` on a CUDA rank, where process_group always sets it."""
        if self.device_index is None:
            raise RuntimeError("a CUDA rank without a device index: process_group sets it")
        return self.device_index

    @property
    def is_reporter(self) -> bool:
        """Rank 0 gathers, aggregates and reports; the other ranks stay quiet."""
        return self.rank == 0


def _int_var(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = environ.get(name)
    if raw is None:
        if default is None:
            raise UsageError(f"{name} is not set; launch with torchrun or set it")
        return default
    try:
        return int(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not an integer; fix the launcher") from None


def agent_serves_store(environ: Mapping[str, str], addr: str, port: int) -> bool:
    """Does the elastic agent host a store at `addr:port`? Only at the address it
    exported with the flag: honouring the flag for another endpoint would make every
    rank a client of a store nobody hosts. torch's own test of this is private and new
    (2.14's `rendezvous._agent_store_serves`; 2.11 has none), so it is read here."""
    return (environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
            and environ.get("MASTER_ADDR") == addr
            and environ.get("MASTER_PORT") == str(port))


def torchrun_world(environ: Mapping[str, str]) -> World:
    """The world torchrun (or any elastic agent) describes in RANK, WORLD_SIZE, ...."""
    world_size = _int_var(environ, "WORLD_SIZE")
    rank = _int_var(environ, "RANK")
    if not 0 <= rank < world_size:
        raise UsageError(f"RANK={rank} is outside WORLD_SIZE={world_size}; fix the launcher")
    addr = environ.get("MASTER_ADDR", "127.0.0.1")
    port = _int_var(environ, "MASTER_PORT", 29500)
    return World(
        rank=rank,
        world_size=world_size,
        local_rank=_int_var(environ, "LOCAL_RANK", 0),
        local_world_size=_int_var(environ, "LOCAL_WORLD_SIZE", world_size),
        node_rank=_int_var(environ, "GROUP_RANK", 0),
        master_addr=addr,
        master_port=port,
        launcher="torchrun",
        agent_store=agent_serves_store(environ, addr, port),
    )


def slurm_world(environ: Mapping[str, str]) -> World:
    """The world of an srun task, from SLURM's variables (see gpucheck.distributed.slurm)."""
    world_size = _int_var(environ, "SLURM_STEP_NUM_TASKS", _int_var(environ, "SLURM_NTASKS", 1))
    rank = _int_var(environ, "SLURM_PROCID")
    if not 0 <= rank < world_size:
        raise UsageError(f"SLURM_PROCID={rank} is outside the task count {world_size}; "
                         "check the srun line")
    node_rank = _int_var(environ, "SLURM_NODEID", 0)
    addr = slurm.master_addr(environ) if world_size > 1 else "127.0.0.1"
    port = slurm.master_port(environ)
    return World(
        rank=rank,
        world_size=world_size,
        local_rank=_int_var(environ, "SLURM_LOCALID", 0),
        local_world_size=slurm.local_world_size(environ, node_rank, world_size),
        node_rank=node_rank,
        master_addr=addr,
        master_port=port,
        launcher="slurm",
        agent_store=agent_serves_store(environ, addr, port),
    )


def world_from_env(environ: Mapping[str, str]) -> World | None:
    """The launcher's world in `environ`, or None when it names none (a process
    started on its own).

    torchrun's variables win; under srun without them, SLURM's are read.
    """
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return torchrun_world(environ)
    if slurm.is_slurm_step(environ):
        return slurm_world(environ)
    return None


def world_of(ctx: RunContext) -> World | None:
    """The launcher's world of the process `ctx` belongs to (its `launcher_env`, read
    where the process started); UsageError when the launcher's variables are wrong."""
    return world_from_env(ctx.launcher_env)


def host_name() -> str:
    """This node's name: SLURM's (SLURMD_NODENAME, what scontrol and sbatch --exclude
    take; it may differ from the kernel's host name) when under SLURM."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()
