"""Findings and sections of `gpucheck hang`: the verdict first, then each rank.

Check ids (actions in gpucheck/actions.py, meanings in docs/hang.md):
hang.rank.<what> (a rank the others wait for: dead, stopped, d_state, desync,
user_code, unreadable), hang.verdict (nobody to blame: progressing, or every rank
waiting), hang.stack (a stack py-spy could not read), hang.discovery, and
hang.traces.<what> for Flight Recorder dumps (missing, desync, no_dump, split, agree,
armed).
"""

from __future__ import annotations

from typing import Any

from gpucheck.hang.observe import RankView
from gpucheck.hang.sites import Site
from gpucheck.hang.stacks import PTRACE_CAPABILITY
from gpucheck.hang.verdict import Culprit, culprits, label, stuck_anyway
from gpucheck.report import Finding, Section, fail, ok, skip, warn

ARM = ("export TORCH_FR_BUFFER_SIZE=2000 TORCH_FR_DUMP_TEMP_FILE=/shared/fr/$JOB/rank_ "
       "TORCH_NCCL_DUMP_ON_TIMEOUT=1 before the job starts (docs/hang.md, 'Arming a job')")
_HINTS = {
    "dead": "read this rank's own log for its last error (OOM killer: dmesg); the job "
            "must be restarted: the others will wait until their timeout",
    "stopped": "resume it (kill -CONT PID) or detach the debugger; a stop you did not "
               "ask for: look for a job-control or checkpoint tool",
    "d-state": "a driver or file-system call that never returns: dmesg for Xid or I/O "
               "errors, the kernel stack in /proc/PID/stack; the node needs a look",
    "other-collective": "the ranks call collectives in different orders: a branch on "
                        "the rank or on data; fix the program (TORCH_DISTRIBUTED_DEBUG="
                        "DETAIL checks collective order on every call)",
    "user-code": "the rank never reaches the collective: read its code at that line "
                 "(a loop, a lock, I/O or a data loader that does not return)",
    "unreadable": "its stack could not be read: " + PTRACE_CAPABILITY,
}
_CHECK = {"dead": "dead", "stopped": "stopped", "d-state": "d_state",
          "other-collective": "desync", "user-code": "user_code", "unreadable": "unreadable"}


def culprit_finding(culprit: Culprit, view: RankView, multi_node: bool = False) -> Finding:
    # Spelled out where the actions differ (gpucheck/actions.py reads these ids).
    check = f"hang.rank.{_CHECK[culprit.what]}"
    if culprit.what == "d-state":
        check = "hang.rank.d_state"
    elif culprit.what == "unreadable":
        check = "hang.rank.unreadable"
    return fail(check, f"{label(view)} {culprit.detail}",
                hint=_HINTS[culprit.what], subject=_subject(view, multi_node))


def _subject(view: RankView, multi_node: bool) -> str:
    where = f"node {view.node_rank} ({view.host})" if multi_node else view.host
    return f"rank {view.rank} on {where}"


def live_findings(views: list[RankView], window_s: float, multi_node: bool) -> list[Finding]:
    """The verdict on one job's ranks (every node's, when gathered)."""
    by_rank = {v.rank: v for v in views}
    if views and all(v.stack_error and v.stack_error.startswith("denied") for v in views):
        return [skip("hang.verdict", "no rank's stack could be read: needs "
                     + PTRACE_CAPABILITY)]
    if views and all(v.stack_error or v.pid is None for v in views):
        reasons = sorted({v.stack_error for v in views if v.stack_error})
        return [skip("hang.verdict", "no rank's stack could be read, nothing to judge: "
                     + "; ".join(reasons))] + [
            culprit_finding(c, by_rank[c.rank], multi_node) for c in stuck_anyway(views)]
    site, named = culprits(views)
    if named:
        return [culprit_finding(c, by_rank[c.rank], multi_node) for c in named]
    # Every rank of the job seen (several nodes gathered, or a one-node job whole).
    whole = multi_node or len(by_rank) == views[0].world_size
    return [_nobody_named(views, site, window_s, whole)]


def _nobody_named(views: list[RankView], site: Site | None, window_s: float,
                  whole: bool) -> Finding:
    if site is not None:
        where = "every rank" if whole else "every rank on this node"
        return fail("hang.verdict", f"{where} waits in {site.op} called from {site.where} "
                    f"for the whole {window_s:g} s window",
                    hint=("every rank is inside the collective: it does not complete "
                          "(network, NCCL or a GPU): run gpucheck comm and read the faults"
                          if whole else "the rank they wait for is not on this node: run "
                          "gpucheck hang on every node at once (srun --ntasks-per-node 1, "
                          "docs/hang.md)"))
    pinned = [v for v in views if v.pinned]
    if pinned:
        sites = sorted({v.where.describe() for v in pinned if v.where})
        return warn("hang.verdict", f"ranks are pinned in {len(sites)} different "
                    f"collective calls with no majority: {'; '.join(sites)}",
                    hint="the ranks disagree on the order of collectives; read each rank's "
                    "stack below and the Flight Recorder dumps (--traces)")
    unread = [v.rank for v in views if v.stack_error]
    unread_words = (f"; rank(s) {', '.join(map(str, unread))} not read (below)"
                    if unread else "")
    return ok("hang.verdict", f"every rank progressed: none sat in one collective for "
              f"the whole {window_s:g} s window ({len(views)} ranks{unread_words})")


def stack_findings(views: list[RankView]) -> list[Finding]:
    """One SKIP per rank whose stack could not be read (the capability named)."""
    return [skip("hang.stack", f"{label(v)}: {v.stack_error}", subject=f"rank {v.rank}")
            for v in views if v.stack_error]


def rank_rows(views: list[RankView]) -> list[dict[str, Any]]:
    rows = []
    for v in views:
        site = v.where
        gpu = v.gpu or {}
        rows.append({
            "rank": v.rank, "local_rank": v.local_rank, "host": v.host, "pid": v.pid,
            "state": v.state, "cpu_pct": None if v.cpu_pct is None else round(v.cpu_pct, 1),
            "gpu": gpu.get("gpu"), "gpu_sm_util_pct": gpu.get("gpu_sm_util_pct"),
            "gpu_memory_bytes": gpu.get("gpu_memory_bytes"),
            "where": site.describe() if site else v.stack_error,
            "pinned": v.pinned, "samples": v.samples,
        })
    return rows


def ranks_section(job: str, views: list[RankView], window_s: float, multi_node: bool,
                  notes: list[str]) -> Section:
    data: dict[str, Any] = {"job": job, "window_s": window_s, "ranks": rank_rows(views),
                            "stacks": {f"rank {v.rank}": v.stack for v in views if v.stack}}
    if notes:
        data["notes"] = notes
    findings = live_findings(views, window_s, multi_node) + stack_findings(views)
    return Section("hang", f"Hang check: job {job}", data, findings)


def armed(views: list[RankView]) -> Finding:
    """Whether the job leaves Flight Recorder dumps, from its allowlisted variables."""
    prefixes = {v.env.get("TORCH_FR_DUMP_TEMP_FILE") or v.env.get(
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE") for v in views}
    prefixes.discard(None)
    if prefixes:
        return ok("hang.traces.armed", "the job is armed: Flight Recorder dumps go to "
                  f"{', '.join(sorted(p for p in prefixes if p))}<rank>; read them with "
                  "gpucheck hang --traces DIR")
    return skip("hang.traces.armed", "no Flight Recorder dumps will be written for this job: "
                f"next time, {ARM}")
