"""Report files in, `Report`s out (read by `Report.from_dict`, the one reader), with
their metrics keyed as compare, fleet and baselines key them (`Metric.key()`, docs/fleet.md
"Metrics") and their facts (versions, hardware, environment, run settings); one line naming
the file and the problem otherwise. Also compare's and fleet's --threshold (`fraction`)."""

from __future__ import annotations

import functools
import gc
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gpucheck.envfacts import node_facts
from gpucheck.errors import UsageError
from gpucheck.inputs import InputError, JsonProblem, parse_json, read_capped
from gpucheck.measure import Better, Metric
from gpucheck.report import Finding, Report, ReportShapeError, Section, schema_problem
from gpucheck.subject import Subject

JUDGED = (Better.HIGHER, Better.LOWER)


def metrics_of(report: Report) -> dict[str, Metric]:
    """Every metric of `report` by key, sorted; the first of two with one key wins (a
    gathered env report names each node's GPUs alike)."""
    found: dict[str, Metric] = {}
    for section in report.sections:
        for metric in section.metrics:
            found.setdefault(metric.key(), metric)
    keys = tuple(found)
    order = _ORDERS.get(keys)
    if order is None:
        order = _ORDERS[keys] = tuple(sorted(found, key=metric_order))
        if len(_ORDERS) > 256:  # a fleet's reports share a few sets of keys
            _ORDERS.clear()
    return found if order == keys else {k: found[k] for k in order}


_ORDERS: dict[tuple[str, ...], tuple[str, ...]] = {}


@functools.lru_cache(maxsize=1 << 16)  # a fleet's reports share their keys
def metric_order(key: str) -> tuple[str, int, str]:
    """How metric keys are listed: by family, then message size as a number (@1024
    before @131072 before @1048576), then position."""
    name, at, rest = key.partition("@")
    digits = len(rest) - len(rest.lstrip("0123456789"))
    if not at or not digits or digits > 18:  # a size, not a forged run of digits
        return (key, -1, "")
    return (name, int(rest[:digits]), rest[digits:])


def position(metric: Metric) -> str | None:
    """The GPU slot ("rank3", "gpu5", "cuda0_to_cuda1"); None for a job-wide figure."""
    return metric.subject.position() if metric.subject is not None else None


def family(metric: Metric) -> str:
    """The name without a message size: `comm.all_reduce.busbw_gbps`."""
    return metric.name.split("@", 1)[0]


def judged(metric: Metric) -> bool:
    return metric.better in JUDGED


def rows(value: Any) -> list[Mapping[str, Any]]:
    """The dict rows of a table (a list), skipping anything else."""
    # isinstance(r, dict), not Mapping: JSON gives dicts, and the ABC check is what
    # a thousand-node fleet would spend its time on.
    return [r for r in value if isinstance(r, dict)] if isinstance(value, list) else []


def slot_words(metric: Metric) -> str | None:
    """How a finding names the figure's slot: the GPU's words when the figure names a
    GPU ("GPU 3 (NVIDIA H200, bus ...)"), else its position ("rank1"); None for the job."""
    who = metric.subject
    if who is None:
        return None
    if who.gpu is not None or who.bus_id or who.uuid:
        return who.label
    return who.position() or who.label


def gpu_words(metric: Metric) -> str | None:
    """The GPU the figure is about, in words, when it names one (the fleet's gpu column)."""
    words = slot_words(metric)
    return words if words is not None and words != position(metric) else None


def slot_subject(metric: Metric) -> Subject | None:
    """The figure's subject, worded as `slot_words` says it (its fields kept)."""
    words = slot_words(metric)
    if metric.subject is None or words is None:
        return None
    who = metric.subject
    return Subject(who.kind, words, rank=who.rank, gpu=who.gpu, bus_id=who.bus_id,
                   uuid=who.uuid, node=who.node, host=who.host, peer=who.peer, port=who.port)


VERSION, HARDWARE, ENVIRONMENT, SETUP = "version", "hardware", "environment", "setup"
KINDS = (VERSION, HARDWARE, ENVIRONMENT, SETUP)
_ENV_KINDS = frozenset({"system", "python", "torch", "driver", "gpus", "environment"})
_HARDWARE = frozenset({"GPU model", "GPU count (torch)", "GPU count (driver)"})
# The setup section's keys that change what a run measures.
_SETUP = {
    "bench": ("model", "dtype", "batch_size", "ranks", "timed_iters", "device", "backend",
              "channels_last"),
    "comm": ("world_size", "nodes", "device", "backend", "sizes", "iters"),
    "stress": ("world_size", "nodes", "device", "backend", "dtypes", "size", "burn_in_s"),
}


class Fact(NamedTuple):
    """One fact: `key` as people read it ("NVIDIA driver version", "bench.batch_size")."""

    key: str
    value: str
    kind: str  # one of KINDS


def extract_facts(report: Report) -> dict[str, Fact]:
    """Every fact of `report`, by key, sorted by key."""
    facts = {"gpucheck version": Fact("gpucheck version", str(report.tool_version), VERSION)}
    facts.update(_env_facts(report.sections))
    for section in report.sections:
        kind = section.name.rsplit(".", 1)[-1]
        if kind in _SETUP:
            facts.update(_setup_facts(kind, section.data))
        elif kind == "timing":
            facts.update(_bench_devices(section.data))
    return dict(sorted(facts.items()))


def _env_facts(sections: list[Section]) -> dict[str, Fact]:
    """envgather's facts, from the first section of each env kind (a combined or
    multi-node report names them "env.driver", "node0.driver")."""
    first: dict[str, Section] = {}
    for section in sections:
        first.setdefault(section.name.rsplit(".", 1)[-1], section)
    if not _ENV_KINDS & first.keys():
        return {}
    plain = {"sections": [{"name": kind, "data": s.data}
                          for kind, s in first.items() if kind in _ENV_KINDS]}
    return {key: Fact(key, value, ENVIRONMENT if key.startswith("$") else
                      HARDWARE if key in _HARDWARE else VERSION)
            for key, value in node_facts(plain).items()}


def _setup_facts(kind: str, data: Mapping[str, Any]) -> dict[str, Fact]:
    facts = {}
    for key in _SETUP[kind]:
        if key in data:
            value = data[key]
            shown = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
            facts[f"{kind}.{key}"] = Fact(f"{kind}.{key}", shown, SETUP)
    return facts


def _bench_devices(data: Mapping[str, Any]) -> dict[str, Fact]:
    """The devices bench's ranks ran on (its report's only GPU model)."""
    devices = sorted({str(r.get("device")) for r in rows(data.get("ranks"))})
    if not devices:
        return {}
    return {"bench.devices": Fact("bench.devices", ", ".join(devices), HARDWARE)}


def fewer_gpus(key: str, kind: str, usual: str | None, value: str | None) -> bool:
    """`value` of a GPU-count fact is fewer than `usual` (or no longer a count)."""
    if kind != HARDWARE or "count" not in key:
        return False
    want, have = _count(usual or ""), _count(value or "")
    return want is not None and (have is None or have < want)


def _count(value: str) -> int | None:
    # ASCII digits only: "²".isdigit() is True but int("²") raises, and a count of
    # thousands of digits is no GPU count (int() refuses over 4300 digits).
    return int(value) if value.isascii() and value.isdigit() and len(value) < 10 else None


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
