"""The live verdict: which rank(s) the others wait for, and what they are doing.

A collective finishes only when every rank of its group has entered it, so ranks
pinned in one collective call wait for the ranks that are not there. Those are
named, each with what it was doing: dead (no process), stopped (SIGSTOP, a debugger),
in uninterruptible sleep (D state: a driver or file-system call that never
returns), in another collective than the others (a desync), or in its own code
(function at file:line). The waited-on site is the one most waiting ranks share;
a split with no majority names no culprit. When no rank is pinned, the job
progresses. Window limits: a job whose steps take longer than the window looks
pinned; `--window` longer than one step decides (docs/hang.md).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from gpucheck.hang.observe import RankView
from gpucheck.hang.sites import Site

STOPPED = ("stopped", "tracing-stop")
# NCCL's kernels poll for their peers: a GPU waiting in one reads near 100 % SM
# utilisation (nvidia-smi pmon's "sm"); a rank that launched nothing reads near 0.
BUSY_PCT = 90.0
IDLE_PCT = 10.0
DEAD = ("exited", "zombie", "dead")
D_STATE = "disk-sleep"


@dataclass(frozen=True)
class Culprit:
    rank: int
    host: str
    what: str  # "stopped", "dead", ...: stable words for the data table
    detail: str  # one sentence


def label(view: RankView) -> str:
    pid = f", pid {view.pid}" if view.pid else ""
    return f"rank {view.rank} ({view.host}{pid})"


def _gpu_words(view: RankView) -> str:
    gpu = view.gpu or {}
    if gpu.get("gpu_sm_util_pct") is None:
        return ""
    return f"; its GPU {gpu['gpu']} at {gpu['gpu_sm_util_pct']:.0f} % SM utilisation"


def describe(view: RankView, waited: Site | None) -> tuple[str, str]:
    """(what, detail) of a rank that is not where the others wait."""
    if view.state in DEAD or view.pid is None:
        how = ("its process is gone" if view.pid else
               "no process has this rank on this node although the launcher started it")
        return "dead", f"dead: {how}"
    if view.state in STOPPED or view.state_start in STOPPED:
        return "stopped", (f"stopped (state {view.state}: SIGSTOP, Ctrl-Z or a debugger) "
                           f"{_at(view)}")
    if view.state == D_STATE and view.state_start == D_STATE:
        return "d-state", ("in uninterruptible sleep (D state) for the whole window: a "
                           f"driver or file-system call that does not return {_at(view)}")
    site = view.where
    if site is None:
        return "unreadable", ("not in the collective; its stack could not be read "
                              f"({view.stack_error})")
    if site.kind == "collective" and waited is not None and site != waited:
        return "other-collective", (f"in a different collective: {site.op} called from "
                                    f"{site.where}, while the others wait in {waited.op} "
                                    f"called from {waited.where}")
    cpu = f"{view.cpu_pct:.0f} % CPU" if view.cpu_pct is not None else "CPU n/a"
    return "user-code", (f"stuck in user code: {site.where} ({cpu}{_gpu_words(view)}) "
                         "and never entered the collective")


def _at(view: RankView) -> str:
    site = view.where
    return f"({site.describe()})" if site else ""


def waited_site(views: list[RankView]) -> tuple[Site | None, list[RankView]]:
    """The collective site most pinned ranks share, and those ranks; (None, []) when
    none is pinned or pinned ranks split evenly between sites (no majority)."""
    pinned = [v for v in views if v.pinned and v.state not in STOPPED + DEAD and v.where]
    counts = Counter(v.where for v in pinned)
    if not counts:
        return None, []
    ranked = counts.most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return None, pinned
    site = ranked[0][0]
    return site, [v for v in pinned if v.where == site]


def _sm_util(view: RankView) -> float | None:
    return (view.gpu or {}).get("gpu_sm_util_pct")


def gpu_waiting(views: list[RankView]) -> list[Culprit]:
    """NCCL: `all_reduce` returns once its kernel is queued, so a waiting rank's Python
    stack is at its next synchronisation in user code (`loss.item()`), while NCCL's
    kernel polls for the missing peer and keeps the GPU busy. Ranks steady at one site
    with a busy GPU (BUSY_PCT) are taken as waiting when they are a strict majority;
    the ranks named are the others whose GPU is idle (IDLE_PCT): stuck before
    launching their part. Without GPU figures, or with every rank busy (a long
    step), nobody is named."""
    busy = [v for v in views if v.steady and (_sm_util(v) or 0) >= BUSY_PCT and v.where]
    sites = Counter(v.where for v in busy if v.where is not None).most_common(1)
    if not sites or 2 * sites[0][1] <= len(views):
        return []
    site, count = sites[0]
    skip = {v.rank for v in busy} | {c.rank for c in stuck_anyway(views)}
    named = []
    for view in views:
        util = _sm_util(view)
        if view.rank in skip or util is None or util > IDLE_PCT or view.where is None:
            continue
        detail = (f"idle on its GPU ({util:.0f} % SM) {view.where.describe()}, while "
                  f"{count} ranks' GPUs are busy (an NCCL kernel waiting for a peer) with "
                  f"their Python at {site.where}")
        named.append(Culprit(view.rank, view.host, "user-code", detail))
    return named


def culprits(views: list[RankView]) -> tuple[Site | None, list[Culprit]]:
    """The site the others wait at and the ranks they wait for."""
    site, waiting = waited_site(views)
    if site is None and not waiting:
        named = gpu_waiting(views)
        if named:
            return None, named + stuck_anyway(views)
    waiting_ranks = {v.rank for v in waiting}
    named = []
    for view in views:
        if view.rank in waiting_ranks:
            continue
        what, detail = describe(view, site)
        if what == "user-code" and _arrived(view, site):
            continue
        # A dead or stopped rank stops the job whether or not the others have reached
        # their collective yet; a D state is often a short I/O wait, so it is named
        # only when the others are seen waiting.
        if site is not None or what in ("dead", "stopped"):
            named.append(Culprit(view.rank, view.host, what, detail))
    return site, named


def _arrived(view: RankView, waited: Site | None) -> bool:
    """Seen inside the collective the others wait in, though most samples were in its own
    code: it came in during the window (the others had been waiting since before it),
    so it is no rank that "never entered the collective"."""
    return waited is not None and any(Site(**seen) == waited for seen in view.collectives_seen)


def stuck_anyway(views: list[RankView]) -> list[Culprit]:
    """Dead and stopped ranks: named whatever the others do."""
    named = []
    for view in views:
        what, detail = describe(view, None)
        if what in ("dead", "stopped"):
            named.append(Culprit(view.rank, view.host, what, detail))
    return named
