"""The one report shape every command produces.

Probes and workers return `Finding`s and plain data; renderers turn a `Report`
into text, JSON or Markdown. The JSON form is versioned (`SCHEMA_VERSION`) and
round-trips through `Report.from_dict`, so later tools can read reports back.
"""

from __future__ import annotations

import datetime as _dt
import enum
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from gpucheck import __version__

SCHEMA_VERSION = 1

# JSON-able values only: str, int, float, bool, None, lists and dicts of them.
JsonValue = Any


class Status(str, enum.Enum):
    """A check's verdict, ordered from best to worst by `severity`."""

    OK = "OK"
    SKIP = "SKIP"
    WARN = "WARN"
    FAIL = "FAIL"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {Status.OK: 0, Status.SKIP: 1, Status.WARN: 2, Status.FAIL: 3}


@dataclass(frozen=True)
class Finding:
    """One verdict: a stable dotted check id, a status, what was seen, what to do."""

    check: str
    status: Status
    message: str
    hint: str | None = None
    subject: str | None = None

    def to_dict(self) -> dict[str, JsonValue]:
        return {
            "check": self.check,
            "status": self.status.value,
            "message": self.message,
            "hint": self.hint,
            "subject": self.subject,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, JsonValue]) -> Finding:
        return cls(
            check=raw["check"],
            status=Status(raw["status"]),
            message=raw["message"],
            hint=raw.get("hint"),
            subject=raw.get("subject"),
        )


def ok(check: str, message: str, subject: str | None = None) -> Finding:
    return Finding(check, Status.OK, message, None, subject)


def warn(check: str, message: str, hint: str, subject: str | None = None) -> Finding:
    return Finding(check, Status.WARN, message, hint, subject)


def fail(check: str, message: str, hint: str, subject: str | None = None) -> Finding:
    return Finding(check, Status.FAIL, message, hint, subject)


def skip(check: str, message: str, subject: str | None = None) -> Finding:
    return Finding(check, Status.SKIP, message, None, subject)


@dataclass
class Section:
    """A titled group of data and findings (`system`, `gpus`, `ranks`, ...).

    `data` holds plain JSON-able values. Renderers show scalars as aligned
    `key: value` lines, dicts as nested lines and lists of dicts as tables.
    """

    name: str
    title: str
    data: dict[str, JsonValue] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def to_dict(self) -> dict[str, JsonValue]:
        return {
            "name": self.name,
            "title": self.title,
            "data": self.data,
            "findings": [f.to_dict() for f in self.findings],
        }

    @classmethod
    def from_dict(cls, raw: dict[str, JsonValue]) -> Section:
        return cls(
            name=raw["name"],
            title=raw["title"],
            data=dict(raw.get("data") or {}),
            findings=[Finding.from_dict(f) for f in raw.get("findings") or []],
        )


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


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
        """FAIL or WARN when any finding says so; a skipped check does not lower an OK.

        SKIP only when every check was skipped; OK for an empty report.
        """
        statuses = {f.status for f in self.findings}
        if statuses == {Status.SKIP}:
            return Status.SKIP
        return worst(statuses - {Status.SKIP})

    def exit_code(self, strict: bool = False) -> int:
        """0 when nothing failed, 1 on any FAIL (with `strict`, on any WARN too)."""
        verdict = self.verdict()
        if verdict is Status.FAIL or (strict and verdict is Status.WARN):
            return 1
        return 0

    def to_dict(self) -> dict[str, JsonValue]:
        return {
            "schema_version": self.schema_version,
            "tool": "gpucheck",
            "tool_version": self.tool_version,
            "command": self.command,
            "argv": self.argv,
            "host": self.host,
            "created_at": self.created_at,
            "verdict": self.verdict().value,
            "summary": self.summary(),
            "sections": [s.to_dict() for s in self.sections],
        }

    @classmethod
    def from_dict(cls, raw: dict[str, JsonValue]) -> Report:
        if raw.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(
                f"report schema_version {raw.get('schema_version')!r} is not "
                f"{SCHEMA_VERSION}; use the gpucheck version that wrote it"
            )
        return cls(
            command=raw["command"],
            sections=[Section.from_dict(s) for s in raw.get("sections") or []],
            argv=list(raw.get("argv") or []),
            host=raw.get("host", ""),
            created_at=raw.get("created_at", ""),
            tool_version=raw.get("tool_version", ""),
            schema_version=raw["schema_version"],
        )


def worst(statuses: Iterable[Status]) -> Status:
    return max(statuses, key=lambda s: s.severity, default=Status.OK)
