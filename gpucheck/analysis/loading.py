"""Report files in, checked dicts out: one line naming the file and the problem otherwise.

compare and fleet read the JSON as plain dicts rather than through `Report.from_dict`:
they only read, and fleet reads a thousand of them, so the shape is checked once here
(schema 3 only: `gpucheck.report.schema_problem`) and read defensively after that.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpucheck.actions import ACTIONS
from gpucheck.analysis.facts import Fact, extract_facts
from gpucheck.analysis.metrics import metrics_of
from gpucheck.errors import UsageError
from gpucheck.inputs import InputError, JsonProblem, parse_json, read_capped
from gpucheck.measure import Metric, SecondLook
from gpucheck.report import Status, schema_problem
from gpucheck.subject import Subject

STATUSES = frozenset(s.value for s in Status)
BASELINE_KIND = "gpucheck-baseline"
# Reports about reports: read by neither analysis (a fleet directory may hold them).
ANALYSIS_COMMANDS = frozenset({"compare", "fleet"})


@dataclass
class ReadBudget:
    """What a run that reads many reports (fleet) may read in all: a thousand nodes'
    reports are tens of MiB, while JSON of nothing but `{}` builds about 30 times its
    size in memory (4 copies of a 32 MiB one took 3.3 GB and 43 s). Counted before
    parsing; a UsageError (exit 2) once spent."""

    bytes_left: int = 512 * 1024**2
    containers_left: int = 4_000_000  # `{` and `[` (in strings too: an upper bound)

    def spend(self, path: str, data: bytes) -> None:
        self.bytes_left -= len(data)
        self.containers_left -= data.count(b"{") + data.count(b"[")
        if self.bytes_left < 0 or self.containers_left < 0:
            raise UsageError(f"{path}: the reports read so far hold more than a fleet run "
                             "reads at once (512 MiB, 4 million JSON objects and lists); "
                             "judge fewer files at a time (one directory per rack)")


class ReportError(Exception):
    """A file that is not a readable gpucheck report: `path` and what is wrong."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


@dataclass(frozen=True)
class LoadedReport:
    """One report file, its shape checked: `raw` is the JSON object as read."""

    path: str
    raw: Mapping[str, Any]
    # Read once, in load_report, where a damaged value becomes a ReportError.
    metrics: Mapping[str, Metric] = field(default_factory=dict, compare=False)
    facts: Mapping[str, Fact] = field(default_factory=dict, compare=False)

    @property
    def command(self) -> str:
        return str(self.raw["command"])

    @property
    def host(self) -> str:
        return str(self.raw.get("host") or "")

    @property
    def created_at(self) -> str:
        return str(self.raw.get("created_at") or "")

    @property
    def sections(self) -> list[Mapping[str, Any]]:
        return list(self.raw["sections"])

    @property
    def findings(self) -> list[Mapping[str, Any]]:
        return [f for s in self.sections for f in s.get("findings") or []]

    @property
    def verdict(self) -> str:
        """The worst WARN/FAIL finding, as Report.verdict says (recomputed, not trusted)."""
        statuses = {f["status"] for f in self.findings}
        if statuses == {"SKIP"}:
            return "SKIP"
        for status in ("FAIL", "WARN"):
            if status in statuses:
                return status
        return "OK"

    @property
    def run_failed(self) -> bool:
        """The run itself did not finish: a failure or stop section (see cli, stress)."""
        return any(_kind(s.get("name")) in ("failure", "interrupted") for s in self.sections)


def _kind(name: object) -> str:
    return str(name or "").rsplit(".", 1)[-1]


def load_report(path: str, budget: ReadBudget | None = None) -> LoadedReport:
    """The report at `path`, or ReportError saying what is wrong with the file;
    UsageError once `budget` (shared by the files of one run) is spent."""
    raw = _read_json(path, budget)
    check_report_shape(path, raw)
    try:
        metrics, facts = metrics_of(raw), extract_facts(raw)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError) as exc:
        # The trust boundary: a value of the wrong type deep in a section (a table
        # replaced by a number) is this file's fault, named, never a traceback.
        raise ReportError(path, "is a damaged gpucheck report (a value of the wrong type: "
                                f"{type(exc).__name__}: {str(exc)[:120]})") from None
    return LoadedReport(path, raw, metrics, facts)


