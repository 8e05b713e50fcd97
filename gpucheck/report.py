"""The one report shape every command produces: `Finding`s in `Section`s in a `Report`,
whose JSON (versioned, SCHEMA_VERSION) `Report.from_dict` reads back: the one reader;
and the findings for ranks' records rank 0 could not read back (`unread_findings`)."""

from __future__ import annotations

import datetime as _dt
import socket
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpucheck import __version__
from gpucheck.checks import ACTIONS, Action, Check, Status, lookup
from gpucheck.measure import Metric, SecondLook
from gpucheck.records import Unread
from gpucheck.subject import Kind, Subject, text
from gpucheck.subject import rank as rank_subject

# 3: sections carry "metrics"; findings "action", "cause", "look" and "subject_fields"
# beside "subject" (its label). Only this version is read (README, "JSON schema").
SCHEMA_VERSION = 3

# JSON-able values only: str, int, float, bool, None, lists and dicts of them.
JsonValue = Any

__all__ = ["ACTIONS", "Action", "Finding", "Report", "ReportShapeError", "SchemaVersionError",
           "Section", "Status", "fail", "looked", "ok", "schema_problem", "skip",
           "unread_findings", "warn", "worst"]


@dataclass(frozen=True)
class Finding:
    """One verdict: a declared check id, a status, what was seen, what to do. `action`
    is derived when it is made (`lookup(check).action(status, cause, look, relayed)`),
    never from the words; an undeclared id raises KeyError at once."""

    check: str
    status: Status
    message: str
    hint: str | None = None
    subject: Subject | None = None
    cause: str | None = None
    look: SecondLook | None = None
    relayed: Action | str | None = None
    action: str | None = field(default=None, init=False)  # derived, stored in JSON

    def __post_init__(self) -> None:
        if self.subject is not None and not isinstance(self.subject, Subject):
            # mypy rejects a plain str; this catches one typed Any (a value from a dict)
            raise TypeError(f"{self.check}: a finding's subject is a gpucheck.subject.Subject "
                            f"(made by its constructors), not {type(self.subject).__name__}")
        if self.relayed is not None:
            object.__setattr__(self, "relayed", Action(self.relayed))
        declared = lookup(self.check)  # KeyError: an undeclared id fails its first test
        object.__setattr__(self, "action", self._derived(declared))  # frozen: set once

    def _derived(self, declared: Check) -> str | None:
        relayed = self.relayed if isinstance(self.relayed, Action) else None
        found = declared.action(self.status, self.cause, self.look, relayed)
        return found.value if found is not None else None

    def to_dict(self) -> dict[str, JsonValue]:
        subject = self.subject
        structured = subject is not None and subject.kind is not Kind.TEXT
        return {
            "check": self.check,
            "status": self.status.value,
            "message": self.message,
            "hint": self.hint,
            "subject": subject.label if subject is not None else None,
            "subject_fields": subject.to_dict() if structured and subject else None,
            "action": self.action,
            "cause": self.cause,
            "look": self.look.to_dict() if self.look is not None else None,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, JsonValue]) -> Finding:
        """A finding as `to_dict` wrote it. The stored action is kept (a report is a
        record: it says what was decided when it was made); a WARN or FAIL without
        one is damaged (schema 3 writes it on every one)."""
        said = raw.get("status") if type(raw) is dict else None
        status = _STATUS_OF.get(said) if type(said) is str else None
        check = raw.get("check") if status is not None else None
        if type(check) is not str:
            raise TypeError("has no check id or a status other than "
                            f"{', '.join(sorted(_STATUS_OF))}")
        message, hint, action, cause, words, fields, look = (
            raw.get("message"), raw.get("hint"), raw.get("action"), raw.get("cause"),
            raw.get("subject"), raw.get("subject_fields"), raw.get("look"))
        if type(message) is not str:
            raise TypeError("'message' is not a string")
        for key, value in (("hint", hint), ("action", action), ("cause", cause),
                           ("subject", words)):
            if value is not None and type(value) is not str:
                raise TypeError(f"{key!r} is {type(value).__name__}, not a string")
        if action is None and status in _ACTING:
            raise ValueError(f"{check}: a {status.value} without an action")
        if action is not None and action not in ACTIONS:
            raise ValueError(f"{check}: unknown action {action!r}")
        # Read back as stored: the action kept, the id not looked up (a report of
        # another gpucheck may hold ids this one does not declare).
        finding = object.__new__(cls)
        finding.__dict__.update(
            check=check, status=status, message=message, hint=hint, action=action,
            cause=cause, relayed=None,
            subject=Subject.from_dict(fields) if fields is not None
            else None if words is None else text(words),
            look=None if look is None else SecondLook.from_dict(look))
        return finding


def ok(check: str, message: str, subject: Subject | None = None, *,
       look: SecondLook | None = None) -> Finding:
    return Finding(check, Status.OK, message, None, subject, look=look)


