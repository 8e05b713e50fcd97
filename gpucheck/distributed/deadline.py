"""When a collective hangs: gpucheck's own deadline on every host wait on NCCL (objects
on a gloo group), NCCL's watchdog as the backstop, how a rank whose NCCL group failed
ends, and torch's Flight Recorder: armed for bench and comm, and this rank's own dump
after a failed collective (docs/hang.md, "When an NCCL collective times out")."""

from __future__ import annotations

import contextlib
import math
import os
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from gpucheck.errors import UsageError
from gpucheck.output import others_may_write, write_atomic

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
    """Return once every op of `pending` and `done()` say complete, else raise
    `DeadlinePassed` after `wait_s`: never blocks in torch, so a hung peer costs the
    deadline, not the watchdog's minutes."""
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
    """`torch.cuda.synchronize()` under gpucheck's deadline (an event recorded and
    polled: a kernel stuck behind a hung NCCL op costs the deadline). Nothing on CPU."""
    if device != "cuda":
        return
    import torch

    end = torch.cuda.Event()
    end.record()
    settle([], wait_s, what, done=end.query)


def gather_objects(obj: T, ctx: RunContext) -> list[T]:
    """Every rank's `obj`, in rank order, on the session's object group (gloo beside
    NCCL: a silent rank costs gloo's timeout, not NCCL's)."""
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
    """Set the `BACKSTOP` settings the user has not (before the group is made): those set."""
    env = os.environ if environ is None else environ
    chosen = {name: value for name, value in BACKSTOP.items() if name not in env}
    env.update(chosen)
    return chosen


def group_timeout_s(backend: str, timeout_s: float) -> float:
    """The group's own timeout: on NCCL the backstop behind gpucheck's deadline; gloo's
    raises in the waiting thread, so it is the deadline itself."""
    return timeout_s + BACKSTOP_S if backend == "nccl" else timeout_s


def abort_groups(dist: Any) -> str | None:
    """Abort every process group of this process: None when done, else why not."""
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
    """Run the command; after an aborted NCCL group end through `leave` (os._exit), so no
    teardown runs the group's destructor or waits on its threads."""
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


# --- the Flight Recorder ----------------------------------------------------------

BUFFER_ENTRIES = "2000"
ARMED_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE")
PREFIX_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
# torch._C._distributed_c10d's function returning a backend's buffer as pickle bytes.
DUMPERS = {"gloo": "_dump_fr_trace", "nccl": "_dump_nccl_trace"}
# A dump on NCCL queries CUDA events, which may not return on a hung GPU.
DUMP_WAIT_S = 5.0
OWN_NAME = "gpucheck_"  # between torch's prefix and the rank: never torch's own file


class UnsafeFolder(Exception):
    """A folder in a shared place that another user could have made or can write."""


@dataclass(frozen=True)
class DumpOutcome:
    """What `dump_after_failure` did: the file written, or why nothing was."""

    path: str | None = None
    skipped: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return {"path": self.path, "skipped": self.skipped}


def dump_folder() -> str:
    """One folder per user for every gpucheck run's dumps (written only on a failure)."""
    return os.path.join(tempfile.gettempdir(), f"gpucheck-fr-{os.getuid()}")


