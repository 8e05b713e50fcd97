"""Each command's headline figures (from the report's metrics, shown under the verdict
in every format) and the formats for machines: JSON (with them as `figures`), one line
(`--format line`: a drain reason) and Prometheus text (families: docs/health.md).
"""

from __future__ import annotations

import datetime as dt
import json
import re
import statistics
from collections.abc import Mapping

from gpucheck.measure import Metric
from gpucheck.render.words import fmt_bytes, fmt_value, problems, terminal
from gpucheck.report import ACTIONS, Finding, Report, Status
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
        ratio = first.unit == "ratio"
        return _made(_JOB[pool], f"{first.value:.1%}" if ratio else fmt_value(first.value),
                     "" if ratio else first.unit, "")
    if pool.startswith("stress.gemm.") and pool.endswith(".tflops"):
        figure = f"stress {pool.split('.')[2]} matmul tflops_p50, slowest rank"
    elif pool in _PER_RANK:
        figure = _PER_RANK[pool]
    else:
        return None
    # The slowest rank's figure, where it ran, and the median of all ranks.
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


def worst_finding(report: Report) -> Finding | None:
    """The problem to name first: the most severe status, then the most disruptive action,
    then the first in the report."""
    return max(problems(report.findings), default=None,
               key=lambda f: (f.status.severity, ACTIONS.index(f.action or "none")))


def render_line(report: Report) -> str:
    """One printable ASCII line of at most MAX_CHARS: the verdict, or the worst problem."""
    worst = worst_finding(report)
    counts = report.summary()
    scope = f" ({report.scope.split(':')[0]})" if report.scope else ""  # its head: short
    if worst is None:
        skipped = f", {counts['SKIP']} skipped" if counts["SKIP"] else ""
        first_skip = next((f for f in report.findings if f.status is Status.SKIP), None)
        why = f": {first_skip.check}: {first_skip.message}" if first_skip and skipped else ""
        line = (f"{PREFIX} {report.command} {report.verdict().value}{scope}: "
                f"{counts['OK']} checks OK{skipped}{why}")
    else:
        others = counts["WARN"] + counts["FAIL"] - 1
        more = f" (+{others} more)" if others else ""
        who = worst.subject
        about = f"{who.label}: " if who is not None else ""
        if who is not None and who.kind is Kind.GPU and who.gpu is not None:
            # Its index and bus id find the GPU; the model and UUID are in the full report.
            about = f"GPU {who.gpu}" + (f" (bus {who.bus_id})" if who.bus_id else "") + ": "
        line = (f"{PREFIX} {report.command} {worst.status.value} {worst.action}{scope}"
                f"{more}: {about}{worst.check}: {worst.message}")
    # Controls and non-ASCII become spaces, runs of spaces one.
    line = _SPACES.sub(" ", _UNSAFE.sub(" ", line.replace("…", "..."))).strip()
    return (line if len(line) <= MAX_CHARS else line[:MAX_CHARS - 3].rstrip() + "...") + "\n"


def render_json(report: Report) -> str:
    """`figures`: the headline table the other formats show under the verdict, derived
    from the sections (Report.from_dict ignores it; compare and fleet read metrics)."""
    raw = report.to_dict()
    at = list(raw).index("summary") + 1
    items = list(raw.items())
    shaped = dict([*items[:at], ("figures", headline_rows(report)), *items[at:]])
    return json.dumps(shaped, indent=2, sort_keys=False, default=str) + "\n"


# Prometheus text exposition format 0.0.4 for node_exporter's textfile collector:
# https://prometheus.io/docs/instrumenting/exposition_formats/
LABELS = ("command", "check", "subject", "gpu", "hca", "port", "status", "action")


def escape(value: str) -> str:
    """A Prometheus label value: UTF-8 (undecodable bytes as \\xNN), controls escaped."""
    if not value.isascii():
        try:  # a file name's undecodable bytes (surrogateescape) back to bytes, shown
            value = value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # any other lone surrogate
            value = value.encode("utf-8", "backslashreplace").decode("ascii")
    # Other controls (ESC, NUL) and bidi overrides as \\x1b: a label is shown by
    # terminals and dashboards, never obeyed. A newline keeps the format's own escape.
    value = "\n".join(map(terminal, value.split("\n")))
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in pairs.items()) + "}"


def _header(name: str, text: str) -> list[str]:
    return [f"# HELP {name} {text}", f"# TYPE {name} gauge"]


def _subject_labels(subject: Subject | None) -> dict[str, str]:
    """The GPU index or HCA and port a subject names, from its fields (a port's field
    is "mlx5_0/1"); never read from its words."""
    if subject is None:
        return {"subject": "", "gpu": "", "hca": "", "port": ""}
    hca, _, number = (subject.port or "").rpartition("/")
    return {"subject": subject.label,
            "gpu": str(subject.gpu) if subject.gpu is not None else "",
            "hca": hca, "port": number if subject.port else ""}


def folded(report: Report) -> list[Finding]:
    """One finding per (check, subject): the worst, the first of equals."""
    worst: dict[tuple[str, str], Finding] = {}
    for finding in report.findings:
        key = (finding.check, "" if finding.subject is None else finding.subject.label)
        if key not in worst or finding.status.severity > worst[key].status.severity:
            worst[key] = finding
    return list(worst.values())


def _epoch(stamp: object) -> float | None:
    try:
        return dt.datetime.fromisoformat(stamp).timestamp() if isinstance(stamp, str) else None
    except ValueError:
        return None


