"""Report files in, `Report`s out (read by `Report.from_dict`, the one reader), with
their metrics and facts; one line naming the file and the problem otherwise. Also
compare's and fleet's --threshold (`fraction`)."""

from __future__ import annotations

import functools
import gc
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpucheck.analysis.metrics import Fact, extract_facts, metrics_of
from gpucheck.errors import UsageError
from gpucheck.inputs import InputError, JsonProblem, parse_json, read_capped
from gpucheck.measure import Metric
from gpucheck.report import Finding, Report, ReportShapeError, Section, schema_problem

BASELINE_KIND = "gpucheck-baseline"
# Reports about reports: read by neither analysis (a fleet directory may hold them).
ANALYSIS_COMMANDS = frozenset({"compare", "fleet"})


@dataclass
class ReadBudget:
    """What a run that reads many reports (fleet) may read in all: JSON of nothing but
    `{}` builds about 30 times its size in memory. Counted before parsing; a UsageError
    (exit 2) once spent."""

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
    """One report file as its `Report`, with its metrics and facts read once."""

    path: str
    report: Report
    metrics: dict[str, Metric] = field(default_factory=dict, compare=False)
    facts: dict[str, Fact] = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, path: str, report: Report) -> LoadedReport:
        return cls(path, report, metrics_of(report), extract_facts(report))

    @property
    def command(self) -> str:
        return self.report.command

    @property
    def host(self) -> str:
        return self.report.host or ""

    @property
    def created_at(self) -> str:
        return self.report.created_at or ""

    @property
    def sections(self) -> list[Section]:
        return self.report.sections

    @property
    def findings(self) -> list[Finding]:
        return self.report.findings

    @functools.cached_property
    def verdict(self) -> str:
        """The worst WARN/FAIL finding (recomputed from the findings, not trusted)."""
        return self.report.verdict().value

    @functools.cached_property
    def run_failed(self) -> bool:
        """The run itself did not finish: a failure or stop section (see cli, stress)."""
        return any(s.name.rsplit(".", 1)[-1] in ("failure", "interrupted")
                   for s in self.sections)


def load_report(path: str, budget: ReadBudget | None = None) -> LoadedReport:
    """The report at `path`, or ReportError saying what is wrong with the file;
    UsageError once `budget` (shared by the files of one run) is spent."""
    report = read_report(path, _read_json(path, budget))
    try:
        return LoadedReport.of(path, report)
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError) as exc:
        # The trust boundary: a value of the wrong type deep in a section's data (a
        # table replaced by a number) is this file's fault, named, never a traceback.
        raise ReportError(path, "is a damaged gpucheck report (a value of the wrong type: "
                                f"{type(exc).__name__}: {str(exc)[:120]})") from None


def load_reports(paths: Sequence[str]) -> tuple[list[LoadedReport], list[ReportError]]:
    """Every readable report of `paths` under one ReadBudget, and what is wrong with
    the others. The collector waits meanwhile and then leaves the reports alone
    (gc.freeze): they hold no cycles, and it would scan a thousand again at every pass."""
    loaded: list[LoadedReport] = []
    unreadable: list[ReportError] = []
    budget = ReadBudget()  # every file together, not only each alone
    paused = gc.isenabled()
    gc.disable()
    try:
        for path in paths:
            try:
                loaded.append(load_report(path, budget))
            except ReportError as exc:
                unreadable.append(exc)
    finally:
        if paused:
            gc.freeze()
            gc.enable()
    return loaded, unreadable


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


def read_report(path: str, raw: Any) -> Report:
    """`raw` through `Report.from_dict`, or ReportError naming what is wrong."""
    if not isinstance(raw, dict):
        kind = {list: "array", str: "string", int: "number", float: "number",
                bool: "boolean", type(None): "null"}.get(type(raw), type(raw).__name__)
        raise ReportError(path, f"is not a gpucheck report (a JSON {kind}, not an object)")
    if raw.get("kind") == BASELINE_KIND:
        raise ReportError(path, "is a gpucheck baseline, not a report (give it to --baseline)")
    if raw.get("tool") != "gpucheck" or not isinstance(raw.get("command"), str):
        raise ReportError(path, "is not a gpucheck report (no \"tool\": \"gpucheck\" and "
                                "\"command\")")
    problem = schema_problem(raw.get("schema_version"))
    if problem is not None:
        raise ReportError(path, problem)
    if not isinstance(raw.get("sections"), list):
        raise ReportError(path, "is a damaged gpucheck report (\"sections\" is not a list)")
    try:
        return Report.from_dict(raw)
    except ReportShapeError as exc:
        raise ReportError(path, f"is a damaged gpucheck report ({exc.problem})") from None


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


def fraction(text: str, option: str) -> float:
    """"0.05" or "5%" as 0.05; it must lie strictly between 0 and 1."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UsageError(f"{option} {text!r} is not a number: give a fraction (0.05) or a "
                         "percentage (5%)") from None
    if not 0 < value < 1:
        raise UsageError(f"{option} {text!r} must lie between 0 and 1 (0% and 100%), e.g. "
                         "0.05 or 5%")
    return value
