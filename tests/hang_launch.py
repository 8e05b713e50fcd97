"""Start a job of tests/hang_jobs.py (3 gloo ranks on 127.0.0.1), wait until every rank
is ready, and kill the whole job afterwards, whatever happened (tests, benchmarks)."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.comm_workers import clean_env, free_port

JOBS = Path(__file__).resolve().parent / "hang_jobs.py"
READY_TIMEOUT_S = 120.0


@dataclass
class Job:
    procs: list[subprocess.Popen[str]]  # the ranks, or torchrun alone
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    pids: list[int] = field(default_factory=list)  # rank PIDs, by rank


def wait_for(job: Job, word: str, count: int, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Until `count` lines start with `word` (e.g. every rank's "ready")."""
    seen, deadline = 0, time.monotonic() + timeout_s
    while seen < count:
        try:
            line = job.lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(f"only {seen} of {count} '{word}' lines") from None
        # Ranks under torchrun share one pipe: two "ready N" writes can land on one
        # line ("ready 1ready 2"), so count every occurrence.
        seen += line.count(word)


def _rank_env(rank: int, nodes: list[int], port: int, extra: dict[str, str]) -> dict[str, str]:
    """torchrun's variables for `rank` when rank r runs on node nodes[r]."""
    node = nodes[rank]
    local = [r for r in range(len(nodes)) if nodes[r] == node]
    return clean_env(RANK=str(rank), WORLD_SIZE=str(len(nodes)),
                     LOCAL_RANK=str(local.index(rank)), LOCAL_WORLD_SIZE=str(len(local)),
                     GROUP_RANK=str(node), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                     **extra)


@contextlib.contextmanager
def hang_job(mode: str, odd: int = 2, n: int = 3, torchrun: bool = False,
             nodes: list[int] | None = None, **extra: str) -> Iterator[Job]:
    """A running job, every rank ready; killed (SIGKILL, every process) on exit.
    `nodes`: the "node" of each rank (all on this machine; default: one node)."""
    job = Job([])
    port = free_port()
    if torchrun:
        runs = [([sys.executable, "-m", "torch.distributed.run", "--standalone",
                  "--nproc-per-node", str(n), str(JOBS), mode, str(odd)], clean_env(**extra))]
    else:
        runs = [([sys.executable, str(JOBS), mode, str(odd)],
                 _rank_env(r, nodes or [0] * n, port, extra)) for r in range(n)]
    try:
        for args, env in runs:
            proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            job.procs.append(proc)
            threading.Thread(target=lambda p=proc: [job.lines.put(line.strip())
                                                    for line in p.stdout or []],
                             daemon=True).start()
        wait_for(job, "ready", n)
        job.pids = _workers(job, torchrun)
        yield job
    finally:
        _kill(job)


def _workers(job: Job, torchrun: bool) -> list[int]:
    if not torchrun:
        return [p.pid for p in job.procs]
    ranks = {}
    for child in psutil.Process(job.procs[0].pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            env = child.environ()
            if "RANK" in env:
                ranks[int(env["RANK"])] = child.pid
    return [ranks[r] for r in sorted(ranks)]


def _kill(job: Job) -> None:
    """Every process of the job: the ranks' sessions, torchrun's workers, then reap."""
    pids = set(job.pids)
    for proc in job.procs:
        with contextlib.suppress(psutil.Error):
            pids.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
    for proc in job.procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    for proc in job.procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).wait(timeout=10)
