"""Helpers for tests that run gpucheck as real processes (own session, bounded time)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's rank variables, plus `extra`."""
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
            "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE", "SLURM_PROCID",
            "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(PYTHONPATH=str(ROOT), NO_COLOR="1", OMP_NUM_THREADS="1", **extra)
    return env


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """Start a process in its own session (so the whole tree can be signalled)."""
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def gpucheck(*args: str) -> list[str]:
    return [PYTHON, "-m", "gpucheck", *args]


def descendants(proc: subprocess.Popen[str]) -> list[psutil.Process]:
    try:
        return psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def alive(pids: list[int]) -> list[int]:
    """Pids still running (zombies waiting for a reaper count as gone)."""
    left = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.append(pid)
    return left


def wait_gone(pids: list[int], within_s: float = 10) -> list[int]:
    deadline = time.monotonic() + within_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive(pids)


def kill_tree(procs: list[subprocess.Popen[str]], extra: list[int]) -> None:
    """Last resort in a finally: SIGKILL each session and any pid seen."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    for pid in extra:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def wait_for_file(path: Path, within_s: float, proc: subprocess.Popen[str] | None = None,
                  ) -> Any:
    """The JSON in `path` once it exists (None if the process ended first)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if path.exists():
            with contextlib.suppress(ValueError):
                return json.loads(path.read_text())
        if proc is not None and proc.poll() is not None:
            return None
        time.sleep(0.05)
    return None


@contextlib.contextmanager
def tracked(procs: list[subprocess.Popen[str]]) -> Iterator[list[int]]:
    """Yield a list to append worker pids to; SIGKILL everything left on the way out."""
    seen: list[int] = []
    try:
        yield seen
    finally:
        for proc in procs:
            seen.extend(p.pid for p in descendants(proc))
        kill_tree(procs, seen)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=5)
