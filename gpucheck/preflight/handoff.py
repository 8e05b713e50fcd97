"""Handing the job over to its command: every rank's process becomes the command.

`os.execvpe` keeps the PID (the launcher still watches the process it started) and
is given the environment as the launcher set it, captured before gpucheck changed
anything (`started_environment`): RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT,
TORCHELASTIC_* and SLURM_* as they were, none of gpucheck's own variables left.

The port: under torchrun the agent hosts the job's store, and preflight's keys live
under their own prefix there, so the command's `init_process_group` finds a store
with nothing of preflight's in the way. Under srun and other `env://` launches rank
0's process hosted preflight's store on MASTER_PORT itself: a rank whose command
connected there before rank 0 exec'd would rendezvous on preflight's store, not the
command's. So every rank says it is done with the store; rank 0 waits for all of
them, then execs (which closes its server: the command binds the port afresh); the
other ranks exec only once rank 0's server has stopped answering.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from gpucheck.distributed.world import World

POLL_S = 0.05
# How long rank 0 waits for the others to be done with its store, and the others for
# rank 0's server to go: every rank has just agreed "go", so this is only skew.
HANDOFF_WAIT_S = 60.0


class HandoffFailed(RuntimeError):
    """The ranks could not hand the job's port over: the command is not started."""


def _ready_key(rank: int) -> str:
    """On the store preflight checked in on, already scoped to it (RunContext.scope)."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"gpucheck/preflight/{attempt}/done/{rank}"


def release_store(store: Any, world: World, on_rank0: bool,
                  wait_s: float = HANDOFF_WAIT_S) -> None:
    """Return when this rank may exec: no rank still needs preflight's store, and (with
    the store `on_rank0`) on ranks > 0 rank 0's server is gone."""
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
    """Does rank 0's preflight store still answer? A closed connection (rank 0 exec'd)
    raises; a new server on the port (the command's, already up) lacks the key."""
    try:
        with _stderr_silenced():
            return bool(store.check([_ready_key(0)]))
    except Exception:  # the server went away: what this loop waits for
        return False


@contextmanager
def _stderr_silenced() -> Iterator[None]:
    """c10d writes a store read that fails (here: rank 0's server reset as it execs,
    the very thing awaited) as 14 lines of C++ frames on descriptor 2 before raising;
    on a passing run that is noise on every rank above 0, `-q` or not."""
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
    """Become `command` (never returns), with the signal dispositions a process gets
    by default and `mask` (the launcher's) as its blocked signals. Output written so
    far is flushed first: the command's own output must not overtake it."""
    sys.stdout.flush()
    sys.stderr.flush()
    for name in PYTHON_IGNORED:
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.execvpe(command[0], list(command), dict(environment))
