"""Start local ranks through torch's elastic launcher (torchrun's machinery), with
gpucheck's signal handling around it (docs/bench.md, "Reading the report": Ctrl-C)."""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

from gpucheck.errors import Interrupted, UsageError, deferred_interrupts, hangup_ignored

# The agent's wait between SIGTERM and SIGKILL (torch 2.11 has no setting: 30 s).
SHUTDOWN_TIMEOUT_S = 3
# LaunchConfig fields newer than the oldest torch gpucheck runs on: dropped where absent.
NEWER_LAUNCH_SETTINGS = frozenset({"shutdown_timeout"})
# The signals torch's elastic agent takes over (TORCHELASTIC_SIGNALS_TO_HANDLE's default).
_AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


@dataclass(frozen=True)
class RankFailure:
    """How one worker ended badly, as the elastic agent saw it."""

    rank: int
    local_rank: int
    exitcode: int
    signal: str | None
    message: str
    # A rank found silent rather than failed: "did not answer", "never checked in".
    cause: str | None = None

    def how(self) -> str:
        if self.cause:
            return self.cause
        if self.signal:
            return f"was killed by {self.signal}"
        return f"exited with code {self.exitcode}"

    def describe(self) -> str:
        return f"rank {self.rank} ({self.how()}): {self.message}"


class WorkersFailed(Exception):
    """One or more local workers failed; `failures` says which and how."""

    def __init__(self, failures: list[RankFailure]) -> None:
        self.failures = failures
        super().__init__("; ".join(f.describe() for f in failures))


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """Raise a UsageError when `port` cannot be bound (before any process starts)."""
    if not 0 < port < 65536:
        raise UsageError(f"--master-port {port} is not a TCP port; use 1024-65535")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                raise UsageError(
                    f"port {port} is in use; choose another --master-port or omit it "
                    "to pick a free one"
                ) from None
            raise


def launch_local(
    entrypoint: Callable[..., Any],
    args: tuple[Any, ...],
    nproc: int,
    master_port: int | None = None,
) -> dict[int, Any]:
    """Run `entrypoint(*args)` on `nproc` local ranks: {rank: return value}. Without a
    `master_port` the rendezvous store binds a free one itself (no pick-then-bind race)."""
    with deferred_interrupts():  # Ctrl-C inside torch's imports: raised after them
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if master_port is not None:
        check_port_free(master_port)
    config = _launch_config(
        LaunchConfig,
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=f"gpucheck-{uuid.uuid4().hex[:12]}",
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{master_port or 0}",
        rdzv_configs={"timeout": 60},
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        # Less SIGHUP under nohup: the agent would stop every rank on a hangup.
        signals_to_handle=",".join(s.name for s in _AGENT_SIGNALS if not hangup_ignored(s)),
    )
    # The agent's config and signal logs: gpucheck says both itself. Every existing
    # logger too: torch's `get_logger` gives each module its own level.
    quiet = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")
    for name in (*quiet, *(n for n in logging.Logger.manager.loggerDict if n.startswith(quiet))):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    handlers = {sig: signal.getsignal(sig) for sig in _AGENT_SIGNALS}
    try:
        with _ranks_start_deaf_to_ctrl_c():
            by_rank: dict[int, Any] = elastic_launch(config, rank_main)(entrypoint, *args)
            return by_rank
    except ChildFailedError as exc:
        failures = []
        for rank, failure in sorted(exc.failures.items()):
            message = failure.message
            while isinstance(message, dict):  # the error file written by @record
                message = message.get("message", "")
            lines = [line.strip() for line in str(message or "").splitlines() if line.strip()]
            failures.append(RankFailure(
                rank, failure.local_rank, failure.exitcode,
                failure.signal_name() if failure.exitcode < 0 else None,
                lines[-1] if lines else "no error message"))
        raise WorkersFailed(failures) from None
    except SignalException as exc:
        # The agent has stopped every worker: the command keeps what was measured.
        raise Interrupted(exc.sigval) from None
    finally:
        # Give back the handlers the agent replaced and never restores (its
        # SignalException outside the agent would end in a traceback); it registers
        # none off the main thread.
        if threading.current_thread() is threading.main_thread():
            for sig, handler in handlers.items():
                if handler is not None:
                    signal.signal(sig, handler)


def _launch_config(config_type: Any, **settings: Any) -> Any:
    """`config_type(**settings)` less the NEWER_LAUNCH_SETTINGS this torch lacks (any
    other unknown name stays a TypeError)."""
    known = {field.name for field in fields(config_type)}
    return config_type(**{name: value for name, value in settings.items()
                          if name in known or name not in NEWER_LAUNCH_SETTINGS})


def rank_main(entrypoint: Callable[..., Any], *args: Any) -> Any:
    """How every spawned rank runs `entrypoint(*args)`: a stop signal ends it at once,
    silently (the launching process reports the stop; the run directory has the rest)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if not hangup_ignored(sig):
            signal.signal(sig, _exit_at_once)
    # Born with SIGINT blocked: a Ctrl-C during its imports is pending and ends it here.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return entrypoint(*args)


@contextmanager
def _ranks_start_deaf_to_ctrl_c() -> Iterator[None]:
    """Ranks are born with SIGINT blocked (a mask survives fork and exec) while this
    process still hears Ctrl-C through a thread that keeps it unblocked; the resource
    tracker is started first (starting it unblocks SIGINT)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    quiet_resource_tracker()
    done = threading.Event()
    listener = threading.Thread(target=done.wait, name="gpucheck-ctrl-c", daemon=True)
    listener.start()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        done.set()


# The tracker's "leaked semaphore" farewell after ranks ended by os._exit.
_TRACKER_LEAK_WARNING = "ignore:resource_tracker:UserWarning"


def quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker without its leaked-semaphore warning
    (ranks stopped by `_exit_at_once` never unregister theirs; it unlinks them all the
    same): it takes its -W options from sys.warnoptions when it starts."""
    from multiprocessing import resource_tracker

    saved = list(sys.warnoptions)
    sys.warnoptions.append(_TRACKER_LEAK_WARNING)
    # Born with SIGHUP blocked too: a hangup to the group killed it, and its successor
    # printed a traceback per rank.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        sys.warnoptions[:] = saved


def _exit_at_once(signum: int, frame: object) -> None:
    os._exit(128 + signum)
