"""Acting on a no-go: the exclude file for a resubmission, and the SLURM drain.

Only a FAIL that names a node condemns it (`gpucheck.preflight.verdict`): a WARN
never drains, and CPU ranks never drain (their slowness is the machine's load, not
a fault of the node's GPUs)."""

from __future__ import annotations

import re
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpucheck.output import write_atomic

REASON_MAX = 200  # scontrol keeps the reason in slurmctld's state; keep it short
SCONTROL_TIMEOUT_S = 30.0
_UNSAFE = re.compile(r"[^A-Za-z0-9 ._:,;=()/+-]")
_HOST = re.compile(r"^[A-Za-z0-9._-]{1,253}$")


def safe_host(host: str) -> str | None:
    """A host name fit for a file line and a scontrol argument, or None."""
    return host if _HOST.match(host) else None


def failing_hosts(failing: Sequence[Mapping[str, Any]]) -> list[str]:
    hosts = [safe_host(str(n.get("host", ""))) for n in failing]
    return sorted({h for h in hosts if h})


def write_exclude_file(path: str, failing: Sequence[Mapping[str, Any]]) -> list[str]:
    """The failing nodes' hosts, one a line, atomically; written when empty too, so a
    wrapper can always read it (`sbatch --exclude=$(paste -sd, FILE)`)."""
    hosts = failing_hosts(failing)
    write_atomic(path, "".join(f"{h}\n" for h in hosts), option="--exclude-file")
    return hosts


def drain_reason(node: Mapping[str, Any]) -> str:
    """"gpucheck preflight: <checks>: <why>", printable ASCII, at most REASON_MAX."""
    why = "; ".join(map(str, node.get("why") or []))
    text = f"gpucheck preflight: {','.join(map(str, node.get('checks') or []))}: {why}"
    return _UNSAFE.sub("_", text)[:REASON_MAX]


def drain_command(host: str, reason: str) -> list[str]:
    return ["scontrol", "update", f"NodeName={host}", "State=DRAIN", f"Reason={reason}"]


def shown_command(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def my_failing_node(failing: Sequence[Mapping[str, Any]], host: str,
                    node_rank: int) -> Mapping[str, Any] | None:
    return next((n for n in failing if n.get("host") == host
                 and int(n.get("node_rank", -1)) == node_rank), None)


Runner = Callable[[list[str]], int]


def _run_scontrol(argv: list[str]) -> int:
    try:
        return subprocess.run(argv, timeout=SCONTROL_TIMEOUT_S, check=False,
                              stdin=subprocess.DEVNULL).returncode
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127 if isinstance(exc, OSError) else 124


def drain_node(node: Mapping[str, Any] | None, device: str, under_slurm: bool, drain: bool,
               runner: Runner = _run_scontrol) -> dict[str, Any] | None:
    """This node's drain, from its own rank 0: {command, ran, exit_code, note} or None
    when this node does not fail. Runs scontrol only with `drain`, under SLURM, on GPU
    ranks; otherwise says the command."""
    if node is None or not safe_host(str(node.get("host", ""))):
        return None
    argv = drain_command(str(node["host"]), drain_reason(node))
    said = {"command": shown_command(argv), "ran": False, "exit_code": None, "note": None}
    if device != "cuda":
        return said | {"note": "not drained: CPU ranks (no GPU fault to drain for)"}
    if not drain:
        return said | {"note": "to drain it: run the command (or pass --drain under SLURM)"}
    if not under_slurm:
        return said | {"note": "not drained: not a SLURM job"}
    code = runner(argv)
    return said | {"ran": True, "exit_code": code}