def _read_json(path: str, budget: ReadBudget | None = None) -> Any:
    try:
        text = read_capped(path)  # regular files only, at most REPORT_MAX_BYTES
    except IsADirectoryError:
        raise ReportError(path, "is a directory, not a report file") from None
    except InputError as exc:
        raise ReportError(path, f"{exc.strerror}") from None
    except OSError as exc:
        raise ReportError(path, f"cannot be read ({exc.strerror})") from None
    if budget is not None:
        budget.spend(path, text)
    try:
        return parse_json(text)
    except JsonProblem as exc:
        raise ReportError(path, f"is not a gpucheck report ({exc})") from None
    except UnicodeDecodeError:
        raise ReportError(path, "is not a gpucheck report (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        raise ReportError(path, f"is not valid JSON ({exc.msg} at line {exc.lineno} column "
                                f"{exc.colno})") from None
    except RecursionError:
        raise ReportError(path, "is not a gpucheck report (JSON nested too deeply)") from None


def check_report_shape(path: str, raw: Any) -> None:
    """Raise ReportError unless `raw` has the report shape compare and fleet rely on."""
    if not isinstance(raw, dict):
        raise ReportError(path, f"is not a gpucheck report (a JSON {_json_type(raw)}, not "
                                "an object)")
    if raw.get("kind") == BASELINE_KIND:
        raise ReportError(path, "is a gpucheck baseline, not a report (give it to --baseline)")
    if raw.get("tool") != "gpucheck" or not isinstance(raw.get("command"), str):
        raise ReportError(path, "is not a gpucheck report (no \"tool\": \"gpucheck\" and "
                                "\"command\")")
    problem = _field_problem(raw, _REPORT_TEXT, "") or _argv_problem(raw.get("argv"))
    if problem is not None:
        raise ReportError(path, f"is a damaged gpucheck report ({problem})")
    problem = schema_problem(raw.get("schema_version"))
    if problem is not None:
        raise ReportError(path, problem)
    problem = _section_problem(raw.get("sections"))
    if problem is not None:
        raise ReportError(path, f"is a damaged gpucheck report ({problem})")


def _json_type(value: Any) -> str:
    return {list: "array", str: "string", int: "number", float: "number", bool: "boolean",
            type(None): "null"}.get(type(value), type(value).__name__)


def _section_problem(sections: Any) -> str | None:
    """What is wrong with the sections list, or None: every field later code reads."""
    if not isinstance(sections, list):
        return "\"sections\" is not a list"
    for i, section in enumerate(sections):
        where = f"sections[{i}]"
        if not isinstance(section, dict) or not isinstance(section.get("name"), str):
            return f"{where} has no name"
        if (problem := _field_problem(section, ("title",), where)) is not None:
            return problem
        if not isinstance(section.get("data", {}), dict):
            return f"{where}.data is not an object"
        if (problem := _metrics_problem(section.get("metrics"), where)) is not None:
            return problem
        findings = section.get("findings", [])
        if not isinstance(findings, list):
            return f"{where}.findings is not a list"
        for j, finding in enumerate(findings):
            if not (isinstance(finding, dict) and isinstance(finding.get("check"), str)
                    and isinstance(finding.get("status"), str)
                    and finding["status"] in STATUSES):
                return f"{where}.findings[{j}] has no check id or a status other than " \
                       f"{', '.join(sorted(STATUSES))}"
            problem = _field_problem(finding, _FINDING_TEXT, f"{where}.findings[{j}]") \
                or _action_problem(finding, f"{where}.findings[{j}]") \
                or _data_problem(finding, f"{where}.findings[{j}]")
            if problem is not None:
                return problem
    return None


def _metrics_problem(metrics: Any, where: str) -> str | None:
    """Schema 3's metrics: a list of what `Metric.to_dict` writes, or absent."""
    if metrics is None:
        return None
    if not isinstance(metrics, list):
        return f"{where}.metrics is not a list"
    for i, metric in enumerate(metrics):
        try:
            Metric.from_dict(metric)
        except (TypeError, ValueError, KeyError) as exc:
            return f"{where}.metrics[{i}]: {str(exc)[:120]}"
    return None


def _action_problem(finding: Mapping[str, Any], where: str) -> str | None:
    """Schema 3 stores the action of every WARN and FAIL, one of gpucheck.actions:
    compare and fleet relay it as it is, never resolve it again."""
    action = finding.get("action")
    if action is None and finding["status"] in ("WARN", "FAIL"):
        return f"{where} is a {finding['status']} without an action"
    if action is not None and action not in ACTIONS:
        return f"{where}.action {str(action)[:40]!r} is not one of gpucheck's actions"
    return None


def _data_problem(finding: Mapping[str, Any], where: str) -> str | None:
    """A subject that is not a string, damaged subject fields, or a damaged look."""
    subject, fields, look = finding.get("subject"), finding.get("subject_fields"), \
        finding.get("look")
    if subject is not None and not isinstance(subject, str):
        return f"{where}.subject is a JSON {_json_type(subject)}, not a string"
    try:
        if fields is not None:
            Subject.from_dict(fields)
        if look is not None:
            SecondLook.from_dict(look)
    except (TypeError, ValueError, KeyError) as exc:
        return f"{where}: {str(exc)[:120]}"
    return None


# Text fields: a string or null where present; anything else is a damaged report.
_REPORT_TEXT = ("host", "created_at", "tool_version")
_FINDING_TEXT = ("message", "hint", "action", "cause")


def _field_problem(raw: Mapping[str, Any], keys: Sequence[str], where: str) -> str | None:
    for key in keys:
        value = raw.get(key)
        if value is not None and not isinstance(value, str):
            name = f"{where}.{key}" if where else f"\"{key}\""
            return f"{name} is a JSON {_json_type(value)}, not a string"
    return None


def _argv_problem(argv: Any) -> str | None:
    if argv is None or (isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
        return None
    return "\"argv\" is not a list of strings"


def report_paths(inputs: Sequence[str]) -> list[str]:
    """Files as given; a directory gives its `*.json` files (sorted, not recursive).

    UsageError for a path that does not exist and for a directory without reports:
    both are typing mistakes, not bad reports.
    """
    paths: list[str] = []
    for given in inputs:
        if os.path.isdir(given):
            found = sorted(os.path.join(given, n) for n in os.listdir(given)
                           if n.endswith(".json") and not n.startswith("."))
            if not found:
                raise UsageError(f"{given}: no .json report files in this directory")
            paths.extend(found)
        elif os.path.exists(given):
            paths.append(given)
        else:
            raise UsageError(f"{given}: no such file or directory")
    # A file named twice (or through a symlink, ./ or ..) is read once: else it would
    # claim its host twice (fleet.duplicate_host) though it is one file.
    unique: dict[str, str] = {}
    for path in paths:
        unique.setdefault(os.path.realpath(path), path)
    return list(unique.values())
