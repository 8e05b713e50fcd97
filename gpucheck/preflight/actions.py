"""What preflight does with its verdict: the exclude file and the SLURM drain for a
no-go, the guard against a hang no timeout can end, and the hand-over of the job to its
command (exec, the job's port freed first); docs/preflight.md says why each is so."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from gpucheck.distributed.world import World
from gpucheck.output import write_atomic

REASON_MAX = 200  # scontrol keeps the reason in slurmctld's state; keep it short
SCONTROL_TIMEOUT_S = 30.0
_UNSAFE = re.compile(r"[^A-Za-z0-9 ._:,;=()/+-]")
_HOST = re.compile(r"^[A-Za-z0-9._-]{1,253}$")


def failing_hosts(failing: Sequence[Mapping[str, Any]]) -> list[str]:
    """The hosts fit for a file line and a scontrol argument, sorted."""
    return sorted({h for n in failing if _HOST.match(h := str(n.get("host", "")))})


def write_exclude_file(path: str, failing: Sequence[Mapping[str, Any]]) -> list[str]:
    """The failing nodes' hosts, one a line, atomically; written when empty too
    (`sbatch --exclude=$(paste -sd, FILE)`)."""
    hosts = failing_hosts(failing)
    write_atomic(path, "".join(f"{h}\n" for h in hosts), option="--exclude-file")
    return hosts


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
    """This node's drain, from its own rank 0: {command, ran, exit_code, note}, or None
    when it does not fail. scontrol runs only with `drain`, under SLURM, on GPU ranks."""
    if node is None or not _HOST.match(str(node.get("host", ""))):
        return None
    # The reason "gpucheck preflight: <checks>: <why>", printable ASCII, short.
    why = "; ".join(map(str, node.get("why") or []))
    reason = f"gpucheck preflight: {','.join(map(str, node.get('checks') or []))}: {why}"
    argv = ["scontrol", "update", f"NodeName={node['host']}", "State=DRAIN",
            f"Reason={_UNSAFE.sub('_', reason)[:REASON_MAX]}"]
    said = {"command": " ".join(map(shlex.quote, argv)), "ran": False, "exit_code": None,
            "note": None}
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
    """Who writes the report and the exclude file after a failed agreement: rank 0 while
    it answers; when rank 0 is blamed, each node's lowest rank still answering."""
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
    exit 1): torchrun's agent sends it to every rank once one has ended."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})


# --- the hang guard: rank 0 stopped while it hosts the job's store --------

# Beyond every bound the checks have: a check may run over its estimated cost (a slow
# GEMM on a loaded machine) without anything being wrong; the guard must never end a
# healthy run, only one that cannot end by itself.
MARGIN_S = 30.0
# Seconds a collective may wait beyond the budget's end: ranks reach the end a little
# apart, and the final agreement (gather, decide, broadcast) needs its own moment.
GRACE_S = 5.0


def guard_seconds(budget_s: float, grace_s: float, backend: str) -> float:
    """The budget, the grace, the roll call twice (its host stays a window for late
    readers) and MARGIN_S."""
    from gpucheck.distributed.checkin import roll_call_window_s

    return budget_s + grace_s + 2 * roll_call_window_s(budget_s, backend) + MARGIN_S


def on_hang_hosts(rank: int, store_on_rank0: bool,
                  roster: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """What this rank writes to the exclude file when the guard fires: rank 0's node when
    rank 0's store is what does not answer; None when it cannot tell."""
    if rank == 0 or not store_on_rank0 or not speaks_for_failed_job([0], roster, rank, False):
        return None
    return [{"host": r.get("host"), "node_rank": r.get("node_rank")}
            for r in roster if int(r.get("rank", -1)) == 0]


class HangGuard:
    """A daemon timer that ends this process (exit 1) unless cancelled in time."""

    def __init__(self, seconds: float, rank: int, on_fire: Callable[[], None],
                 exit_now: Callable[[int], None] = os._exit) -> None:
        self._rank = rank
        self._on_fire = on_fire
        self._exit = exit_now
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self.seconds = seconds

    def __enter__(self) -> HangGuard:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()

    def _fire(self) -> None:
        try:
            print(f"gpucheck preflight: rank {self._rank}: the checks and the agreement did "
                  f"not end within {self.seconds:g} s (the budget and every bound past it): "
                  "a rank or the job's store stopped answering; the command is not started",
                  file=sys.stderr, flush=True)
            self._on_fire()
        finally:
            self._exit(1)


def exclude_on_hang(path: str | None, hosts: list[dict[str, Any]] | None) -> Callable[[], None]:
    def write() -> None:
        if path is None or hosts is None:
            return
        written = write_exclude_file(path, hosts)
        print(f"gpucheck preflight: rank 0 unresponsive (its store does not answer): "
              f"{path} names {', '.join(written) or 'no host'}", file=sys.stderr, flush=True)
    return write


# --- handing the job over to its command ---------------------------------

POLL_S = 0.05
# How long rank 0 waits for the others to be done with its store, and the others for
# rank 0's server to go: every rank has just agreed "go", so this is only skew.
HANDOFF_WAIT_S = 60.0


class HandoffFailed(RuntimeError):
    """The ranks could not hand the job's port over: the command is not started."""


def _ready_key(rank: int) -> str:
    return f"gpucheck/preflight/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/done/{rank}"


def release_store(store: Any, world: World, on_rank0: bool,
                  wait_s: float = HANDOFF_WAIT_S) -> None:
    """Return when this rank may exec: no rank needs preflight's store any more, and
    (with the store `on_rank0`, an srun launch) rank 0's server is gone."""
    if store is None or world.world_size == 1:
        return
    store.set(_ready_key(world.rank), "1")
    if not on_rank0:
        return
    deadline = time.monotonic() + wait_s
    if world.rank == 0:
        keys = [_ready_key(r) for r in range(world.world_size)]
        while not store.check(keys):
            if time.monotonic() > deadline:
                late = [r for r in range(world.world_size) if not store.check([keys[r]])]
                raise HandoffFailed(f"rank(s) {late} never finished the hand-over")
            time.sleep(POLL_S)
        return
    while _still_served(store):
        if time.monotonic() > deadline:
            raise HandoffFailed("rank 0 still holds the job's port (MASTER_PORT)")
        time.sleep(POLL_S)


def _still_served(store: Any) -> bool:
    """Does rank 0's preflight store still answer (a new server on the port, the
    command's, lacks the key)?"""
    try:
        with _stderr_silenced():
            return bool(store.check([_ready_key(0)]))
    # The server went away (torch's DistError is a RuntimeError): what this loop waits
    # for. Anything else (a store without `check`) is a bug to see, not a hand-over.
    except (RuntimeError, OSError):
        return False


@contextmanager
def _stderr_silenced() -> Iterator[None]:
    """c10d writes a failed store read (rank 0's server gone, the very thing awaited) as
    14 lines of C++ frames on descriptor 2: noise on a passing run."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


# Python ignores these at start-up (a write to a closed pipe raises instead of killing
# it); an ignored signal stays ignored across exec, so the job would inherit it:
# `yes | head -1` under pipefail would give 1 and "Broken pipe" instead of 141.
PYTHON_IGNORED = ("SIGPIPE", "SIGXFSZ")


def exec_command(command: Sequence[str], environment: Mapping[str, str],
                 mask: Iterable[int] = ()) -> None:
    """Become `command` (never returns) with default signal dispositions and `mask` (the
    launcher's) blocked; output so far flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    for name in PYTHON_IGNORED:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.execvpe(command[0], list(command), dict(environment))
