"""Text renderer for a terminal: aligned sections, colour only when asked."""

from __future__ import annotations

from typing import Any

from gpucheck.actions import strip_hint
from gpucheck.render.safe import terminal as esc
from gpucheck.render.values import fmt_field, is_table, table_columns
from gpucheck.report import Finding, Report, Section, Status

_COLORS = {Status.OK: "32", Status.SKIP: "2", Status.WARN: "33", Status.FAIL: "31;1"}


def _paint(text: str, status: Status, color: bool) -> str:
    return f"\033[{_COLORS[status]}m{text}\033[0m" if color else text


def render_text(report: Report, color: bool = False) -> str:
    lines = [_headline(report, color), ""]
    for section in report.sections:
        lines.extend(_section_lines(section, color))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _headline(report: Report, color: bool) -> str:
    counts = ", ".join(f"{n} {status}" for status, n in report.summary().items())
    verdict = _paint(report.verdict().value, report.verdict(), color)
    return (f"gpucheck {esc(report.command)} on {esc(report.host)} at "
            f"{esc(report.created_at)}: {verdict} ({counts})")


def _section_lines(section: Section, color: bool) -> list[str]:
    lines = [f"== {esc(section.title)} =="]
    lines.extend(_data_lines(section.data, indent="  "))
    lines.extend(_finding_lines(f, color) for f in section.findings)
    return lines


def _data_lines(data: dict[str, Any], indent: str) -> list[str]:
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict) and not is_table(v)}
    width = max((len(esc(k)) for k in scalars), default=0)
    lines = [f"{indent}{esc(key):<{width}}  {esc(fmt_field(str(key), value))}"
             for key, value in scalars.items()]
    for key, value in data.items():
        if isinstance(value, dict):
            lines.append(f"{indent}{esc(key)}:")
            lines.extend(_data_lines(value, indent + "  "))
        elif is_table(value):
            lines.append(f"{indent}{esc(key)}:")
            lines.extend(table_lines(value, indent + "  "))
    return lines


def table_lines(rows: list[dict[str, Any]], indent: str = "") -> list[str]:
    """Rows of dicts as aligned columns under a header."""
    columns = table_columns(rows)
    cells = [[esc(fmt_field(str(c), row.get(c))) for c in columns] for row in rows]
    columns = [esc(c) for c in columns]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    header = "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))
    body = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return [f"{indent}{line}" for line in [header.rstrip(), *body]]


def _finding_lines(finding: Finding, color: bool) -> str:
    tag = _paint(f"[{finding.status.value:^4}]", finding.status, color)
    subject = f" ({esc(finding.subject)})" if finding.subject else ""
    line = f"  {tag} {esc(finding.check)}{subject}: {esc(finding.message)}"
    hint = strip_hint(finding.hint, finding.action)
    action = f" ({esc(finding.action)})" if finding.action else ""
    if hint:
        line += f"\n         HINT{action}: {esc(hint)}"
    elif action:
        line += f"\n         ACTION: {esc(finding.action)}"
    return line