def render_prometheus(report: Report) -> str:
    command = {"command": report.command}
    lines = _header("gpucheck_info", "The report's scope: what its figures measure.")
    lines.append(f"gpucheck_info{_labels({**command, 'scope': report.scope or ''})} 1")
    lines += _header("gpucheck_check_status", "Status of one check on one subject: 0 OK, "
                    "1 SKIP, 2 WARN, 3 FAIL.")
    for f in folded(report):
        labels = {**command, "check": f.check, **_subject_labels(f.subject),
                  "status": f.status.value, "action": f.action or ""}
        lines.append(f"gpucheck_check_status{_labels(labels)} {f.status.severity}")
    lines += _header("gpucheck_verdict", "The report's verdict: 0 OK, 1 SKIP, 2 WARN, 3 FAIL.")
    lines.append(f"gpucheck_verdict{_labels(command)} {report.verdict().severity}")
    lines += _header("gpucheck_findings", "Findings of each status in the report.")
    for status, count in report.summary().items():
        lines.append(f"gpucheck_findings{_labels({**command, 'status': status})} {count}")
    until = next((e for s in report.sections
                  if (e := _epoch(s.data.get("valid_until"))) is not None), None)
    for name, value, text in (
            ("report_timestamp", _epoch(report.created_at), "When the report was made "
             "(Unix time)."),
            ("valid_until_timestamp", until, "Until when the report holds (Unix time): a "
             "later time() means the check stopped running.")):
        if value is not None:
            lines += _header(f"gpucheck_{name}_seconds", text)
            lines.append(f"gpucheck_{name}_seconds{_labels(command)} {value:.0f}")
    lines += _figures(report, command)
    return "\n".join(lines) + "\n"


# A figure's unit -> (the name's unit suffix, the factor to base units), after
# https://prometheus.io/docs/practices/naming/ (base units, the unit in the name).
_UNITS = {"s": ("seconds", 1.0), "ms": ("seconds", 1e-3), "GB/s": ("bytes_per_second", 1e9),
          "TFLOP/s": ("flops_per_second", 1e12), "images/s": ("images_per_second", 1.0),
          "bytes": ("bytes", 1.0), "W": ("watts", 1.0), "C": ("celsius", 1.0),
          "MHz": ("hertz", 1e6), "%": ("ratio", 1e-2), "ratio": ("ratio", 1.0)}
# The figure's own words that name its unit, dropped from the family's name.
_UNIT_WORDS = ("gbps", "tflops", "ms", "s", "w", "c", "mhz", "pct", "bytes", "per", "images")
_FIGURE_LABELS = ("command", "gpu", "UUID", "pci_bus_id", "Hostname", "rank", "peer", "node",
                  "collective", "size_bytes", "dtype")
_DTYPES = ("fp32", "fp16", "bf16", "tf32", "fp64", "fp8")


def _figure_name(metric: Metric) -> tuple[str, dict[str, str]]:
    """The family's name and the labels its metric name carries: "comm.all_reduce.
    busbw_gbps@1024" is gpucheck_comm_busbw_bytes_per_second{collective="all_reduce",
    size_bytes="1024"}, "stress.gemm.bf16.tflops" gpucheck_stress_gemm_flops_per_second
    {dtype="bf16"}."""
    name, _, size = metric.name.partition("@")
    parts = name.split(".")
    labels = {"size_bytes": size} if size else {}
    if parts[0] == "comm" and len(parts) == 3 and parts[1] != "pairwise":
        labels["collective"] = parts.pop(1)
    if len(parts) > 2 and parts[2] in _DTYPES:
        labels["dtype"] = parts.pop(2)
    suffix, _ = _UNITS.get(metric.unit, (_sanitized(metric.unit), 1.0))
    words = [w for w in "_".join(parts).split("_") if w not in _UNIT_WORDS]
    if words and words[-1] == suffix:  # "nvlink_active_links" in links
        words.pop()
    return "_".join(["gpucheck", *map(_sanitized, words), suffix]), labels


def _sanitized(word: str) -> str:
    return "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_"
                   for c in word.lower()).strip("_") or "value"


def _figure_labels(metric: Metric) -> dict[str, str]:
    s = metric.subject
    if s is None:
        return {}
    fields = {"gpu": s.gpu, "UUID": s.uuid, "pci_bus_id": s.bus_id, "Hostname": s.host,
              "rank": s.rank, "peer": s.peer, "node": s.node}
    return {k: str(v) for k, v in fields.items() if v is not None}


def _figures(report: Report, command: dict[str, str]) -> list[str]:
    """Every metric of the report as a gauge in base units, one family per figure, every
    sample of a family with the family's labels ("" where a sample has none)."""
    families: dict[str, list[tuple[dict[str, str], float]]] = {}
    for section in report.sections:
        for metric in section.metrics:
            name, labels = _figure_name(metric)
            labels = {**command, **labels, **_figure_labels(metric)}
            value = metric.value * _UNITS.get(metric.unit, ("", 1.0))[1]
            families.setdefault(name, []).append((labels, value))
    lines: list[str] = []
    for name, samples in families.items():
        keys = [k for k in _FIGURE_LABELS if any(labels.get(k) for labels, _ in samples)]
        series = {tuple((k, labels.get(k, "")) for k in keys): value
                  for labels, value in reversed(samples)}  # a series once: the first
        lines += _header(name, f"A figure gpucheck {terminal(report.command)} measured ({name}).")
        lines += [f"{name}{_labels(dict(full))} {value!r}" for full, value in series.items()]
    return lines
