"""Where this process stands in a distributed job, read from its launcher's variables:
torchrun's, or SLURM's for an srun step (its node list and tasks per node)."""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpucheck.errors import UsageError

if TYPE_CHECKING:
    from gpucheck.context import RunContext

PORT_BASE = 20000
PORT_SPAN = 20000
# The largest SLURM clusters have tens of thousands of nodes; a host list longer
# than this is a typo (gpu[1-99999999]), not a job.
MAX_HOSTS = 100_000
_NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
_PER_NODE_VARS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE")


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
    # The CUDA ordinal this rank computes on among the GPUs it sees (None on CPU), set
    # by `process_group`: not the local rank (under srun --gpus-per-task=1 it is 0).
    device_index: int | None = None
    # Does the elastic agent serve the job's store at master_addr:master_port?
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


def is_slurm_step(environ: Mapping[str, str]) -> bool:
    """True inside an srun task: SLURM gave it a rank and a task count."""
    return "SLURM_PROCID" in environ and (
        "SLURM_STEP_NUM_TASKS" in environ or "SLURM_NTASKS" in environ)


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets: `a1,b[2-3]` -> [`a1`, `b[2-3]`]."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _expand_range(item: str) -> list[str]:
    """`01-04` -> 01 02 03 04 (zero padding kept); `7` -> 7."""
    if "-" not in item:
        return [item]
    low, high = item.split("-", 1)
    if not (low.isascii() and high.isascii() and low.isdigit() and high.isdigit()) \
            or len(high) > 9 or int(high) < int(low):
        raise ValueError(f"bad range {item!r}")
    if int(high) - int(low) >= MAX_HOSTS:
        raise ValueError(f"range {item!r} names more than {MAX_HOSTS} hosts")
    return [str(n).zfill(len(low)) for n in range(int(low), int(high) + 1)]


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compact host list as host names: `gpu[01-02,07],cpu1` -> gpu01 gpu02 gpu07
    cpu1; one bracket group per name, ValueError for anything else."""
    hosts: list[str] = []
    for part in _split_top_level(nodelist):
        match = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)", part)
        if match is None:
            if "[" in part or "]" in part:
                raise ValueError(f"unsupported host list form {part!r}")
            hosts.append(part)
        else:
            prefix, ranges, suffix = match.groups()
            for item in ranges.split(","):
                hosts += [f"{prefix}{n}{suffix}" for n in _expand_range(item.strip())]
                if len(hosts) > MAX_HOSTS:  # bounded: a typo must not fill the memory
                    raise ValueError(f"more than {MAX_HOSTS} hosts")
        if len(hosts) > MAX_HOSTS:
            raise ValueError(f"more than {MAX_HOSTS} hosts")
    if not hosts:
        raise ValueError("empty host list")
    return hosts


def tasks_per_node(value: str) -> list[int]:
    """SLURM_TASKS_PER_NODE as one count per node: `4(x2),3` -> [4, 4, 3]."""
    counts: list[int] = []
    for part in _split_top_level(value):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if match is None:
            raise ValueError(f"bad tasks-per-node item {part!r}")
        repeat = int(match.group(2) or 1)
        # Bounded before expanding: another process's environment (`gpucheck hang`)
        # may say `1(x99999999999999999999)`.
        if repeat > MAX_HOSTS - len(counts):
            raise ValueError(f"more than {MAX_HOSTS} nodes in {part!r}")
        counts.extend([int(match.group(1))] * repeat)
    return counts


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


def master_addr(environ: Mapping[str, str]) -> str:
    """MASTER_ADDR, else the first host of the step's or job's node list."""
    if environ.get("MASTER_ADDR"):
        return environ["MASTER_ADDR"]
    for name in _NODELIST_VARS:
        if environ.get(name):
            try:
                return expand_nodelist(environ[name])[0]
            except ValueError as exc:
                raise UsageError(
                    f"cannot read the first host from {name}={environ[name]!r} ({exc}); set "
                    "MASTER_ADDR, e.g. export MASTER_ADDR=$(scontrol show hostnames "
                    '"$SLURM_JOB_NODELIST" | head -n 1)') from None
    raise UsageError("SLURM_JOB_NODELIST is not set, so the master host is unknown; "
                     "set MASTER_ADDR to the first node's host name")


def master_port(environ: Mapping[str, str]) -> int:
    """MASTER_PORT, else one derived from SLURM_JOB_ID (so two jobs rarely collide)."""
    if environ.get("MASTER_PORT"):
        return _int_var(environ, "MASTER_PORT")
    if environ.get("SLURM_JOB_ID", "").isdigit():
        return PORT_BASE + int(environ["SLURM_JOB_ID"]) % PORT_SPAN
    return 29500


def local_world_size(environ: Mapping[str, str], node_rank: int, world_size: int) -> int:
    """Ranks on this node, from the tasks-per-node variables (this node's entry)."""
    for name in _PER_NODE_VARS:
        if environ.get(name):
            try:
                counts = tasks_per_node(environ[name])
            except ValueError as exc:
                raise UsageError(f"{name}={environ[name]!r}: {exc}; check the srun line") from None
            return counts[node_rank] if node_rank < len(counts) else counts[-1]
    return world_size


def agent_serves_store(environ: Mapping[str, str], addr: str, port: int) -> bool:
    """Does the elastic agent host a store at `addr:port`? Only at the address it exported
    with TORCHELASTIC_USE_AGENT_STORE (torch's own test of it is private and new)."""
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
    return World(rank, world_size, _int_var(environ, "LOCAL_RANK", 0),
                 _int_var(environ, "LOCAL_WORLD_SIZE", world_size),
                 _int_var(environ, "GROUP_RANK", 0), addr, port, "torchrun",
                 agent_store=agent_serves_store(environ, addr, port))


def slurm_world(environ: Mapping[str, str]) -> World:
    """The world of an srun task, from SLURM's variables."""
    world_size = _int_var(environ, "SLURM_STEP_NUM_TASKS", _int_var(environ, "SLURM_NTASKS", 1))
    rank = _int_var(environ, "SLURM_PROCID")
    if not 0 <= rank < world_size:
        raise UsageError(f"SLURM_PROCID={rank} is outside the task count {world_size}; "
                         "check the srun line")
    node_rank = _int_var(environ, "SLURM_NODEID", 0)
    addr = master_addr(environ) if world_size > 1 else "127.0.0.1"
    port = master_port(environ)
    return World(rank, world_size, _int_var(environ, "SLURM_LOCALID", 0),
                 local_world_size(environ, node_rank, world_size), node_rank, addr, port,
                 "slurm", agent_store=agent_serves_store(environ, addr, port))


def world_from_env(environ: Mapping[str, str]) -> World | None:
    """The launcher's world in `environ` (torchrun's variables first, then SLURM's), or
    None for a process started on its own."""
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return torchrun_world(environ)
    if is_slurm_step(environ):
        return slurm_world(environ)
    return None


def world_of(ctx: RunContext) -> World | None:
    """The launcher's world of the process `ctx` belongs to (its `launcher_env`)."""
    return world_from_env(ctx.launcher_env)


def reports(ctx: RunContext) -> bool:
    """Does this process write the report: rank 0 of a launched job, or no launcher?"""
    world = world_of(ctx)
    return world is None or world.is_reporter


def host_name() -> str:
    """This node's name: SLURM's (what scontrol and sbatch --exclude take) under SLURM."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()
