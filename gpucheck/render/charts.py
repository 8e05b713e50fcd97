"""Charts for the HTML report drawn as SVG by matplotlib, imported lazily (the `html`
extra); a chart that fails to draw is left out with a one-line note.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Any

from gpucheck.render.chart_find import (
    BarSpec,
    ChangeSpec,
    ChartSpec,
    LineSpec,
    RangeRow,
    RangeSpec,
    find_charts,
)
from gpucheck.render.words import fmt_bytes, fmt_value
from gpucheck.report import Report

__all__ = ["FLAGGED_COLOR", "INSTALL_NOTE", "BarSpec", "ChangeSpec", "Chart", "ChartSpec",
           "LineSpec", "RangeRow", "RangeSpec", "draw_charts", "find_charts"]

INSTALL_NOTE = ("charts need matplotlib: pip install '.[html]' from the gpucheck checkout "
                "(or pip install matplotlib)")


@dataclass
class Chart:
    """A drawn chart (`svg`), or the one-line `note` saying why it is not there."""

    title: str
    svg: str | None = None
    note: str | None = None


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
    # Labels are data (node, metric and GPU names from report files): never TeX.
    # With mathtext on, "$\\frac{..}$" in a node name took a minute or removed the
    # chart (matplotlib text.parse_math, text.usetex).
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": salt, "font.size": 9,
                     "text.parse_math": False, "text.usetex": False}):
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
    colors = {}
    for name, points in spec.series.items():
        (line,) = axes.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                            markersize=3, label=name)
        colors[name] = line.get_color()
    for name, points in spec.baseline.items():  # dashed, in its collective's colour
        axes.plot([p[0] for p in points], [p[1] for p in points], linestyle="--",
                  color=colors.get(name, BASELINE_COLOR), linewidth=1,
                  label=f"{name}: baseline floor")
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
        _draw_panel(axes, spec, group, bars)
        if len(panels) > 1:
            axes.set_title(group)
    figure.suptitle(spec.title)
    figure.tight_layout()
    return figure


FLAGGED_COLOR, BAR_COLOR, BASELINE_COLOR = "#c0392b", "#4878a8", "#e67e22"


def _draw_panel(axes: Any, spec: BarSpec, group: str, bars: list[tuple[str, float]]) -> None:
    """Bars coloured by the section's verdict; the median; the check's WARN line and the
    baseline's floor per bar (each rank's own: a node's median, a GPU slot's limit)."""
    from matplotlib.patches import Patch

    labels, values = [label for label, _ in bars], [v for _, v in bars]
    flagged = spec.flagged.get(group, set())
    axes.bar(range(len(bars)), values,
             color=[FLAGGED_COLOR if label in flagged else BAR_COLOR for label in labels])
    axes.set_xticks(range(len(bars)), labels)
    median = statistics.median(values)
    axes.axhline(median, color="black", linestyle="--", linewidth=1,
                 label=f"median {fmt_value(median)}")
    _per_bar_lines(axes, labels, spec.limits.get(group, {}), FLAGGED_COLOR, ":",
                   spec.limit_label)
    _per_bar_lines(axes, labels, spec.baseline.get(group, {}), BASELINE_COLOR, "-.",
                   "baseline floor (--baseline)")
    handles, _ = axes.get_legend_handles_labels()
    if spec.rule:
        handles.append(Patch(color=FLAGGED_COLOR, label=spec.rule))
    axes.set_ylabel(spec.ylabel)
    axes.tick_params(axis="x", labelrotation=45 if len(bars) > 8 else 0)
    # Under the axes, never over a bar; tight_layout makes room for it.
    axes.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.14 if
                len(bars) <= 8 else -0.3), fontsize=7, frameon=False)


def _per_bar_lines(axes: Any, labels: list[str], levels: dict[str, float], color: str,
                   style: str, label: str) -> None:
    """A short line across each bar that has a level; one legend entry for all."""
    at = [(x, levels[name]) for x, name in enumerate(labels) if name in levels]
    if at and label:
        axes.hlines([y for _, y in at], [x - 0.45 for x, _ in at], [x + 0.45 for x, _ in at],
                    colors=color, linestyles=style, linewidth=1.5, label=label)


def _draw_ranges(spec: RangeSpec) -> Any:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 1.4 + 0.36 * len(spec.rows)))
    axes = figure.add_subplot()
    for y, row in enumerate(spec.rows):
        axes.plot([row.low / row.median, row.high / row.median], [y, y], color="#4878a8",
                  linewidth=4, solid_capstyle="butt", alpha=0.6)
        axes.plot([1.0], [y], marker="|", color="black", markersize=10)
        for node, value in row.outliers:
            _mark_node(axes, node, value / row.median, y)
    axes.set_yticks(range(len(spec.rows)), [row.label for row in spec.rows], fontsize=8)
    axes.margins(x=0.08, y=0.6 / max(len(spec.rows), 1))
    axes.invert_yaxis()
    axes.set_xlabel("value / fleet median (bar: low..high; |: median; x: outlier node)")
    more = f"\n(the {len(spec.rows)} with outliers or the widest range; {spec.left_out} more " \
        "in the table)" if spec.left_out else ""
    axes.set_title(spec.title + more)
    axes.grid(True, axis="x", alpha=0.3)
    # Twice: the node names move with their points when the first pass narrows the
    # axes, and a long name at the right edge would still be cut off after one.
    figure.tight_layout()
    figure.tight_layout()
    return figure


def _mark_node(axes: Any, node: str, x: float, y: float) -> None:
    """An outlier node: a red x and its name, legible (8 pt), above the row's bar and to
    the right of the mark (to the left it would run into the metric names); the
    figure's tight_layout keeps the text inside the figure."""
    axes.plot([x], [y], marker="x", color="#c0392b", markersize=8)
    axes.annotate(node, (x, y), textcoords="offset points", xytext=(4, 5), fontsize=8,
                  color="#c0392b")


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
