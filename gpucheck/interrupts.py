"""Ctrl-C inside an import: held, then raised right after it.

torch's and torchvision's imports catch BaseException in places (entry points,
optional modules): a KeyboardInterrupt raised inside them was sometimes printed and
swallowed, or turned into another error, instead of ending the command with its one
line. `deferred_interrupts()` holds a stop signal during such a bounded step and
delivers it right after, where gpucheck's own handling (one line, exit 130/143)
takes over. (Spawned ranks: gpucheck.distributed.launch.)
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

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
