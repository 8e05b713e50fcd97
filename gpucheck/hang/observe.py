"""Watch every rank for a short window, all at once and within about two windows
whatever the node runs: stack samples, process state, CPU, and its GPU as NVML sees
it (docs/hang.md, "What it looks at")."""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from gpucheck.hang import stacks
from gpucheck.hang.procs import RankProcess
from gpucheck.hang.stacks import Frame, Site, StackError, site_of
from gpucheck.probes.nvml import Nvml, NvmlFailure

DEFAULT_WINDOW_S = 2.0
MAX_FRAMES = 12
MAX_PY_SPY = 16  # py-spy processes at once (each samples one rank at 50 Hz)
# Ranks being watched at once (a thread each; most of them only wait out the window,
# their py-spy done or failed fast, as on a process that is no Python at all).
MAX_THREADS = 512
START_BUDGET_S = 4.0  # a rank not started by then is not watched
NOT_WATCHED = "not watched"  # stack_error kind of a rank whose turn never came


@dataclass
class RankView:
    """What one rank was doing during the window (plain values: sent across nodes)."""

    rank: int
    local_rank: int
    world_size: int
    pid: int | None
    host: str
    node_rank: int = 0
    state: str = "unknown"  # psutil's status at the end: running, sleeping, stopped, ...
    state_start: str = "unknown"
    cpu_pct: float | None = None
    site: dict[str, Any] | None = None  # Site as a dict: the most frequent site
    pinned: bool = False  # every sample at that one collective site
    steady: bool = False  # every sample at that one site, whatever its kind
    moved: bool | None = None  # seen at two sites or more with Python frames (None: not
    # recorded, as in a view built by hand: then "sampled and not steady")
    samples: int = 0
    collectives_seen: list[dict[str, Any]] = field(default_factory=list)  # every collective
    # site of its samples, as dicts: one seen entering the waited collective is arriving
    site_share: float | None = None  # of the samples, the share at `site`
    stack: list[str] = field(default_factory=list)  # innermost first
    stack_error: str | None = None  # kind: detail
    gpu: dict[str, Any] | None = None
    env: dict[str, str] = field(default_factory=dict)  # allowlisted only
    watched: bool = True  # False: its turn for py-spy never came (NOT_WATCHED)

    @property
    def where(self) -> Site | None:
        return Site(**self.site) if self.site else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def _status(proc: psutil.Process) -> str:
    try:
        return str(proc.status())
    except psutil.NoSuchProcess:
        return "exited"
    except psutil.Error:
        return "unknown"


def _main_thread(samples: stacks.Samples, pid: int) -> int | None:
    """The thread that matters: one seen in a collective (the most often), else the
    main thread (its id is the PID), else the busiest."""
    in_c10d: Counter[int] = Counter()
    seen: Counter[int] = Counter()
    for (tid, frames), count in samples.items():
        seen[tid] += count
        if site_of(frames).kind == "collective":
            in_c10d[tid] += count
    if in_c10d:
        return in_c10d.most_common(1)[0][0]
    return pid if pid in seen else (seen.most_common(1)[0][0] if seen else None)


def _judge_samples(view: RankView, samples: stacks.Samples) -> None:
    tid = _main_thread(samples, view.pid or 0)
    sites: Counter[Site] = Counter()
    stack_at: dict[Site, tuple[Frame, ...]] = {}
    for (thread, frames), count in samples.items():
        if thread == tid:
            site = site_of(frames)
            sites[site] += count
            stack_at.setdefault(site, frames)
    if not sites:
        # py-spy ran and saw no thread at all: nothing is known of this rank, and a
        # rank with no sample must never count as one that moved.
        view.stack_error = "empty: py-spy recorded no sample of this process"
        return
    site, count = sites.most_common(1)[0]
    view.samples = sum(sites.values())
    view.site, view.site_share = asdict(site), count / view.samples
    # Pinned: every sample with a Python frame at one collective call (--nonblocking
    # reads can catch a thread between frames: such a sample says nothing).
    known = [s for s in sites if s.kind != "unknown"]
    view.steady = len(known) == 1
    view.moved = len(known) > 1  # samples with no Python frame say nothing of moving
    view.pinned = view.steady and known[0].kind == "collective"
    view.collectives_seen = [asdict(s) for s in sites if s.kind == "collective"]
    view.stack = [f.where for f in stack_at[site][:MAX_FRAMES]]


class _Turns:
    """Who may start a py-spy now: at most MAX_PY_SPY at once, none after the budget."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.slots = threading.BoundedSemaphore(MAX_PY_SPY)

    def acquire(self) -> bool:
        left = START_BUDGET_S - (time.monotonic() - self.start)
        return left > 0 and self.slots.acquire(timeout=left)


def watch_rank(rank: RankProcess, host: str, window_s: float,
               turns: _Turns | None = None) -> RankView:
    """Watch one rank for `window_s`; every failure becomes a field, never a raise."""
    view = RankView(rank.rank, rank.local_rank, rank.world_size, rank.pid, host,
                    env=dict(rank.env))
    turns = turns or _Turns()
    if not turns.acquire():
        return _not_watched(view)
    try:
        proc = psutil.Process(rank.pid)
        view.state_start = _status(proc)
        cpu0, t0 = _cpu_seconds(proc), time.monotonic()
    except psutil.Error:
        turns.slots.release()
        view.state = view.state_start = "exited"
        return view
    try:
        _judge_samples(view, stacks.record(rank.pid, window_s))
    except StackError as exc:
        view.stack_error = f"{exc.kind}: {exc.detail}"
    finally:
        turns.slots.release()
    time.sleep(max(0.0, window_s - (time.monotonic() - t0)))  # the state's window
    view.state = _status(proc)
    try:
        view.cpu_pct = 100.0 * (_cpu_seconds(proc) - cpu0) / max(time.monotonic() - t0, 1e-3)
    except psutil.Error:
        view.cpu_pct = None
    return view


def _not_watched(view: RankView) -> RankView:
    """Its process state only (a stopped or dead rank is still seen)."""
    try:
        view.state = view.state_start = _status(psutil.Process(view.pid or 0))
    except psutil.Error:
        view.state = view.state_start = "exited"
    view.watched = False
    view.stack_error = (f"{NOT_WATCHED}: more rank processes on this node than "
                        f"{MAX_PY_SPY} py-spy at a time could watch within "
                        f"{START_BUDGET_S:g} s of the start")
    return view


def _gpu_after(pids: list[int], window_s: float,
               nvml_timeout_s: float) -> tuple[dict[int, dict[str, Any]], str | None]:
    """NVML's per-process figures over the window just watched."""
    time.sleep(window_s)
    return per_process(pids, nvml_timeout_s, window_s)


