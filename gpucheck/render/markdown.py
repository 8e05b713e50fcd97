"""Markdown renderer for cluster tickets: verdict and summary first, details folded."""

from __future__ import annotations

from typing import Any

from gpucheck.render import safe
from gpucheck.render.values import fmt_field, is_table, table_columns
from gpucheck.render.words import hint_words, message_words
from gpucheck.report import Finding, Report, Section, Status


def _cell(column: str, value: Any) -> str:
    return safe.markdown(fmt_field(str(column), value))


def md_table(rows: list[dict[str, Any]]) -> list[str]:
    columns = table_columns(rows)
    lines = ["| " + " | ".join(map(safe.markdown, columns)) + " |",
             "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(c, row.get(c)) for c in columns) + " |" for row in rows]
    return lines


def render_markdown(report: Report) -> str:
    lines = [
        f"# gpucheck {safe.markdown(report.command)}: **{report.verdict().value}**",
        "",
        *([f"_{safe.markdown(report.scope)}_", ""] if report.scope else []),
        f"Host {safe.markdown_code(report.host)}, {safe.markdown(report.created_at)}, "
        f"gpucheck {safe.markdown(report.tool_version)}, command "
        f"{safe.markdown_code(' '.join(report.argv))}",
        "",
        *md_table([{"status": s, "count": n} for s, n in report.summary().items()]),
        "",
    ]
    lines.extend(_problem_lines(report.findings))
    for section in report.sections:
        lines.extend(_section_lines(section))
    return "\n".join(lines).rstrip() + "\n"


def _finding_rows(findings: list[Finding]) -> list[dict[str, Any]]:
    """Rows of a findings table; the action column only where a finding has one, so
    all-OK sections stay narrow. The hint loses an "action: x:" prefix the column shows."""
    with_action = any(f.action for f in findings)
    return [{"status": f.status.value, **({"action": f.action or ""} if with_action else {}),
             "check": f.check, "subject": f.subject or "", "message": message_words(f),
             "hint": hint_words(f) or ""} for f in findings]


def _problem_lines(findings: list[Finding]) -> list[str]:
    problems = [f for f in findings if f.status in (Status.FAIL, Status.WARN)]
    problems.sort(key=lambda f: -f.status.severity)
    if not problems:
        return ["No FAIL or WARN findings.", ""]
    return ["## Problems", "", *md_table(_finding_rows(problems)), ""]


def _section_lines(section: Section) -> list[str]:
    lines = [f"<details><summary><b>{safe.html(section.title)}</b> "
             f"({_section_verdict(section)})"
             "</summary>", ""]
    scalars = [{"key": k, "value": fmt_field(k, v)} for k, v in _flatten(section.data).items()]
    if scalars:
        lines += [*md_table(scalars), ""]
    for key, value in section.data.items():
        if is_table(value):
            lines += [f"**{safe.markdown(key)}**", "", *md_table(value), ""]
    if section.findings:
        lines += [*md_table(_finding_rows(section.findings)), ""]
    return [*lines, "</details>", ""]


def _section_verdict(section: Section) -> str:
    verdict = section.verdict()
    return verdict.value if verdict is not None else "info"


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys; tables are left for their own blocks."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        elif not is_table(value):
            flat[f"{prefix}{key}"] = value
    return flat
