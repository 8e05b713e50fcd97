"""Markdown for cluster tickets, verdict, figures and problems first: GFM (pipe tables,
`<details>` folds), or `markdown-plain` CommonMark (tables as text in code blocks)."""

from __future__ import annotations

import re
from typing import Any

from gpucheck.render import words
from gpucheck.render.headline import headline_rows
from gpucheck.render.words import (
    finding_rows,
    fmt_field,
    is_table,
    is_verbatim,
    problems,
    table_columns,
    walk,
)
from gpucheck.report import Report, Section


def md_table(rows: list[dict[str, Any]], plain: bool = False) -> list[str]:
    """A GFM pipe table, or (`plain`) the text renderer's columns in a code block."""
    if plain:
        from gpucheck.render.text import table_lines

        return fenced(table_lines(rows))
    columns = table_columns(rows)
    lines = ["| " + " | ".join(map(words.markdown, columns)) + " |",
             "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(words.markdown(fmt_field(str(c), row.get(c))) for c in columns)
              + " |" for row in rows]
    return lines


def fenced(lines: list[str]) -> list[str]:
    """`lines` as a fenced code block, the fence longer than any backticks inside."""
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, *lines, fence]


def render_markdown(report: Report, plain: bool = False) -> str:
    figures, found = headline_rows(report), problems(report.findings)
    lines = [
        f"# gpucheck {words.markdown(report.command)}: **{report.verdict().value}**",
        "",
        *([f"_{words.markdown(report.scope)}_", ""] if report.scope else []),
        f"Host {words.markdown_code(report.host)}, {words.markdown(report.created_at)}, "
        f"gpucheck {words.markdown(report.tool_version)}, command "
        f"{words.markdown_code(' '.join(report.argv))}",
        "",
        *md_table([{"status": s, "count": n} for s, n in report.summary().items()], plain),
        "",
        *(["## Figures", "", *md_table(figures, plain), ""] if figures else []),
        *(["## Problems", "", *md_table(finding_rows(found, narrow=True), plain), ""] if found
          else ["No FAIL or WARN findings.", ""]),
    ]
    for section in report.sections:
        lines.extend(_section_lines(section, plain))
    return "\n".join(lines).rstrip() + "\n"


def _section_lines(section: Section, plain: bool) -> list[str]:
    verdict = section.verdict()
    badge = verdict.value if verdict is not None else "info"
    # plain: no HTML, a heading instead of a fold
    lines = [f"### {words.markdown(section.title)} ({badge})" if plain else
             f"<details><summary><b>{words.html(section.title)}</b> ({badge})</summary>", ""]
    flat = walk(section.data, _dotted, lambda path, key, value, inner:
                _dotted(path, {key: value}) if inner is None else inner)
    scalars = [{"key": k, "value": fmt_field(k, v)} for k, v in flat
               if not is_table(v) and not is_verbatim(k, v)]
    if scalars:
        lines += [*md_table(scalars, plain), ""]
    blocks = [(k, fenced(v.splitlines())) for k, v in flat if is_verbatim(k, v)]
    blocks += [(k, md_table(v, plain)) for k, v in flat if is_table(v)]
    for key, block in blocks:
        lines += [f"**{words.markdown(key)}**", "", *block, ""]
    if section.findings:
        lines += [*md_table(finding_rows(section.findings, narrow=True), plain), ""]
    return lines if plain else [*lines, "</details>", ""]


def _dotted(path: tuple[str, ...], items: dict[str, Any]) -> list[tuple[str, Any]]:
    """Nested keys as one dotted key."""
    return [(".".join((*path, key)), value) for key, value in items.items()]
