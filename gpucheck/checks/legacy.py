"""The transition (issue 25): today's words, read only for findings made without data.

A finding with neither a cause nor a look, and no explicit action, gets its action as
gpucheck did before the registry: a hint's "action: <x>: " prefix (the kernel-log XID
findings and the fault watcher's, from their per-XID and per-event tables), else a
keyword of its message or hint that names a cause or a look, else its check's
`action_by_status`. Once the finding sites set `cause=` and `look=` (streams S2, S3,
S6), S6 deletes this module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpucheck.actions import ACTIONS, Action, Status
from gpucheck.checks import CHECKS
from gpucheck.checks.check import Check, find
from gpucheck.measure import LookState

# "action: drain-node: drain the node and ..." (probes/xid_section.py, faults/findings.py).
_HINT_PREFIX = re.compile(r"action: ([a-z-]+): ?")


@dataclass(frozen=True)
class Keyword:
    """Words of a message or hint that stand for a cause key or a look state of the
    check ids matching `pattern` (a `*` segment matches any one), for `status` only
    when set."""

    pattern: str
    words: str
    cause: str | None = None
    look: LookState | None = None
    status: Status | None = None

    def matches(self, check: str, status: Status, text: str) -> bool:
        parts, want = check.split("."), self.pattern.split(".")
        return len(parts) == len(want) and all(
            w in ("*", p) for w, p in zip(want, parts, strict=True)) \
            and self.status in (None, status) and self.words.lower() in text

    @property
    def specificity(self) -> tuple[int, bool]:
        return sum(s != "*" for s in self.pattern.split(".")), self.status is not None


_F, _W = Status.FAIL, Status.WARN
_CONFIRMED, _NOT_AGAIN = LookState.CONFIRMED, LookState.NOT_MEASURED
KEYWORDS: tuple[Keyword, ...] = (
    Keyword("driver.nvml", "is lost", "gpu_lost", status=_F),
    Keyword("driver.nvml", "needs a reset", "needs_reset", status=_F),
    Keyword("driver.nvml", "timed out", "timed_out", status=_F),
    Keyword("driver.nvml", "no answer", "no_answer", status=_F),
    Keyword("gpu.query", "not permitted", "no_permission"),
    Keyword("gpu.fabric", "still in progress", "registering"),
    Keyword("gpu.fabric.configuration", "INSUFFICIENT_NVLINKS", "insufficient_nvlinks"),
    Keyword("gpu.recovery_action", "RECOVERY_ACTION_GPU_RESET", "gpu_reset"),
    Keyword("gpu.recovery_action", "RECOVERY_ACTION_BUS_RESET", "bus_reset"),
    Keyword("gpu.topology", "no answer", "no_answer"),
    Keyword("gpu.topology", "timed out", "timed_out"),
    Keyword("bench.rank.straggler", "its host did not run it", "host_stall"),
    Keyword("bench.consistency", "suspect the software", "all_alike"),
    Keyword("stress.sdc.agreement", "suspect the software", "all_alike"),
    Keyword("stress.p2p", "without peer access", "no_peer_access"),
    Keyword("comm.pairwise.slow_pair", "cpu ranks exchange", "cpu_ranks", status=_W),
    *(Keyword(check, "confirmed:", look=_CONFIRMED) for check in (
        "comm.pairwise.slow_pair", "comm.nodes.slow_node", "comm.internode.slow_pair",
        "comm.internode.slow_rail", "comm.internode.shared_node")),
    *(Keyword(check, "not measured again", look=_NOT_AGAIN) for check in (
        "stress.*.peers", "stress.sdc.straggler", "stress.copies.together",
        "stress.copies.link", "stress.p2p")),
)


def hint_action(hint: str | None) -> str | None:
    """The action a hint names in its "action: <action>: " prefix, if one of ACTIONS."""
    match = _HINT_PREFIX.match(hint or "")
    return match[1] if match and match[1] in ACTIONS else None


def strip_hint(hint: str | None, action: str | None) -> str | None:
    """The hint without an "action: <action>: " prefix that only repeats `action`
    (the renderers show the action on its own)."""
    match = _HINT_PREFIX.match(hint or "")
    if hint is None or match is None or match[1] != action:
        return hint
    return hint[match.end():]


def strip_any_prefix(hint: str | None) -> str | None:
    """The hint without any "action: <action>: " prefix: for a finding whose action
    follows from its cause or look, which no words may contradict."""
    match = _HINT_PREFIX.match(hint or "")
    return hint if hint is None or match is None else hint[match.end():]


def keyword_for(check: str, status: Status, message: str = "",
                hint: str | None = None) -> Keyword | None:
    """The most specific keyword in the message or hint (the first of equals)."""
    text = f"{message}\n{hint or ''}".lower()
    matching = [k for k in KEYWORDS if k.matches(check, status, text)]
    return max(matching, key=lambda k: k.specificity, default=None)


def legacy_action(check: Check, check_id: str, status: Status, message: str,
                  hint: str | None) -> Action | None:
    """The action of a finding made with neither cause nor look (None for OK, SKIP)."""
    if status not in (Status.WARN, Status.FAIL):
        return None
    named = hint_action(hint)
    if named is not None:
        return Action(named)
    keyword = keyword_for(check_id, status, message, hint)
    if keyword is not None and keyword.cause is not None:
        return check.action(status, keyword.cause)
    if keyword is not None and keyword.look is not None and check.on_look is not None:
        return check.on_look[keyword.look]
    return check.action(status)


def _unknown(status: Status) -> Action:
    """Only for a finding of a version-1 report (no stored action) whose id this
    gpucheck does not declare: a FAIL drains, a WARN is run again, as before."""
    return Action.DRAIN_NODE if status is Status.FAIL else Action.RERUN


def resolve_action(check_id: str, status: str, message: str = "",
                   hint: str | None = None) -> str | None:
    """The action of a finding read from a report that stored none (schema 1), or of a
    plain finding: the declared check and the legacy words; an undeclared id (a report
    of another gpucheck) falls back as gpucheck always did."""
    state = Status(status)
    if state not in (Status.WARN, Status.FAIL):
        return None
    try:
        check = find(CHECKS, check_id)
    except KeyError:
        named = hint_action(hint)
        return named if named is not None else _unknown(state).value
    action = legacy_action(check, check_id, state, message, hint)
    return action.value if action is not None else None
