"""Start local ranks through torch's elastic launcher (the machinery behind torchrun):
it spawns them, rendezvous on loopback, stops the others when one fails, and returns
every rank's value; gpucheck adds its signal handling around it."""

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

# Seconds the agent waits after SIGTERM before SIGKILL when it stops workers. torch
# 2.11 has no such setting and waits 30 s (`_launch_config`); 2.14 has it.
SHUTDOWN_TIMEOUT_S = 3
# LaunchConfig fields newer than the oldest torch gpucheck runs on: left out where the
# installed torch lacks them, which then keeps its own default.
NEWER_LAUNCH_SETTINGS = frozenset({"shutdown_timeout"})


@dataclass(frozen=True)
class RankFailure:
    """How one worker ended badly, as the elastic agent saw it."""

    rank: int
    local_rank: int
    exitcode: int
    signal: str | None
    message: str
    # Set when the rank did not fail itself but was found silent: "did not answer"
    # (roll call after a failed collective) or "never checked in".
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
    """Run `entrypoint(*args)` on `nproc` local ranks; return {rank: return value}.

    `master_port=None` lets the rendezvous store bind a free port itself, which
    avoids the race of picking a port and binding it later.
    """
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
        signals_to_handle=_signals_for_the_agent(),
    )
    _quiet_elastic_logs()
    handlers = _signal_handlers()
    try:
        with _ranks_start_deaf_to_ctrl_c():
            by_rank: dict[int, Any] = elastic_launch(config, rank_main)(entrypoint, *args)
            return by_rank
    except ChildFailedError as exc:
        raise WorkersFailed(_failures(exc)) from None
    except SignalException as exc:
        # The agent has already stopped every worker (the same signal, then SIGKILL
        # after SHUTDOWN_TIMEOUT_S). Ctrl-C and SIGTERM alike leave as an interruption,
        # so the command keeps what was measured and exits 128 + the signal.
        raise Interrupted(exc.sigval) from None
    finally:
        _restore(handlers)


def _launch_config(config_type: Any, **settings: Any) -> Any:
    """`config_type(**settings)` less the newer settings this torch does not know.

    Only NEWER_LAUNCH_SETTINGS may be dropped: any other unknown name is a mistake here,
    and LaunchConfig's own TypeError says so."""
    known = {field.name for field in fields(config_type)}
    return config_type(**{name: value for name, value in settings.items()
                          if name in known or name not in NEWER_LAUNCH_SETTINGS})


def rank_main(entrypoint: Callable[..., Any], *args: Any) -> Any:
    """How every spawned rank runs `entrypoint(*args)`: a stop signal ends it at once.

    A terminal's Ctrl-C reaches every process of the group, then the agent stops the
    ranks with the same signal. As a KeyboardInterrupt that second SIGINT landed in
    torch's own handler of the first one and printed a traceback per rank. The
    launching process reports the stop; what rank 0 measured is already in the run
    directory (written atomically), so a rank has nothing to unwind.
    """
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if not hangup_ignored(sig):
            signal.signal(sig, _exit_at_once)
    # Started with SIGINT blocked (see _ranks_start_deaf_to_ctrl_c): a Ctrl-C that came
    # while the rank imported torch is pending and ends it here, silently.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return entrypoint(*args)


@contextmanager
def _ranks_start_deaf_to_ctrl_c() -> Iterator[None]:
    """Ranks are born with SIGINT blocked; this process still hears Ctrl-C.

    A terminal's Ctrl-C reaches every process of the group, and a spawned rank
    spends its first seconds importing torch (while multiprocessing unpickles its
    function) before rank_main can set a handler: each rank printed a
    KeyboardInterrupt traceback (14 to 73 lines) before gpucheck's one line. A
    blocked signal stays blocked across fork and exec (POSIX sigprocmask), so the
    agent's thread, which forks the ranks, blocks SIGINT for the launch; a waiting
    thread started before keeps it unblocked, so the kernel delivers this process's
    Ctrl-C there and Python runs the agent's handler on the main thread as usual.
    (CPython does the same for its resource tracker, bpo-33613; starting that tracker
    unblocks SIGINT afterwards, so it is started first.)"""
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


# The resource tracker's own farewell when a rank ended by os._exit (Ctrl-C, SIGTERM)
# left its multiprocessing semaphores registered: it unlinks them all the same.
_TRACKER_LEAK_WARNING = "ignore:resource_tracker:UserWarning"


def quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker (shared by the spawned ranks) without its
    "resource_tracker: There appear to be N leaked semaphore objects" line after a
    Ctrl-C: ranks stopped by `_exit_at_once` never unregister their semaphores, and the
    tracker, which still unlinks them, warned on stderr below gpucheck's one line. The
    tracker takes its -W options from sys.warnoptions when it starts."""
    from multiprocessing import resource_tracker

    saved = list(sys.warnoptions)
    sys.warnoptions.append(_TRACKER_LEAK_WARNING)
    # Born with SIGHUP blocked (a mask survives fork and exec), as CPython starts it
    # with SIGINT and SIGTERM blocked: a hangup sent to the whole group killed the
    # tracker, its successor then met the ranks' farewells and printed a traceback each.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        sys.warnoptions[:] = saved


def _exit_at_once(signum: int, frame: object) -> None:
    os._exit(128 + signum)


# The signals torch's elastic agent takes over (TORCHELASTIC_SIGNALS_TO_HANDLE's default).
_AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _signals_for_the_agent() -> str:
    """The stop signals torch's agent takes over, less SIGHUP under `nohup`: it would
    otherwise stop every rank when the terminal hangs up."""
    return ",".join(sig.name for sig in _AGENT_SIGNALS if not hangup_ignored(sig))


def _signal_handlers() -> dict[signal.Signals, Any]:
    return {sig: signal.getsignal(sig) for sig in _AGENT_SIGNALS}


def _restore(handlers: dict[signal.Signals, Any]) -> None:
    """Give back the handlers the agent replaced and never restores: its handler raises
    SignalException, which outside the agent would end in a traceback."""
    if threading.current_thread() is not threading.main_thread():
        return  # the agent registers none off the main thread
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)


def _failures(exc: Any) -> list[RankFailure]:
    failures = []
    for rank, failure in sorted(exc.failures.items()):
        message = failure.message
        while isinstance(message, dict):  # the error file written by @record
            message = message.get("message", "")
        failures.append(RankFailure(
            rank=rank,
            local_rank=failure.local_rank,
            exitcode=failure.exitcode,
            signal=failure.signal_name() if failure.exitcode < 0 else None,
            message=_first_line(str(message or "")) or "no error message",
        ))
    return failures


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


_QUIET_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher",
                  "torch.multiprocessing")


def _quiet_elastic_logs() -> None:
    """The agent logs its whole config at INFO/WARNING, and "Received 15 death signal,
    shutting down workers" on a signal; gpucheck reports failures and signals itself.

    Setting the parents is not enough: torch's `get_logger` gives each module's logger
    its own level (LOGLEVEL, default WARNING), so every existing one is set as well.
    """
    names = [n for n in logging.Logger.manager.loggerDict if n.startswith(_QUIET_LOGGERS)]
    for name in (*_QUIET_LOGGERS, *names):
        logging.getLogger(name).setLevel(logging.CRITICAL)
