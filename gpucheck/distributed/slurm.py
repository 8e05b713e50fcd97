"""The rank environment under SLURM (`srun ... python -m gpucheck bench`), derived from
SLURM's own variables when torchrun's (RANK, WORLD_SIZE, ...) are absent.

Variables read (see `man srun`, "OUTPUT ENVIRONMENT VARIABLES"):
SLURM_PROCID (rank), SLURM_STEP_NUM_TASKS or SLURM_NTASKS (world size),
SLURM_LOCALID (local rank), SLURM_NODEID (node rank), SLURM_STEP_TASKS_PER_NODE /
SLURM_TASKS_PER_NODE / SLURM_NTASKS_PER_NODE (ranks per node), SLURM_STEP_NODELIST /
SLURM_JOB_NODELIST / SLURM_NODELIST (the master is the first host), SLURM_JOB_ID
(the default port). MASTER_ADDR and MASTER_PORT, when set, win.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from gpucheck.errors import UsageError

PORT_BASE = 20000
PORT_SPAN = 20000
DEFAULT_PORT = 29500

_NODELIST_VARS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
_PER_NODE_VARS = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE")


def is_slurm_step(environ: Mapping[str, str]) -> bool:
    """True inside an srun task: SLURM gave it a rank and a task count."""
    return "SLURM_PROCID" in environ and (
        "SLURM_STEP_NUM_TASKS" in environ or "SLURM_NTASKS" in environ)


# The largest SLURM clusters have tens of thousands of nodes; a host list longer
# than this is a typo (gpu[1-99999999]), not a job.
MAX_HOSTS = 100_000


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
    width = len(low)
    return [str(n).zfill(width) for n in range(int(low), int(high) + 1)]


def _expand_one(part: str) -> list[str]:
    match = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)", part)
    if match is None:
        if "[" in part or "]" in part:
            raise ValueError(f"unsupported host list form {part!r}")
        return [part]
    prefix, ranges, suffix = match.groups()
    hosts: list[str] = []
    for item in ranges.split(","):
        hosts += [f"{prefix}{n}{suffix}" for n in _expand_range(item.strip())]
        if len(hosts) > MAX_HOSTS:
            raise ValueError(f"more than {MAX_HOSTS} hosts")
    return hosts


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compact host list as host names: `gpu[01-02,07],cpu1` -> gpu01 gpu02 gpu07 cpu1.

    Handles one bracket group per host name (the forms SLURM prints for a job's
    nodes); raises ValueError for anything else (`scontrol show hostnames` does all).
    """
    hosts: list[str] = []
    for part in _split_top_level(nodelist):
        hosts += _expand_one(part)
        if len(hosts) > MAX_HOSTS:  # bounded: a typo must not fill the memory
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
        # Bounded before expanding: `1(x99999999999999999999)` (another process's
        # environment, read by `gpucheck hang`) must not allocate.
        if repeat > MAX_HOSTS - len(counts):
            raise ValueError(f"more than {MAX_HOSTS} nodes in {part!r}")
        counts.extend([int(match.group(1))] * repeat)
    return counts


def _int(environ: Mapping[str, str], *names: str) -> int:
    for name in names:
        if name in environ:
            try:
                return int(environ[name])
            except ValueError:
                raise UsageError(f"{name}={environ[name]!r} is not an integer; "
                                 "check the srun line") from None
    raise UsageError(f"{names[0]} is not set; run under srun or set it (or use torchrun)")


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
        return _int(environ, "MASTER_PORT")
    if environ.get("SLURM_JOB_ID", "").isdigit():
        return PORT_BASE + int(environ["SLURM_JOB_ID"]) % PORT_SPAN
    return DEFAULT_PORT


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