def warn(check: str, message: str, hint: str, subject: Subject | None = None, *,
         cause: str | None = None, look: SecondLook | None = None,
         relayed: Action | str | None = None) -> Finding:
    """`cause`, `look`, `relayed`: the data the action follows from (gpucheck.checks)."""
    return Finding(check, Status.WARN, message, hint, subject, cause, look, relayed)


def fail(check: str, message: str, hint: str, subject: Subject | None = None, *,
         cause: str | None = None, look: SecondLook | None = None,
         relayed: Action | str | None = None) -> Finding:
    """As `warn`, for a FAIL."""
    return Finding(check, Status.FAIL, message, hint, subject, cause, look, relayed)


def looked(check: str, message: str, hint: str, subject: Subject | None, look: SecondLook,
           *, cause: str | None = None) -> Finding:
    """A figure that crossed its bound, with its second look: the one place the look
    decides the status. An OK keeping the look when the check's `on_look` asks nothing
    of it (unstable: fine the second time, "act only if it repeats"); else a WARN, or a
    FAIL where the action taken (the cause's, else the look's) is one the check declares
    for a FAIL and not for a WARN (preflight's confirmed slow node on GPU ranks)."""
    declared = lookup(check)
    if declared.look_action(look) is None:
        return ok(check, message, subject, look=look)
    action = declared.action(Status.WARN, cause, look)
    by_status = declared.action_by_status
    fails = by_status.get(Status.FAIL) is action and by_status.get(Status.WARN) is not action
    return Finding(check, Status.FAIL if fails else Status.WARN, message, hint, subject, cause,
                   look)


def skip(check: str, message: str, subject: Subject | None = None) -> Finding:
    return Finding(check, Status.SKIP, message, None, subject)


@dataclass
class Section:
    """A titled group: `data` (JSON-able values, shown as lines and tables), findings,
    and `metrics`, the figures compare, fleet, baselines and charts read."""

    name: str
    title: str
    data: dict[str, JsonValue] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)

    def verdict(self) -> Status | None:
        """The section's badge: its worst WARN or FAIL, else OK when anything was checked;
        SKIP only when every check was skipped; None when it holds data alone."""
        statuses = {f.status for f in self.findings}
        if not statuses:
            return None
        if statuses == {Status.SKIP}:
            return Status.SKIP
        return worst(statuses - {Status.SKIP})

    def to_dict(self) -> dict[str, JsonValue]:
        return {
            "name": self.name,
            "title": self.title,
            "data": self.data,
            "findings": [f.to_dict() for f in self.findings],
            "metrics": [m.to_dict() for m in self.metrics],
        }

    @classmethod
    def from_dict(cls, raw: dict[str, JsonValue]) -> Section:
        if not isinstance(raw, dict):
            raise TypeError(f"a section is {type(raw).__name__}, not an object")
        name, title, data = raw.get("name"), raw.get("title"), raw.get("data") or {}
        if not isinstance(name, str) or not isinstance(title, str):
            raise TypeError("a section's 'name' or 'title' is not a string")
        if not isinstance(data, dict):
            raise TypeError("'data' is not an object")
        findings, metrics = raw.get("findings"), raw.get("metrics")
        return cls(name, title, data,
                   [] if findings is None else _each(findings, Finding.from_dict, "findings"),
                   [] if metrics is None else _each(metrics, _metric, "metrics"))


_STATUS_OF = {s.value: s for s in Status}
_ACTING = (Status.WARN, Status.FAIL)
_T = TypeVar("_T")


def _each(items: JsonValue, read: Callable[[Any], _T], where: str) -> list[_T]:
    """`read` of each item of a list; an error names the item ("findings[2]: ...")."""
    if not isinstance(items, list):
        raise TypeError(f"{where!r} is {type(items).__name__}, not a list")
    done = []
    for at, item in enumerate(items):
        try:
            done.append(read(item))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"{where}[{at}]: {_said(exc)}") from None
    return done


def _metric(raw: JsonValue) -> Metric:
    try:
        return Metric.from_dict(raw)
    except OverflowError:  # an integer too large for a float: a damaged file
        raise ValueError("a metric's value is too large") from None


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def schema_problem(version: object) -> str | None:
    """None when this gpucheck reads a report of `version`; else what is wrong and what
    to do, as the rest of a line that names the file ("bench.json has ...")."""
    if type(version) is int and version == SCHEMA_VERSION:  # bool is an int: not `true`
        return None
    if type(version) is int and 0 < version < SCHEMA_VERSION:
        return (f"has schema_version {version}, written by an older gpucheck: gpucheck "
                f"{__version__} reads schema_version {SCHEMA_VERSION} only; run the command "
                "again with this gpucheck for a report it reads")
    shown = repr(version)  # a file's value: a long string or list is cut to one line
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return (f"has unknown schema_version {shown} (gpucheck {__version__} reads "
            f"{SCHEMA_VERSION}: read it with the gpucheck that wrote it)")


