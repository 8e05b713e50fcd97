"""Text renderer for a terminal: the verdict and the problems first, then the details,
then a one-line summary; every line fits `width` columns; colour only when asked."""

from __future__ import annotations

import textwrap
from functools import partial
from typing import Any

from gpucheck.render.headline import headline_rows
from gpucheck.render.words import (
    fmt_field,
    is_verbatim,
    message_words,
    table_columns,
    walk,
)
from gpucheck.render.words import problems as worst_first
from gpucheck.render.words import shown as esc
from gpucheck.report import Finding, Report, Status

# A terminal of 100 columns shows every line whole (tables too: wide ones are split
# into column groups); the CLI passes a real terminal's own width.
WIDTH = 100
MIN_WIDTH = 60
_KEY_MAX = 32
# Columns that name a table's row, strongest first (see _key_count).
_KEY_COLUMNS = ("node", "host", "metric", "check", "command", "rank", "gpu")
_CELL_MAX = 48  # a longer cell wraps inside its column
_HINT_INDENT = " " * 9  # under the text after "  [WARN] "

_COLORS = {Status.OK: "32", Status.SKIP: "2", Status.WARN: "33", Status.FAIL: "31;1"}


def _paint(text: str, status: Status, color: bool) -> str:
    return f"\033[{_COLORS[status]}m{text}\033[0m" if color else text


def render_text(report: Report, color: bool = False, width: int = WIDTH) -> str:
    width = max(width, MIN_WIDTH)
    lines = _wrap(_headline(report), width, "  ")
    if report.scope:
        lines += _wrap(f"Scope: {esc(report.scope)}", width, "  ")
    lines.append("")
    figures = headline_rows(report)
    lines += ["Figures:", *table_lines(figures, "  ", width), ""] if figures else []
    lines += _problem_lines(report, color, width)
    for section in report.sections:
        verdict = section.verdict()
        badge = f" ({verdict.value})" if verdict is not None else ""
        lines.append(f"== {esc(section.title)}{badge} ==")
        lines += walk(section.data, partial(_fields, width), partial(_branch, width))
        for finding in section.findings:
            lines += finding_lines(finding, color, width)
        lines.append("")
    lines.append(_closing(report, width))
    return "\n".join(_paint_verdicts(lines, report, color)) + "\n"


def _headline(report: Report) -> str:
    return (f"gpucheck {esc(report.command)} on {esc(report.host)} at {esc(report.created_at)}: "
            f"{report.verdict().value} ({_counts(report)})")


def _counts(report: Report) -> str:
    return ", ".join(f"{n} {status}" for status, n in report.summary().items())


def _closing(report: Report, width: int) -> str:
    plain = f"{report.verdict().value}: {_counts(report)}"
    problems = worst_first(report.findings)
    if not problems:
        return plain
    top = problems[0]
    # One line whatever the width: with the subject's short name, without, or counts only.
    where = f" on {esc(top.subject.short_name())}" if top.subject else ""
    for candidate in (f"{plain}; first: {esc(top.check)}{where} ({top.action})",
                      f"{plain}; first: {esc(top.check)} ({top.action})"):
        if len(candidate) <= width:
            return candidate
    return plain


def _paint_verdicts(lines: list[str], report: Report, color: bool) -> list[str]:
    """The verdict word of the headline and the closing line in its colour."""
    if not color or not lines:
        return lines
    word = report.verdict().value
    painted = _paint(word, report.verdict(), True)
    first = lines[0].replace(f": {word}", f": {painted}", 1)
    last = lines[-1].replace(word, painted, 1)
    return [first, *lines[1:-1], last] if len(lines) > 1 else [first]


def _problem_lines(report: Report, color: bool, width: int) -> list[str]:
    problems = worst_first(report.findings)
    if not problems:
        return ["No problems: no check ended in WARN or FAIL.", ""]
    counts = {s: sum(f.status is s for f in problems) for s in (Status.FAIL, Status.WARN)}
    said = ", ".join(f"{n} {s.value}" for s, n in counts.items() if n)
    lines = [f"Problems ({said}):"]
    for finding in problems:
        lines += finding_lines(finding, color, width)
    return [*lines, ""]


