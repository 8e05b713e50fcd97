"""Each command's headline figures under the verdict in every format, from the
report's metrics (never rendered cells); the JSON renderer, which carries them as
`figures`; and the one-line summary (`--format line`: a drain reason).
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping

from gpucheck.actions import ACTIONS
from gpucheck.measure import Metric
from gpucheck.render.words import fmt_bytes, fmt_value
from gpucheck.report import Finding, Report, Status
from gpucheck.subject import Kind, Subject

# Per-rank (or per-pair) families, shown as their slowest member beside the median.
_PER_RANK = {
    "bench.images_per_s": "bench images/s, slowest rank",
    "stress.membw.gbps": "stress memory gbps_p50, slowest rank",
    "comm.pairwise.gbps": "comm send/recv GB/s, slowest pair",
}
_JOB = {
    "bench.aggregate_images_per_s": "bench images/s, whole job",
    "bench.parallel_efficiency": "bench parallel efficiency",
}


def headline_rows(report: Report) -> list[dict[str, str]]:
    """Rows `{figure, value, unit, where}`: empty for a report without such figures
    (env, health, compare...)."""
    metrics: dict[str, Metric] = {}
    for section in report.sections:
        for metric in section.metrics:  # the first of one key, as compare reads them
            metrics.setdefault(metric.key(), metric)
    pools: dict[str, list[Metric]] = {}
    for _, metric in sorted(metrics.items()):  # by key, as compare lists them
        pools.setdefault(metric.name, []).append(metric)
    rows = [row for pool, members in pools.items()
            if (row := _row(pool, members)) is not None]
    rows += peak_busbw_rows(dict(sorted(metrics.items())))
    # bench, comm, stress; in each, the whole job's figures before the slowest rank's.
    return sorted(rows, key=lambda r: (_ORDER.get(r["figure"].split(" ", 1)[0], 9),
                                       "slowest" in r["figure"]))


_ORDER = {"bench": 0, "comm": 1, "stress": 2}


def _row(pool: str, members: list[Metric]) -> dict[str, str] | None:
    first = members[0]
    if pool in _JOB:
        value = f"{first.value:.1%}" if first.unit == "ratio" else fmt_value(first.value)
        return _made(_JOB[pool], value, "" if first.unit == "ratio" else first.unit, "")
    if pool in _PER_RANK or _is_gemm(pool):
        return _slowest(_figure(pool), members)
    return None


def _is_gemm(pool: str) -> bool:
    return pool.startswith("stress.gemm.") and pool.endswith(".tflops")


def _figure(pool: str) -> str:
    if _is_gemm(pool):
        dtype = pool.split(".")[2]
        return f"stress {dtype} matmul tflops_p50, slowest rank"
    return _PER_RANK[pool]


def _slowest(figure: str, members: list[Metric]) -> dict[str, str]:
    """The slowest rank's figure, where it ran, and the median of all ranks."""
    low = min(members, key=lambda m: m.value)
    where = _position(low)
    if len(members) > 1:
        median = statistics.median(m.value for m in members)
        where += f"; median {fmt_value(median)} of {len(members)}"
    return _made(figure, fmt_value(low.value), low.unit, where)


def _position(metric: Metric) -> str:
    # "rank3" reads "rank 3"; a pair "rank0_to_rank1" reads "rank 0 to rank 1"
    who = metric.subject
    if who is None:
        return ""
    head = (who.position() or "").replace("_to_", " to ").replace("rank", "rank ")
    named_gpu = who.gpu is not None or who.bus_id or who.uuid
    return f"{head} ({who.label})" if named_gpu else head