def private_folder(path: str) -> str:
    """Make `path` (0700), or accept it only as a real directory of this user's that no
    one else can write; UnsafeFolder says what is wrong."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    info = os.lstat(path)  # lstat: a symlink is refused, never followed
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise UnsafeFolder(f"{path} is not a directory (a link or a file): remove it")
    why = others_may_write(info) or (None if info.st_uid == os.geteuid() else
                                     f"belongs to uid {info.st_uid}")
    if why is not None:
        raise UnsafeFolder(f"{path} {why}: another user may have put files there; remove it")
    if stat.S_IMODE(info.st_mode) & 0o077:  # ours, closed to writers (older gpucheck: 0755)
        os.chmod(path, 0o700)
    return path


def arm(command: str, environ: MutableMapping[str, str] | None = None) -> str | None:
    """Set the Flight Recorder variables not set yet: the dump prefix, or None (the
    user's own, or an untrusted folder, said on stderr)."""
    env = os.environ if environ is None else environ
    if any(name in env for name in PREFIX_VARS):
        return None
    try:
        folder = private_folder(dump_folder())
    except (OSError, UnsafeFolder) as exc:
        print(f"gpucheck {command}: no Flight Recorder dumps for this run: {exc}",
              file=sys.stderr)
        return None
    # The same on every rank of one job: one prefix gathers the job's dumps.
    if "SLURM_JOB_ID" in env:
        job = f"slurm{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '0')}"
    else:
        run_id = env.get("TORCHELASTIC_RUN_ID") or env.get("MASTER_PORT")
        job = "".join(c for c in run_id if c.isalnum()) if run_id else str(os.getpid())
    prefix = os.path.join(folder, f"{command}_{job}_rank_")
    env.setdefault("TORCH_FR_BUFFER_SIZE", env.get("TORCH_NCCL_TRACE_BUFFER_SIZE",
                                                   BUFFER_ENTRIES))
    env["TORCH_FR_DUMP_TEMP_FILE"] = prefix
    return prefix


@contextlib.contextmanager
def armed(command: str) -> Iterator[str | None]:
    """`arm` for the block, the environment restored afterwards (`all` arms each anew)."""
    saved = dict(os.environ)
    try:
        yield arm(command)
    finally:
        for name in ARMED_VARS:
            if name in saved:
                os.environ[name] = saved[name]
            else:
                os.environ.pop(name, None)


def own_path(prefix: str, rank: int) -> str:
    """`<prefix>gpucheck_<rank>`: never the `<prefix><rank>` torch's watchdog writes."""
    return f"{prefix}{OWN_NAME}{rank}"


def dumper(backend: str) -> tuple[Callable[[], bytes] | None, str | None]:
    """(torch's function returning this backend's buffer, None), or (None, why not).
    Without stack traces: symbolising them can hold the GIL for seconds, unbounded."""
    name = DUMPERS.get(backend)
    if name is None:
        return None, f"torch keeps no Flight Recorder for the {backend} backend"
    import torch

    found = getattr(getattr(torch._C, "_distributed_c10d", None), name, None)
    if found is None:
        return None, (f"torch {torch.__version__} has no torch._C._distributed_c10d.{name} "
                      f"to dump the {backend} Flight Recorder with")
    return lambda: bytes(found(includeStackTraces=False)), None


def dump_after_failure(rank: int, backend: str,
                       wait_s: float = DUMP_WAIT_S) -> DumpOutcome | None:
    """After a failed collective, this rank's buffer to its own file (`own_path`): None
    when not armed, else the file written or why nothing was (never silent)."""
    prefix = next((os.environ[n] for n in PREFIX_VARS if os.environ.get(n)), None)
    if prefix is None:
        return None
    function, why = dumper(backend)
    if function is None:
        return DumpOutcome(skipped=why)
    data, error = _bounded(function, wait_s)
    if data is None:
        return DumpOutcome(skipped=error)
    path = own_path(prefix, rank)
    try:
        write_atomic(path, data, "the Flight Recorder dump", sync=False)
    except UsageError as exc:  # WriteError, or a folder another user could change
        return DumpOutcome(skipped=str(exc))
    return DumpOutcome(path=path)


def _bounded(function: Callable[[], bytes], wait_s: float) -> tuple[bytes | None, str | None]:
    """Call `function` in a daemon thread: (its bytes, None), or (None, why not)."""
    result: dict[str, object] = {}

    def call() -> None:
        try:
            result["data"] = function()
        except Exception as exc:  # torch's own error: reported, not raised over the failure
            result["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"

    worker = threading.Thread(target=call, name="gpucheck-fr-dump", daemon=True)
    worker.start()
    worker.join(wait_s)
    if "data" in result and isinstance(result["data"], bytes):
        return result["data"], None
    if "error" in result:
        return None, f"the Flight Recorder dump failed: {result['error']}"
    if worker.is_alive():
        return None, f"the Flight Recorder dump did not return within {wait_s:g} s"
    return None, "the Flight Recorder dump returned no bytes"
