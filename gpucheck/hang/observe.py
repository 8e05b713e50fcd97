"""Watch every rank for one short window, all at once: py-spy stack samples (never
pausing a rank), where each stack is (a collective or the job's own code), process
state, CPU and its GPU as NVML sees it (docs/hang.md, "What it looks at")."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from gpucheck.hang.procs import RankProcess
from gpucheck.probes.nvml import Nvml, NvmlFailure

DEFAULT_WINDOW_S = 2.0
MAX_FRAMES = 12
MAX_PY_SPY = 16  # py-spy processes at once (each samples one rank at 50 Hz)
MAX_THREADS = 512  # ranks watched at once (most only wait out the window)
START_BUDGET_S = 4.0  # a rank not started by then is not watched
NOT_WATCHED = "not watched"  # stack_error kind of a rank whose turn never came
RECORD_RATE_HZ = 50
# py-spy writes its raw file after the window; later than this it is stuck, not slow.
RECORD_GRACE_S = 3.0
MAX_RAW_BYTES = 8 << 20  # a target's own stacks must not fill gpucheck's memory
PTRACE_CAPABILITY = ("the capability to read other processes' memory: run as the job's "
                     "user or root with CAP_SYS_PTRACE (docker run --cap-add SYS_PTRACE; "
                     "Kubernetes securityContext.capabilities.add: [SYS_PTRACE]) and "
                     "kernel.yama.ptrace_scope at most 1 (sysctl kernel.yama.ptrace_scope)")
C10D = "torch/distributed/distributed_c10d.py"
TORCH_DISTRIBUTED = "torch/distributed/"
_LIBRARY_MARKS = ("/site-packages/", "/dist-packages/", "<frozen ")
_STDLIB = sysconfig.get_paths().get("stdlib", "") or ""
# Another interpreter's standard library (the target may run another Python).
_ANY_STDLIB = re.compile(r"/lib/python3\.\d+/[^/]+\.py$|/lib/python3\.\d+/(?!site-)[a-z_]+/")
# A thread's name is the target's own text; py-spy 0.4 writes none for a thread started
# without `threading`: `thread (TID);<module> (<string>:1) 49`.
_RAW_LINE = re.compile(r"thread \((?P<tid>0x[0-9a-fA-F]{1,16}|\d{1,19})\)(?:: [^;]*)?"
                       r"(?:;(?P<frames>.*))? (?P<count>\d{1,9})")


@dataclass(frozen=True)
class Frame:
    function: str
    file: str  # as py-spy gives it (dump: full path; record: package-relative)
    line: int

    @property
    def where(self) -> str:
        """`function at file:line`, an installed package's file from its package folder."""
        file = self.file
        for mark in ("/site-packages/", "/dist-packages/"):
            if mark in file:
                file = file.split(mark, 1)[1]
        return f"{self.function} at {file}:{self.line}"


@dataclass(frozen=True)
class Site:
    """kind: collective or user (or unknown: no Python frame at all)."""

    kind: str
    op: str | None  # the collective (all_reduce), for kind collective
    where: str  # "function at file:line": the call site, or the user frame
    innermost: str  # the innermost frame, as seen

    def describe(self) -> str:
        if self.kind == "collective":
            return f"in {self.op} called from {self.where}"
        if self.kind == "user":
            return f"in user code: {self.where}" + (
                f" (innermost: {self.innermost})" if self.innermost != self.where else "")
        return "no Python frame (in native code or between frames)"


class StackError(Exception):
    """py-spy could not read the stack: `kind` is denied, gone, timeout, missing or error."""

    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind
        self.detail = detail
        super().__init__(detail)


Samples = Counter[tuple[int, tuple[Frame, ...]]]  # (thread id, stack innermost first)


def py_spy_path() -> str | None:
    """py-spy on PATH, else beside this Python (a venv's bin/ not on PATH)."""
    beside = Path(sys.executable).parent / "py-spy"
    return shutil.which("py-spy") or (str(beside) if beside.exists() else None)


