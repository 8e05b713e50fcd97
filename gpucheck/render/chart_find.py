"""The HTML report's charts found in the report (no matplotlib here): bars and lines
from the metrics, colours and limits from the verdicts' own thresholds (docs/html.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpucheck.render.words import is_table
from gpucheck.report import Report, Section, Status
from gpucheck.stats import number
from gpucheck.subject import Kind

# A fleet of many metrics would make a chart too tall to read; the table has them all.
MAX_RANGE_ROWS = 30


@dataclass
class LineSpec:
    """Lines over message size, one per series; `baseline`: each series' limits."""

    title: str
    ylabel: str
    series: dict[str, list[tuple[float, float]]]
    baseline: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


@dataclass
class BarSpec:
    """Bars per rank, one panel per group (a dtype); `flagged` (red), `limits` (the WARN
    line per bar) and `baseline` come from the section's verdict, never the chart."""

    title: str
    ylabel: str
    groups: dict[str, list[tuple[str, float]]]
    flagged: dict[str, set[str]] = field(default_factory=dict)
    rule: str = ""
    limits: dict[str, dict[str, float]] = field(default_factory=dict)
    limit_label: str = ""
    baseline: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class RangeRow:
    label: str
    median: float
    low: float
    high: float
    outliers: list[tuple[str, float]] = field(default_factory=list)


@dataclass
class RangeSpec:
    """Per metric, the fleet's low..high relative to its median, outlier nodes marked."""

    title: str
    rows: list[RangeRow]
    left_out: int = 0


@dataclass
class ChangeSpec:
    """compare: each metric's change from A to B in percent, coloured by its verdict."""

    title: str
    rows: list[tuple[str, float, str]]
    left_out: int = 0