def peak_busbw_rows(metrics: Mapping[str, Metric]) -> list[dict[str, str]]:
    """comm: each collective's highest bus bandwidth over its message sizes."""
    best: dict[str, Metric] = {}
    for metric in metrics.values():
        family = metric.name.split("@", 1)[0]
        if family.startswith("comm.") and family.endswith(".busbw_gbps") and (
                family not in best or metric.value > best[family].value):
            best[family] = metric
    rows = []
    for family, metric in best.items():
        size = metric.name.split("@", 1)[1] if "@" in metric.name else ""
        where = f"at {fmt_bytes(int(size))}" if size.isdigit() else ""
        rows.append(_made(f"comm {family.split('.')[1]} busbw, peak",
                          fmt_value(metric.value), metric.unit, where))
    return rows


def _made(figure: str, value: str, unit: str, where: str) -> dict[str, str]:
    return {"figure": figure, "value": value, "unit": unit, "where": where}


MAX_CHARS = 200  # NPD's default max_output_length is 80: its config here raises it
PREFIX = "gpucheck"
_UNSAFE = re.compile(r"[^\x20-\x7e]+")  # control characters and non-ASCII
_SPACES = re.compile(r"\s+")


def clean(text: str) -> str:
    """One line of printable ASCII: anything else becomes a space, runs of spaces one."""
    return _SPACES.sub(" ", _UNSAFE.sub(" ", text.replace("…", "..."))).strip()


def worst_finding(report: Report) -> Finding | None:
    """The problem to name first: the most severe status, then the most disruptive action."""
    problems = [f for f in report.findings if f.status in (Status.WARN, Status.FAIL)]
    if not problems:
        return None
    # The position from enumerate: problems.index(f) made this quadratic (minutes for a
    # report of many thousand findings).
    _, worst = max(enumerate(problems), key=lambda pair: (
        pair[1].status.severity, ACTIONS.index(pair[1].action or "none"), -pair[0]))
    return worst


def _fit(text: str, limit: int = MAX_CHARS) -> str:
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


def _short_subject(subject: Subject) -> str:
    """"GPU 3 (NVIDIA H200, bus 00000000:9A:00.0, GPU-...)" -> "GPU 3 (bus 00000000:9A:00.0)":
    the index and bus id find the GPU; the model and UUID are in the full report. From
    a GPU subject's fields; any other subject as its label."""
    if subject.kind is Kind.GPU and subject.gpu is not None:
        bus = f" (bus {subject.bus_id})" if subject.bus_id else ""
        return f"GPU {subject.gpu}{bus}"
    return subject.label


def _scope(report: Report) -> str:
    """The scope's head, before its first colon ("CPU ranks, no GPU"): one line is short."""
    return f" ({report.scope.split(':')[0]})" if report.scope else ""


def render_line(report: Report) -> str:
    worst = worst_finding(report)
    counts = report.summary()
    if worst is None:
        verdict = report.verdict().value
        skipped = f", {counts['SKIP']} skipped" if counts["SKIP"] else ""
        first_skip = next((f for f in report.findings if f.status is Status.SKIP), None)
        why = f": {first_skip.check}: {first_skip.message}" if first_skip and skipped else ""
        line = (f"{PREFIX} {report.command} {verdict}{_scope(report)}: {counts['OK']} checks OK"
                f"{skipped}{why}")
        return _fit(clean(line)) + "\n"
    others = counts["WARN"] + counts["FAIL"] - 1
    more = f" (+{others} more)" if others else ""
    about = f"{_short_subject(worst.subject)}: " if worst.subject else ""
    head = f"{PREFIX} {report.command} {worst.status.value} {worst.action}{_scope(report)}" \
        f"{more}: {about}"
    return _fit(clean(f"{head}{worst.check}: {worst.message}")) + "\n"


def render_json(report: Report) -> str:
    """`figures`: the headline table the other formats show under the verdict, derived
    from the sections (Report.from_dict ignores it; compare and fleet read metrics)."""
    raw = report.to_dict()
    at = list(raw).index("summary") + 1
    items = list(raw.items())
    shaped = dict([*items[:at], ("figures", headline_rows(report)), *items[at:]])
    return json.dumps(shaped, indent=2, sort_keys=False, default=str) + "\n"