def watch(ranks: list[RankProcess], host: str, window_s: float = DEFAULT_WINDOW_S,
          nvml_timeout_s: float = 3.0) -> tuple[list[RankView], str | None]:
    """Every rank at once, NVML beside them: (views in the order given, why no GPU
    data). Give the ranks in the order they should be watched when not all can be."""
    if not ranks:
        return [], None
    turns = _Turns()
    with ThreadPoolExecutor(max_workers=max(1, min(len(ranks), MAX_THREADS))) as pool, \
            ThreadPoolExecutor(max_workers=1) as nvml_pool:
        gpu_future = nvml_pool.submit(_gpu_after, [r.pid for r in ranks], window_s,
                                      nvml_timeout_s)
        views = list(pool.map(lambda r: watch_rank(r, host, window_s, turns), ranks))
        gpus, gpu_note = gpu_future.result()
    for view in views:
        view.gpu = gpus.get(view.pid or -1)
    return views, gpu_note


def per_process(pids: Iterable[int], timeout_s: float = 3.0,
                window_s: float = 2.0) -> tuple[dict[int, dict[str, Any]], str | None]:
    """({pid: {gpu, gpu_name, gpu_memory_bytes, gpu_sm_util_pct}}, why some or none are
    missing). Utilisation is over the last `window_s` seconds: call it at the end of the
    window. A GPU NVML fails on is asked once more, then left out with its reason: the
    other GPUs' ranks keep their view."""
    wanted = set(pids)
    since_us = max(0, int((time.time() - window_s) * 1e6))
    nvml = Nvml(timeout_s=timeout_s)
    found: dict[int, dict[str, Any]] = {}
    failed: list[str] = []
    try:
        for index in range(nvml.call("nvmlDeviceGetCount")):
            seen, why = _one_gpu(nvml, index, wanted, since_us)
            found.update(seen)
            failed += [f"GPU {index}: {why}"] if why else []
    except NvmlFailure as exc:
        return {}, f"NVML: {exc.meaning}"
    finally:
        nvml.shutdown()
    if failed:
        return found, "NVML: " + "; ".join(failed)
    return found, None if found else "NVML lists none of these PIDs on any GPU"


def _one_gpu(nvml: Nvml, index: int, wanted: set[int],
             since_us: int) -> tuple[dict[int, dict[str, Any]], str | None]:
    """One GPU's ranks, asked twice (as gpu_read asks a changing process list again):
    (its ranks, None), or ({}, NVML's reason)."""
    why = None
    for _ in range(2):
        try:
            handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
            return _gpu_processes(nvml, handle, index, wanted, since_us), None
        except NvmlFailure as exc:
            why = exc.meaning
    return {}, why


def _gpu_processes(nvml: Nvml, handle: Any, index: int, wanted: set[int],
                   since_us: int) -> dict[int, dict[str, Any]]:
    procs = nvml.get("nvmlDeviceGetComputeRunningProcesses", handle, default=[]) or []
    mine = {p.pid: p for p in procs if p.pid in wanted}
    if not mine:
        return {}
    name = nvml.get("nvmlDeviceGetName", handle)
    util = _sm_util(nvml, handle, since_us)
    return {pid: {"gpu": index, "gpu_name": name,
                  "gpu_memory_bytes": getattr(p, "usedGpuMemory", None),
                  # Listed on the GPU with no sample since `since_us`: NVML keeps samples
                  # only of processes with non-zero utilisation, so this one was at 0 %.
                  "gpu_sm_util_pct": None if util is None else util.get(pid, 0.0)}
            for pid, p in mine.items()}


def _sm_util(nvml: Nvml, handle: Any, since_us: int) -> dict[int, float] | None:
    """Mean SM utilisation per PID over the samples NVML took after `since_us` (CPU
    time, microseconds: lastSeenTimeStamp), so a busy phase before the hang does not
    count. NVML returns a sample only for a process with non-zero utilisation and
    raises NotFound when no process has one (every process idle): {} then. None when
    the figure is not to be had (NotSupported, NoPermission, a timeout)."""
    try:
        samples = nvml.call("nvmlDeviceGetProcessUtilization", handle, since_us)
    except NvmlFailure as exc:
        return {} if exc.kind == "NVMLError_NotFound" else None
    by_pid: dict[int, list[int]] = defaultdict(list)
    for sample in samples or []:
        if getattr(sample, "timeStamp", since_us + 1) > since_us:
            by_pid[sample.pid].append(sample.smUtil)
    return {pid: sum(v) / len(v) for pid, v in by_pid.items()}
