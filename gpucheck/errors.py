"""Errors that end a command with a one-line message, the stop signals behind an
interruption, and Ctrl-C held during an import (torch's imports swallow it)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class UsageError(Exception):
    """Bad input from the user: one line saying what to do, exit code 2."""


class Interrupted(KeyboardInterrupt):
    """A signal stopped the run: SIGTERM (a SLURM time limit, `timeout`, a pod eviction),
    SIGHUP, or SIGINT when it arrives through torch's elastic agent.

    A KeyboardInterrupt on purpose: every `except Exception` lets it through, and every
    place that keeps partial results on Ctrl-C keeps them on SIGTERM too. The command
    ends with exit code 128 + the signal's number, as a shell reports a killed process.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signal.Signals(signum)
        super().__init__(self.signum.name)


def stop_signal(exc: KeyboardInterrupt) -> signal.Signals:
    """The signal behind an interruption: a plain KeyboardInterrupt is Ctrl-C (SIGINT)."""
    return exc.signum if isinstance(exc, Interrupted) else signal.SIGINT


def describe_stop(signum: signal.Signals) -> str:
    """"interrupted (Ctrl-C)" or "terminated by SIGTERM": the words every report uses."""
    return "interrupted (Ctrl-C)" if signum == signal.SIGINT else f"terminated by {signum.name}"


_DEFERRED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def deferred_interrupts() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP for the block (an import: bounded, and not safe
    to interrupt), then deliver the first one the way it would have come."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous: dict[signal.Signals, Any] = {}
    for sig in _DEFERRED:
        previous[sig] = signal.signal(sig, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    if held:
        _deliver(held[0], previous[signal.Signals(held[0])])


def _deliver(signum: int, handler: Any) -> None:
    """Run the handler that was in place (gpucheck's, raising Interrupted; Python's,
    raising KeyboardInterrupt); a default disposition gets the signal itself."""
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)


def hangup_ignored(sig: int) -> bool:
    """`nohup gpucheck ...` asked the run to outlive its terminal's hangup: a SIGHUP
    ignored when gpucheck started stays ignored, in gpucheck, torch's agent and the
    ranks. Only SIGHUP: a background job of a non-interactive shell is born with SIGINT
    ignored too, and gpucheck's Ctrl-C and SIGTERM handling must not depend on that."""
    return sig == signal.SIGHUP and signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