def _run(args: list[str], timeout_s: float) -> str:
    exe = py_spy_path()
    if exe is None:
        raise StackError("missing", "py-spy is not installed (pip install py-spy)")
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise StackError("timeout", f"py-spy gave no stack within {timeout_s:g} s") from None
    except OSError as exc:
        raise StackError("error", f"cannot run py-spy: {exc}") from None
    if done.returncode == 0:
        return done.stdout
    # "Permission Denied" when ptrace is refused; "(os error 13)" when even
    # /proc/PID/exe is closed to us.
    text = (done.stdout + done.stderr).strip()
    if "Permission Denied" in text or "os error 13" in text or "os error 1)" in text:
        raise StackError("denied", "no permission to read the process's stack: needs "
                         + PTRACE_CAPABILITY)
    if "os error 2" in text or "os error 3)" in text or "No such process" in text:
        raise StackError("gone", "the process exited")
    first = next((line for line in text.splitlines() if line.strip()), "py-spy failed")
    raise StackError("error", first[:300])


def record(pid: int, duration_s: float, rate_hz: int = RECORD_RATE_HZ) -> Samples:
    """How often each thread's stack was seen, idle threads included (a rank waiting
    in a collective is idle, and that is what matters here)."""
    seconds = max(1, round(duration_s))  # py-spy takes whole seconds
    with tempfile.TemporaryDirectory(prefix="gpucheck-hang-") as tmp:
        out = os.path.join(tmp, "raw.txt")
        _run(["record", "--nonblocking", "--idle", "--threads", "--full-filenames",
              "--format", "raw", "--rate", str(rate_hz), "--duration", str(seconds),
              "--output", out, "--pid", str(pid)], seconds + RECORD_GRACE_S)
        if not os.path.exists(out):
            return Samples()
        with open(out, "rb") as handle:  # a cut file loses only its last, partial line
            return parse_raw(handle.read(MAX_RAW_BYTES).decode("utf-8", errors="replace"))


def parse_raw(text: str) -> Samples:
    """py-spy's raw format with --threads, one line per distinct stack:
    `thread (TID): NAME;outer (file:line);...;inner (file:line) COUNT`."""
    stacks: Samples = Counter()
    for line in text.splitlines():
        match = _RAW_LINE.fullmatch(line.rstrip())
        if match is None:
            continue
        frames = []
        for part in reversed((match["frames"] or "").split(";")):
            name, _, rest = part.rpartition(" (")
            file, _, number = rest.rstrip(")").rpartition(":")
            if name and number.isdigit():
                frames.append(Frame(name, file, int(number)))
        stacks[(int(match["tid"], 0), tuple(frames))] += int(match["count"])
    return stacks


def _is_library(file: str) -> bool:
    if any(mark in file for mark in _LIBRARY_MARKS):
        return True
    return (bool(_STDLIB) and file.startswith(_STDLIB)) or bool(_ANY_STDLIB.search(file))


def site_of(frames: tuple[Frame, ...]) -> Site:
    """The site of one stack (frames innermost first)."""
    if not frames:
        return Site("unknown", None, "no Python frame", "none")
    innermost = frames[0].where
    c10d = [i for i, f in enumerate(frames) if f.file.endswith(C10D)]
    if c10d:
        outer = c10d[-1]
        caller = next((f for f in frames[outer + 1:] if TORCH_DISTRIBUTED not in f.file),
                      frames[outer])
        return Site("collective", frames[outer].function, caller.where, innermost)
    user = next((f for f in frames if not _is_library(f.file)), frames[0])
    return Site("user", None, user.where, innermost)


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
    moved: bool | None = None  # at two sites or more (None, built by hand: not steady)
    samples: int = 0
    collectives_seen: list[dict[str, Any]] = field(default_factory=list)  # arriving?
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


def _main_thread(samples: Samples, pid: int) -> int | None:
    """The thread seen in a collective most, else the main thread, else the busiest."""
    in_c10d: Counter[int] = Counter()
    seen: Counter[int] = Counter()
    for (tid, frames), count in samples.items():
        seen[tid] += count
        if site_of(frames).kind == "collective":
            in_c10d[tid] += count
    if in_c10d:
        return in_c10d.most_common(1)[0][0]
    return pid if pid in seen else (seen.most_common(1)[0][0] if seen else None)