def _fields(width: int, path: tuple[str, ...], items: dict[str, Any]) -> list[str]:
    indent = "  " * (len(path) + 1)
    # Up to 32 columns of key: the longest keys gpucheck writes keep their values aligned.
    key_width = min(max((len(esc(k)) for k in items), default=0), _KEY_MAX)
    lines: list[str] = []
    for key, value in items.items():
        head = f"{indent}{esc(key):<{key_width}}  "
        shown = (f"{len(value.splitlines())} lines, shown in the Markdown, HTML and JSON "
                 "reports" if is_verbatim(key, value) else fmt_field(key, value))
        lines += _wrap(esc(shown), width, " " * min(len(head), width // 2), head)
    return lines


def _branch(width: int, path: tuple[str, ...], key: str, value: Any,
            inner: list[str] | None) -> list[str]:
    indent = "  " * (len(path) + 1)
    rows = table_lines(value, indent + "  ", width) if inner is None else inner
    return [f"{indent}{esc(key)}:", *rows]


def table_lines(rows: list[dict[str, Any]], indent: str = "", width: int = WIDTH) -> list[str]:
    """Rows of dicts as aligned columns under one header. Too wide: the widest cells
    wrap at spaces, then columns leave from the right (named in a last line, never a
    key column); past half of them, row by row instead."""
    columns = table_columns(rows)
    if not columns:  # rows without a field (a damaged report's `[{}]`): nothing to align
        return []
    texts = [[esc(fmt_field(c, row.get(c))) for c in columns] for row in rows]
    names = [esc(c) for c in columns]
    keys = _key_count(names)
    widths = _fitted_widths(names, texts, width - len(indent), keys)
    lines: list[str] = []
    if widths is None:  # too wide to fit: row by row, `key value: name value; name value`
        for t in texts:
            head = " ".join(f"{names[i]} {t[i]}" for i in range(keys))
            rest = "; ".join(f"{names[i]} {t[i]}" for i in range(keys, len(names)))
            lines += _wrap(rest, width, indent + "    ", f"{indent}{head}: ")
        return lines
    shown = len(widths)
    header = "  ".join(c.ljust(w) for c, w in zip(names[:shown], widths, strict=True))
    lines.append(f"{indent}{header.rstrip()}")
    for t in texts:
        cells = [textwrap.wrap(t[i], w, break_on_hyphens=False) or [""]
                 for i, w in enumerate(widths)]
        for k in range(max(len(cell) for cell in cells)):
            parts = [(cell[k] if k < len(cell) else "").ljust(w)
                     for cell, w in zip(cells, widths, strict=True)]
            lines.append(f"{indent}{'  '.join(parts).rstrip()}")
    if shown < len(names):
        lines += _wrap(f"(left out at {width} columns, rightmost first: "
                       f"{', '.join(names[shown:])}; every column is in the JSON, Markdown "
                       "and HTML reports)", width, indent, indent)
    return lines


def _fitted_widths(names: list[str], texts: list[list[str]], room: int,
                   keys: int) -> list[int] | None:
    """The widths of the leading columns shown (the widest narrowed first, down to its
    longest word), None when half the columns or a key column would be left out."""
    natural = [max(len(name), min(_CELL_MAX, max((len(t[i]) for t in texts), default=0)))
               for i, name in enumerate(names)]
    floor = [min(natural[i], max([len(name), *(len(w) for t in texts for w in t[i].split())]))
             for i, name in enumerate(names)]
    for shown in range(len(names), max(keys, (len(names) + 1) // 2) - 1, -1):
        widths = natural[:shown]
        while sum(widths) + 2 * (shown - 1) > room:
            i = max(range(shown), key=lambda k: widths[k] - floor[k])
            if widths[i] <= floor[i]:
                break
            widths[i] -= 1
        else:
            return widths
    return None


def _key_count(columns: list[str]) -> int:
    """How many leading columns name a row: up to a key column among the first three
    (fleet's `rank, node`), else one."""
    leading = columns[:3]
    for key in _KEY_COLUMNS:  # the strongest name first: a node before its rank
        if key in leading:
            return leading.index(key) + 1
    return 1


def finding_lines(finding: Finding, color: bool, width: int = WIDTH) -> list[str]:
    """`[WARN] check (subject): message`, then its hint and action, wrapped to `width`."""
    tag = f"[{finding.status.value:^4}]"
    subject = f" ({esc(finding.subject)})" if finding.subject else ""
    lines = _wrap(f"{tag} {esc(finding.check)}{subject}: {esc(message_words(finding))}", width,
                  _HINT_INDENT, "  ")
    if color:
        lines[0] = lines[0].replace(tag, _paint(tag, finding.status, True), 1)
    hint = finding.hint
    action = f" ({esc(finding.action)})" if finding.action else ""
    if hint:
        lines += _wrap(f"HINT{action}: {esc(hint)}", width, _HINT_INDENT + "  ", _HINT_INDENT)
    elif finding.action:
        lines.append(f"{_HINT_INDENT}ACTION: {esc(finding.action)}")
    return lines


def _wrap(text: str, width: int, indent: str, first: str = "") -> list[str]:
    """`text` in lines of at most `width` columns; long words (paths) are broken."""
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=indent,
                         break_on_hyphens=False) or [first.rstrip()]


BRIEF_PROBLEM_LINES = 16  # a gate's summary stays on one screen


def render_brief(report: Report, seconds: float, kept: list[str], color: bool = False,
                 width: int = WIDTH) -> str:
    """What a gate prints before its job: verdict, problems (one screen), seconds, and
    where the full report went."""
    width = max(width, MIN_WIDTH)
    lines = _wrap(f"{_headline(report)} in {seconds:.0f} s", width, "  ")
    problems = _problem_lines(report, color, width)[:-1]
    if len(problems) > BRIEF_PROBLEM_LINES:
        problems = problems[:BRIEF_PROBLEM_LINES]
        shown = sum(line.lstrip().startswith(("[WARN]", "[FAIL]")) for line in problems)
        more = len(worst_first(report.findings)) - shown
        problems.append(f"  ... {more} more in the full report")
    where = ", ".join(esc(p) for p in kept) if kept else "not kept (add -o FILE.json)"
    lines += [*problems, f"Full report: {where}"]
    return "\n".join([*_paint_verdicts(lines[:1], report, color), *lines[1:]]) + "\n"