class SchemaVersionError(ValueError):
    """A report whose `schema_version` this gpucheck cannot read (`version` says which)."""

    def __init__(self, version: object) -> None:
        self.version = version
        super().__init__(f"the report {schema_problem(version)}")


@dataclass
class Report:
    """Everything one command found, in the order it should be read."""

    command: str
    sections: list[Section] = field(default_factory=list)
    argv: list[str] = field(default_factory=lambda: list(sys.argv))
    host: str = field(default_factory=socket.gethostname)
    created_at: str = field(default_factory=_utc_now)
    tool_version: str = __version__
    schema_version: int = SCHEMA_VERSION
    # What the verdict covers when that is less than the command's name suggests
    # ("no NVIDIA GPU or driver found: software checks only"); shown in the headline.
    scope: str | None = None

    def add(self, section: Section) -> Section:
        self.sections.append(section)
        return section

    def section(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)

    @property
    def findings(self) -> list[Finding]:
        return [f for s in self.sections for f in s.findings]

    def summary(self) -> dict[str, int]:
        counts = {status.value: 0 for status in Status}
        for finding in self.findings:
            counts[finding.status.value] += 1
        return counts

    def verdict(self) -> Status:
        """As a section's verdict over every finding; OK with none."""
        return Section("", "", findings=self.findings).verdict() or Status.OK

    def exit_code(self, strict: bool = False) -> int:
        """0 when nothing failed, 1 on any FAIL (with `strict`, on any WARN too)."""
        verdict = self.verdict()
        if verdict is Status.FAIL or (strict and verdict is Status.WARN):
            return 1
        return 0

    def to_dict(self) -> dict[str, JsonValue]:
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": "gpucheck",
            "tool_version": self.tool_version,
            "command": self.command,
            "argv": self.argv,
            "host": self.host,
            "created_at": self.created_at,
            "verdict": self.verdict().value,
            "scope": self.scope,
            "summary": self.summary(),
            "sections": [s.to_dict() for s in self.sections],
        }

    @classmethod
    def from_dict(cls, raw: dict[str, JsonValue]) -> Report:
        """A report as `to_dict` wrote it; SchemaVersionError for any other version
        (`schema_problem` says what to do)."""
        if not isinstance(raw, dict):
            raise ReportShapeError(f"a report is a JSON object, not {type(raw).__name__}")
        version = raw.get("schema_version")
        if schema_problem(version) is not None:
            raise SchemaVersionError(version)
        try:
            return cls._from_checked(raw)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            # A damaged or hostile file: one error type with the cause, not a traceback.
            raise ReportShapeError(_said(exc)[:160]) from None

    @classmethod
    def _from_checked(cls, raw: dict[str, JsonValue]) -> Report:
        for key in ("command", "host", "created_at", "tool_version", "scope"):
            value = raw.get(key)
            if not isinstance(value, str) and not (key != "command" and value is None):
                raise TypeError(f"{key!r} is {type(value).__name__}, not a string")
        argv = raw.get("argv") or []
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise TypeError("'argv' is not a list of strings")
        return cls(
            command=raw["command"],
            sections=_each(raw.get("sections") or [], Section.from_dict, "sections"),
            argv=list(raw.get("argv") or []),
            host=raw.get("host", ""),
            created_at=raw.get("created_at", ""),
            tool_version=raw.get("tool_version", ""),
            schema_version=raw["schema_version"],
            scope=raw.get("scope"),
        )


class ReportShapeError(ValueError):
    """A report dict that `from_dict` cannot read: a missing key, a value of the wrong
    type (a table replaced by a number, a list where an object belongs)."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(f"damaged report: {problem}")


def _said(exc: Exception) -> str:
    return f"no {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)


def worst(statuses: Iterable[Status]) -> Status:
    return max(statuses, key=lambda s: s.severity, default=Status.OK)


UNREAD_HINT = ("the rank sent a record of another shape than rank 0 reads: run one gpucheck "
               "version on every node (pip show gpucheck on each), then run the command again")


def unread_findings(check: str, unread: Sequence[Unread]) -> list[Finding]:
    """One WARN per rank (or one for records that name no rank), nothing when all read."""
    by_rank: dict[int | None, list[Unread]] = {}
    for u in unread:
        by_rank.setdefault(u.rank, []).append(u)
    return [warn(check, f"{f'rank {who}:' if who is not None else 'a rank that named none:'} "
                 f"{len(mine)} record(s) could not be read and were left out of the verdicts: "
                 f"{'; '.join(f'{u.what} ({u.why})' for u in mine)}", hint=UNREAD_HINT,
                 subject=rank_subject(who) if who is not None else None)
            for who, mine in sorted(by_rank.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))]