def _judge_samples(view: RankView, samples: Samples) -> None:
    tid = _main_thread(samples, view.pid or 0)
    sites: Counter[Site] = Counter()
    stack_at: dict[Site, tuple[Frame, ...]] = {}
    for (thread, frames), count in samples.items():
        if thread == tid:
            site = site_of(frames)
            sites[site] += count
            stack_at.setdefault(site, frames)
    if not sites:  # nothing is known: a rank with no sample never counts as moved
        view.stack_error = "empty: py-spy recorded no sample of this process"
        return
    site, count = sites.most_common(1)[0]
    view.samples = sum(sites.values())
    view.site, view.site_share = asdict(site), count / view.samples
    # --nonblocking reads can catch a thread between frames: such a sample says nothing.
    known = [s for s in sites if s.kind != "unknown"]
    view.steady = len(known) == 1
    view.moved = len(known) > 1
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
    if not turns.acquire():  # its process state only (a stopped or dead rank is seen)
        try:
            view.state = view.state_start = _status(psutil.Process(view.pid or 0))
        except psutil.Error:
            view.state = view.state_start = "exited"
        view.watched = False
        view.stack_error = (f"{NOT_WATCHED}: more rank processes on this node than "
                            f"{MAX_PY_SPY} py-spy at a time could watch within "
                            f"{START_BUDGET_S:g} s of the start")
        return view
    try:
        proc = psutil.Process(rank.pid)
        view.state_start = _status(proc)
        cpu0, t0 = _cpu_seconds(proc), time.monotonic()
    except psutil.Error:
        turns.slots.release()
        view.state = view.state_start = "exited"
        return view
    try:
        _judge_samples(view, record(rank.pid, window_s))
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


def _gpu_after(pids: list[int], window_s: float,
               nvml_timeout_s: float) -> tuple[dict[int, dict[str, Any]], str | None]:
    """NVML's per-process figures over the window just watched."""
    time.sleep(window_s)
    return per_process(pids, nvml_timeout_s, window_s)


def watch(ranks: list[RankProcess], host: str, window_s: float = DEFAULT_WINDOW_S,
          nvml_timeout_s: float = 3.0) -> tuple[list[RankView], str | None]:
    """(views in the order given, why no GPU data): ranks watched in that order."""
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
    missing), utilisation over the last `window_s`. A GPU NVML fails on is asked once
    more, then left out with its reason."""
    wanted = set(pids)
    since_us = max(0, int((time.time() - window_s) * 1e6))
    nvml = Nvml(timeout_s=timeout_s)
    found: dict[int, dict[str, Any]] = {}
    failed: list[str] = []
    try:
        for index in range(nvml.call("nvmlDeviceGetCount")):
            for attempt in range(2):  # a changing process list: asked again
                try:
                    handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
                    found.update(_gpu_processes(nvml, handle, index, wanted, since_us))
                    break
                except NvmlFailure as exc:
                    if attempt:
                        failed.append(f"GPU {index}: {exc.meaning}")
    except NvmlFailure as exc:
        return {}, f"NVML: {exc.meaning}"
    finally:
        nvml.shutdown()
    if failed:
        return found, "NVML: " + "; ".join(failed)
    return found, None if found else "NVML lists none of these PIDs on any GPU"


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
                  # NVML keeps samples only of processes with non-zero utilisation.
                  "gpu_sm_util_pct": None if util is None else util.get(pid, 0.0)}
            for pid, p in mine.items()}


def _sm_util(nvml: Nvml, handle: Any, since_us: int) -> dict[int, float] | None:
    """Mean SM utilisation per PID over NVML's samples after `since_us`; {} when NVML
    raises NotFound (every process idle), None when the figure is not to be had."""
    try:
        samples = nvml.call("nvmlDeviceGetProcessUtilization", handle, since_us)
    except NvmlFailure as exc:
        return {} if exc.kind == "NVMLError_NotFound" else None
    by_pid: dict[int, list[int]] = defaultdict(list)
    for sample in samples or []:
        if getattr(sample, "timeStamp", since_us + 1) > since_us:
            by_pid[sample.pid].append(sample.smUtil)
    return {pid: sum(v) / len(v) for pid, v in by_pid.items()}
