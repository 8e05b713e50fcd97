"""Judge Flight Recorder traces: the first collective where the ranks of a group
differ, the ranks in the minority, the last collective every rank agreed on.

Order-independent by construction: ranks are compared as a set at each sequence
number (a vote), never against a first-read reference rank.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from gpucheck.hang.traces import MISSING, Call, GroupTrace

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
    # rank -> the collective it is still inside, one behind the others, while a member
    # left no dump: it waits for that member, as the others do (`_still_inside`).
    waiting: dict[int, int] = field(default_factory=dict)
    last_agreed: tuple[int, Call] | None = None
    last_completed_by_all: int | None = None


def _value(calls: dict[int, Call], seq: int) -> Value:
    return calls.get(seq, MISSING)


def _words(value: Value) -> str:
    return value.describe() if isinstance(value, Call) else value


def _majority(values: dict[int, Value]) -> Value | None:
    """The value most ranks share; on a tie, a call beats ranks that never arrived
    (those wait for them); otherwise None."""
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
        values = {r: _value(calls[r], seq) for r in ranks}
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


def _still_inside(verdict: GroupVerdict, seq: int, calls: dict[int, Call]) -> bool:
    """Is a rank that never reached #seq still inside #seq-1, waiting for a member that
    left no dump? With a peer stopped mid-collective, the ranks of a ring can end one
    collective apart (some received everything before the stop, some did not): the one
    behind is not the cause. Its #seq-1 reading "completed" proves nothing: once NCCL
    aborts a communicator (gpucheck's deadline, or the watchdog), the aborted kernels
    read as completed, and a dump taken after the abort shows every survivor's last
    collective so. With one member's dump missing, that member is the one named."""
    return bool(verdict.no_dump) and max(calls, default=None) == seq - 1


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
        if value == MISSING and _still_inside(verdict, seq, calls[rank]):
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
