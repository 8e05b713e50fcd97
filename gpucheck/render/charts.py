"""Charts for the HTML report: found in the report's data, drawn by matplotlib as SVG.

Finding a chart's data (`find_charts`) is plain Python and never imports matplotlib;
drawing (`draw_charts`) imports it lazily, so gpucheck installs and renders HTML
without it (the `html` extra adds it). Data is found defensively by the section's
name (its last dotted part, so `gpucheck all`'s `comm.all_reduce` counts) and the
row keys; a section that does not have them gives no chart. A chart that fails to
draw is left out with a one-line note: a chart must never cost the report.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from gpucheck.render.values import fmt_bytes, fmt_value, is_table
from gpucheck.report import Report

INSTALL_NOTE = ("charts need matplotlib: pip install '.[html]' from the gpucheck checkout "
                "(or pip install matplotlib)")
# A fleet of many metrics would make a chart too tall to read; the table has them all.
MAX_RANGE_ROWS = 30


@dataclass
class LineSpec:
    """Lines over message size (log x axis): one per series."""

    title: str
    ylabel: str
    series: dict[str, list[tuple[float, float]]]


@dataclass
class BarSpec:
    """Bars per rank with the median as a line; one panel per group (a dtype)."""

    title: str
    ylabel: str
    groups: dict[str, list[tuple[str, float]]]


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


@dataclass
class Chart:
    """A drawn chart (`svg`), or the one-line `note` saying why it is not there."""

    title: str
    svg: str | None = None
    note: str | None = None


def _number(value: Any) -> float | None:
    """A finite int or float (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _rows(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = data.get(key)
    return value if is_table(value) else []


def find_charts(report: Report) -> list[ChartSpec]:
    """Every chart this report has data for, in the order they are shown."""
    specs: list[ChartSpec | None] = [_comm_chart(report), _bench_chart(report),
                                     *_stress_charts(report), _fleet_chart(report),
                                     _compare_chart(report)]
    return [spec for spec in specs if spec is not None]


def _comm_chart(report: Report) -> LineSpec | None:
    """busbw over message size, a line per collective: any section whose `results`
    rows have size_bytes and busbw_gbps (all_reduce, all_gather, later ones too)."""
    series: dict[str, list[tuple[float, float]]] = {}
    for section in report.sections:
        points = []
        for row in _rows(section.data, "results"):
            size, busbw = _number(row.get("size_bytes")), _number(row.get("busbw_gbps"))
            if size is not None and busbw is not None and size > 0:
                points.append((size, busbw))
        if points:
            series[section.name] = sorted(points)
    if not series:
        return None
    return LineSpec("Bus bandwidth by message size", "busbw (GB/s)", series)


def _per_rank(rows: list[dict[str, Any]], key: str) -> list[tuple[str, float]]:
    bars = []
    for row in rows:
        value = _number(row.get(key))
        if value is not None and row.get("rank") is not None:
            bars.append((f"rank {row['rank']}", value))
    return bars


def _bench_chart(report: Report) -> BarSpec | None:
    groups = {}
    for section in report.sections:
        if _short(section.name) == "timing":
            bars = _per_rank(_rows(section.data, "ranks"), "images_per_s")
            if bars:
                groups[section.name] = bars
    return BarSpec("Images/s per rank", "images/s", groups) if groups else None


def _stress_charts(report: Report) -> list[BarSpec]:
    """GEMM TFLOP/s per rank, a panel per dtype (their scales differ by 10x and more),
    and memory bandwidth per rank. The median product (`_p50`) is what stress judges."""
    charts = []
    for section in report.sections:
        rows = _rows(section.data, "results")
        if _short(section.name) == "gemm":
            key = "tflops_p50" if any("tflops_p50" in r for r in rows) else "tflops"
            groups: dict[str, list[tuple[str, float]]] = {}
            for dtype in dict.fromkeys(str(r.get("dtype")) for r in rows):
                bars = _per_rank([r for r in rows if str(r.get("dtype")) == dtype], key)
                if bars:
                    groups[dtype] = bars
            if groups:
                charts.append(BarSpec("GEMM TFLOP/s per rank (median product)",
                                      "TFLOP/s", groups))
        elif _short(section.name) == "membw":
            key = "gbps_p50" if any("gbps_p50" in r for r in rows) else "gbps"
            bars = _per_rank(rows, key)
            if bars:
                charts.append(BarSpec("Memory bandwidth per rank", "GB/s", {"": bars}))
    return charts


def _fleet_chart(report: Report) -> RangeSpec | None:
    """The fleet's `metrics` rows (median, low, high) with the `outliers` rows' nodes.
    Values are shown relative to the median, so metrics of every unit share an axis;
    metrics with outliers come first."""
    metrics = report.section("metrics")
    if metrics is None:
        return None
    marked: dict[tuple[str, str], list[tuple[str, float]]] = {}
    outliers = report.section("outliers")
    for row in _rows(outliers.data, "outliers") if outliers else []:
        value = _number(row.get("value"))
        if value is not None:
            key = (str(row.get("command")), str(row.get("metric")))
            marked.setdefault(key, []).append((str(row.get("node")), value))
    rows = []
    for row in _rows(metrics.data, "metrics"):
        median, low, high = (_number(row.get(k)) for k in ("median", "low", "high"))
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
        change = _number(row.get("change_pct"))
        if change is not None and "verdict" in row:
            rows.append((str(row.get("metric")), change, str(row["verdict"])))
    if not rows:
        return None
    rows.sort(key=lambda r: (r[2] != "worse", -abs(r[1]), r[0]))
    return ChangeSpec("Change from A to B (%)", rows[:MAX_RANGE_ROWS],
                      max(0, len(rows) - MAX_RANGE_ROWS))


def draw_charts(report: Report) -> list[Chart]:
    """The report's charts as inline SVG; notes instead where they cannot be drawn."""
    specs = find_charts(report)
    if not specs:
        return []
    try:
        import matplotlib  # noqa: F401  (lazy: an optional extra)
    except ImportError:
        return [Chart("Charts", note=INSTALL_NOTE)]
    charts = []
    for index, spec in enumerate(specs):
        try:
            charts.append(Chart(spec.title, svg=_draw(spec, f"gpucheck-chart-{index}")))
        except Exception as exc:  # any error: a chart must never cost the report
            first_line = (str(exc).splitlines() or [""])[0]
            charts.append(Chart(spec.title, note=f"chart left out ({type(exc).__name__}: "
                                                 f"{first_line})"))
    return charts


def _draw(spec: ChartSpec, salt: str) -> str:
    # The object API (Figure, no pyplot) never touches a GUI backend or global figure
    # state; the SVG canvas draws without Agg's rasteriser.
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    # Text as <text>: no embedded glyphs, searchable; the hash salt keeps the ids
    # stable from run to run; no date either, so the same report gives the same page.
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": salt, "font.size": 9}):
        if isinstance(spec, LineSpec):
            figure = _draw_lines(Figure(figsize=(7, 3.6)), spec)
        elif isinstance(spec, BarSpec):
            figure = _draw_bars(spec)
        elif isinstance(spec, ChangeSpec):
            figure = _draw_changes(spec)
        else:
            figure = _draw_ranges(spec)
        return _svg(figure, salt)


def _draw_lines(figure: Any, spec: LineSpec) -> Any:
    axes = figure.add_subplot()
    for name, points in spec.series.items():
        axes.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                  markersize=3, label=name)
    axes.set_xscale("log", base=2)
    axes.xaxis.set_major_formatter(_bytes_formatter())
    axes.set_xlabel("message size (per rank buffer)")
    axes.set_ylabel(spec.ylabel)
    axes.set_title(spec.title)
    axes.grid(True, which="major", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    return figure


def _bytes_formatter() -> Any:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda x, _pos: fmt_bytes(int(x)).replace(".0 ", " "))


def _draw_bars(spec: BarSpec) -> Any:
    from matplotlib.figure import Figure

    panels = list(spec.groups.items())
    widest = max(len(bars) for _, bars in panels)
    figure = Figure(figsize=(min(3 + 0.5 * widest, 10) * len(panels), 3.4))
    for index, (group, bars) in enumerate(panels, start=1):
        axes = figure.add_subplot(1, len(panels), index)
        values = [v for _, v in bars]
        median = statistics.median(values)
        colors = ["#c0392b" if v < 0.9 * median else "#4878a8" for v in values]
        axes.bar([label for label, _ in bars], values, color=colors)
        axes.axhline(median, color="black", linestyle="--", linewidth=1,
                     label=f"median {fmt_value(median)}")
        axes.set_ylabel(spec.ylabel)
        if len(panels) > 1:
            axes.set_title(group)
        axes.legend(loc="lower right")
        axes.tick_params(axis="x", labelrotation=45 if len(bars) > 8 else 0)
    figure.suptitle(spec.title)
    figure.tight_layout()
    return figure


def _draw_ranges(spec: RangeSpec) -> Any:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 1.2 + 0.28 * len(spec.rows)))
    axes = figure.add_subplot()
    for y, row in enumerate(spec.rows):
        axes.plot([row.low / row.median, row.high / row.median], [y, y], color="#4878a8",
                  linewidth=4, solid_capstyle="butt", alpha=0.6)
        axes.plot([1.0], [y], marker="|", color="black", markersize=10)
        for node, value in row.outliers:
            axes.plot([value / row.median], [y], marker="x", color="#c0392b", markersize=8)
            axes.annotate(node, (value / row.median, y), textcoords="offset points",
                          xytext=(4, 3), fontsize=7, color="#c0392b")
    axes.set_yticks(range(len(spec.rows)), [row.label for row in spec.rows], fontsize=7)
    axes.invert_yaxis()
    axes.set_xlabel("value / fleet median (bar: low..high; |: median; x: outlier node)")
    more = f"\n(the {len(spec.rows)} with outliers or the widest range; {spec.left_out} more " \
        "in the table)" if spec.left_out else ""
    axes.set_title(spec.title + more)
    axes.grid(True, axis="x", alpha=0.3)
    figure.tight_layout()
    return figure


