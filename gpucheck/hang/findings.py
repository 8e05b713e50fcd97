"""`gpucheck hang`'s verdicts: live, the ranks the others wait for and what they do; from
Flight Recorder dumps, a vote at each sequence number (checks: docs/hang.md)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpucheck import subject as subjects
from gpucheck.errors import UsageError
from gpucheck.hang.observe import PTRACE_CAPABILITY, RankView, Site
from gpucheck.hang.traces import MISSING, Call, GroupTrace, dump_files, groups, load
from gpucheck.report import Finding, Section, fail, ok, skip, warn

STOPPED = ("stopped", "tracing-stop")
# NCCL's kernels poll for their peers: near 100 % SM; a rank that launched nothing: 0.
BUSY_PCT = 90.0
IDLE_PCT = 10.0
DEAD = ("exited", "zombie", "dead")
D_STATE = "disk-sleep"


@dataclass(frozen=True)
class Culprit:
    rank: int
    host: str
    what: str  # the check's last word: "stopped", "dead", "d_state", ...
    detail: str  # one sentence


def label(view: RankView) -> str:
    pid = f", pid {view.pid}" if view.pid else ""
    return f"rank {view.rank} ({view.host}{pid})"


def describe(view: RankView, waited: Site | None) -> tuple[str, str]:
    """(what, detail) of a rank that is not where the others wait."""
    if view.state in DEAD or view.pid is None:
        how = ("its process is gone" if view.pid else
               "no process has this rank on this node although the launcher started it")
        return "dead", f"dead: {how}"
    site = view.where
    at = f"({site.describe()})" if site else ""
    if view.state in STOPPED or view.state_start in STOPPED:
        return "stopped", (f"stopped (state {view.state}: SIGSTOP, Ctrl-Z or a debugger) "
                           f"{at}")
    if view.state == D_STATE and view.state_start == D_STATE:
        return "d_state", ("in uninterruptible sleep (D state) for the whole window: a "
                           f"driver or file-system call that does not return {at}")
    if site is None:
        return "unreadable", ("not in the collective; its stack could not be read "
                              f"({view.stack_error})")
    if site.kind == "collective" and waited is not None and site != waited:
        return "desync", (f"in a different collective: {site.op} called from "
                                    f"{site.where}, while the others wait in {waited.op} "
                                    f"called from {waited.where}")
    cpu = f"{view.cpu_pct:.0f} % CPU" if view.cpu_pct is not None else "CPU n/a"
    gpu = view.gpu or {}
    if gpu.get("gpu_sm_util_pct") is not None:
        cpu += f"; its GPU {gpu['gpu']} at {gpu['gpu_sm_util_pct']:.0f} % SM utilisation"
    return "user_code", (f"stuck in user code: {site.where} ({cpu}) "
                         "and never entered the collective")


def waited_site(views: list[RankView]) -> tuple[Site | None, list[RankView]]:
    """The collective site most pinned ranks share, and those ranks; None with no
    majority."""
    pinned = [v for v in views if v.pinned and v.state not in STOPPED + DEAD and v.where]
    counts = Counter(v.where for v in pinned)
    if not counts:
        return None, []
    ranked = counts.most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return None, pinned
    site = ranked[0][0]
    return site, [v for v in pinned if v.where == site]


def gpu_waiting(views: list[RankView]) -> list[Culprit]:
    """NCCL: a strict majority steady at one site with a busy GPU waits (the Python
    stack is past the queued collective); the ranks named have an idle GPU."""
    busy = [v for v in views if v.steady and v.where
            and ((v.gpu or {}).get("gpu_sm_util_pct") or 0) >= BUSY_PCT]
    sites = Counter(v.where for v in busy if v.where is not None).most_common(1)
    if not sites or 2 * sites[0][1] <= len(views):
        return []
    site, count = sites[0]
    skip = {v.rank for v in busy} | {c.rank for c in stuck_anyway(views)}
    named = []
    for view in views:
        util = (view.gpu or {}).get("gpu_sm_util_pct")
        if view.rank in skip or util is None or util > IDLE_PCT or view.where is None:
            continue
        detail = (f"idle on its GPU ({util:.0f} % SM) {view.where.describe()}, while "
                  f"{count} ranks' GPUs are busy (an NCCL kernel waiting for a peer) with "
                  f"their Python at {site.where}")
        named.append(Culprit(view.rank, view.host, "user_code", detail))
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
        # Seen inside the waited collective during the window: arriving, not stuck.
        if what == "user_code" and site is not None and any(
                Site(**seen) == site for seen in view.collectives_seen):
            continue
        # Dead or stopped stops the job anyway; a D state (often a short I/O wait) is
        # named only when the others are seen waiting.
        if site is not None or what in ("dead", "stopped"):
            named.append(Culprit(view.rank, view.host, what, detail))
    return site, named


def stuck_anyway(views: list[RankView]) -> list[Culprit]:
    """Dead and stopped ranks: named whatever the others do."""
    found = (Culprit(view.rank, view.host, *describe(view, None)) for view in views)
    return [c for c in found if c.what in ("dead", "stopped")]


ARM = ("export TORCH_FR_BUFFER_SIZE=2000 TORCH_FR_DUMP_TEMP_FILE=/shared/fr/$JOB/rank_ "
       "TORCH_NCCL_DUMP_ON_TIMEOUT=1 before the job starts (docs/hang.md, 'Arming a job')")

_HINTS = {
    "dead": "read this rank's own log for its last error (OOM killer: dmesg); the job "
            "must be restarted: the others will wait until their timeout",
    "stopped": "resume it (kill -CONT PID) or detach the debugger; a stop you did not "
               "ask for: look for a job-control or checkpoint tool",
    "d_state": "a driver or file-system call that never returns: dmesg for Xid or I/O "
               "errors, the kernel stack in /proc/PID/stack; the node needs a look",
    "desync": "the ranks call collectives in different orders: a branch on the rank or "
              "on data; fix the program (TORCH_DISTRIBUTED_DEBUG=DETAIL checks collective "
              "order on every call)",
    "user_code": "the rank never reaches the collective: read its code at that line "
                 "(a loop, a lock, I/O or a data loader that does not return)",
    "unreadable": "its stack could not be read: " + PTRACE_CAPABILITY,
}


def culprit_finding(culprit: Culprit, view: RankView, multi_node: bool = False,
                    job: str | None = None) -> Finding:
    """Its subject: `rank 2 on node7`; with several jobs seen, `rank 2 of job KEY on ...`."""
    where = f"node {view.node_rank} ({view.host})" if multi_node else view.host
    of_job = f" of job {job}" if job else ""
    subject = subjects.rank(view.rank, f"rank {view.rank}{of_job} on {where}",
                            host=view.host, node=view.node_rank if multi_node else None)
    return fail(f"hang.rank.{culprit.what}", f"{label(view)} {culprit.detail}",
                hint=_HINTS[culprit.what], subject=subject)


def live_findings(views: list[RankView], window_s: float, multi_node: bool,
                  job: str | None = None) -> list[Finding]:
    """The verdict on one job's ranks (every node's, when gathered)."""
    by_rank = {v.rank: v for v in views}

    def named(found: list[Culprit]) -> list[Finding]:
        return [culprit_finding(c, by_rank[c.rank], multi_node, job) for c in found]

    unwatched = [v.rank for v in views if not v.watched]
    if unwatched:
        return [skip("hang.verdict", f"{len(unwatched)} of {len(views)} ranks of this job "
                     "were not watched (more rank processes on this node than could be "
                     "watched in time): no verdict; give this job's PIDs or its "
                     "launcher's PID"), *named(stuck_anyway(views))]
    # Every rank of the job seen (several nodes gathered, or a one-node job whole).
    whole = multi_node or len({v.rank for v in views}) == views[0].world_size
    seen = [v for v in views if v.pid is not None]
    if seen and whole and all(v.state in DEAD for v in seen):
        return [ok("hang.verdict", "every rank of this job exited during the window (after "
                   "destroy_process_group, say): the job ended, nothing hangs")]
    if views and all(v.stack_error and v.stack_error.startswith("denied") for v in views):
        return [skip("hang.verdict", "no rank's stack could be read: needs "
                     + PTRACE_CAPABILITY)]
    if views and all(v.stack_error or v.pid is None for v in views):
        reasons = sorted({v.stack_error for v in views if v.stack_error})
        return [skip("hang.verdict", "no rank's stack could be read, nothing to judge: "
                     + "; ".join(reasons)), *named(stuck_anyway(views))]
    site, culprit_list = culprits(views)
    if culprit_list:
        return named(culprit_list)
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
    if any(moved(v) for v in views):
        return ok("hang.verdict", f"every rank progressed: none sat in one collective for "
                  f"the whole {window_s:g} s window ({len(views)} ranks{unread_words})")
    # None in a collective and none moving: a long step or a job stuck outside
    # torch.distributed, never an all-clear.
    sites = sorted({v.where.describe() for v in views if v.where is not None})
    cpu = [v.cpu_pct for v in views if v.cpu_pct is not None]
    cpu_words = f", at most {max(cpu):.0f} % CPU" if cpu else ""
    return warn("hang.verdict", f"no rank moved for the whole {window_s:g} s window and "
                f"none is in a collective ({len(views)} ranks{cpu_words}; "
                f"{'; '.join(sites[:3]) or 'no site read'}{unread_words})",
                hint="a step longer than the window, or every rank stuck in its own code: "
                     "run again with a longer --window; if nothing moves still, read the "
                     "stacks below (a data loader, a lock, a file system)")


def moved(view: RankView) -> bool:  # seen at more than one place in the window
    if view.stack_error or view.samples == 0:
        return False
    return view.moved if view.moved is not None else not view.steady


Value = Call | str  # a Call, or MISSING


@dataclass
class GroupVerdict:
    group: str
    desc: str
    members: list[int]
    first_seq: int | None = None  # the first sequence number every rank's buffer holds
    last_seq: int | None = None
    diverge_seq: int | None = None
    expected: Value | None = None  # the majority's call at diverge_seq
    culprits: dict[int, str] = field(default_factory=dict)  # rank -> what it did
    split: dict[str, list[int]] = field(default_factory=dict)  # a tie: value -> ranks
    no_dump: list[int] = field(default_factory=list)
    waiting: dict[int, int] = field(default_factory=dict)
    last_agreed: tuple[int, Call] | None = None
    last_completed_by_all: int | None = None


def _words(value: Value) -> str:
    return value.describe() if isinstance(value, Call) else value


def _majority(values: dict[int, Value]) -> Value | None:
    """The value most ranks share; on a tie, a call beats MISSING; otherwise None."""
    ranked = Counter(values.values()).most_common()
    top = [v for v, n in ranked if n == ranked[0][1]]
    if len(top) == 1:
        return top[0]
    calls = [v for v in top if v != MISSING]
    return calls[0] if len(calls) == 1 and MISSING in top else None


def judge_group(group: GroupTrace, dumped: set[int]) -> GroupVerdict:
    verdict = GroupVerdict(group.name, group.desc, group.members,
                           no_dump=sorted(set(group.members) - dumped))
    ranks = sorted(set(group.members) & dumped)
    calls = {r: group.calls.get(r, {}) for r in ranks}
    starts = [min(c) for c in calls.values() if c]
    if not starts:
        return verdict
    verdict.first_seq, verdict.last_seq = max(starts), max(max(c) for c in calls.values() if c)
    # Only the numbers some rank recorded: a number no rank holds is one every rank
    # lacks alike (and ids 1 and 10**12 must not mean 10**12 steps).
    recorded = sorted({s for c in calls.values() for s in c if s >= verdict.first_seq})
    for seq in recorded:
        values = {r: calls[r].get(seq, MISSING) for r in ranks}
        if len(set(values.values())) > 1:
            _diverged(verdict, seq, values, calls)
            break
        agreed = next(iter(values.values()))
        # Every rank holds the same value at a number some rank recorded: a Call.
        if isinstance(agreed, Call):
            verdict.last_agreed = (seq, agreed)
    done = [group.completed[r] for r in ranks if r in group.completed]
    if done and len(done) == len(ranks):
        verdict.last_completed_by_all = min(done)
    return verdict


def _diverged(verdict: GroupVerdict, seq: int, values: dict[int, Value],
              calls: dict[int, dict[int, Call]]) -> None:
    verdict.diverge_seq = seq
    expected = _majority(values)
    if expected is None:
        for rank, value in sorted(values.items()):
            verdict.split.setdefault(_words(value), []).append(rank)
        return
    verdict.expected = expected
    where = f"collective #{seq} of group {verdict.group} ({verdict.desc})"
    for rank, value in sorted(values.items()):
        if value == expected:
            continue
        # Still inside #seq-1 while a member left no dump: one behind in a ring stopped
        # mid-collective, waiting for that member too (docs/hang.md).
        if value == MISSING and verdict.no_dump and max(calls[rank], default=None) == seq - 1:
            verdict.waiting[rank] = seq - 1
            continue
        if value == MISSING:
            last = max(calls[rank], default=None)
            before = (f"its last was #{last} ({_words(calls[rank][last])})"
                      if last is not None else "it issued none in this group")
            verdict.culprits[rank] = (f"never reached {where}, {_words(expected)}, which "
                                      f"the others entered: {before}")
        elif expected == MISSING:
            verdict.culprits[rank] = (f"called {_words(value)} as {where}, which no other "
                                      "rank reached")
        else:
            verdict.culprits[rank] = (f"called {_words(value)} as {where}, where the others "
                                      f"called {_words(expected)}")


_DESYNC_HINT = ("the ranks call collectives in different orders or with different "
                "shapes: a branch on the rank or on data; fix the program "
                "(TORCH_DISTRIBUTED_DEBUG=DETAIL checks every call)")
_MISSING_HINT = ("the others wait for this rank: see what it does instead (gpucheck hang "
                 "on its node while the job still runs, or its log)")


def group_findings(v: GroupVerdict) -> list[Finding]:
    found = []
    for rank, what in sorted(v.culprits.items()):
        check = "hang.traces.missing" if "never reached" in what else "hang.traces.desync"
        found.append(fail(check, f"rank {rank} {what}",
                          hint=_MISSING_HINT if check.endswith("missing") else _DESYNC_HINT,
                          subject=subjects.rank(rank)))
    if v.split:
        sides = "; ".join(f"ranks {', '.join(map(str, r))}: {w}" for w, r in v.split.items())
        found.append(warn("hang.traces.split", f"collective #{v.diverge_seq} of group "
                          f"{v.group} ({v.desc}) splits the ranks evenly: {sides}",
                          hint=_DESYNC_HINT))
    if v.no_dump and not v.culprits:
        more = f" and {len(v.no_dump) - 20} more" if len(v.no_dump) > 20 else ""
        ranks = ", ".join(map(str, v.no_dump[:20])) + more  # a group may list thousands
        behind = "; ".join(f"rank {r} is still inside collective #{s}, one behind, waiting "
                           "too" for r, s in sorted(v.waiting.items()))
        found.append(fail("hang.traces.no_dump", f"rank(s) {ranks} of group {v.group} left "
                          "no dump while the others agree: dead, or stuck before dumping"
                          + (f" ({behind})" if behind else ""),
                          hint="read those ranks' logs; a rank that died writes no dump",
                          subject=subjects.ranks(v.no_dump, f"rank {ranks}")))
    if not found:
        last = f"#{v.last_agreed[0]} ({v.last_agreed[1].describe()})" if v.last_agreed else "none"
        found.append(ok("hang.traces.agree", f"group {v.group} ({v.desc}): the "
                        f"{len(v.members)} ranks agree on every recorded collective, "
                        f"through {last}"))
    return found


def group_row(v: GroupVerdict) -> dict[str, Any]:
    # A Call, or MISSING, or None (no majority).
    expected = v.expected.describe() if isinstance(v.expected, Call) else v.expected
    return {"group": v.group, "desc": v.desc, "ranks": len(v.members),
            "recorded": f"#{v.first_seq}..#{v.last_seq}" if v.first_seq is not None else None,
            "first_mismatch": v.diverge_seq, "expected": expected,
            "culprits": ", ".join(map(str, sorted(v.culprits))) or None,
            "last_agreed": (f"#{v.last_agreed[0]} {v.last_agreed[1].describe()}"
                            if v.last_agreed else None),
            "last_completed_by_all": v.last_completed_by_all}


def traces_section(directory: str, prefix: str | None) -> Section:
    """Raises UsageError when DIR holds no dump torch can read."""
    files = dump_files(directory, prefix)
    if not files:
        raise UsageError(f"--traces {directory}: no Flight Recorder dump (files named "
                         f"<prefix><rank>); to have them next time, {ARM}")
    dumps, unreadable = load(files)
    if not dumps:
        raise UsageError(f"--traces {directory}: no dump torch can read: {unreadable[0]}")
    verdicts = [judge_group(g, set(dumps)) for g in groups(dumps)]
    dropped = {rank: d["dropped"] for rank, d in sorted(dumps.items()) if d.get("dropped")}
    data = {"directory": directory, "ranks_dumped": sorted(dumps),
            "unreadable": unreadable,
            "torch_fr_version": sorted({str(d.get("version")) for d in dumps.values()}),
            "entries_skipped": {str(r): n for r, n in dropped.items()} or None,
            "groups": [group_row(v) for v in verdicts]}
    findings = [f for v in verdicts for f in group_findings(v)]
    return Section("traces", "Flight Recorder traces", data, findings or [
        skip("hang.traces.empty", f"the {len(dumps)} dump(s) hold no collective: nothing "
             "was recorded (TORCH_FR_BUFFER_SIZE unset or 0 in the job, or a job that "
             "failed before its first collective); nothing to judge")])
