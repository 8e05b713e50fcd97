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


def speaks_for_failed_job(blamed: Sequence[int], roster: Sequence[Mapping[str, Any]],
                          rank: int | None, reporter: bool) -> bool:
    """Who writes the report and the exclude file after a failed agreement: rank 0
    (the reporter) while it answers. When rank 0 itself is blamed (stopped, crashed,
    never checked in), nobody would, and a wrapper reading the exclude file would find
    none: so each node's lowest rank still answering speaks for what it knows (every
    node's own, as the drain; on a shared file system each writes the same path
    atomically, the last one's view stays)."""
    if reporter:
        return True
    if rank is None or 0 not in set(blamed):
        return False
    me = next((r for r in roster if int(r.get("rank", -1)) == rank), None)
    if me is None:
        return False
    node = me.get("node_rank")
    alive = sorted(int(r["rank"]) for r in roster
                   if r.get("node_rank") == node and int(r["rank"]) not in set(blamed))
    return bool(alive) and alive[0] == rank


def hold_sigterm() -> None:
    """Block SIGTERM for the rest of this process (a rank about to write its files and
    exit 1): under torchrun the agent sends it to every rank as soon as one has ended
    (here: the silent rank 0, killed by the roll call), which would cut the report and
    the exclude file short. The process still ends: it exits right after, and the
    agent's SIGKILL follows its SIGTERM regardless."""
    import signal

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
