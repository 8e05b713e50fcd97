"""The shapes of a declaration: Check and Cause, and how an id finds its Check.
Imports only actions and measure (floor 1), so every area module can import it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpucheck.actions import Action, Status
from gpucheck.measure import LookState, SecondLook

PROBLEMS = (Status.WARN, Status.FAIL)


@dataclass(frozen=True)
class Cause:
    """A reason the measurement itself names, as a key ("gpu_lost", "host_stall",
    "table.reset-gpu"), and what it calls for; `status`, when set, is the only status
    it fits."""

    key: str
    action: Action
    why: str
    status: Status | None = None


@dataclass(frozen=True)
class Check:
    """One check id. `action_by_status` holds WARN and/or FAIL (OK and SKIP have no
    action); `on_look` decides a figure measured a second time (an action, or None: the
    look asks nothing, and the finding is an OK keeping it, `gpucheck.report.looked`);
    `relays` checks (fleet, compare) take the action of the finding they relay."""

    id: str
    title: str
    measures: str  # what is measured, and the command to see it by hand
    action_by_status: Mapping[Status, Action]
    why: str
    docs_anchor: str  # "docs/env.md#gpu-pcie-width"
    causes: tuple[Cause, ...] = ()
    on_look: Mapping[LookState, Action | None] | None = None
    relays: bool = False
    _causes: Mapping[str, Cause] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if set(self.action_by_status) - set(PROBLEMS):
            raise ValueError(f"{self.id}: only WARN and FAIL have an action")
        if self.on_look is not None and set(self.on_look) != set(LookState):
            raise ValueError(f"{self.id}: on_look names every look state or none")
        # Frozen all the way down: the registry is read by every finding.
        object.__setattr__(self, "action_by_status", MappingProxyType(dict(self.action_by_status)))
        object.__setattr__(self, "_causes", MappingProxyType({c.key: c for c in self.causes}))

    def action(self, status: Status, cause: str | None = None,
               look: SecondLook | None = None, relayed: Action | None = None) -> Action | None:
        """None for OK and SKIP; for WARN and FAIL: the relayed action (relaying checks),
        else the cause's, else the look's, else the status's. ValueError for a cause,
        look or status this check does not declare: a bug at the finding's site."""
        if status not in PROBLEMS:
            return None
        if look is not None and self.look_action(look) is None:
            raise ValueError(f"{self.id}: a {look.state.value} look asks nothing: an OK "
                             "(make it with gpucheck.report.looked)")
        if self.relays and relayed is not None:
            return relayed
        if cause is not None:
            return self._cause(cause, status).action
        if look is not None:
            return self.look_action(look)
        if status not in self.action_by_status:
            raise ValueError(f"{self.id}: no action declared for {status.value} "
                             f"(declare it in {area_file(self.id)})")
        return self.action_by_status[status]

    def look_action(self, look: SecondLook) -> Action | None:
        """What the second look calls for; None: nothing (the figure was fine again)."""
        if self.on_look is None:
            raise ValueError(f"{self.id}: a second look on a check without on_look "
                             f"(declare it in {area_file(self.id)})")
        return self.on_look[look.state]

    def _cause(self, key: str, status: Status) -> Cause:
        found = self._causes.get(key)
        if found is None:
            raise ValueError(f"{self.id}: unknown cause {key!r} (declare it in "
                             f"{area_file(self.id)})")
        if found.status is not None and found.status is not status:
            raise ValueError(f"{self.id}: cause {key!r} is a {found.status.value}, "
                             f"not a {status.value}")
        return found


TABLE = "table"  # the cause family of the per-XID and per-event tables


def table_cause(action: Action | str) -> str:
    """The cause key of a finding whose action a per-XID or per-event table names
    (probes/xid_table.py, faults/judge_events.py): "table.reset-gpu"."""
    return f"{TABLE}.{Action(action).value}"


def table_causes() -> tuple[Cause, ...]:
    """One cause per action the tables can name: the table row is the measurement's
    data (an XID number and its line, an NVML event kind), decided where it is read."""
    return tuple(Cause(table_cause(a), a, "the per-XID or per-event table names this "
                       "action for what was seen (probes/xid_table.py, "
                       "faults/judge_events.py)") for a in Action)


def both(action: Action) -> Mapping[Status, Action]:
    """The same action for WARN and FAIL."""
    return MappingProxyType({Status.WARN: action, Status.FAIL: action})


_AREAS = (("driver", "env"), ("torch", "env"), ("python", "env"), ("system", "env"),
          ("consistency", "env"), ("env", "env"), ("gpu", "gpu"), ("faults", "faults"),
          ("kernel_log", "faults"), ("ib", "health"), ("health", "health"),
          ("bench", "bench"), ("comm", "comm"), ("stress", "stress"), ("hang", "hang"),
          ("fleet", "fleet"), ("compare", "fleet"), ("baseline", "fleet"))


def area_file(check_id: str) -> str:
    """The module a check id is declared in."""
    first = check_id.split(".", 1)[0]
    area = next((a for prefix, a in _AREAS if prefix == first), "run")
    return f"gpucheck/checks/{area}.py"


def _is_template(check_id: str) -> bool:
    return "{" in check_id


def _matches(template: str, check_id: str) -> bool:
    want, parts = template.split("."), check_id.split(".")
    return len(want) == len(parts) and all(
        w.startswith("{") or w == p for w, p in zip(want, parts, strict=True))


def _specificity(template: str) -> tuple[int, int]:
    """More literal segments win, then more literal segments at the end (the last
    segment says how a check ended, `{command}.probe`)."""
    segments = template.split(".")
    literal = [not s.startswith("{") for s in segments]
    trailing = len(literal) - max((i + 1 for i, lit in enumerate(literal) if not lit),
                                  default=0)
    return sum(literal), trailing


def build(declared: Iterable[Check]) -> Mapping[str, Check]:
    """An immutable registry; ValueError for an id declared twice."""
    table: dict[str, Check] = {}
    for check in declared:
        if check.id in table:
            raise ValueError(f"check {check.id!r} is declared twice")
        table[check.id] = check
    return MappingProxyType(table)


def find(table: Mapping[str, Check], check_id: str) -> Check:
    """The exact id, else the most specific matching template; KeyError naming the file
    to declare it in."""
    found = table.get(check_id)
    if found is not None:
        return found
    templates = [t for t in table if _is_template(t) and _matches(t, check_id)]
    if not templates:
        raise KeyError(f"check {check_id!r} is not declared: add it to "
                       f"{area_file(check_id)}")
    return table[max(templates, key=_specificity)]


def _looks(confirmed: Action, not_measured: Action) -> Mapping[LookState, Action | None]:
    # Unstable (fine when measured again) asks nothing: "act only if it repeats" is no
    # WARN, as bench kept it (issue 36 item 4); the OK keeps the look for the record.
    return MappingProxyType({LookState.CONFIRMED: confirmed, LookState.UNSTABLE: None,
                             LookState.NOT_MEASURED: not_measured})


# Slow twice, the second time beside known-good peers: contention would have slowed
# those too, so the part is the suspect; not measured again condemns nothing.
SLOW_TWICE = _looks(Action.DRAIN_NODE, Action.RERUN)
# Below the model's typical figure (an estimate): a setting when it holds.
BELOW_EXPECTED = _looks(Action.FIX_CONFIG, Action.FIX_CONFIG)
# Copies of every GPU at once contend by design: never a drain, whatever the look.
NEVER_DRAIN = _looks(Action.RERUN, Action.RERUN)
