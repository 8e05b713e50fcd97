"""torch's Flight Recorder armed for bench and comm, and this rank's own dump after a
failed collective (`<prefix>gpucheck_<rank>`, never torch's file), taken before the
roll call and any abort so the stuck op still reads started (docs/hang.md)."""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass

from gpucheck.errors import UsageError
from gpucheck.output import others_may_write, write_atomic

BUFFER_ENTRIES = "2000"
ARMED_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE")
PREFIX_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
# torch._C._distributed_c10d's function returning a backend's buffer as pickle bytes
# (torch 2.14: `_dump_fr_trace` for every backend but NCCL, `_dump_nccl_trace` for
# NCCL, which adds the communicators' state).
DUMPERS = {"gloo": "_dump_fr_trace", "nccl": "_dump_nccl_trace"}
# A dump on NCCL queries the ops' CUDA events; on a GPU that hangs that may not
# return, and the rank still has its roll call to answer (the window counts this).
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
    """Make `path` (mode 0700) or accept it only as a real directory of this user's
    that no one else can write (then made 0700): never through a symlink, never one
    another user made first. UnsafeFolder says what is wrong and what to do."""
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
    """Set the Flight Recorder variables not set yet; the dump prefix, or None when the
    user chose their own or the default folder cannot be trusted (said on stderr)."""
    env = os.environ if environ is None else environ
    if any(name in env for name in PREFIX_VARS):
        return None
    try:
        folder = private_folder(dump_folder())
    except (OSError, UnsafeFolder) as exc:
        print(f"gpucheck {command}: no Flight Recorder dumps for this run: {exc}",
              file=sys.stderr)
        return None
    prefix = os.path.join(folder, f"{command}_{_job_id(env)}_rank_")
    env.setdefault("TORCH_FR_BUFFER_SIZE", env.get("TORCH_NCCL_TRACE_BUFFER_SIZE",
                                                   BUFFER_ENTRIES))
    env["TORCH_FR_DUMP_TEMP_FILE"] = prefix
    return prefix


@contextlib.contextmanager
def armed(command: str) -> Iterator[str | None]:
    """`arm` for the block, this process's environment restored afterwards (a second
    command in the same process, as `gpucheck all` runs them, arms itself anew)."""
    saved = dict(os.environ)
    try:
        yield arm(command)
    finally:
        for name in ARMED_VARS:
            if name in saved:
                os.environ[name] = saved[name]
            else:
                os.environ.pop(name, None)


def _job_id(env: MutableMapping[str, str]) -> str:
    """The same for every rank of one job (each rank is its own process under torchrun
    or srun), so one prefix gathers the job's dumps."""
    if "SLURM_JOB_ID" in env:
        return f"slurm{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '0')}"
    run_id = env.get("TORCHELASTIC_RUN_ID") or env.get("MASTER_PORT")
    return "".join(c for c in run_id if c.isalnum()) if run_id else str(os.getpid())


def dump_prefix(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Where this job's dumps go (`<prefix><rank>`), or None when not armed."""
    env = os.environ if environ is None else environ
    return next((env[name] for name in PREFIX_VARS if env.get(name)), None)


def own_path(prefix: str, rank: int) -> str:
    """gpucheck's dump of `rank`: `<prefix>gpucheck_<rank>`, a prefix of its own, so it
    never replaces the `<prefix><rank>` torch's watchdog writes, and `gpucheck hang
    --traces DIR --prefix <prefix>gpucheck_` reads gpucheck's dumps together."""
    return f"{prefix}{OWN_NAME}{rank}"


def dumper(backend: str) -> tuple[Callable[[], bytes] | None, str | None]:
    """(torch's function that returns this backend's buffer, None), or (None, why not):
    a backend without a recorder, or a torch that lacks the function. Called without
    stack traces: symbolising them can hold the GIL inside torch for seconds, which
    no join could bound."""
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
    """After a failed collective: write this rank's Flight Recorder buffer to its own
    file (`own_path`). None when the job is not armed; otherwise what
    was written, or why nothing was (a missing torch function, a dump that did not
    come back within `wait_s`, an unwritable folder): never silent."""
    prefix = dump_prefix()
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
