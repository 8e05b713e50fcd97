"""Errors that end a command with a one-line message."""

from __future__ import annotations

import signal


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
