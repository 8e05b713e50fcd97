"""HTML renderer: one self-contained page (no scripts, no external files; charts inline
SVG), every value escaped."""

from __future__ import annotations

from typing import Any

from gpucheck.render.charts import draw_charts
from gpucheck.render.headline import headline_rows
from gpucheck.render.words import (
    finding_rows,
    fmt_field,
    is_verbatim,
    problems,
    table_columns,
    walk,
)
from gpucheck.render.words import html as escape  # control characters too
from gpucheck.report import Report, Section, Status

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin: 0; display: inline; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 2px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.kv th { font-weight: normal; color: #555; }
.s-OK { background: #d8f0d8; } .s-SKIP { background: #eee; color: #666; }
.s-WARN { background: #fbe7b5; } .s-FAIL { background: #f5c6c6; font-weight: bold; }
.badge { padding: 1px 8px; border-radius: 4px; }
details { border-top: 1px solid #ddd; padding: 0.5em 0; }
summary { cursor: pointer; } .note { color: #666; font-style: italic; }
ul.tree { margin: 0.2em 0; } figure { margin: 0.5em 0 1.5em; }
svg { max-width: 100%; height: auto; }
"""

_STATUSES = {s.value for s in Status}
# Columns whose OK/SKIP/WARN/FAIL cells get their status colour in any table.
_STATUS_COLUMNS = ("status", "verdict")


def render_html(report: Report) -> str:
    verdict = report.verdict().value
    title = f"gpucheck {report.command} on {report.host}: {verdict}"
    counts = [{"status": status, "count": n} for status, n in report.summary().items()]
    rows = headline_rows(report)  # outside every fold
    found = problems(report.findings)
    charts = draw_charts(report)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>gpucheck {escape(report.command)}: "
        f'<span class="badge s-{verdict}">{verdict}</span></h1>',
        *([f'<p class="note">{escape(report.scope)}</p>'] if report.scope else []),
        f"<p>Host <code>{escape(report.host)}</code>, {escape(report.created_at)}, "
        f"gpucheck {escape(report.tool_version)}, command "
        f"<code>{escape(' '.join(report.argv))}</code></p>",
        _table(counts),
        *(["<h2>Figures</h2>", _table(rows, css="figures")] if rows else []),
        "<h2>Problems</h2>",
        _table(finding_rows(found), css="problems") if found else
        "<p>No FAIL or WARN findings.</p>",
        *(["<h2>Charts</h2>"] if charts else []),
        *(f"<figure>{c.svg}</figure>" if c.svg is not None else
          f'<p class="note">{escape(c.title)}: {escape(c.note or "")}</p>' for c in charts),
        *(line for section in report.sections for line in _section(section)),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _section(section: Section) -> list[str]:
    status = section.verdict()
    verdict = status.value if status is not None else "info"
    badge_class = f"s-{verdict}" if verdict in _STATUSES else ""
    # Sections with a problem stay open; OK, SKIP and data-only ones are folded.
    opened = " open" if status in (Status.WARN, Status.FAIL) else ""
    lines = [f'<details{opened} id="{escape(section.name)}"><summary><h2>'
             f"{escape(section.title)}</h2> "
             f'<span class="badge {badge_class}">{verdict}</span></summary>']
    lines.extend(walk(section.data, _fields, _branch))
    if section.findings:
        lines.append(_table(finding_rows(section.findings)))
    lines.append("</details>")
    return lines


def _fields(path: tuple[str, ...], items: dict[str, Any]) -> list[str]:
    """Scalars as one key/value table, or inside a mapping's list as its items."""
    if path:
        return [f"<li>{escape(k)}: {escape(fmt_field(k, v))}</li>" for k, v in items.items()]
    # Verbatim output for <pre>: each line escaped (controls too), the newlines kept.
    lines = [f"<p><b>{escape(k)}</b></p><pre>"
             + "\n".join(escape(line) for line in v.splitlines()) + "</pre>"
             for k, v in items.items() if is_verbatim(k, v)]
    rows = "".join(f"<tr><th>{escape(k)}</th><td>{escape(fmt_field(k, v))}</td></tr>"
                   for k, v in items.items() if not is_verbatim(k, v))
    return [*lines, f'<table class="kv">{rows}</table>'] if rows else lines


def _branch(path: tuple[str, ...], key: str, value: Any, inner: list[str] | None) -> list[str]:
    """A table, or a mapping as a nested list."""
    inside = (_table(value) if inner is None else
              f'<ul class="tree">{"".join(inner)}</ul>' if inner else "")
    return [f"<li>{escape(key)}:{inside}</li>" if path else f"<p><b>{escape(key)}</b></p>{inside}"]


def _table(rows: list[dict[str, Any]], css: str = "") -> str:
    columns = table_columns(rows)
    head = "".join(f"<th>{escape(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(_cell(str(c), row.get(c)) for c in columns) + "</tr>"
                   for row in rows)
    css_attr = f' class="{css}"' if css else ""
    return f"<table{css_attr}><tr>{head}</tr>{body}</table>"


def _cell(column: str, value: Any) -> str:
    text = escape(fmt_field(column, value))
    if column in _STATUS_COLUMNS and value in _STATUSES:
        return f'<td class="s-{value}">{text}</td>'
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f'<td class="num">{text}</td>'
    return f"<td>{text}</td>"
