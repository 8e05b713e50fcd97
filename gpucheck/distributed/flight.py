"""gpucheck's own jobs (bench, comm, stress) run with torch's Flight Recorder armed, so
a hang leaves evidence that `gpucheck hang --traces DIR` reads (docs/hang.md).

The variables are set only where the user has not set them, before any process
group exists (the ranks gpucheck starts inherit them; under torchrun or srun the
process sets them for itself before it joins):
- TORCH_FR_BUFFER_SIZE: entries kept per rank (torch 2.15 keeps 2000 by default;
  older releases recorded nothing unless TORCH_NCCL_TRACE_BUFFER_SIZE was set);
- TORCH_FR_DUMP_TEMP_FILE (older: TORCH_NCCL_DEBUG_INFO_TEMP_FILE): the dump's
  path prefix, the rank is appended;
- TORCH_NCCL_DUMP_ON_TIMEOUT=1: NCCL's watchdog dumps when a collective times out.
gloo has no watchdog that dumps, so a rank whose gloo collective fails dumps itself
(`dump_after_failure`, from the process-group frame).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, MutableMapping

BUFFER_ENTRIES = "2000"
ARMED_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE")


def dump_folder() -> str:
    """One folder per user for every gpucheck run's dumps (written only on a failure)."""
    return os.path.join(tempfile.gettempdir(), f"gpucheck-fr-{os.getuid()}")


def arm(command: str, environ: MutableMapping[str, str] | None = None) -> str | None:
    """Set the Flight Recorder variables not set yet; the dump prefix, or None when the
    user chose their own."""
    env = os.environ if environ is None else environ
    if "TORCH_FR_DUMP_TEMP_FILE" in env or "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" in env:
        return None
    folder = dump_folder()
    with contextlib.suppress(OSError):
        os.makedirs(folder, exist_ok=True)
    prefix = os.path.join(folder, f"{command}_{_job_id(env)}_rank_")
    env.setdefault("TORCH_FR_BUFFER_SIZE", env.get("TORCH_NCCL_TRACE_BUFFER_SIZE",
                                                   BUFFER_ENTRIES))
    env.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
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


def dump_after_failure(rank: int, backend: str) -> None:
    """After a failed gloo collective: write this rank's Flight Recorder buffer to
    `<TORCH_FR_DUMP_TEMP_FILE><rank>` (NCCL's watchdog does it for NCCL). Best effort:
    an older torch without the binding, or an unwritable folder, changes nothing."""
    if backend != "gloo" or "TORCH_FR_DUMP_TEMP_FILE" not in os.environ:
        return
    with contextlib.suppress(Exception):
        import torch

        torch._C._distributed_c10d._dump_fr_trace_file(rank)
