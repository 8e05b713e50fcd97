"""Judge Flight Recorder traces by a vote at each sequence number: the first collective
where a group's ranks differ, the minority, the last agreed; `hang --traces`'s section."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpucheck import subject as subjects
from gpucheck.hang.traces import MISSING, Call, GroupTrace, dump_files, groups, load
from gpucheck.report import Finding, Section, fail, ok, skip, warn

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


def nothing_recorded(dumps: dict[int, dict[str, Any]]) -> Finding:
    return skip("hang.traces.empty", f"the {len(dumps)} dump(s) hold no collective: "
                "nothing was recorded (TORCH_FR_BUFFER_SIZE unset or 0 in the job, or a "
                "job that failed before its first collective); nothing to judge")


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
    from gpucheck.errors import UsageError
    from gpucheck.hang.live import ARM

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
    return Section("traces", "Flight Recorder traces", data,
                   findings or [nothing_recorded(dumps)])
