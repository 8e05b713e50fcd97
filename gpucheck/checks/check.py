"""A finding's two closed lists (Status, Action), the shapes of a declaration (Check,
Cause), how an id finds its Check, and the title and docs anchor a check gets from its
id. Imports only measure (floor 1)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gpucheck.measure import LookState, SecondLook


class Status(str, enum.Enum):
    """A check's verdict, ordered from best to worst by `severity` (report.py re-exports
    it)."""

    OK = "OK"
    SKIP = "SKIP"
    WARN = "WARN"
    FAIL = "FAIL"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {Status.OK: 0, Status.SKIP: 1, Status.WARN: 2, Status.FAIL: 3}


class Action(str, enum.Enum):
    """What to do about a WARN or FAIL: the fixed list, least to most disruptive."""

    NONE = "none"  # nothing to do now: information, or a count to watch
    RERUN = "rerun"  # run again: the result may be transient, or names no culprit yet
    FIX_CONFIG = "fix-config"  # software, settings or the launch: the hardware is fine
    RESTART_APP = "restart-app"  # the application's fault; the GPU is healthy
    RESET_GPU = "reset-gpu"  # nvidia-smi -r (or a reboot) clears it; the node may stay
    DRAIN_NODE = "drain-node"  # take the node out of service until someone has looked
    REPLACE_HARDWARE = "replace-hardware"  # a part is bad or unseated: hands on the box


ACTIONS: tuple[str, ...] = tuple(a.value for a in Action)
PROBLEMS = (Status.WARN, Status.FAIL)
INFO = "OK and SKIP only: information, never an action"
SITE = ("the finding's own site names its action (per kind, per XID or per event); this "
        "default is what that site passes")


@dataclass(frozen=True)
class Cause:
    """A reason the measurement itself names, as a key ("gpu_lost", "table.reset-gpu"),
    and what it calls for; `status`, when set, is the only status it fits."""

    key: str
    action: Action
    why: str
    status: Status | None = None


@dataclass(frozen=True)
class Check:
    """One check id. `action_by_status` holds WARN and/or FAIL; `on_look` decides a
    figure measured a second time (None: the look asks nothing, an OK keeping it);
    `relays` checks (fleet, compare) take the action of the finding they relay. `title`
    and `docs_anchor` are derived from the id unless given."""

    id: str
    measures: str  # what is measured, and the command to see it by hand
    action_by_status: Mapping[Status, Action]
    why: str
    causes: tuple[Cause, ...] = ()
    on_look: Mapping[LookState, Action | None] | None = None
    relays: bool = False
    title: str = ""
    docs_anchor: str = ""  # "docs/env.md#gpu-pcie-width"
    _causes: Mapping[str, Cause] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if set(self.action_by_status) - set(PROBLEMS):
            raise ValueError(f"{self.id}: only WARN and FAIL have an action")
        if self.on_look is not None and set(self.on_look) != set(LookState):
            raise ValueError(f"{self.id}: on_look names every look state or none")
        # Frozen all the way down: the registry is read by every finding.
        object.__setattr__(self, "action_by_status", MappingProxyType(dict(self.action_by_status)))
        if self.on_look is not None:
            object.__setattr__(self, "on_look", MappingProxyType(dict(self.on_look)))
        object.__setattr__(self, "_causes", MappingProxyType({c.key: c for c in self.causes}))
        object.__setattr__(self, "title", self.title or title_of(self.id))
        object.__setattr__(self, "docs_anchor", self.docs_anchor or docs_of(self.id))

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
            found = self._causes.get(cause)
            if found is None:
                raise ValueError(f"{self.id}: unknown cause {cause!r} (declare it in {TABLES})")
            if found.status is not None and found.status is not status:
                raise ValueError(f"{self.id}: cause {cause!r} is a {found.status.value}, "
                                 f"not a {status.value}")
            return found.action
        if look is not None:
            return self.look_action(look)
        if status not in self.action_by_status:
            raise ValueError(f"{self.id}: no action declared for {status.value} "
                             f"(declare it in {TABLES})")
        return self.action_by_status[status]

    def look_action(self, look: SecondLook) -> Action | None:
        """What the second look calls for; None: nothing (the figure was fine again)."""
        if self.on_look is None:
            raise ValueError(f"{self.id}: a second look on a check without on_look "
                             f"(declare it in {TABLES})")
        return self.on_look[look.state]


TABLES = "gpucheck/checks/node.py or runs.py"
_WORDS = {"gpu": "GPU", "cuda": "CUDA", "nvml": "NVML", "cudnn": "cuDNN", "nccl": "NCCL",
          "ib": "InfiniBand", "nvlink": "NVLink", "nvlink5": "NVLink5", "pcie": "PCIe",
          "ecc": "ECC", "xid": "Xid", "sdc": "SDC", "gemm": "GEMM", "p2p": "P2P", "mig": "MIG",
          "numa": "NUMA", "cpu": "CPU", "membw": "memory bandwidth", "busbw": "bus bandwidth",
          "shm": "/dev/shm", "{op}": "<collective>", "{field}": "<setting>"}
# The docs page of each id's first segment; any other is docs/all.md.
_DOCS = {"driver": "env", "torch": "env", "python": "env", "system": "env", "gpu": "env",
         "consistency": "env", "env": "env", "faults": "faults", "kernel_log": "xid",
         "ib": "health", "health": "health", "bench": "bench", "comm": "comm",
         "stress": "stress", "hang": "hang", "fleet": "fleet", "compare": "fleet",
         "baseline": "fleet", "preflight": "preflight"}


def title_of(check_id: str) -> str:
    """"gpu.pcie.width" -> "GPU PCIe width", "comm.{op}.correct" -> "Comm <collective> correct"."""
    words = [_WORDS.get(w, w.replace("{", "<").replace("}", ">"))
             for segment in check_id.split(".") for w in segment.split("_")]
    if words[0].islower():
        words[0] = words[0].capitalize()
    return " ".join(words)


def docs_of(check_id: str) -> str:
    """"docs/env.md#gpu-pcie-width": the area's page, the id's slug."""
    slug = check_id.lower().translate(str.maketrans("._", "--", "{}"))
    return f"docs/{_DOCS.get(check_id.split('.', 1)[0], 'all')}.md#{slug}"


def how(where: str) -> Callable[[str], str]:
    """What is measured, followed by how to see it: `how("gpucheck env")("x")`."""
    return lambda what: f"{what} ({where})"


def table_cause(action: Action | str) -> str:
    """The cause key of a finding whose action a per-XID or per-event table names
    (probes/xid_table.py, faults/judge.py): "table.reset-gpu"."""
    return f"table.{Action(action).value}"


def table_causes() -> tuple[Cause, ...]:
    """One cause per action the tables can name: the row is the measurement's data."""
    return tuple(Cause(table_cause(a), a, "the per-XID or per-event table names this "
                       "action for what was seen (probes/xid_table.py, "
                       "faults/judge.py)") for a in Action)


def both(action: Action) -> Mapping[Status, Action]:
    """The same action for WARN and FAIL."""
    return MappingProxyType({Status.WARN: action, Status.FAIL: action})


def _matches(template: str, check_id: str) -> bool:
    want, parts = template.split("."), check_id.split(".")
    return len(want) == len(parts) and all(
        w.startswith("{") or w == p for w, p in zip(want, parts, strict=True))


def _specificity(template: str) -> tuple[int, int]:
    """More literal segments win, then more literal segments at the end (the last
    segment says how a check ended, `{command}.probe`)."""
    literal = [not s.startswith("{") for s in template.split(".")]
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
    """The exact id, else the most specific matching template; KeyError naming where to
    declare it."""
    found = table.get(check_id)
    if found is not None:
        return found
    templates = [t for t in table if "{" in t and _matches(t, check_id)]
    if not templates:
        raise KeyError(f"check {check_id!r} is not declared: add it to {TABLES}")
    return table[max(templates, key=_specificity)]
