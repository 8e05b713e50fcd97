"""gpucheck's own deadline on every host wait on NCCL (and objects on a gloo group), NCCL's
watchdog as the backstop, and how a rank whose NCCL group failed ends (docs/hang.md,
"When an NCCL collective times out")."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Iterable, MutableMapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from gpucheck.context import RunContext

# The group's timeout is the command's + this: gpucheck's deadline always fires first.
BACKSTOP_S = 30.0
POLL_S = 0.002  # 2 ms between completion queries: the timing is taken on the GPU
# NCCL's settings gpucheck chooses when the user has not (ProcessGroupNCCL.hpp names):
# CleanUpOnly (the watchdog aborts, the process lives on to answer the roll call), a
# 3 s dump wait (the post-timeout sleep is 4x this), a 60 s heartbeat timeout (the
# monitor's own sleep), and the watchdog's dump on a timeout.
BACKSTOP = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
            "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "3000",
            "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "60",
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
T = TypeVar("T")
TRACEBACK_CAP_S = 8.0  # the watchdog's traceback print is given at most this long


class DeadlinePassed(RuntimeError):
    """An NCCL op did not complete within gpucheck's deadline (the command's timeout)."""


class Pending(Protocol):
    """What `settle` polls: a `torch.distributed.Work`."""

    def is_completed(self) -> bool: ...


def settle(pending: Iterable[Pending], wait_s: float, what: str,
           done: Callable[[], bool] = lambda: True,
           clock: Callable[[], float] = time.monotonic,
           sleep: Callable[[float], object] = time.sleep) -> None:
    """Return once every op of `pending` and `done()` (an end mark's `query()`) say
    complete; raise `DeadlinePassed` `wait_s` after the call otherwise. Never blocks in
    torch: a hung peer costs the deadline, not the watchdog's minutes."""
    ops = list(pending)
    deadline = clock() + wait_s
    while not (all(op.is_completed() for op in ops) and done()):
        if clock() >= deadline:
            raise DeadlinePassed(f"{what} timed out: not complete within {wait_s:g} s "
                                 "(gpucheck's deadline; NCCL's watchdog waits "
                                 f"{BACKSTOP_S:g} s more)")
        sleep(POLL_S)


def synchronize(device: str, wait_s: float = math.inf, what: str = "the device's work",
                ) -> None:
    """`torch.cuda.synchronize()` under gpucheck's deadline: an event recorded after the
    work and polled, so a kernel stuck behind a hung NCCL op (DDP's buffer broadcast, an
    all_reduce) costs the deadline, not the watchdog's backstop; no deadline where no
    NCCL op can be in flight (`wait_s` infinite). Nothing on CPU."""
    if device != "cuda":
        return
    import torch

    end = torch.cuda.Event()
    end.record()
    settle([], wait_s, what, done=end.query)


def gather_objects(obj: T, ctx: RunContext) -> list[T]:
    """Every rank's `obj`, in rank order (all_gather_object on the session's object
    group: gloo beside NCCL, so a silent rank costs gloo's timeout, not NCCL's)."""
    import torch.distributed as dist

    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, obj, group=ctx.session.objects)
    return every


def broadcast_object(obj: T, ctx: RunContext, src: int = 0) -> T:
    """Rank `src`'s `obj` on every rank, through the session's object group."""
    import torch.distributed as dist

    box: list[Any] = [obj]
    dist.broadcast_object_list(box, src=src, group=ctx.session.objects)
    return box[0]  # type: ignore[no-any-return]


def nccl_backstop(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set the `BACKSTOP` settings the user has not set (before the group is made);
    what was set, for the report's run section."""
    env = os.environ if environ is None else environ
    chosen = {name: value for name, value in BACKSTOP.items() if name not in env}
    env.update(chosen)
    return chosen


def group_timeout_s(backend: str, timeout_s: float) -> float:
    """The process group's own timeout: on NCCL the backstop behind gpucheck's deadline;
    gloo's own timeout raises in the waiting thread, so it is the deadline itself."""
    return timeout_s + BACKSTOP_S if backend == "nccl" else timeout_s


def latest_arrival_s(environ: MutableMapping[str, str] | None = None) -> float:
    """How long after the first survivor's deadline the last one can reach the roll
    call: a rank whose wait escaped the poll reaches it only when the watchdog aborts
    (the backstop, the traceback, then 4 x the dump wait, as set or NCCL's default)."""
    env = os.environ if environ is None else environ
    dump_ms = env.get("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", "")
    seconds = int(dump_ms) / 1000 if dump_ms.isdigit() else 15.0  # NCCL's default 15000
    return BACKSTOP_S + TRACEBACK_CAP_S + 4 * seconds


def abort_groups(dist: Any) -> str | None:
    """Abort every process group of this process (the kernels stop, the heartbeat
    monitor with them); None when done, else why not, for a visible SKIP line.
    `_abort_process_group` where this torch has it, the default group's `abort()`
    otherwise."""
    c10d = dist.distributed_c10d
    abort = getattr(c10d, "_abort_process_group", None)
    try:
        if abort is not None:
            abort()
            return None
        method = getattr(c10d._get_default_group(), "abort", None)
        if method is None:
            return ("this torch has neither distributed_c10d._abort_process_group nor "
                    "ProcessGroup.abort: the failed NCCL group is left to os._exit")
        method()
    except Exception as exc:  # torch's own failure, said where the report is read
        return f"aborting the NCCL group failed: {type(exc).__name__}: {str(exc)[:200]}"
    return None


def exit_after_abort(aborted: Callable[[], bool], run: Callable[[], int],
                     leave: Callable[[int], object] = os._exit) -> int:
    """Run the command (it writes its report); when a failed NCCL group was aborted in
    this process, end with the command's code through `leave` (os._exit): no
    interpreter teardown runs the group's destructor or waits on its threads."""
    try:
        code = run()
    except SystemExit as exc:  # a rank that does not report says one line and exits
        if not aborted():
            raise
        code = exc.code if isinstance(exc.code, int) else 1
    leave_if_aborted(aborted(), code, leave)
    return code


def leave_if_aborted(aborted: bool, code: int,
                     leave: Callable[[int], object] = os._exit) -> None:
    """`leave(code)` with the output flushed, when this process aborted an NCCL group."""
    if aborted:
        sys.stdout.flush()
        sys.stderr.flush()
        leave(code)
