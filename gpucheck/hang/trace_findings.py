"""`gpucheck hang --traces DIR`: the Flight Recorder verdict as a report section."""

from __future__ import annotations

from typing import Any

from gpucheck import subject as subjects
from gpucheck.hang.trace_verdict import GroupVerdict, judge_group
from gpucheck.hang.traces import Call, dump_files, groups, load
from gpucheck.report import Finding, Section, fail, ok, skip, warn

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
        ranks = _some(v.no_dump)
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


def _some(ranks: list[int], shown: int = 20) -> str:
    """The first ranks of a list, and how many more (a group may list thousands)."""
    more = f" and {len(ranks) - shown} more" if len(ranks) > shown else ""
    return ", ".join(map(str, ranks[:shown])) + more


def nothing_recorded(dumps: dict[int, dict[str, Any]]) -> Finding:
    """Dumps that hold no collective: nothing to judge, which is not agreement."""
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
    from gpucheck.hang.findings import ARM

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