_VERDICT_COLORS = {"worse": "#c0392b", "better": "#2e8b57", "same": "#999999"}


def _draw_changes(spec: ChangeSpec) -> Any:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 1.2 + 0.28 * len(spec.rows)))
    axes = figure.add_subplot()
    labels = [f"{name} ({verdict})" for name, _, verdict in spec.rows]
    colors = [_VERDICT_COLORS.get(verdict, "#cccccc") for _, _, verdict in spec.rows]
    axes.barh(range(len(spec.rows)), [change for _, change, _ in spec.rows], color=colors)
    axes.set_yticks(range(len(spec.rows)), labels, fontsize=7)
    axes.invert_yaxis()
    axes.axvline(0, color="black", linewidth=1)
    axes.set_xlabel("B against A (%); worse and better follow each metric's direction")
    more = f" ({spec.left_out} more in the table)" if spec.left_out else ""
    axes.set_title(spec.title + more)
    axes.grid(True, axis="x", alpha=0.3)
    figure.tight_layout()
    return figure


# The root tag's namespace declarations are URLs; inline SVG in HTML needs none.
_XMLNS = re.compile(r'\s+xmlns(?::\w+)?="[^"]*"')
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.DOTALL)


def _svg(figure: Any, prefix: str) -> str:
    """The figure as an <svg> element for inline HTML: no XML prolog, DOCTYPE,
    metadata or namespace URLs (they are not fetched, but a reader of the file
    should find no address in it at all), and every id and reference to one
    prefixed: ids are page-wide, and each figure numbers its own from 1."""
    import io

    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    svg = text[text.index("<svg"):]
    svg = _METADATA.sub("", svg)
    head, rest = svg.split(">", 1)
    svg = _XMLNS.sub("", head) + ">" + rest
    svg = svg.replace(' id="', f' id="{prefix}-').replace('href="#', f'href="#{prefix}-')
    return svg.replace("url(#", f"url(#{prefix}-")
