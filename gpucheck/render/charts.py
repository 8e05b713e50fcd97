"""The HTML report's charts drawn as SVG by matplotlib (the `html` extra, imported
lazily); a chart that fails to draw is left out with a one-line note."""

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
    RangeSpec,
    find_charts,
)
from gpucheck.render.words import fmt_bytes, fmt_value
from gpucheck.report import Report

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
    # The object API (Figure, no pyplot): no GUI backend, no global figure state.
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    # Text as <text>; the salt keeps ids stable run to run (the same report, the same
    # page); labels are data, never TeX ("$\\frac{..}$" in a node name took a minute).
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
    from matplotlib.ticker import FuncFormatter

    axes.xaxis.set_major_formatter(FuncFormatter(
        lambda x, _pos: fmt_bytes(int(x)).replace(".0 ", " ")))
    axes.set_xlabel("message size (per rank buffer)")
    axes.set_ylabel(spec.ylabel)
    axes.set_title(spec.title)
    axes.grid(True, which="major", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    return figure


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
    """Bars coloured by the verdict; the median; per bar the WARN line and baseline."""
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
        for node, value in row.outliers:  # a red x, its name above and right of it
            x = value / row.median
            axes.plot([x], [y], marker="x", color=FLAGGED_COLOR, markersize=8)
            axes.annotate(node, (x, y), textcoords="offset points", xytext=(4, 5),
                          fontsize=8, color=FLAGGED_COLOR)
    axes.set_yticks(range(len(spec.rows)), [row.label for row in spec.rows], fontsize=8)
    axes.margins(x=0.08, y=0.6 / max(len(spec.rows), 1))
    axes.invert_yaxis()
    axes.set_xlabel("value / fleet median (bar: low..high; |: median; x: outlier node)")
    more = f"\n(the {len(spec.rows)} with outliers or the widest range; {spec.left_out} more " \
        "in the table)" if spec.left_out else ""
    axes.set_title(spec.title + more)
    axes.grid(True, axis="x", alpha=0.3)
    # Twice: a long node name at the right edge is still cut off after one pass.
    figure.tight_layout()
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
    """The figure as an inline <svg>: no prolog, metadata or namespace URLs (no address
    in the file at all), every id prefixed (ids are page-wide)."""
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