ChartSpec = LineSpec | BarSpec | RangeSpec | ChangeSpec


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _rows(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value: Any = data.get(key)
    return value if is_table(value) else []


def find_charts(report: Report) -> list[ChartSpec]:
    """Every chart this report has data for, in the order they are shown."""
    limits = baseline_limits(report)
    specs: list[ChartSpec | None] = [_comm_chart(report, limits), _bench_chart(report, limits),
                                     *_stress_charts(report, limits), _fleet_chart(report),
                                     _compare_chart(report)]
    return [spec for spec in specs if spec is not None]


def _comm_chart(report: Report, limits: dict[str, float]) -> LineSpec | None:
    """busbw over message size, a line per collective (its busbw_gbps@SIZE metrics)."""
    series: dict[str, list[tuple[float, float]]] = {}
    baseline: dict[str, list[tuple[float, float]]] = {}
    for section in report.sections:
        points, floor = [], []
        family = f"comm.{_short(section.name)}.busbw_gbps@"
        for metric in section.metrics:
            size = metric.name.removeprefix(family)
            if metric.name.startswith(family) and size.isdigit() and int(size) > 0:
                points.append((float(size), metric.value))
                if metric.key() in limits:
                    floor.append((float(size), limits[metric.key()]))
        if points:
            series[section.name] = sorted(points)
        if floor:
            baseline[section.name] = sorted(floor)
    if not series:
        return None
    return LineSpec("Bus bandwidth by message size", "busbw (GB/s)", series, baseline)


def _per_rank(section: Section, name: str, limits: dict[str, float]
              ) -> tuple[list[tuple[str, float]], dict[str, float]]:
    """(`rank N`, value) of the section's `name` metrics in rank order, and the
    baseline's limit per `rank N` where it has one."""
    mine = sorted((m.subject.rank, m.value, m.key()) for m in section.metrics
                  if m.name == name and m.subject is not None and m.subject.rank is not None)
    return ([(f"rank {rank}", value) for rank, value, _ in mine],
            {f"rank {rank}": limits[key] for rank, _, key in mine if key in limits})


def _bench_chart(report: Report, limits: dict[str, float]) -> BarSpec | None:
    """images/s per rank; red: the ranks the straggler check warned about."""
    spec = BarSpec("Images/s per rank", "images/s", {},
                   rule="red: a rank this section's findings warned about (a straggler)")
    for section in report.sections:
        bars, floor = _per_rank(section, "bench.images_per_s", limits)
        if _short(section.name) == "timing" and bars:
            spec.groups[section.name] = bars
            spec.flagged[section.name] = flagged_ranks(section)
            spec.baseline[section.name] = floor
    return spec if spec.groups else None


def _stress_charts(report: Report, limits: dict[str, float]) -> list[BarSpec]:
    """GEMM TFLOP/s per rank, a panel per dtype (scales differ 10x), and memory GB/s;
    each bar coloured and lined by the section's own thresholds."""
    charts = []
    for section in report.sections:
        gemm = _short(section.name) == "gemm"
        if not gemm and _short(section.name) != "membw":
            continue
        rows = _rows(section.data, "results")
        rule = PeerRule(section)
        spec = BarSpec("GEMM TFLOP/s per rank (median product)" if gemm else
                       "Memory bandwidth per rank", "TFLOP/s" if gemm else "GB/s", {},
                       rule=rule.describe(rows), limit_label="" if rule.peer is None else
                       f"WARN below {rule.peer:g} x node median")
        dtypes = dict.fromkeys(str(r.get("dtype")) for r in rows) if gemm else {"": None}
        for group in dtypes:
            mine = [r for r in rows if str(r.get("dtype")) == group] if gemm else rows
            name = f"stress.gemm.{group}.tflops" if gemm else "stress.membw.gbps"
            bars, floor = _per_rank(section, name, limits)
            if bars:
                spec.groups[group] = bars
                spec.flagged[group] = rule.flagged(mine)
                spec.limits[group] = rule.limits(dict(bars), mine)
                spec.baseline[group] = floor
        if spec.groups:
            charts.append(spec)
    return charts


def _fleet_chart(report: Report) -> RangeSpec | None:
    """The fleet's `metrics` rows relative to their median, the `outliers` nodes marked."""
    metrics = report.section("metrics")
    if metrics is None:
        return None
    marked: dict[tuple[str, str], list[tuple[str, float]]] = {}
    outliers = report.section("outliers")
    for row in _rows(outliers.data, "outliers") if outliers else []:
        value = number(row.get("value"))
        if value is not None:
            key = (str(row.get("command")), str(row.get("metric")))
            marked.setdefault(key, []).append((str(row.get("node")), value))
    rows = []
    for row in _rows(metrics.data, "metrics"):
        median, low, high = (number(row.get(k)) for k in ("median", "low", "high"))
        if median is None or low is None or high is None or median <= 0:
            continue
        key = (str(row.get("command")), str(row.get("metric")))
        rows.append(RangeRow(key[1], median, low, high, marked.get(key, [])))
    if not rows:
        return None
    # Outliers first, then the widest spread: the rows most worth a look fit the chart.
    rows.sort(key=lambda r: (not r.outliers, -(r.high - r.low) / r.median, r.label))
    return RangeSpec("Fleet: each metric's range across nodes, relative to its median",
                     rows[:MAX_RANGE_ROWS], max(0, len(rows) - MAX_RANGE_ROWS))


def _compare_chart(report: Report) -> ChangeSpec | None:
    """compare's `metrics` rows (change_pct, verdict): worse first, then the largest."""
    metrics = report.section("metrics")
    rows = []
    for row in _rows(metrics.data, "metrics") if metrics else []:
        change = number(row.get("change_pct"))
        if change is not None and "verdict" in row:
            rows.append((str(row.get("metric")), change, str(row["verdict"])))
    if not rows:
        return None
    rows.sort(key=lambda r: (r[2] != "worse", -abs(r[1]), r[0]))
    return ChangeSpec("Change from A to B (%)", rows[:MAX_RANGE_ROWS],
                      max(0, len(rows) - MAX_RANGE_ROWS))


def baseline_limits(report: Report) -> dict[str, float]:
    """The baseline's limit per metric key, when the report was judged against one."""
    limits: dict[str, float] = {}
    for section in report.sections:
        if _short(section.name) != "baseline":
            continue
        for row in _rows(section.data, "limits"):
            limit = number(row.get("limit"))
            if limit is not None and isinstance(row.get("metric"), str):
                limits[row["metric"]] = limit
    return limits


def flagged_ranks(section: Section) -> set[str]:
    """`rank N` (the bar's label) of every rank a WARN or FAIL of `section` is about."""
    return {f"rank {f.subject.rank}" for f in section.findings
            if f.status in (Status.WARN, Status.FAIL) and f.subject is not None
            and f.subject.kind is Kind.RANK and f.subject.rank is not None}


class PeerRule:
    """stress's rule for one section: a rank is flagged below `peer` x its node's median
    or `expected` x its GPU model's typical figure (`gpucheck.stress.verdicts`)."""

    def __init__(self, section: Section) -> None:
        self.section = section
        self.peer = number(section.data.get("peer_threshold"))
        self.expected = number(section.data.get("expected_threshold"))

    def flagged(self, rows: list[dict[str, Any]]) -> set[str]:
        if self.peer is None:  # no threshold in the data: what the findings flagged
            return flagged_ranks(self.section)
        peer, expected = self.peer, self.expected
        return {f"rank {r['rank']}" for r in rows
                if ((vs_peers := number(r.get("vs_peers"))) is not None and vs_peers < peer)
                or ((vs_expected := number(r.get("vs_expected"))) is not None
                    and expected is not None and vs_expected < expected)}

    def limits(self, bars: Mapping[str, float], rows: list[dict[str, Any]]
               ) -> dict[str, float]:
        """Bar label -> where its peer WARN starts: `peer` x value / `vs_peers`."""
        found = {}
        for row in rows:
            label, vs_peers = f"rank {row.get('rank')}", number(row.get("vs_peers"))
            if self.peer is not None and label in bars and vs_peers:
                found[label] = self.peer * bars[label] / vs_peers
        return found

    def describe(self, rows: list[dict[str, Any]]) -> str:
        if self.peer is None:
            return "red: a rank this section's findings warned about"
        judged = any(number(r.get("vs_expected")) is not None for r in rows)
        expected = (f" or {self.expected:g} x its GPU model's typical figure"
                    if self.expected is not None and judged else "")
        return f"red: below {self.peer:g} x its node's median{expected}"
